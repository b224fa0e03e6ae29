"""Preference: the ordering of eligible candidates (SPEC §5.4, changed 2026-12-05).

Contract: `order` sorts candidates that already passed the eligibility gate; it never adds,
drops or filters (the plan gates first). Health comes first, then tier:

1. the probe: a candidate whose half-open circuit THIS request holds the lease of (`Health.HELD`)
   comes first, whatever its tier, weight or the size of the pool, so a cooled account is tried by
   the next request that can use it and a recovered one gets traffic back within one cooldown;
2. group (`group`): (1) a closed circuit (healthy, or failing below the threshold), or half-open
   with this request holding the lease; (2) demoted candidates (§7.1: a demotion, a 429's or a
   headroom one, moves the assignment to the end of later plans, it never excludes it); (3) a
   circuit open with its cooldown running, open past it without this request holding the lease
   (`Health.PROBE`: the router first tries to take the lease and sets HELD when it wins), or
   half-open with the lease held by another request (`Health.COOLING`);
3. tier (lower first);
4. inside a group and tier, the deterministic order is healthy before failing, weight (higher first),
   then recent latency (lower first, unknown after known); and when the caller gives a `draw` (a
   uniform number in [0, 1), fresh for each request: stateless, so every node spreads alike), the
   FIRST candidate is instead drawn from the leading group and tier in proportion to `share_weights`
   (its weight, scaled down by the headroom its rate-limit headers report and by its latency against
   the fastest of them; behind a held probe, the draw picks who comes second). The rest keep the
   deterministic order. Without a draw (`routing_explain`, a pool with the features off) the order is
   the deterministic one, a priority list. The draw is made CHOICES times (`_draws`), and of those the
   candidate with the least recent load for its share (`Candidate.load`, kept by the ledger writer: its
   served requests, a conversation placed on it counting as several, routing.policy.latency) goes first: the
   power of several choices, which keeps the busiest account near its fair share where one draw left it
   at twice it.

The sort is stable, so candidates equal on every key keep the selector's order. Group (3) stays in
the plan at the end for an explicit model (availability); `auto` uses the ready pool instead (§5.5,
`routing.policy.auto`).
"""

import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from routing.policy.types import Candidate, Health

_HEALTH_RANK: dict[Health, int] = {health: rank for rank, health in enumerate(Health)}
_GROUP_ONE = frozenset({Health.HEALTHY, Health.FAILING, Health.HELD})
# The smallest share of its weight a slow candidate keeps, however slow: it still gets traffic now and
# then, so its latency average moves when it recovers.
LATENCY_FLOOR = 0.1
# Added to both latencies compared: a few milliseconds of jitter between two fast accounts (loopback,
# one region) must not split their load 3 to 1; an account 0.5 s slower than its sibling still loses most.
LATENCY_SLACK_MS = 50.0
# How many candidates the draw takes, of which the least loaded goes first (`order`). Four: in an offline
# model of make bench-pool three left the busiest of 20 accounts at 1.21x its fair share (median), four at
# 1.18x; eight, a worse tail (its 90th percentile 1.31x against 1.27x), as more choices herd new conversations
# onto whichever account looks idlest while the load the ledger writer keeps is a batch behind.
CHOICES = 4
# The smallest share of its weight an account keeps while its rate-limit headers say little is left: it
# still answers, and its next answer says whether the limit has been reset.
HEADROOM_SHARE_FLOOR = 0.05


def group(candidate: Candidate) -> int:
    """The §5.4 health group: 1 closed or lease held by this request, 2 demoted, 3 open/cooling."""
    if candidate.health not in _GROUP_ONE:
        return 3
    return 2 if candidate.demoted else 1


def preference_key(candidate: Candidate) -> tuple[bool, int, int, int, int, bool, float]:
    latency = candidate.latency_ms
    return (
        candidate.health is not Health.HELD,
        group(candidate),
        candidate.tier,
        _HEALTH_RANK[candidate.health],
        -candidate.weight,
        latency is None,
        latency if latency is not None else 0.0,
    )


def _held(ranked: Sequence[Candidate]) -> int:
    """How many candidates at the head of `ranked` hold this request's probe lease (they go first)."""
    count = 0
    while count < len(ranked) and ranked[count].health is Health.HELD:
        count += 1
    return count


def _leading(ranked: Sequence[Candidate]) -> Sequence[Candidate]:
    """The candidates that share the first place: the first one's group and tier."""
    if not ranked:
        return ()
    first = (group(ranked[0]), ranked[0].tier)
    end = 1
    while end < len(ranked) and (group(ranked[end]), ranked[end].tier) == first:
        end += 1
    return ranked[:end]


def share_weights(candidates: Sequence[Candidate]) -> list[float]:
    """Each candidate's weight in the draw: its `weight`, times (a) the share of its tightest rate limit
    its last answer said is left (headroom, at least HEADROOM_SHARE_FLOOR; unknown: all of it), so new
    work goes where the accounts' own limits say there is room, and (b) the fastest known latency among
    them over its own, each plus LATENCY_SLACK_MS (at least LATENCY_FLOOR; a candidate without a latency
    yet counts as the fastest)."""
    known = [c.latency_ms for c in candidates if c.latency_ms is not None and c.latency_ms >= 0]
    fastest = min(known, default=None)
    weights = []
    for c in candidates:
        factor = 1.0
        if fastest is not None and c.latency_ms is not None and c.latency_ms >= 0:
            factor = max((fastest + LATENCY_SLACK_MS) / (c.latency_ms + LATENCY_SLACK_MS), LATENCY_FLOOR)
        if c.headroom_left is not None:
            factor *= min(max(c.headroom_left, HEADROOM_SHARE_FLOOR), 1.0)
        weights.append(max(c.weight, 0) * factor)
    return weights


