"""Preference: the ordering of eligible candidates (SPEC §5.4).

Contract: `order` sorts candidates that already passed the eligibility gate; it never adds,
drops or filters (the plan gates first). The key is lexicographic:

1. not demoted before demoted: §7.1 says a demotion "moves the assignment to the end of later
   plans", so an account that just rejected a model stops costing every request a wasted first
   attempt, whatever its tier (it is never excluded: it stays in the plan, last);
2. tier (lower first);
3. health: a closed circuit (healthy, then recently failing) before a transiently cooling one
   (an admissible half-open probe, then open for a transient reason);
4. weight (higher first), then recent latency (lower first, unknown after known).

The sort is stable, so candidates equal on every key keep the selector's order. Cooling
candidates of an explicit model therefore stay in the plan, behind the closed ones of their tier
(availability); `auto` uses the ready pool instead (§5.5, `routing.auto`).
"""

from collections.abc import Iterable

from routing.types import Candidate, Health

_HEALTH_RANK: dict[Health, int] = {health: rank for rank, health in enumerate(Health)}


def preference_key(candidate: Candidate) -> tuple[bool, int, int, int, bool, float]:
    latency = candidate.latency_ms
    return (
        candidate.demoted,
        candidate.tier,
        _HEALTH_RANK[candidate.health],
        -candidate.weight,
        latency is None,
        latency if latency is not None else 0.0,
    )


def order(candidates: Iterable[Candidate]) -> tuple[Candidate, ...]:
    return tuple(sorted(candidates, key=preference_key))
