"""SPEC §5.6: every row of the classification table, each error shape at each relevant status, with
and without provenance, in every envelope; then the disposition order and the circuit effects."""

import pytest

from routing.policy import failures
from routing.policy.failures import (
    CanonicalError,
    DispatchState,
    Disposition,
    ErrorShape,
    FailureClass,
    Observation,
    TransportEvent,
    canonical_error,
    circuit_reason,
    classify,
    demotes,
    demotion_reason,
    dispatch_state,
    disposition,
)
from routing.policy.types import CircuitReason

FC = FailureClass
TE = TransportEvent
DS = DispatchState
# Errors that may name their type in a top-level `__type` (AWS's shape, declared by a provider module).
AWS = ErrorShape(type_field="__type")


def err(*, code=None, type=None, param=None, message="a provider message, never read"):
    fields = {"message": message}
    if type is not None:
        fields["type"] = type
    if code is not None:
        fields["code"] = code
    if param is not None:
        fields["param"] = param
    return fields


def openai(**fields):
    return {"error": err(**fields)}


def response_envelope(**fields):
    return {"type": "response.failed", "response": {"id": "resp_1", "error": err(**fields)}}


def status_details(**fields):
    return {"type": "response.done", "status_details": {"type": "failed", "error": err(**fields)}}


def anthropic(error_type):
    return {"type": "error", "error": {"type": error_type, "message": "model: claude-x"}}


ENVELOPES = [openai, response_envelope, status_details]
# A catalog provenance for (assignment, model) (`catalog.models.Provenance`), or none.
PROVENANCES = ["configured", "observed", "preserved", None]
KNOWN = ["configured", "observed", "preserved"]
MODEL_PARAM_404 = {"type": "invalid_request_error", "param": "model"}


@pytest.mark.parametrize("envelope", ENVELOPES)
@pytest.mark.parametrize("status", [400, 403, 404, 422, 429, 500, None])
@pytest.mark.parametrize("provenance", PROVENANCES)
def test_structured_model_not_found_is_model_unavailable_at_any_status(envelope, status, provenance):
    body = envelope(code="model_not_found", type="invalid_request_error", param="model")
    assert classify(Observation(status=status, body=body, provenance=provenance)) is FC.MODEL_UNAVAILABLE


def test_structured_model_not_found_in_a_stream_error_event():
    obs = Observation(
        status=200, body=response_envelope(code="model_not_found"), transport=TE.STREAM_ERROR_EVENT
    )
    assert classify(obs) is FC.MODEL_UNAVAILABLE


@pytest.mark.parametrize("envelope", ENVELOPES)
@pytest.mark.parametrize(
    ("provenance", "expected"), [*((p, FC.MODEL_UNAVAILABLE) for p in KNOWN), (None, FC.CLIENT_ERROR)]
)
def test_codeless_404_param_model_needs_provenance(envelope, provenance, expected):
    obs = Observation(status=404, body=envelope(**MODEL_PARAM_404), provenance=provenance)
    assert classify(obs) is expected


@pytest.mark.parametrize(
    "fields",
    [
        {"type": "invalid_request_error", "param": "messages"},  # another param
        {"type": "invalid_request_error"},  # no param: a generic 404
        {"type": "invalid_request_error", "param": "model", "code": "invalid_model"},  # a code
        {"type": "invalid_request_error", "param": "model", "code": "unknown_url"},
        {"type": "server_error", "param": "model"},  # another type
        {"param": "model"},  # no type
    ],
)
@pytest.mark.parametrize("provenance", PROVENANCES)
def test_other_404_shapes_are_client_errors_even_with_provenance(fields, provenance):
    assert classify(Observation(status=404, body=openai(**fields), provenance=provenance)) is FC.CLIENT_ERROR


@pytest.mark.parametrize("status", [400, 403, 422])
def test_codeless_param_model_shape_only_counts_at_404(status):
    obs = Observation(status=status, body=openai(**MODEL_PARAM_404), provenance="configured")
    assert classify(obs) is FC.CLIENT_ERROR


