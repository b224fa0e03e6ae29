"""SPEC §5.5 and seeds/003: model="auto" selection and session stickiness."""

import pytest

from routing.policy.auto import AutoChoice, AutoError, AutoReason, choose_model
from routing.policy.errors import ErrorCode
from routing.policy.types import Candidate, Health, IneligibleReason, Requirements, TriState

ALL = ["*"]
MODELS = ["gpt-5", "gpt-5-mini", "claude-opus-4-8"]


def c(aid: int, model: str, **fields) -> Candidate:
    return Candidate(assignment_id=aid, model=model, **fields)


def routes(**health_by_model) -> dict[str, list[Candidate]]:
    """One route per model; `gpt_5="cooling"` sets that route's health."""
    result = {}
    for aid, model in enumerate(MODELS, start=1):
        name = model.replace("-", "_").replace(".", "_")
        result[model] = [c(aid, model, health=Health(health_by_model.get(name, "healthy")))]
    return result


def choose(**kwargs) -> AutoChoice:
    kwargs.setdefault("auto_models", MODELS)
    kwargs.setdefault("allowed_models", ALL)
    kwargs.setdefault("requirements", Requirements())
    result = choose_model(**kwargs)
    assert isinstance(result, AutoChoice)
    return result


def test_picks_the_first_ready_model():
    result = choose(routes=routes())
    assert (result.model, result.reason) == ("gpt-5", AutoReason.READY)
    assert result.ready == tuple(MODELS)


@pytest.mark.parametrize("cooling", ["cooling", "probe", "blocked"])
def test_a_model_whose_only_route_is_not_closed_is_skipped_when_another_is_ready(cooling):
    result = choose(routes=routes(gpt_5=cooling))
    assert (result.model, result.reason) == ("gpt-5-mini", AutoReason.READY)
    assert result.ready == ("gpt-5-mini", "claude-opus-4-8")


def test_a_recently_failing_but_closed_route_is_still_ready():
    assert choose(routes=routes(gpt_5="failing")).model == "gpt-5"


def test_one_closed_eligible_route_makes_a_model_ready():
    r = routes(gpt_5="cooling")
    r["gpt-5"].append(c(9, "gpt-5"))
    assert choose(routes=r).model == "gpt-5"


def test_a_closed_but_ineligible_route_does_not_make_a_model_ready():
    r = routes(gpt_5="cooling")
    r["gpt-5"].append(c(9, "gpt-5", min_deadline_ms=5000))
    result = choose(routes=r, requirements=Requirements(deadline_remaining_ms=1000))
    assert result.model == "gpt-5-mini"


def test_all_cooling_falls_back_to_the_full_list_for_availability():
    result = choose(routes=routes(gpt_5="cooling", gpt_5_mini="cooling", claude_opus_4_8="probe"))
    assert (result.model, result.reason, result.ready) == ("gpt-5", AutoReason.AVAILABILITY, ())


def test_models_the_key_may_not_use_are_not_candidates():
    result = choose(routes=routes(), allowed_models=["gpt-5-mini", "claude-opus-4-8"])
    assert result.model == "gpt-5-mini"
    assert result.candidates == ("gpt-5-mini", "claude-opus-4-8")


def test_models_that_cannot_fit_the_media_are_not_candidates():
    r = routes()
    r["gpt-5-mini"] = [c(2, "gpt-5-mini", vision=TriState.TRUE)]
    result = choose(routes=r, requirements=Requirements(vision=True))
    assert (result.model, result.candidates) == ("gpt-5-mini", ("gpt-5-mini",))


def test_models_that_cannot_fit_the_context_are_not_candidates():
    r = routes()
    r["gpt-5"] = [c(1, "gpt-5", context_window=1000)]
    result = choose(routes=r, requirements=Requirements(prompt_tokens=900, max_output_tokens=101))
    assert result.model == "gpt-5-mini"
    assert "gpt-5" not in result.candidates


def test_models_without_routes_are_not_candidates():
    r = routes()
    r["gpt-5"] = []
    del r["gpt-5-mini"]
    assert choose(routes=r).candidates == ("claude-opus-4-8",)


