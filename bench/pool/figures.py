"""The figures of one `make bench-pool` phase, from what the fake accounts recorded and what the clients
saw (pure).

- `Turn`: one client request as the client saw it.
- `CircuitSample`: one account's circuit row as the bench read it from the gateway's database.
- `phase_figures(events, turns, specs, heals, circuits)`: client-visible outcomes, the busiest steady
  account's share over the fair share (and each steady account's figures behind it), each healed
  account's time to its first served request against the cooldown in force when it healed, the
  affinity hit rate and the cached-token share.

Heal time: SPEC §13 wants a healed account serving again "within one cooldown plus one probe". The
cooldown that applies is the one in force when the account healed: each failed probe doubled it (SPEC
§7.1), so it is not the configured first one. Met when the first request it served after its heal came
at most that cooldown plus PROBE_S later (an account whose circuit was closed at its heal: PROBE_S).
Beside it, when the first new conversation after the heal came: a continuing conversation keeps its
account, so a closed account gets work again only when a new one is drawn.

Affinity: a turn hits when the account that served it also served the conversation's previous turn;
it counts only when that account was healthy from the previous turn to this one (no outage scheduled
at this turn's time, no 429 answered in between), as SPEC §5.4 prefers it only then.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from devkit.pool_upstream import AccountSpec

# What the fakes record per request: (t, account, conversation, turn, status, input tokens, cached tokens,
# the smallest share of a limit left its headers reported or None)
Event = tuple[float, str, str, int, int, int, int, float | None]
PROBE_S = 5.0  # "plus one probe": the probe's own time and the poll's granularity


@dataclass(frozen=True)
class CircuitSample:
    t: float  # when it was read, seconds on the phase clock
    account: str
    circuit: str  # which of the account's circuits: "model:route_class"
    state: str  # closed | open | half_open
    cooldown_s: int
    opened_t: float | None  # open_until - cooldown_s on the phase clock: when this open period began


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


def cooldown_in_force(samples: list[CircuitSample], account: str, at: float) -> int:
    """The cooldown of `account`'s circuits at `at` (the longest when several are open; 0 when all are
    closed). Each circuit's state at `at` is its latest change before it: an open period from when it
    began (open_until - cooldown, exact, whenever it was read), a close from when it was read."""
    longest = 0
    for circuit in {s.circuit for s in samples if s.account == account}:
        changes = sorted(
            (s.t, 0) if s.state == "closed" or s.opened_t is None else (s.opened_t, s.cooldown_s)
            for s in samples
            if s.account == account and s.circuit == circuit
        )
        before = [cooldown for t, cooldown in changes if t <= at]
        longest = max(longest, before[-1] if before else 0)
    return longest


def heal_times(
    events: list[Event], heals: dict[str, float], circuits: list[CircuitSample]
) -> dict[str, dict[str, Any]]:
    """Per healed account: seconds from its heal to the first request it served after it (None: never),
    the cooldown in force at its heal, whether it served within that cooldown plus PROBE_S, and seconds
    from its heal to the first turn of a new conversation on any account (None: none came)."""
    found: dict[str, dict[str, Any]] = {}
    for name, healed in heals.items():
        served = [e[0] for e in events if e[1] == name and e[4] == 200 and e[0] >= healed]
        after = min(served) - healed if served else None
        cooldown = cooldown_in_force(circuits, name, healed)
        new = [e[0] for e in events if e[3] == 1 and e[0] >= healed]
        found[name] = {
            "after_s": after,
            "cooldown_s": cooldown,
            "met": after is not None and after <= cooldown + PROBE_S,
            "first_new_s": min(new) - healed if new else None,
        }
    return found


def per_account(events: list[Event], specs: list[AccountSpec], windows: int = 4) -> dict[str, Any]:
    """Each steady account's requests served, in `windows` equal spans of the phase too, the
    conversations it served a first turn of and any turn of, its 429s, and the headroom its answers
    reported (mean and least): what lies behind the busiest share."""
    steady = [s.name for s in specs if not s.outages]
    end = max((e[0] for e in events), default=0.0) or 1.0
    found: dict[str, Any] = {}
    for name in steady:
        mine = [e for e in events if e[1] == name]
        served = [e for e in mine if e[4] == 200]
        reported = [e[7] for e in mine if e[7] is not None]
        spans = Counter(min(int(e[0] / end * windows), windows - 1) for e in served)
        found[name] = {
            "served": len(served),
            "served_by_window": [spans.get(i, 0) for i in range(windows)],
            "first_turns": sum(1 for e in served if e[3] == 1),
            "conversations": len({e[2] for e in served}),
            "rate_limited": sum(1 for e in mine if e[4] == 429),
            "headroom_mean": sum(reported) / len(reported) if reported else None,
            "headroom_least": min(reported, default=None),
        }
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
    events: list[Event],
    turns: list[Turn],
    specs: list[AccountSpec],
    heals: dict[str, float],
    circuits: list[CircuitSample],
) -> dict[str, Any]:
    return {
        "client": client_outcomes(turns),
        "busiest": busiest_share(events, specs),
        "per_account": per_account(events, specs),
        "heals": heal_times(events, heals, circuits),
        "affinity": affinity(events, specs, {t.conversation: t.kind for t in turns}),
        "cached_share": cached_share(events),
        "upstream_429": sum(1 for e in events if e[4] == 429),
        "upstream_requests": len(events),
    }