@pytest.mark.parametrize(
    "body",
    [
        None,
        {},
        {"error": {"message": "Not Found"}},
        {"detail": "Not Found"},
        {"error": "Not Found"},  # a string, not an error object
        {"error": {"code": 404, "message": "No endpoints found"}},  # non-string code counts as absent
    ],
)
@pytest.mark.parametrize("provenance", PROVENANCES)
def test_bare_404_is_model_not_found_cross_whatever_the_provenance(body, provenance):
    assert classify(Observation(status=404, body=body, provenance=provenance)) is FC.MODEL_NOT_FOUND_CROSS


@pytest.mark.parametrize(
    ("provenance", "expected"),
    [
        # The account's own discovery listed the model, and it now says not found: it lost the model,
        # and a sibling of the same model is tried first (SPEC §5.6, exception of 2026-12-05).
        ("observed", FC.MODEL_UNAVAILABLE),
        # Configured or preserved says nothing about what this account serves today: the bare 404.
        ("configured", FC.MODEL_NOT_FOUND_CROSS),
        ("preserved", FC.MODEL_NOT_FOUND_CROSS),
        (None, FC.MODEL_NOT_FOUND_CROSS),
    ],
)
@pytest.mark.parametrize("transport", [None, TE.STREAM_ERROR_EVENT], ids=["http", "stream-event"])
def test_anthropic_not_found_is_a_lost_model_only_with_observed_provenance(provenance, expected, transport):
    status = 404 if transport is None else 200
    obs = Observation(
        status=status, body=anthropic("not_found_error"), transport=transport, provenance=provenance
    )
    assert classify(obs) is expected


def test_anthropic_not_found_with_observed_provenance_goes_to_a_sibling_of_the_same_model():
    failure = classify(Observation(status=404, body=anthropic("not_found_error"), provenance="observed"))
    assert disposition(failure, dispatch_state(None, 404)) is Disposition.NEXT_CANDIDATE
    assert circuit_reason(failure) is CircuitReason.UPSTREAM_MODEL_UNAVAILABLE


def test_observed_is_the_catalogs_own_spelling():
    from catalog.models import Provenance

    assert failures.OBSERVED == Provenance.OBSERVED


@pytest.mark.parametrize(
    "body",
    [
        {"__type": "ValidationException", "message": "The provided model identifier is invalid."},
        {"__type": "com.amazonaws.bedrock#ValidationException:http://internal.amazon.com/coral/"},
        {"error": {"type": "ValidationException", "message": "model not enabled in this region"}},
    ],
)
def test_bedrock_validation_exception_at_400_is_model_not_found_cross(body):
    assert classify(Observation(status=400, body=body, errors=AWS)) is FC.MODEL_NOT_FOUND_CROSS


def test_a_top_level_type_is_read_only_for_a_provider_whose_errors_may_have_one():
    body = {"__type": "ValidationException"}
    assert classify(Observation(status=400, body=body)) is FC.CLIENT_ERROR
    assert canonical_error(body) == CanonicalError()


@pytest.mark.parametrize("status", [403, 422, 429])
def test_validation_exception_at_other_statuses_is_not_cross(status):
    result = classify(Observation(status=status, body={"__type": "ValidationException"}, errors=AWS))
    assert result is not FC.MODEL_NOT_FOUND_CROSS


def test_anthropic_not_found_error_at_400_is_a_client_error():
    assert classify(Observation(status=400, body=anthropic("not_found_error"))) is FC.CLIENT_ERROR


@pytest.mark.parametrize(
    "body",
    [None, openai(code="rate_limit_exceeded", type="requests"), anthropic("rate_limit_error"), {}],
)
def test_429_is_rate_limited(body):
    assert classify(Observation(status=429, body=body)) is FC.RATE_LIMITED


@pytest.mark.parametrize(
    "obs",
    [
        Observation(status=429, body=openai(code="insufficient_quota", type="insufficient_quota")),
        Observation(status=429, body=openai(type="insufficient_quota")),
        Observation(status=429, body=response_envelope(code="insufficient_quota")),
        Observation(
            status=200, body=response_envelope(code="insufficient_quota"), transport=TE.STREAM_ERROR_EVENT
        ),
    ],
)
def test_insufficient_quota_is_quota(obs):
    assert classify(obs) is FC.QUOTA


