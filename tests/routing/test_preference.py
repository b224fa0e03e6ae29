"""SPEC §5.4: ordering of eligible candidates."""

import pytest

from routing.preference import group, order
from routing.types import Candidate, Health


def c(aid: int, **fields) -> Candidate:
    return Candidate(assignment_id=aid, model="gpt-5", **fields)


def ids(candidates) -> list[int]:
    return [x.assignment_id for x in candidates]


def test_lower_tier_first():
    assert ids(order([c(1, tier=2), c(2, tier=0), c(3, tier=1)])) == [2, 3, 1]


def test_not_demoted_before_demoted_within_a_tier():
    assert ids(order([c(1, demoted=True), c(2)])) == [2, 1]


def test_demotion_moves_to_the_end_whatever_the_tier():
    assert ids(order([c(1, tier=1), c(2, tier=0, demoted=True)])) == [1, 2]


def test_health_groups_come_before_tier():
    # SPEC §5.4 (changed 2026-12-01): closed or lease-held (1), demoted (2), open/cooling (3); then tier.
    candidates = [
        c(1, tier=0, health=Health.COOLING),
        c(2, tier=0, health=Health.PROBE),  # probe admissible, lease not held by this request
        c(3, tier=0, demoted=True),
        c(4, tier=2),
        c(5, tier=1, health=Health.HELD),  # this request holds the probe lease
    ]
    assert ids(order(candidates)) == [5, 4, 3, 2, 1]


def test_an_open_tier0_is_ordered_after_a_healthy_tier1():
    assert ids(order([c(1, tier=0, health=Health.COOLING), c(2, tier=1)])) == [2, 1]


def test_the_lease_holder_tries_the_half_open_assignment_first_by_tier():
    assert ids(order([c(1, tier=0, health=Health.HELD), c(2, tier=1)])) == [1, 2]
    assert ids(order([c(1, tier=0, health=Health.PROBE), c(2, tier=1)])) == [2, 1]


def test_a_demoted_candidate_goes_before_an_open_one_and_after_a_closed_one():
    assert ids(order([c(1, demoted=True), c(2, health=Health.COOLING), c(3, tier=5)])) == [3, 1, 2]


@pytest.mark.parametrize(
    ("health", "demoted", "expected"),
    [
        (Health.HEALTHY, False, 1),
        (Health.FAILING, False, 1),
        (Health.HELD, False, 1),
        (Health.HEALTHY, True, 2),
        (Health.HELD, True, 2),
        (Health.PROBE, False, 3),
        (Health.COOLING, False, 3),
        (Health.COOLING, True, 3),
        (Health.BLOCKED, False, 3),
    ],
)
def test_group(health, demoted, expected):
    assert group(c(1, health=health, demoted=demoted)) == expected


def test_closed_before_cooling_and_cooling_stays_in_the_order():
    result = order(
        [c(1, health=Health.COOLING), c(2, health=Health.PROBE), c(3, health=Health.FAILING), c(4)]
    )
    assert ids(result) == [4, 3, 2, 1]


def test_health_outranks_weight():
    assert ids(order([c(1, weight=100, health=Health.PROBE), c(2, weight=1)])) == [2, 1]


def test_higher_weight_first():
    assert ids(order([c(1, weight=1), c(2, weight=5), c(3, weight=3)])) == [2, 3, 1]


def test_lower_latency_first_unknown_last():
    result = order([c(1, latency_ms=None), c(2, latency_ms=300.0), c(3, latency_ms=120.0)])
    assert ids(result) == [3, 2, 1]


def test_weight_outranks_latency():
    assert ids(order([c(1, latency_ms=10.0), c(2, weight=2, latency_ms=900.0)])) == [2, 1]


@pytest.mark.parametrize("permutation", [[1, 2, 3], [3, 2, 1], [2, 3, 1]])
def test_stable_for_equal_keys(permutation):
    assert ids(order([c(aid) for aid in permutation])) == permutation


def test_order_is_a_permutation():
    candidates = [c(i, tier=i % 3, demoted=i % 2 == 0, health=list(Health)[i % 4]) for i in range(12)]
    assert sorted(ids(order(candidates))) == list(range(12))


def test_the_full_key():
    candidates = [
        c(1, tier=1),
        c(2, tier=0, demoted=True),
        c(3, tier=0, health=Health.COOLING),
        c(4, tier=0, weight=2),
        c(5, tier=0),
        c(6, tier=0, health=Health.FAILING, weight=9),
    ]
    assert ids(order(candidates)) == [4, 5, 6, 1, 2, 3]