def _busyness(c: Candidate, weight: float) -> float:
    """Its recent load for its share of the draw: the lower, the more room it has."""
    return (c.load or 0.0) / weight if weight > 0 else float("inf")


def shares(candidates: Iterable[Candidate]) -> dict[tuple[int, str], float]:
    """The chance each candidate of an ordered set has of being drawn first (`order` with a draw): what
    `routing_explain` and the panel show. Candidates outside the leading group and tier have 0. Of
    CHOICES draws the least busy wins, and a tie goes to the first drawn of the tied: i wins when every
    draw is of a candidate at least as busy as i (odds `1 - less`), at least one of them tied with it
    (less `(1 - less - tied) ** CHOICES`), and the first tied one drawn is i (`odds[i] / tied`)."""
    ranked = sorted(candidates, key=preference_key)
    result = dict.fromkeys((c.key for c in ranked), 0.0)
    if _held(ranked):
        result[ranked[0].key] = 1.0
        return result
    leading = _leading(ranked)
    weights = share_weights(leading)
    total = sum(weights)
    if total <= 0:
        result[leading[0].key] = 1.0
        return result
    odds = [w / total for w in weights]
    busy = [_busyness(c, w) for c, w in zip(leading, weights, strict=True)]
    for i, c in enumerate(leading):
        less = sum(p for p, b in zip(odds, busy, strict=True) if b < busy[i])
        tied = sum(p for p, b in zip(odds, busy, strict=True) if b == busy[i])
        if odds[i] > 0:
            result[c.key] = ((1 - less) ** CHOICES - max(1 - less - tied, 0.0) ** CHOICES) * odds[i] / tied
    return result


def _pick(weights: Sequence[float], running: Sequence[float], total: float, draw: float) -> int:
    """The index that `draw` (uniform in [0, 1)) picks in proportion to `weights` (`share_weights`):
    `running` their running sums (`itertools.accumulate`), `total` their `sum`. The first index whose
    running sum is above the point, by bisection rather than a walk over the candidates."""
    if total <= 0:
        return 0
    point = min(max(draw, 0.0), 1.0) * total
    index = bisect_right(running, point)
    if index < len(running):
        return index
    return max(i for i, w in enumerate(weights) if w > 0)  # draw == 1.0, or rounding at the end


def _draws(draw: float) -> list[float]:
    """CHOICES uniform numbers from the request's one draw: itself, then its lower digits, 13 bits at a
    time (a double's 53 bits leave the last of four 14 bits: finer than any pool's shares)."""
    return [math.modf(draw * 8_192.0**n)[0] if n else draw for n in range(CHOICES)]


@dataclass(frozen=True, slots=True)
class Ranking:
    """What `order` works out of a set of candidates before the draw: their deterministic order, how
    many held probes lead it, how many candidates share the first place behind them, and those
    candidates' share weights with their running sums and total. Nothing in it depends on the request,
    so the plan keeps it per routes tuple (`routing.policy.plan`)."""

    ranked: tuple[Candidate, ...]
    held: int
    leading: tuple[Candidate, ...]
    weights: tuple[float, ...]
    running: tuple[float, ...]
    total: float


def ranking(candidates: Iterable[Candidate]) -> Ranking:
    ranked = tuple(sorted(candidates, key=preference_key))
    held = _held(ranked)  # the probe first; the draw picks who comes next, should the probe fail
    leading = tuple(_leading(ranked[held:]))
    weights = tuple(share_weights(leading)) if len(leading) > 1 else ()
    return Ranking(ranked, held, leading, weights, tuple(accumulate(weights)), sum(weights))


def ordered(r: Ranking, draw: float | None) -> tuple[Candidate, ...]:
    """The ranking's order for a request's draw (`order`)."""
    if draw is None or len(r.leading) < 2:
        return r.ranked
    # Several choices: of CHOICES candidates drawn by share, the one with the least recent load for its
    # share goes first (a tie keeps the first drawn). Conversations keep their account, so where a new
    # one lands decides the load for its whole length: one random draw left the busiest of 20 accounts
    # at 2.1x its fair share in make bench-pool, the better of two at 1.44x.
    leading, weights = r.leading, r.weights
    picks = [_pick(weights, r.running, r.total, u) for u in _draws(draw)]
    chosen = min(picks, key=lambda i: _busyness(leading[i], weights[i]))  # min keeps the first of equals
    if not chosen:
        return r.ranked
    ranked = list(r.ranked)
    ranked.insert(r.held, ranked.pop(r.held + chosen))
    return tuple(ranked)


def order(candidates: Iterable[Candidate], draw: float | None = None) -> tuple[Candidate, ...]:
    return ordered(ranking(candidates), draw)