@pytest.mark.parametrize("status", [500, 502, 503, 529])
@pytest.mark.parametrize("body", [None, openai(type="server_error"), anthropic("overloaded_error")])
def test_server_unavailable_statuses(status, body):
    assert classify(Observation(status=status, body=body)) is FC.UNAVAILABLE


@pytest.mark.parametrize("event", [TE.CONNECT_REFUSED, TE.CONNECT_TIMEOUT, TE.RESET_BEFORE_SEND])
def test_not_sent_transport_failures_are_unavailable(event):
    assert classify(Observation(transport=event)) is FC.UNAVAILABLE


@pytest.mark.parametrize(
    "obs",
    [
        Observation(transport=TE.READ_TIMEOUT),
        Observation(transport=TE.RESET_AFTER_SEND),
        Observation(status=200, transport=TE.READ_TIMEOUT),  # mid-stream, before anything visible
        Observation(status=504),
    ],
)
def test_sent_then_lost_is_dispatch_unknown(obs):
    assert classify(obs) is FC.DISPATCH_UNKNOWN


@pytest.mark.parametrize(
    "obs",
    [
        Observation(status=200, finish_reason="content_filter"),
        Observation(status=200, finish_reason="refusal"),
        Observation(status=200, safety_block=True),
        Observation(status=400, body=openai(code="content_filter", type="invalid_request_error")),
        Observation(status=400, body=openai(code="content_policy_violation")),
        Observation(
            status=200, body=response_envelope(code="content_filter"), transport=TE.STREAM_ERROR_EVENT
        ),
        # a refusal stays a refusal whatever else the attempt shows
        Observation(status=503, finish_reason="content_filter"),
        Observation(transport=TE.READ_TIMEOUT, safety_block=True),
        Observation(status=404, body=openai(code="model_not_found"), finish_reason="refusal"),
    ],
)
def test_safety_refusal(obs):
    assert classify(obs) is FC.SAFETY_REFUSAL


@pytest.mark.parametrize(
    "finish_reason", ["stop", "length", "tool_calls", "end_turn", "Content_Filter", None]
)
def test_other_finish_reasons_are_no_failure(finish_reason):
    assert classify(Observation(status=200, finish_reason=finish_reason)) is None


@pytest.mark.parametrize(
    "obs",
    [
        Observation(status=400, body=openai(code="context_length_exceeded", type="invalid_request_error")),
        Observation(status=400, body=response_envelope(code="context_length_exceeded")),
        Observation(status=200, body=status_details(code="context_length_exceeded")),
        Observation(status=200, body=openai(code="context_length_exceeded"), transport=TE.STREAM_ERROR_EVENT),
    ],
)
def test_context_length_exceeded_is_context_overflow(obs):
    assert classify(obs) is FC.CONTEXT_OVERFLOW


@pytest.mark.parametrize(
    "obs",
    [
        Observation(status=400, body=openai(code="invalid_model", param="model")),
        Observation(status=404, body=openai(code="invalid_model", param="model"), provenance="configured"),
        Observation(
            status=400, body=openai(code="previous_response_not_found", param="previous_response_id")
        ),
        Observation(
            status=404, body=openai(code="previous_response_not_found", type="invalid_request_error")
        ),
        Observation(status=400, body=None),
        Observation(status=400, body=openai(type="invalid_request_error", param="max_tokens")),
        Observation(status=400, body=anthropic("invalid_request_error")),
        Observation(status=403, body=openai(type="invalid_request_error")),
        Observation(status=403, body=None),
        Observation(status=408),
        Observation(status=413),
        Observation(status=422, body={"detail": [{"loc": ["body", "model"]}]}),
    ],
)
def test_other_4xx_are_client_errors(obs):
    assert classify(obs) is FC.CLIENT_ERROR


def test_the_message_is_never_read():
    # A message that names a retriable condition changes nothing: only canonical fields count.
    for message in ("model_not_found", "insufficient_quota", "context_length_exceeded", "content_filter"):
        body = {"error": {"type": "invalid_request_error", "message": message}}
        assert classify(Observation(status=400, body=body)) is FC.CLIENT_ERROR


