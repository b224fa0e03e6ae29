"""SPEC §5.4: ordering of eligible candidates."""

import random

import pytest

from routing.policy.preference import (
    CHOICES,
    HEADROOM_SHARE_FLOOR,
    LATENCY_FLOOR,
    LATENCY_SLACK_MS,
    _draws,
    group,
    order,
    shares,
)
from routing.policy.types import Candidate, Health


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


# -- sharing the load (SPEC §5.4, changed 2026-12-05) ----------------------------------------------


def _firsts(candidates, draws) -> dict[int, int]:
    counts: dict[int, int] = {}
    for draw in draws:
        first = order(candidates, draw)[0].assignment_id
        counts[first] = counts.get(first, 0) + 1
    return counts


def test_without_a_draw_the_order_is_the_deterministic_priority_list():
    assert ids(order([c(1), c(2), c(3)])) == [1, 2, 3]
    assert ids(order([c(1, weight=1), c(2, weight=3)])) == [2, 1]


def test_equal_candidates_each_come_first_for_their_share_of_the_draws():
    # A fixed seed: the same draws give the same firsts on every run and every node.
    rng = random.Random(43)
    draws = [rng.random() for _ in range(12)]
    firsts = [order([c(1), c(2)], draw)[0].assignment_id for draw in draws]
    # The reproduction: 12 of 12 went to the first. Now the draw decides, the same on every node.
    assert firsts == [1 if draw < 0.5 else 2 for draw in draws]
    assert _firsts([c(1), c(2)], draws) == {1: 8, 2: 4}


def test_the_draw_follows_weight_over_many_requests():
    rng = random.Random(7)
    counts = _firsts([c(1, weight=1), c(2, weight=3)], [rng.random() for _ in range(20_000)])
    # Expected 5,000 and 15,000; a binomial's standard deviation here is about 61.
    assert 4_700 < counts[1] < 5_300
    assert counts[1] + counts[2] == 20_000


def test_a_draw_picks_in_proportion_to_weight_at_its_boundaries():
    cands = [c(1, weight=1), c(2, weight=3)]
    assert order(cands, 0.0)[0].assignment_id == 2  # the deterministic first owns the start of the line
    assert order(cands, 0.74)[0].assignment_id == 2
    assert order(cands, 0.76)[0].assignment_id == 1
    assert order(cands, 0.9999)[0].assignment_id == 1


def test_only_the_first_is_drawn_the_rest_keep_the_deterministic_order():
    cands = [c(1), c(2), c(3), c(4)]
    result = order(cands, 0.6)  # the third of four equal shares
    assert ids(result) == [3, 1, 2, 4]


def test_the_draw_stays_inside_the_leading_group_and_tier():
    cands = [c(1), c(2, tier=1), c(3, demoted=True), c(4, health=Health.COOLING)]
    for draw in (0.0, 0.3, 0.6, 0.99):
        assert ids(order(cands, draw)) == [1, 2, 3, 4]
    # Two demoted equal candidates behind a healthy one: the healthy one still comes first.
    assert order([c(1, demoted=True), c(2, demoted=True), c(3, tier=4)], 0.99)[0].assignment_id == 3


def test_a_failing_but_closed_candidate_still_shares_the_draw():
    # One failure below the threshold must not starve an account: only a success clears its count.
    counts = _firsts([c(1), c(2, health=Health.FAILING)], [i / 100 for i in range(100)])
    assert counts == {1: 50, 2: 50}


def test_latency_scales_the_share_and_orders_the_rest():
    fast, slow = c(1, latency_ms=150.0), c(2, latency_ms=550.0)
    counts = _firsts([slow, fast], [i / 1000 for i in range(1000)])
    assert counts == {1: 750, 2: 250}  # weights 1 and (150 + 50) / (550 + 50)
    assert ids(order([slow, fast])) == [1, 2]  # deterministic: lower latency first
    # Unknown latency counts as the fastest (a new account gets its share), and a very slow one keeps
    # the floor so its average can recover.
    assert shares([c(1), c(2, latency_ms=50.0)]) == {(1, "gpt-5"): 0.5, (2, "gpt-5"): 0.5}
    share = shares([c(1, latency_ms=10.0), c(2, latency_ms=10_000.0)])[(2, "gpt-5")]
    assert share == pytest.approx(LATENCY_FLOOR / (1 + LATENCY_FLOOR))


def test_a_few_milliseconds_of_jitter_do_not_split_the_load():
    # Two fast accounts 1 ms and 3 ms: without the slack the second got a third of the first's share.
    one, three = shares([c(1, latency_ms=1.0), c(2, latency_ms=3.0)]).values()
    second = (1 + LATENCY_SLACK_MS) / (3 + LATENCY_SLACK_MS)
    assert (one, three) == (pytest.approx(1 / (1 + second)), pytest.approx(second / (1 + second)))
    assert 0.45 < three < 0.5


