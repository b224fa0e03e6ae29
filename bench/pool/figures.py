"""The figures of one `make bench-pool` phase, from what the fake accounts recorded and what the clients
saw (pure).

- `Turn`: one client request as the client saw it.
- `phase_figures(events, turns, specs)`: client-visible outcomes, the busiest steady account's share
  over the fair share, each healed account's time to its first served request, the affinity hit rate
  and the cached-token share.

Affinity: a turn hits when the account that served it also served the conversation's previous turn;
it counts only when that account was healthy from the previous turn to this one (no outage scheduled
at this turn's time, no 429 answered in between), as SPEC §5.4 prefers it only then.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from devkit.pool_upstream import AccountSpec

# What the fakes record per request: (t, account, conversation, turn, status, input tokens, cached tokens)
Event = tuple[float, str, str, int, int, int, int]


@dataclass(frozen=True)
class Turn:
    t: float  # seconds after the phase start, when it was sent
    kind: str  # bench.pool.workload.KINDS
    conversation: str
    turn: int
    status: int  # 0: no answer (transport error or client timeout)
    code: str  # the error's code (else its type) for a failure, "" for a 200


def client_outcomes(turns: list[Turn]) -> dict[str, Any]:
    failures = Counter(f"{t.status} {t.code}".strip() for t in turns if t.status != 200)
    return {
        "sent": len(turns),
        "ok": sum(1 for t in turns if t.status == 200),
        "rate_limited": sum(1 for t in turns if t.status == 429),
        "no_eligible_backend": sum(1 for t in turns if t.code == "no_eligible_backend"),
        "failures": dict(failures.most_common()),
    }


def busiest_share(events: list[Event], specs: list[AccountSpec]) -> dict[str, Any]:
    """The busiest steady account's served requests over the mean of the steady accounts'."""
    steady = [s.name for s in specs if not s.outages]
    served = Counter(e[1] for e in events if e[4] == 200 and e[1] in steady)
    counts = {name: served.get(name, 0) for name in steady}
    fair = sum(counts.values()) / len(counts)
    busiest = max(counts, key=lambda name: counts[name])
    return {
        "share": counts[busiest] / fair if fair else None,
        "busiest": busiest,
        "served": counts[busiest],
        "fair": fair,
        "idle": sum(1 for c in counts.values() if c == 0),
    }


def heal_times(events: list[Event], heals: dict[str, float]) -> dict[str, float | None]:
    """Seconds from each account's heal to the first request it served after it (None: never)."""
    found: dict[str, float | None] = {}
    for name, healed in heals.items():
        served = [e[0] for e in events if e[1] == name and e[4] == 200 and e[0] >= healed]
        found[name] = min(served) - healed if served else None
    return found


def affinity(events: list[Event], specs: list[AccountSpec], kinds: dict[str, str]) -> dict[str, Any]:
    """Hits and counted turns, overall and per kind of conversation key (`kinds`: conversation -> kind)."""
    by_spec = {s.name: s for s in specs}
    limited: dict[str, list[float]] = defaultdict(list)
    served: dict[str, dict[int, tuple[float, str]]] = defaultdict(dict)
    for t, account, conversation, turn, status, *_ in events:
        if status == 429:
            limited[account].append(t)
        elif status == 200 and conversation:
            served[conversation].setdefault(turn, (t, account))
    counted: Counter[str] = Counter()
    hits: Counter[str] = Counter()
    for conversation, turns in served.items():
        for turn, (t, account) in turns.items():
            before = turns.get(turn - 1)
            if before is None:
                continue
            t0, previous = before
            healthy = by_spec[previous].outage(t) is None and not any(t0 <= x <= t for x in limited[previous])
            if healthy:
                kind = kinds.get(conversation, "?")
                counted[kind] += 1
                hits[kind] += account == previous
    total = sum(counted.values())
    return {
        "rate": sum(hits.values()) / total if total else None,
        "counted": total,
        "by_kind": {k: (hits[k] / counted[k], counted[k]) for k in counted},
    }


def cached_share(events: list[Event]) -> float | None:
    served = [e for e in events if e[4] == 200]
    inputs = sum(e[5] for e in served)
    return sum(e[6] for e in served) / inputs if inputs else None


def phase_figures(
    events: list[Event], turns: list[Turn], specs: list[AccountSpec], heals: dict[str, float]
) -> dict[str, Any]:
    return {
        "client": client_outcomes(turns),
        "busiest": busiest_share(events, specs),
        "heal_s": heal_times(events, heals),
        "affinity": affinity(events, specs, {t.conversation: t.kind for t in turns}),
        "cached_share": cached_share(events),
        "upstream_429": sum(1 for e in events if e[4] == 429),
        "upstream_requests": len(events),
    }