@pytest.mark.parametrize("status", [501, 505, 520, 302])
def test_other_non_success_statuses_are_upstream_errors(status):
    assert classify(Observation(status=status)) is FC.UPSTREAM_ERROR


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (anthropic("overloaded_error"), FC.UNAVAILABLE),
        (anthropic("api_error"), FC.UNAVAILABLE),
        (response_envelope(code="server_error"), FC.UNAVAILABLE),
        (anthropic("rate_limit_error"), FC.RATE_LIMITED),
        (anthropic("not_found_error"), FC.MODEL_NOT_FOUND_CROSS),
        (response_envelope(code="rate_limit_exceeded"), FC.RATE_LIMITED),
        (response_envelope(code="invalid_prompt"), FC.UPSTREAM_ERROR),
        ({"type": "error"}, FC.UPSTREAM_ERROR),
        (None, FC.UPSTREAM_ERROR),
    ],
)
@pytest.mark.parametrize("status", [200, None])
def test_stream_error_events(body, expected, status):
    assert classify(Observation(status=status, body=body, transport=TE.STREAM_ERROR_EVENT)) is expected


def test_stream_error_type_never_overrides_an_http_status():
    assert classify(Observation(status=400, body=anthropic("overloaded_error"))) is FC.CLIENT_ERROR


@pytest.mark.parametrize(
    ("obs", "expected"),
    [
        (Observation(transport=TE.STREAM_TRUNCATED), FC.INTERRUPTED),
        (Observation(status=200, transport=TE.CANCELLED), FC.CANCELLED),
        (Observation(status=200), None),
        (Observation(status=201, body={"id": "resp_1", "error": None}), None),
        (Observation(), None),
    ],
)
def test_neutral_and_success_outcomes(obs, expected):
    assert classify(obs) is expected


def test_error_object_lookup_order_response_error_first():
    body = {
        "response": {"error": {"code": "model_not_found"}},
        "error": {"code": "context_length_exceeded"},
        "status_details": {"error": {"code": "insufficient_quota"}},
    }
    assert canonical_error(body).code == "model_not_found"
    assert classify(Observation(status=400, body=body)) is FC.MODEL_UNAVAILABLE


def test_error_object_lookup_order_error_before_status_details():
    body = {
        "error": {"code": "context_length_exceeded"},
        "status_details": {"error": {"code": "model_not_found"}},
    }
    assert classify(Observation(status=400, body=body)) is FC.CONTEXT_OVERFLOW


def test_error_object_lookup_skips_non_objects():
    body = {
        "response": {"error": None},
        "error": "boom",
        "status_details": {"error": {"code": "model_not_found"}},
    }
    assert classify(Observation(status=400, body=body)) is FC.MODEL_UNAVAILABLE


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            openai(code="model_not_found", type="invalid_request_error", param="model"),
            CanonicalError("invalid_request_error", "model_not_found", "model"),
        ),
        (anthropic("not_found_error"), CanonicalError(type="not_found_error")),
        ({"__type": "ValidationException", "message": "x"}, CanonicalError(type="ValidationException")),
        ({"__type": "a.b#ThrottlingException"}, CanonicalError(type="ThrottlingException")),
        ({"__type": "#"}, CanonicalError()),
        (
            {"error": {"type": "ValidationException"}, "__type": "Other"},
            CanonicalError(type="ValidationException"),
        ),
        ({"error": {"code": 429, "type": ["x"], "param": {"p": 1}}}, CanonicalError()),
        ({"error": {"message": "secret prompt echo"}}, CanonicalError()),
        (None, CanonicalError()),
    ],
)
def test_canonical_error_extracts_only_type_code_param(body, expected):
    result = canonical_error(body, AWS)
    assert result == expected
    assert "secret" not in repr(result) and "provider message" not in repr(result)


# Disposition, in the SPEC's order.

ALL_DISPATCH = list(DispatchState)
KNOWN_REJECTED = [DS.NOT_SENT, DS.REJECTED]
NOT_KNOWN_REJECTED = [DS.UNKNOWN, DS.COMPLETED]


@pytest.mark.parametrize("dispatch", ALL_DISPATCH)
def test_safety_refusal_is_terminal_whatever_the_dispatch(dispatch):
    assert disposition(FC.SAFETY_REFUSAL, dispatch) is Disposition.TERMINAL_REFUSAL


