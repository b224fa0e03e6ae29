"""SPEC §5.2: the route plan, hard pins, soft session preference, the shortlist, and the handoff."""

import pytest

from routing.policy.eligibility import Verdict
from routing.policy.errors import ErrorCode
from routing.policy.failures import Disposition
from routing.policy.plan import HardPin, PinKind, Plan, PlanError, build_plan, next_candidate
from routing.policy.types import Candidate, Health, IneligibleReason, Requirements, TriState

ALL = ["*"]


def c(aid: int, model: str = "gpt-5", **fields) -> Candidate:
    return Candidate(assignment_id=aid, model=model, assignment=f"acct-{aid}", **fields)


def keys(candidates) -> list[tuple[int, str]]:
    return [x.key for x in candidates]


def plan(**kwargs) -> Plan:
    kwargs.setdefault("requirements", Requirements())
    kwargs.setdefault("allowed_models", ALL)
    kwargs.setdefault("max_attempts", 10)
    result = build_plan(**kwargs)
    assert isinstance(result, Plan)
    return result


def test_primary_candidates_then_cross_model_candidates():
    result = plan(primary=[c(1), c(2)], fallback=[c(1, "gpt-5.1"), c(3, "gpt-5.1")])
    assert keys(result.order) == [(1, "gpt-5"), (2, "gpt-5"), (1, "gpt-5.1"), (3, "gpt-5.1")]
    assert [x.cross_model for x in result.order] == [False, False, True, True]


def test_cross_model_candidates_stay_behind_even_when_preferred():
    result = plan(primary=[c(1, tier=5, health=Health.COOLING)], fallback=[c(2, "gpt-5.1", tier=0)])
    assert keys(result.order) == [(1, "gpt-5"), (2, "gpt-5.1")]


def test_primary_candidates_are_never_marked_cross_model():
    result = plan(primary=[c(1, cross_model=True)])
    assert result.order[0].cross_model is False


def test_cross_model_candidates_are_rechecked_against_the_allow_list():
    result = plan(primary=[c(1)], fallback=[c(2, "gpt-5.1")], allowed_models=["gpt-5"])
    assert keys(result.order) == [(1, "gpt-5")]
    assert keys(result.disallowed) == [(2, "gpt-5.1")]
    assert result.ineligible == ()


def test_each_model_group_is_ordered_by_preference():
    result = plan(
        primary=[c(1, tier=1), c(2, tier=0)],
        fallback=[c(3, "gpt-5.1", demoted=True), c(4, "gpt-5.1")],
    )
    assert keys(result.order) == [(2, "gpt-5"), (1, "gpt-5"), (4, "gpt-5.1"), (3, "gpt-5.1")]


def test_ineligible_candidates_are_reported_with_reasons_and_never_ordered():
    result = plan(
        primary=[c(1, vision=TriState.TRUE), c(2), c(3, health=Health.BLOCKED)],
        fallback=[c(4, "gpt-5.1")],
        requirements=Requirements(vision=True),
    )
    assert keys(result.order) == [(1, "gpt-5")]
    assert [(v.candidate.assignment_id, v.reasons) for v in result.ineligible] == [
        (2, (IneligibleReason.CAPABILITY,)),
        (3, (IneligibleReason.CAPABILITY, IneligibleReason.CIRCUIT_OPEN)),
        (4, (IneligibleReason.CAPABILITY,)),
    ]


def test_exclusion_reason_names_the_last_excluded_candidate():
    result = plan(
        primary=[c(1, min_deadline_ms=900), c(2, health=Health.BLOCKED)],
        requirements=Requirements(deadline_remaining_ms=800),
    )
    assert result.order == ()
    assert result.exclusion_reason is IneligibleReason.CIRCUIT_OPEN


def test_exclusion_reason_is_none_when_something_is_eligible():
    result = plan(primary=[c(1), c(2, health=Health.BLOCKED)])
    assert result.exclusion_reason is None