def test_headroom_scales_the_share():
    # An account whose headers say 20 % of its tightest limit is left gets a fifth of an untouched one's.
    odds = shares([c(1, headroom_left=0.2), c(2, headroom_left=1.0), c(3)])
    assert odds[(1, "gpt-5")] == pytest.approx(0.2 / 2.2)
    assert odds[(2, "gpt-5")] == odds[(3, "gpt-5")] == pytest.approx(1 / 2.2)
    # Nearly spent keeps the floor (its next answer tells whether the limit was reset).
    spent = shares([c(1, headroom_left=0.0), c(2)])[(1, "gpt-5")]
    assert spent == pytest.approx(HEADROOM_SHARE_FLOOR / (1 + HEADROOM_SHARE_FLOOR))
    counts = _firsts([c(1, headroom_left=0.25), c(2)], [i / 1000 for i in range(1000)])
    assert counts == {1: 200, 2: 800}


def test_the_probe_this_request_holds_comes_first_whatever_its_tier_weight_and_the_draw():
    cands = [c(1, weight=10), c(2, weight=10), c(3, tier=5, weight=1, health=Health.HELD)]
    for draw in (None, 0.0, 0.5, 0.99):
        assert order(cands, draw)[0].assignment_id == 3
    assert shares(cands)[(3, "gpt-5")] == 1.0


def test_shares_are_the_draws_odds():
    cands = [c(1, weight=2), c(2, weight=1), c(3, weight=1), c(4, tier=1)]
    assert shares(cands) == {(1, "gpt-5"): 0.5, (2, "gpt-5"): 0.25, (3, "gpt-5"): 0.25, (4, "gpt-5"): 0.0}
    counts = _firsts(cands, [i / 1000 for i in range(1000)])
    assert counts == {1: 500, 2: 250, 3: 250}


def test_a_zero_weight_candidate_is_never_drawn_while_another_has_weight():
    counts = _firsts([c(1, weight=0), c(2, weight=1)], [i / 100 for i in range(100)])
    assert counts == {2: 100}


def test_of_the_draws_the_account_with_the_least_load_goes_first():
    busy, idle = c(1, load=5.0), c(2, load=0.0)
    counts = _firsts([busy, idle], [(i + 0.5) / 4000 for i in range(4000)])
    # busy comes first only when all four draws pick it: a sixteenth of the time, not a half.
    assert CHOICES == 4
    assert 180 < counts[1] < 320
    assert shares([busy, idle]) == {(1, "gpt-5"): 0.0625, (2, "gpt-5"): 0.9375}
    # Three accounts, loads 0, 1 and 2: the odds of the least loaded winning four draws.
    three = shares([c(1, load=2.0), c(2, load=1.0), c(3, load=0.0)])
    assert three == pytest.approx(
        {(1, "gpt-5"): 1 / 81, (2, "gpt-5"): 16 / 81 - 1 / 81, (3, "gpt-5"): 65 / 81}
    )
    counts = _firsts(
        [c(1, load=2.0), c(2, load=1.0), c(3, load=0.0)], [(i + 0.5) / 8100 for i in range(8100)]
    )
    assert abs(counts[3] - 6500) < 200 and abs(counts[2] - 1500) < 150 and abs(counts.get(1, 0) - 100) < 60
    # Load is measured against each one's share of the draw: twice the weight carries twice the load.
    assert shares([c(1, weight=2, load=4.0), c(2, load=2.0)]) == pytest.approx(
        {(1, "gpt-5"): 2 / 3, (2, "gpt-5"): 1 / 3}
    )


def test_the_choices_drawn_from_the_requests_one_number_are_each_uniform_and_independent():
    # The request has one random number (a double: 53 bits); each choice needs its own. Spread over too
    # many choices, the last gets a handful of bits and lands on a coarse grid, whatever the pool's shares.
    rng = random.Random(11)
    drawn = [_draws(rng.random()) for _ in range(8192)]
    assert all(len(d) == CHOICES for d in drawn)
    for n in range(CHOICES):
        assert len({int(d[n] * 512) for d in drawn}) == 512  # every 512th of [0, 1) met: 16 expected in each
    for m in range(CHOICES):
        for n in range(m + 1, CHOICES):
            assert len({(int(d[m] * 16), int(d[n] * 16)) for d in drawn}) == 256  # every pair of 16ths met


def test_equal_loads_keep_the_first_draw():
    cands = [c(1, load=3.0), c(2, load=3.0), c(3, load=3.0)]
    assert shares(cands) == pytest.approx({(1, "gpt-5"): 1 / 3, (2, "gpt-5"): 1 / 3, (3, "gpt-5"): 1 / 3})
    assert _firsts(cands, [0.1, 0.5, 0.9]) == {1: 1, 2: 1, 3: 1}