@pytest.mark.parametrize("failure", [f for f in FailureClass if f not in (FC.SAFETY_REFUSAL, FC.CANCELLED)])
@pytest.mark.parametrize("dispatch", NOT_KNOWN_REJECTED)
def test_dispatch_not_known_rejected_is_never_replayed(failure, dispatch):
    assert disposition(failure, dispatch) is Disposition.DISPATCH_UNKNOWN


@pytest.mark.parametrize("failure", [FC.DISPATCH_UNKNOWN, FC.INTERRUPTED])
@pytest.mark.parametrize("dispatch", KNOWN_REJECTED)
def test_dispatch_unknown_classes_are_never_replayed(failure, dispatch):
    assert disposition(failure, dispatch) is Disposition.DISPATCH_UNKNOWN


@pytest.mark.parametrize("failure", [FC.MODEL_UNAVAILABLE, FC.RATE_LIMITED, FC.QUOTA, FC.UNAVAILABLE])
@pytest.mark.parametrize("dispatch", KNOWN_REJECTED)
def test_handoff_classes_go_to_the_next_candidate(failure, dispatch):
    assert disposition(failure, dispatch) is Disposition.NEXT_CANDIDATE


@pytest.mark.parametrize("dispatch", KNOWN_REJECTED)
def test_model_not_found_cross_goes_to_another_model_only(dispatch):
    assert disposition(FC.MODEL_NOT_FOUND_CROSS, dispatch) is Disposition.NEXT_MODEL


@pytest.mark.parametrize("failure", [FC.CLIENT_ERROR, FC.CONTEXT_OVERFLOW, FC.UPSTREAM_ERROR])
@pytest.mark.parametrize("dispatch", KNOWN_REJECTED)
def test_everything_else_returns_the_failure(failure, dispatch):
    assert disposition(failure, dispatch) is Disposition.RETURN_FAILURE


@pytest.mark.parametrize("dispatch", ALL_DISPATCH)
def test_cancelled_is_never_replayed(dispatch):
    assert disposition(FC.CANCELLED, dispatch) is Disposition.RETURN_FAILURE


CIRCUIT_EFFECTS = {
    FC.MODEL_UNAVAILABLE: (CircuitReason.UPSTREAM_MODEL_UNAVAILABLE, True),
    FC.UNAVAILABLE: (CircuitReason.UPSTREAM_UNAVAILABLE, False),
    FC.DISPATCH_UNKNOWN: (CircuitReason.TIMEOUT, False),
    # 429 and quota demote (until retry-after) and never count toward a circuit (SPEC §5.6).
    FC.RATE_LIMITED: (None, True),
    FC.QUOTA: (None, True),
    FC.CREDENTIAL_REJECTED: (CircuitReason.CREDENTIAL_REJECTED, False),
    FC.DEADLINE: (None, False),  # the client's own deadline: neutral
    FC.MODEL_NOT_FOUND_CROSS: (None, False),
    FC.CLIENT_ERROR: (None, False),
    FC.CONTEXT_OVERFLOW: (None, False),
    FC.SAFETY_REFUSAL: (None, False),
    FC.UPSTREAM_ERROR: (None, False),
    FC.INTERRUPTED: (None, False),
    FC.CANCELLED: (None, False),
}


@pytest.mark.parametrize(("failure", "effect"), CIRCUIT_EFFECTS.items())
def test_circuit_effects(failure, effect):
    reason, demotion = effect
    assert circuit_reason(failure) is reason
    assert demotes(failure) is demotion


def test_the_circuit_effect_table_covers_every_failure_class():
    assert set(CIRCUIT_EFFECTS) == set(FailureClass)


@pytest.mark.parametrize(
    ("transport", "status", "expected"),
    [
        (TE.CONNECT_REFUSED, None, DS.NOT_SENT),
        (TE.CONNECT_TIMEOUT, None, DS.NOT_SENT),
        (TE.RESET_BEFORE_SEND, None, DS.NOT_SENT),
        (TE.READ_TIMEOUT, None, DS.UNKNOWN),
        (TE.READ_TIMEOUT, 200, DS.UNKNOWN),
        (TE.RESET_AFTER_SEND, None, DS.UNKNOWN),
        (TE.STREAM_TRUNCATED, 200, DS.UNKNOWN),
        (TE.CANCELLED, None, DS.UNKNOWN),
        (TE.STREAM_ERROR_EVENT, 200, DS.REJECTED),
        (None, 404, DS.REJECTED),
        (None, 429, DS.REJECTED),
        (None, 503, DS.REJECTED),
        (None, 504, DS.UNKNOWN),
        (None, 200, DS.COMPLETED),
        (None, None, DS.UNKNOWN),
    ],
)
def test_dispatch_state(transport, status, expected):
    assert dispatch_state(transport, status) is expected


