"""Latency: the moving average of an (assignment, model)'s upstream time to first byte (SPEC §5.4).

Contract: every sample moves the average ALPHA of the way towards itself (an exponentially weighted
moving average: the latest sample weighs ALPHA, the one before ALPHA * (1 - ALPHA), and so on), so an
account that slows down is seen within a handful of answers and one slow answer does not swing it.
The ledger writer folds a whole batch's samples of a pair in one step (`Fold`), which is the same as
folding them one by one in the order they came; a pair's first batch starts the average at its
samples' weighted mean (one sample: that sample). A sample is the time from dispatch to the upstream's
response headers (HTTP, SSE) or to its first event (websocket), of a succeeded attempt only: a failure's
timing says nothing about how fast the account serves.

Beside the average the writer keeps the pair's recent load (`Fold.load`), which the draw weighs
(routing.policy.preference): each served request counts 1, except one that placed a conversation on the
account
(its first turn, or a turn its previous account could not serve), which counts PLACEMENT_LOAD: the
conversation's next turns follow it there (cache affinity), so the account is busier than what it has
served so far shows.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

ALPHA = 0.2
# How fast a pair's recent load (`routing.models.Latency.load`) forgets: a request served this long ago
# counts half. Long enough to see which accounts the conversations of the last minute went to, short
# enough that an account the draw has stopped favouring looks idle again within a minute or two.
LOAD_HALF_LIFE_S = 30.0
# What a served request that placed a conversation on an account adds to its load: about what a conversation
# that goes on adds within a half-life (an agent's turn every few seconds). Counted as 1, a new conversation
# looked like one request for its first turns, and the draw kept piling new ones onto the account that had
# just taken some: the busiest of 20 accounts served 1.39x to 1.48x its fair share in make bench-pool, 1.25x
# with this (an offline model of the bench: 1.41x median with served requests alone, whatever the half-life).
PLACEMENT_LOAD = 10.0


def load_now(load: float, written_at: datetime, now: datetime) -> float:
    """A stored load as it stands at `now`: halved for every LOAD_HALF_LIFE_S since it was written."""
    age = max((now - written_at).total_seconds(), 0.0)
    return float(load * 0.5 ** (age / LOAD_HALF_LIFE_S))


@dataclass(frozen=True, slots=True)
class Fold:
    """One pair's samples of one batch, folded: `mean` (their mean weighted as the average weighs them:
    the latest most) moves a previous average `previous` to `previous * keep + mean * (1 - keep)`;
    `placed` of the `count` placed a conversation on the pair."""

    assignment_id: int
    model: str
    mean: float
    count: int
    placed: int = 0

    @property
    def load(self) -> float:
        """What the batch adds to the pair's recent load."""
        return self.count + (PLACEMENT_LOAD - 1) * self.placed

    @property
    def keep(self) -> float:
        """The share of the previous average left after `count` samples."""
        return float((1 - ALPHA) ** self.count)

    def applied(self, previous: float | None) -> float:
        """The average after this batch (what the writer's upsert computes in SQL)."""
        if previous is None:
            return self.mean
        return previous * self.keep + self.mean * (1 - self.keep)


def folds(samples: Iterable[tuple[int, str, int, bool]]) -> list[Fold]:
    """The folds of a batch's samples, (assignment id, model, ttfb ms, whether it placed a conversation)
    in the order they came; one per pair, in order of each pair's first sample."""
    by_pair: dict[tuple[int, str], list[int]] = {}
    placed: dict[tuple[int, str], int] = {}
    for assignment_id, model, ttfb_ms, places in samples:
        by_pair.setdefault((assignment_id, model), []).append(ttfb_ms)
        placed[(assignment_id, model)] = placed.get((assignment_id, model), 0) + places
    result = []
    for (assignment_id, model), values in by_pair.items():
        # The i-th of n samples weighs (1 - ALPHA) ** (n - 1 - i) against the latest.
        weights = [(1 - ALPHA) ** (len(values) - 1 - i) for i in range(len(values))]
        mean = sum(w * v for w, v in zip(weights, values, strict=True)) / sum(weights)
        result.append(Fold(assignment_id, model, mean, len(values), placed[(assignment_id, model)]))
    return result