def test_exclusion_reason_is_none_when_nothing_was_gated():
    result = plan(primary=[], fallback=[c(2, "gpt-5.1")], allowed_models=["gpt-5"])
    assert (result.order, result.exclusion_reason) == ((), None)


@pytest.mark.parametrize(("max_attempts", "kept"), [(1, [1]), (2, [1, 2]), (3, [1, 2, 3]), (9, [1, 2, 3])])
def test_shortlist_cut(max_attempts, kept):
    result = plan(primary=[c(1), c(2)], fallback=[c(3, "gpt-5.1")], max_attempts=max_attempts)
    assert [x.assignment_id for x in result.order] == kept
    assert [x.assignment_id for x in result.beyond_shortlist] == [1, 2, 3][len(kept) :]


def test_shortlist_counts_only_eligible_candidates():
    result = plan(primary=[c(1, health=Health.BLOCKED), c(2), c(3)], max_attempts=2)
    assert [x.assignment_id for x in result.order] == [2, 3]


@pytest.mark.parametrize("kind", [PinKind.RESPONSE, PinKind.FILE, PinKind.WEBSOCKET])
def test_hard_pin_reduces_the_plan_to_the_pinned_assignment(kind):
    result = plan(
        primary=[c(1), c(2), c(3)],
        fallback=[c(2, "gpt-5.1"), c(4, "gpt-5.1")],
        pins=[HardPin(kind, 2)],
    )
    assert keys(result.order) == [(2, "gpt-5"), (2, "gpt-5.1")]
    assert result.pins == (HardPin(kind, 2),)


def test_hard_pin_never_escapes_when_the_pinned_route_is_ineligible():
    result = plan(primary=[c(1), c(2, health=Health.BLOCKED)], pins=[HardPin(PinKind.RESPONSE, 2)])
    assert result.order == ()
    assert result.exclusion_reason is IneligibleReason.CIRCUIT_OPEN
    assert [v.candidate.assignment_id for v in result.ineligible] == [2]  # only the pinned route is judged


def test_hard_pin_ignores_the_session_preference():
    result = plan(primary=[c(1), c(2)], pins=[HardPin(PinKind.RESPONSE, 2)], session_assignment_id=1)
    assert keys(result.order) == [(2, "gpt-5")]
    assert result.session_moved is False


@pytest.mark.parametrize("assignment_id", [None, 9])
def test_file_pin_to_a_gone_assignment_is_a_conflict(assignment_id):
    pin = HardPin(PinKind.FILE, assignment_id)
    result = build_plan(
        primary=[c(1)], requirements=Requirements(), allowed_models=ALL, max_attempts=4, pins=[pin]
    )
    assert result == PlanError(ErrorCode.FILE_ASSIGNMENT_CONFLICT, pin)


@pytest.mark.parametrize("kind", [PinKind.RESPONSE, PinKind.WEBSOCKET])
@pytest.mark.parametrize("assignment_id", [None, 9])
def test_other_pins_to_an_absent_assignment_are_typed_errors(kind, assignment_id):
    pin = HardPin(kind, assignment_id)
    result = build_plan(
        primary=[c(1)], requirements=Requirements(), allowed_models=ALL, max_attempts=4, pins=[pin]
    )
    assert result == PlanError(ErrorCode.PIN_UNAVAILABLE, pin)


def test_pins_that_disagree_are_a_conflict_not_a_union():
    response, file = HardPin(PinKind.RESPONSE, 1), HardPin(PinKind.FILE, 2)
    result = build_plan(
        primary=[c(1), c(2)],
        requirements=Requirements(),
        allowed_models=ALL,
        max_attempts=4,
        pins=[response, file],
    )
    assert result == PlanError(ErrorCode.FILE_ASSIGNMENT_CONFLICT, file)