@pytest.mark.parametrize(
    ("obs", "expected"),
    [
        (Observation(status=404, body=openai(code="model_not_found")), Disposition.NEXT_CANDIDATE),
        (Observation(status=404, body=anthropic("not_found_error")), Disposition.NEXT_MODEL),
        (Observation(status=404, body=openai(**MODEL_PARAM_404)), Disposition.RETURN_FAILURE),
        (Observation(transport=TE.CONNECT_REFUSED), Disposition.NEXT_CANDIDATE),
        (Observation(transport=TE.READ_TIMEOUT), Disposition.DISPATCH_UNKNOWN),
        (Observation(status=504), Disposition.DISPATCH_UNKNOWN),
        (Observation(status=200, finish_reason="content_filter"), Disposition.TERMINAL_REFUSAL),
        (Observation(status=400, body=openai(code="context_length_exceeded")), Disposition.RETURN_FAILURE),
    ],
)
def test_classify_then_dispose_end_to_end(obs, expected):
    failure = classify(obs)
    assert failure is not None
    assert disposition(failure, dispatch_state(obs.transport, obs.status)) is expected


@pytest.mark.parametrize(
    "obs",
    [
        # OpenAI's answer to a revoked key, and Anthropic's.
        Observation(status=401, body=openai(code="invalid_api_key", type="invalid_request_error")),
        Observation(status=401, body=anthropic("authentication_error")),
        Observation(status=401, body=None),
        Observation(status=403, body=anthropic("permission_error")),
        Observation(status=403, body=openai(code="permission_denied")),
        Observation(status=403, body=openai(code="account_deactivated")),
        Observation(status=403, body=openai(type="invalid_api_key")),
        Observation(status=403, body=openai(code="organization_deactivated")),
    ],
)
def test_credential_rejected(obs):
    assert classify(obs) is FC.CREDENTIAL_REJECTED
    assert disposition(FC.CREDENTIAL_REJECTED, DS.REJECTED) is Disposition.NEXT_CANDIDATE


def test_the_client_deadline_is_neutral_and_never_replayed():
    assert classify(Observation(transport=TE.DEADLINE)) is FC.DEADLINE
    assert dispatch_state(TE.DEADLINE, None) is DS.UNKNOWN
    assert disposition(FC.DEADLINE, DS.UNKNOWN) is Disposition.DISPATCH_UNKNOWN
    assert circuit_reason(FC.DEADLINE) is None


def test_the_gateway_own_read_timeout_counts_as_timeout():
    failure = classify(Observation(transport=TE.READ_TIMEOUT))
    assert circuit_reason(failure) is CircuitReason.TIMEOUT


def test_the_gateway_own_deadline_counts_as_timeout_and_is_never_replayed():
    """A deadline the client did not send (`retry.default_deadline_ms`) is the gateway's own: its cut
    cools a hung account (SPEC §5.6, §6.0), and the request, which may have executed, is not replayed."""
    failure = classify(Observation(transport=TE.GATEWAY_DEADLINE))
    assert failure is FC.DISPATCH_UNKNOWN
    assert circuit_reason(failure) is CircuitReason.TIMEOUT
    assert dispatch_state(TE.GATEWAY_DEADLINE, None) is DS.UNKNOWN
    assert disposition(failure, DS.UNKNOWN) is Disposition.DISPATCH_UNKNOWN


@pytest.mark.parametrize("failure", [FC.RATE_LIMITED, FC.QUOTA])
def test_rate_limits_demote_with_their_own_reason(failure):
    assert demotion_reason(failure) is CircuitReason.RATE_LIMITED
    assert demotion_reason(FC.MODEL_UNAVAILABLE) is CircuitReason.UPSTREAM_MODEL_UNAVAILABLE
    assert demotion_reason(FC.UNAVAILABLE) is None
