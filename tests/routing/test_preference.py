"""SPEC §5.4: ordering of eligible candidates."""

import pytest

from routing.preference import order
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


def test_demotion_outranks_health():
    assert ids(order([c(1, demoted=True), c(2, health=Health.COOLING)])) == [2, 1]


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
    assert ids(order(candidates)) == [4, 5, 6, 3, 1, 2]
