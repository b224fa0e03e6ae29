"""The latency average's arithmetic (routing.policy.latency): each sample moves it a fifth of the way, and a
batch folded in one step lands where its samples folded one by one would."""

import pytest

from routing.policy.latency import ALPHA, PLACEMENT_LOAD, Fold, folds


def test_each_sample_moves_the_average_a_fifth_of_the_way_towards_itself():
    assert ALPHA == 0.2  # the documented weight (README, routing.policy.latency)
    (fold,) = folds([(1, "m", 200, False)])
    assert fold.applied(100.0) == pytest.approx(120.0)
    assert fold.applied(None) == 200.0  # a pair's first sample starts it


@pytest.mark.parametrize(
    "samples", [[200, 300], [5, 5000, 40], [1000] * 30, [120, 80, 95, 300, 60, 70, 75, 2000, 90]]
)
def test_a_batch_folded_in_one_step_equals_its_samples_folded_one_by_one(samples):
    one_by_one = 100.0
    for s in samples:
        one_by_one += ALPHA * (s - one_by_one)
    (fold,) = folds([(7, "gpt-5", s, False) for s in samples])
    assert (fold.count, fold.applied(100.0)) == (len(samples), pytest.approx(one_by_one))


def test_a_pairs_first_batch_starts_at_its_samples_mean_weighted_towards_the_latest():
    (fold,) = folds([(1, "m", 200, False), (1, "m", 300, False)])
    assert fold.applied(None) == pytest.approx((0.8 * 200 + 300) / 1.8)


def test_samples_are_folded_per_assignment_and_model_in_the_order_each_pair_first_came():
    found = folds([(1, "a", 10, True), (2, "a", 20, False), (1, "b", 30, False), (1, "a", 40, False)])
    assert [(f.assignment_id, f.model, f.count) for f in found] == [(1, "a", 2), (2, "a", 1), (1, "b", 1)]
    assert found[1] == Fold(2, "a", 20.0, 1)
    assert [f.placed for f in found] == [1, 0, 0]


def test_a_request_that_placed_a_conversation_adds_placement_load_to_the_load_the_others_one():
    (fold,) = folds([(1, "m", 100, True), (1, "m", 100, False), (1, "m", 100, True), (1, "m", 100, False)])
    assert PLACEMENT_LOAD == 10.0  # the documented weight (README, routing.policy.latency)
    assert (fold.count, fold.placed, fold.load) == (4, 2, 2 * PLACEMENT_LOAD + 2)
    assert Fold(1, "m", 100.0, 3).load == 3