def test_pin_to_a_disallowed_cross_model_route_does_not_escape():
    pin = HardPin(PinKind.RESPONSE, 2)
    result = build_plan(
        primary=[c(1)],
        fallback=[c(2, "gpt-5.1")],
        requirements=Requirements(),
        allowed_models=["gpt-5"],
        max_attempts=4,
        pins=[pin],
    )
    assert result == PlanError(ErrorCode.PIN_UNAVAILABLE, pin)


def test_session_preference_moves_the_last_assignment_to_the_front_and_keeps_everybody():
    result = plan(primary=[c(1), c(2), c(3, tier=1)], fallback=[c(4, "gpt-5.1")], session_assignment_id=3)
    assert [x.assignment_id for x in result.order] == [3, 1, 2, 4]
    assert result.session_moved is True


def test_session_preference_applies_before_the_shortlist_cut():
    result = plan(primary=[c(1), c(2), c(3, tier=1)], session_assignment_id=3, max_attempts=2)
    assert [x.assignment_id for x in result.order] == [3, 1]
    assert [x.assignment_id for x in result.beyond_shortlist] == [2]


@pytest.mark.parametrize(
    ("session_route", "moved"),
    [
        (c(3, tier=1), True),
        (c(3, tier=1, health=Health.FAILING), True),
        (c(3, tier=1, health=Health.COOLING), False),
        (c(3, tier=1, health=Health.PROBE), False),
        (c(3, tier=1, demoted=True), False),
    ],
)
def test_session_preference_never_outranks_a_health_signal(session_route, moved):
    result = plan(primary=[c(1), session_route], session_assignment_id=3)
    assert result.session_moved is moved
    assert [x.assignment_id for x in result.order] == ([3, 1] if moved else [1, 3])


def test_session_preference_never_promotes_an_ineligible_route():
    result = plan(primary=[c(1), c(3, health=Health.BLOCKED)], session_assignment_id=3)
    assert [x.assignment_id for x in result.order] == [1]
    assert result.session_moved is False


def test_session_preference_does_not_pull_a_cross_model_route_ahead_of_the_primary():
    result = plan(primary=[c(1)], fallback=[c(3, "gpt-5.1")], session_assignment_id=3)
    assert keys(result.order) == [(1, "gpt-5"), (3, "gpt-5.1")]
    assert result.session_moved is False


def test_session_already_first_is_not_a_move():
    result = plan(primary=[c(1), c(2)], session_assignment_id=1)
    assert (result.session_moved, [x.assignment_id for x in result.order]) == (False, [1, 2])


ORDER = (c(1), c(2), c(3, "gpt-5.1", cross_model=True), c(4, "gpt-5.1", cross_model=True))


@pytest.mark.parametrize(
    ("current", "disposition", "expected"),
    [
        (0, Disposition.NEXT_CANDIDATE, 1),
        # SPEC §5.2: only "not found" crosses the model boundary; unavailable, rate limits and
        # model_unavailable stay among the primary model's candidates.
        (1, Disposition.NEXT_CANDIDATE, None),
        (2, Disposition.NEXT_CANDIDATE, 3),  # once crossed, the fallback model's candidates in order
        (3, Disposition.NEXT_CANDIDATE, None),  # plan exhausted: the final failure is returned as it came
        (0, Disposition.NEXT_MODEL, 2),  # model_not_found_cross skips the rest of the same model
        (1, Disposition.NEXT_MODEL, 2),
        (2, Disposition.NEXT_MODEL, None),  # already cross-model: no other model after it
        (0, Disposition.RETURN_FAILURE, None),
        (0, Disposition.TERMINAL_REFUSAL, None),
        (0, Disposition.DISPATCH_UNKNOWN, None),
    ],
)
def test_next_candidate(current, disposition, expected):
    assert next_candidate(ORDER, current, disposition) == expected


def test_verdicts_in_the_plan_carry_the_reservation():
    result = plan(primary=[c(1, health=Health.BLOCKED)])
    assert isinstance(result.ineligible[0], Verdict)
    assert result.ineligible[0].reservation_micros is None


