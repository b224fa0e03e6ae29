"""Preference: the ordering of eligible candidates (SPEC §5.4, changed 2026-12-01).

Contract: `order` sorts candidates that already passed the eligibility gate; it never adds,
drops or filters (the plan gates first). Health comes first, then tier:

1. group (`group`): (1) a closed circuit (healthy, or failing below the threshold), or half-open
   with THIS request holding the probe lease (`Health.HELD`); (2) demoted candidates (§7.1: a
   demotion moves the assignment to the end of later plans, it never excludes it); (3) a circuit
   open with its cooldown running, open past it without this request holding the lease
   (`Health.PROBE`: the router first tries to take the lease and sets HELD when it wins), or
   half-open with the lease held by another request (`Health.COOLING`);
2. tier (lower first);
3. health rank inside the group (healthy before failing), as a tie-break only;
4. weight (higher first), then recent latency (lower first, unknown after known).

So an assignment whose circuit is open receives no traffic while any other candidate can take it,
and in half-open exactly one request (the lease holder) tries it first, whatever the reason.

The sort is stable, so candidates equal on every key keep the selector's order. Group (3) stays in
the plan at the end for an explicit model (availability); `auto` uses the ready pool instead (§5.5,
`routing.auto`).
"""

from collections.abc import Iterable

from routing.types import Candidate, Health

_HEALTH_RANK: dict[Health, int] = {health: rank for rank, health in enumerate(Health)}
_GROUP_ONE = frozenset({Health.HEALTHY, Health.FAILING, Health.HELD})


def group(candidate: Candidate) -> int:
    """The §5.4 health group: 1 closed or lease held by this request, 2 demoted, 3 open/cooling."""
    if candidate.health not in _GROUP_ONE:
        return 3
    return 2 if candidate.demoted else 1


def preference_key(candidate: Candidate) -> tuple[int, int, int, int, bool, float]:
    latency = candidate.latency_ms
    return (
        group(candidate),
        candidate.tier,
        _HEALTH_RANK[candidate.health],
        -candidate.weight,
        latency is None,
        latency if latency is not None else 0.0,
    )


def order(candidates: Iterable[Candidate]) -> tuple[Candidate, ...]:
    return tuple(sorted(candidates, key=preference_key))