def test_duplicate_auto_models_are_considered_once():
    assert choose(routes=routes(), auto_models=["gpt-5", "gpt-5", "gpt-5-mini"]).candidates == (
        "gpt-5",
        "gpt-5-mini",
    )


# Session stickiness


def test_all_cooling_keeps_the_session_model():
    result = choose(
        routes=routes(gpt_5="cooling", gpt_5_mini="cooling", claude_opus_4_8="cooling"),
        session_model="gpt-5-mini",
    )
    assert (result.model, result.reason) == ("gpt-5-mini", AutoReason.SESSION_KEPT)


def test_a_ready_alternate_moves_a_cooling_session():
    result = choose(routes=routes(gpt_5_mini="cooling"), session_model="gpt-5-mini")
    assert (result.model, result.reason) == ("gpt-5", AutoReason.SESSION_MOVED)


def test_a_ready_session_model_is_kept_even_if_it_is_not_first():
    result = choose(routes=routes(), session_model="claude-opus-4-8")
    assert (result.model, result.reason) == ("claude-opus-4-8", AutoReason.SESSION_KEPT)


def test_a_missing_cached_model_reclassifies():
    result = choose(routes=routes(), session_model="gpt-4")
    assert (result.model, result.reason) == ("gpt-5", AutoReason.SESSION_RECLASSIFIED)


def test_a_missing_cached_model_reclassifies_even_when_all_cool():
    result = choose(
        routes=routes(gpt_5="cooling", gpt_5_mini="cooling", claude_opus_4_8="cooling"), session_model="gpt-4"
    )
    assert (result.model, result.reason) == ("gpt-5", AutoReason.SESSION_RECLASSIFIED)


def test_a_cached_model_that_cannot_satisfy_the_media_reclassifies():
    r = routes(gpt_5_mini="cooling", claude_opus_4_8="cooling")
    r["gpt-5-mini"] = [c(2, "gpt-5-mini", vision=TriState.TRUE, health=Health.COOLING)]
    result = choose(routes=r, requirements=Requirements(vision=True), session_model="gpt-5")
    assert (result.model, result.reason) == ("gpt-5-mini", AutoReason.SESSION_RECLASSIFIED)


def test_a_cached_model_the_key_may_no_longer_use_reclassifies():
    result = choose(routes=routes(), allowed_models=["gpt-5-mini"], session_model="gpt-5")
    assert (result.model, result.reason) == ("gpt-5-mini", AutoReason.SESSION_RECLASSIFIED)


# Typed errors


def test_no_routed_auto_model_is_model_not_found():
    result = choose_model(
        auto_models=["gpt-9"], allowed_models=ALL, routes=routes(), requirements=Requirements()
    )
    assert result == AutoError(ErrorCode.MODEL_NOT_FOUND)


def test_no_auto_models_at_all_is_model_not_found():
    result = choose_model(auto_models=[], allowed_models=ALL, routes=routes(), requirements=Requirements())
    assert result == AutoError(ErrorCode.MODEL_NOT_FOUND)


def test_no_usable_auto_model_is_permission_denied():
    result = choose_model(
        auto_models=MODELS, allowed_models=["gpt-9"], routes=routes(), requirements=Requirements()
    )
    assert result == AutoError(ErrorCode.PERMISSION_DENIED)


@pytest.mark.parametrize(
    ("requirements", "reason"),
    [
        (Requirements(vision=True), IneligibleReason.CAPABILITY),
        (Requirements(prompt_tokens=2000), IneligibleReason.CONTEXT_WINDOW),
    ],
)
def test_a_request_that_fits_no_model_is_no_eligible_backend(requirements, reason):
    r = {m: [c(i, m, context_window=1000)] for i, m in enumerate(MODELS)}
    result = choose_model(auto_models=MODELS, allowed_models=ALL, routes=r, requirements=requirements)
    assert result == AutoError(ErrorCode.NO_ELIGIBLE_BACKEND, reason)