def test_an_ineligible_primary_is_never_swapped_for_its_fallback_model():
    # Context window too small for the explicit model while its family sibling fits: SPEC §5.2.
    result = plan(
        primary=[c(1, context_window=1000)],
        fallback=[c(2, "gpt-5.1", context_window=100000)],
        requirements=Requirements(prompt_tokens=5000),
    )
    assert result.order == ()
    assert result.exclusion_reason is IneligibleReason.CONTEXT_WINDOW
    assert result.cross_open is False


def test_a_transiently_unhealthy_primary_keeps_the_plan_on_its_model():
    result = plan(primary=[c(1, health=Health.COOLING)], fallback=[c(2, "gpt-5.1")])
    assert keys(result.order) == [(1, "gpt-5"), (2, "gpt-5.1")]
    assert result.cross_open is False
    assert next_candidate(result.order, 0, Disposition.NEXT_CANDIDATE) is None
    assert next_candidate(result.order, 0, Disposition.NEXT_MODEL) == 1


def test_every_primary_blocked_by_model_unavailable_opens_the_fallback_model():
    result = plan(
        primary=[c(1, health=Health.BLOCKED), c(3, health=Health.BLOCKED)], fallback=[c(2, "gpt-5.1")]
    )
    assert result.cross_open is True
    assert keys(result.order) == [(2, "gpt-5.1")]


def test_a_primary_blocked_and_another_too_small_does_not_open_the_fallback():
    result = plan(
        primary=[c(1, health=Health.BLOCKED), c(3, context_window=10)],
        fallback=[c(2, "gpt-5.1")],
        requirements=Requirements(prompt_tokens=500),
    )
    assert result.order == ()
    assert result.exclusion_reason is IneligibleReason.CONTEXT_WINDOW


# -- SPEC §5.3/§5.4 as changed 2026-12-05 ----------------------------------------------------------


def test_the_deadline_gate_runs_before_the_shortlist_cut():
    # The reproduction: with max_attempts 1 a deadline that excludes the first account ended in
    # no_eligible_backend: deadline, although an eligible account was next.
    reqs = Requirements(deadline_remaining_ms=500, min_attempt_ms=100)
    result = plan(primary=[c(1, min_deadline_ms=1_000), c(2, tier=1)], requirements=reqs, max_attempts=1)
    assert keys(result.order) == [(2, "gpt-5")]
    assert [v.reason for v in result.ineligible] == [IneligibleReason.DEADLINE]
    assert result.exclusion_reason is None


def test_a_session_keeps_its_account_behind_the_probe_this_request_holds():
    result = plan(primary=[c(1), c(2), c(3, tier=2, health=Health.HELD)], session_assignment_id=2)
    assert keys(result.order) == [(3, "gpt-5"), (2, "gpt-5"), (1, "gpt-5")]
    assert result.session_moved


def test_a_session_overrides_the_draw_but_never_health():
    for draw in (0.0, 0.4, 0.6, 0.99):
        result = plan(primary=[c(1), c(2)], session_assignment_id=2, draw=draw)
        assert keys(result.order)[0] == (2, "gpt-5")
        demoted = plan(primary=[c(1), c(2, demoted=True)], session_assignment_id=2, draw=draw)
        assert keys(demoted.order)[0] == (1, "gpt-5")


def test_the_draw_spreads_a_plan_and_its_shortlist_is_a_prefix_of_its_order():
    firsts = set()
    for draw in (0.1, 0.35, 0.6, 0.85):
        full = plan(primary=[c(1), c(2), c(3), c(4)], draw=draw)
        cut = plan(primary=[c(1), c(2), c(3), c(4)], draw=draw, max_attempts=2)
        assert cut.order + cut.beyond_shortlist == full.order
        firsts.add(full.order[0].assignment_id)
    assert firsts == {1, 2, 3, 4}
