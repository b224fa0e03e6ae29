"""Failure classification and disposition (SPEC §5.6).

Contract:
- `canonical_error(body, shape)` extracts only the canonical (type, code, param) strings of a parsed
  error body, never its message, but for the two integers of a context overflow worded as its
  provider documents it, read by a strict full match of the whole message (`overflow`: Anthropic's
  `invalid_request_error` "prompt is too long: N tokens > M maximum", OpenAI's
  `context_length_exceeded` "This model's maximum context length is M tokens. However, your messages
  resulted in N tokens."); any other wording yields nothing of the message. Where they are is the
  upstream provider's `ErrorShape` (data of its module in `proxy.wire.providers`): the error object is
  looked up at its paths in order (by default `response.error`, `error`, `status_details.error`), and
  a provider whose errors may name their type in a top-level field (AWS's `__type`,
  `namespace#Type:uri`) reads the type from it when the object has none. Non-string values count as absent.
- `classify(observation)` maps one attempt's typed observation (HTTP status, parsed body, transport
  event, finish/stop reason, catalog provenance for (assignment, model)) to a FailureClass, or None
  when nothing failed. A code-less model 404 is a model failure only with provenance; an Anthropic
  `not_found_error` is one only when the provenance is `observed` (this assignment's own discovery
  listed the model, so the account lost it: a sibling of the same model may serve), else it is the
  bare 404 that crosses to another model. Decisions use exact enumerated values only: no message
  text, no substring (the overflow's integers are read only from a whole message that is exactly the
  documented wording). The checks run in this order: refusal; transport event; `code` model_not_found
  (any status), context_length_exceeded or an Anthropic-worded overflow, insufficient_quota; then the
  HTTP status; then, for a stream error event (no error status), the error's canonical type/code.
- `disposition(failure, dispatch)` applies §5.6 in its order: safety refusal is terminal; a
  dispatch not known to be rejected (or not sent) is never replayed; model_unavailable,
  rate_limited, quota, unavailable and credential_rejected go to the next candidate;
  model_not_found_cross goes to the next candidate of another model only; anything else returns
  the failure.
- `circuit_reason(failure)` is the circuit failure an outcome records (None: it writes no circuit
  row; an attempt holding a probe then frees it with `breaker.on_neutral`). Only unavailable, the
  gateway's own timeouts (dispatch_unknown: its upstream read timeout, and its own deadline, the
  `retry.default_deadline_ms` a client that sent none is given), credential_rejected
  (assignment-wide) and model_unavailable count. 429/quota never do; the client's own deadline
  (`deadline`) never does.
- `demotion_reason(failure)`: model_unavailable demotes for `demotion_seconds`; rate_limited and
  quota demote until the upstream's `retry-after` (read bounded by the proxy), else
  `demotion_seconds`.
- `dispatch_state(transport, status)` is the ledger's dispatch state of an attempt.
"""

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass

from routing.policy.types import CircuitReason
from routing.policy.vocabulary import DispatchState as DispatchState
from routing.policy.vocabulary import FailureClass as FailureClass


@dataclass(frozen=True, slots=True)
class ErrorShape:
    """Where one provider's error bodies keep their canonical fields."""

    # The error object's paths, tried in order (Responses, Chat/Anthropic, a Responses status event).
    paths: tuple[tuple[str, ...], ...] = (("response", "error"), ("error",), ("status_details", "error"))
    # A top-level field naming the type as `namespace#Type:uri` (AWS), read when the object has none.
    type_field: str | None = None


REFUSAL_FINISH_REASONS = frozenset({"content_filter", "refusal"})
REFUSAL_CODES = frozenset({"content_filter", "content_policy_violation"})
UNAVAILABLE_STATUSES = frozenset({500, 502, 503, 529})
# An upstream proxy timed out waiting for the provider: the provider may have executed the request.
DISPATCH_UNKNOWN_STATUSES = frozenset({504})
# Canonical type/code of errors reported inside a stream (whose HTTP status was 200).
STREAM_RATE_LIMITED = frozenset({"rate_limit_error", "rate_limit_exceeded"})
STREAM_UNAVAILABLE = frozenset({"overloaded_error", "api_error", "server_error"})
# The catalog provenance of a model this very assignment's discovery listed (catalog.models.Provenance).
OBSERVED = "observed"


class TransportEvent(enum.StrEnum):
    CONNECT_REFUSED = "connect_refused"
    CONNECT_TIMEOUT = "connect_timeout"
    RESET_BEFORE_SEND = "reset_before_send"
    READ_TIMEOUT = "read_timeout"
    RESET_AFTER_SEND = "reset_after_send"
    # The client's deadline (x-gateway-deadline-ms) ran out while the attempt was in flight (§6.0):
    # the wall-clock bound cut it, not the gateway's own upstream timeout. Neutral for health.
    DEADLINE = "deadline"
    # The gateway's own deadline (retry.default_deadline_ms: the client sent none, or a longer one)
    # ran out while the attempt was in flight: the gateway's own timeout, so it counts for the circuit
    # like a read timeout (§5.6, §6.0), and may have executed upstream like one.
    GATEWAY_DEADLINE = "gateway_deadline"
    STREAM_ERROR_EVENT = "stream_error_event"  # an SSE/websocket terminal error event, pre-visible
    STREAM_TRUNCATED = "stream_truncated"  # the stream closed without a terminal event
    CANCELLED = "cancelled"  # the client disconnected


NOT_SENT_EVENTS = frozenset(
    {TransportEvent.CONNECT_REFUSED, TransportEvent.CONNECT_TIMEOUT, TransportEvent.RESET_BEFORE_SEND}
)
SENT_EVENTS = frozenset(
    {TransportEvent.READ_TIMEOUT, TransportEvent.RESET_AFTER_SEND, TransportEvent.GATEWAY_DEADLINE}
)
# 403 whose canonical type or code names the assignment's credential or account, not the request.
CREDENTIAL_403 = frozenset(
    {
        "permission_error",
        "permission_denied",
        "account_deactivated",
        "invalid_api_key",
        "organization_deactivated",
    }
)


class Disposition(enum.StrEnum):
    TERMINAL_REFUSAL = "terminal_refusal"  # relay the refusal, never fail over
    DISPATCH_UNKNOWN = "dispatch_unknown"  # upstream_dispatch_unknown (504), never replay
    NEXT_CANDIDATE = "next_candidate"  # the next eligible candidate in the plan
    NEXT_MODEL = "next_model"  # the next candidate of another model only
    RETURN_FAILURE = "return_failure"  # the sanitized failure as it came, no retry


@dataclass(frozen=True, slots=True)
class CanonicalError:
    type: str | None = None
    code: str | None = None
    param: str | None = None
    overflow: tuple[int, int] | None = None  # a context overflow's (tokens, maximum), as documented

    @property
    def bare(self) -> bool:
        return self.type is None and self.code is None and self.param is None


@dataclass(frozen=True, slots=True)
class Observation:
    status: int | None = None  # the upstream HTTP status (a stream's is its opening status)
    body: Mapping[str, object] | None = None  # the parsed JSON error body or stream error event
    transport: TransportEvent | None = None
    finish_reason: str | None = None  # finish_reason / stop_reason / incomplete reason, verbatim
    safety_block: bool = False  # the adapter saw a structured provider safety block
    # The catalog provenance of (assignment, model) (`configured`, `observed`, `preserved`); None when
    # the catalog holds none (`routing.policy.types.Candidate.provenance`).
    provenance: str | None = None
    errors: ErrorShape = ErrorShape()  # where the upstream provider's error bodies keep their fields


def _string(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _error_object(
    body: Mapping[str, object], paths: tuple[tuple[str, ...], ...]
) -> Mapping[str, object] | None:
    for path in paths:
        node: object = body
        for step in path:
            node = node.get(step) if isinstance(node, Mapping) else None
        if isinstance(node, Mapping):
            return node
    return None


def _namespaced_type(value: object) -> str | None:
    """`com.amazonaws.bedrock#ValidationException:http://...` -> `ValidationException`."""
    text = _string(value)
    if text is None:
        return None
    return text.rpartition("#")[2].partition(":")[0] or None


# The documented overflow wordings, whole (module docstring); bounded integers, nothing else captured.
_ANTHROPIC_OVERFLOW = re.compile(r"prompt is too long: ([0-9]{1,9}) tokens > ([0-9]{1,9}) maximum")
_OPENAI_OVERFLOW = re.compile(
    r"This model's maximum context length is ([0-9]{1,9}) tokens\. "
    r"However, your messages resulted in ([0-9]{1,9}) tokens\."
)


def _overflow(type_: str | None, code: str | None, message: object) -> tuple[int, int] | None:
    """(tokens, maximum) of a context overflow in its provider's documented words; None otherwise."""
    if not isinstance(message, str):
        return None
    if (
        type_ == "invalid_request_error"
        and code is None
        and (found := _ANTHROPIC_OVERFLOW.fullmatch(message))
    ):
        return int(found[1]), int(found[2])
    if code == "context_length_exceeded" and (found := _OPENAI_OVERFLOW.fullmatch(message)):
        return int(found[2]), int(found[1])
    return None


def canonical_error(body: Mapping[str, object] | None, shape: ErrorShape = ErrorShape()) -> CanonicalError:
    if not isinstance(body, Mapping):
        return CanonicalError()
    error = _error_object(body, shape.paths)
    fields = error if error is not None else {}
    named = _namespaced_type(body.get(shape.type_field)) if shape.type_field is not None else None
    type_, code = _string(fields.get("type")) or named, _string(fields.get("code"))
    return CanonicalError(
        type=type_,
        code=code,
        param=_string(fields.get("param")),
        overflow=_overflow(type_, code, fields.get("message")),
    )


def _lost_model(error: CanonicalError, provenance: str | None) -> bool:
    """Anthropic's `not_found_error` for a model this assignment's own discovery listed: the account
    lost a model it advertised, which a sibling of the same model may still serve (§5.6, 2026-12-05)."""
    return error.code is None and error.type == "not_found_error" and provenance == OBSERVED


def _by_status(status: int, error: CanonicalError, provenance: str | None) -> FailureClass:
    if status == 429:
        return FailureClass.RATE_LIMITED
    if status == 401 or (status == 403 and (error.type in CREDENTIAL_403 or error.code in CREDENTIAL_403)):
        return FailureClass.CREDENTIAL_REJECTED
    if status in UNAVAILABLE_STATUSES:
        return FailureClass.UNAVAILABLE
    if status in DISPATCH_UNKNOWN_STATUSES:
        return FailureClass.DISPATCH_UNKNOWN
    if status == 404:
        if error.code is None and error.type == "invalid_request_error" and error.param == "model":
            return FailureClass.MODEL_UNAVAILABLE if provenance is not None else FailureClass.CLIENT_ERROR
        if _lost_model(error, provenance):
            return FailureClass.MODEL_UNAVAILABLE
        if error.bare or (error.code is None and error.type == "not_found_error"):
            return FailureClass.MODEL_NOT_FOUND_CROSS
        return FailureClass.CLIENT_ERROR
    if status == 400 and error.type == "ValidationException":
        return FailureClass.MODEL_NOT_FOUND_CROSS
    if 400 <= status < 500:
        return FailureClass.CLIENT_ERROR
    return FailureClass.UPSTREAM_ERROR


def _by_stream_error(error: CanonicalError, provenance: str | None) -> FailureClass:
    if _lost_model(error, provenance):
        return FailureClass.MODEL_UNAVAILABLE
    if error.code is None and error.type == "not_found_error":
        # Anthropic's unknown-model error arriving as a stream event: the same bare 404 as over HTTP.
        return FailureClass.MODEL_NOT_FOUND_CROSS
    if error.code in STREAM_RATE_LIMITED or error.type in STREAM_RATE_LIMITED:
        return FailureClass.RATE_LIMITED
    if error.code in STREAM_UNAVAILABLE or error.type in STREAM_UNAVAILABLE:
        return FailureClass.UNAVAILABLE
    return FailureClass.UPSTREAM_ERROR


def classify(observation: Observation) -> FailureClass | None:
    obs = observation
    error = canonical_error(obs.body, obs.errors)
    # A refusal stays terminal whatever else the attempt shows.
    if obs.safety_block or obs.finish_reason in REFUSAL_FINISH_REASONS or error.code in REFUSAL_CODES:
        return FailureClass.SAFETY_REFUSAL
    if obs.transport is TransportEvent.CANCELLED:
        return FailureClass.CANCELLED
    if obs.transport is TransportEvent.DEADLINE:
        return FailureClass.DEADLINE
    if obs.transport in NOT_SENT_EVENTS:
        return FailureClass.UNAVAILABLE
    if obs.transport in SENT_EVENTS:
        return FailureClass.DISPATCH_UNKNOWN
    if obs.transport is TransportEvent.STREAM_TRUNCATED:
        return FailureClass.INTERRUPTED
    if error.code == "model_not_found":
        return FailureClass.MODEL_UNAVAILABLE
    if error.code == "context_length_exceeded" or error.overflow is not None:
        return FailureClass.CONTEXT_OVERFLOW
    if "insufficient_quota" in (error.code, error.type):
        return FailureClass.QUOTA
    if obs.status is not None and not 200 <= obs.status < 300:
        return _by_status(obs.status, error, obs.provenance)
    if obs.transport is TransportEvent.STREAM_ERROR_EVENT or not error.bare:
        return _by_stream_error(error, obs.provenance)
    return None


NEXT_CANDIDATE_CLASSES = frozenset(
    {
        FailureClass.MODEL_UNAVAILABLE,
        FailureClass.RATE_LIMITED,
        FailureClass.QUOTA,
        FailureClass.UNAVAILABLE,
        FailureClass.CREDENTIAL_REJECTED,
    }
)
NEVER_REPLAYED = frozenset({FailureClass.DISPATCH_UNKNOWN, FailureClass.INTERRUPTED, FailureClass.DEADLINE})
KNOWN_REJECTED = frozenset({DispatchState.NOT_SENT, DispatchState.REJECTED})


def disposition(failure: FailureClass, dispatch: DispatchState) -> Disposition:
    if failure is FailureClass.SAFETY_REFUSAL:
        return Disposition.TERMINAL_REFUSAL
    if failure is FailureClass.CANCELLED:  # nobody is left to answer; never a replay either
        return Disposition.RETURN_FAILURE
    if dispatch not in KNOWN_REJECTED or failure in NEVER_REPLAYED:
        return Disposition.DISPATCH_UNKNOWN
    if failure in NEXT_CANDIDATE_CLASSES:
        return Disposition.NEXT_CANDIDATE
    if failure is FailureClass.MODEL_NOT_FOUND_CROSS:
        return Disposition.NEXT_MODEL
    return Disposition.RETURN_FAILURE


_CIRCUIT_REASONS: dict[FailureClass, CircuitReason] = {
    FailureClass.MODEL_UNAVAILABLE: CircuitReason.UPSTREAM_MODEL_UNAVAILABLE,
    FailureClass.UNAVAILABLE: CircuitReason.UPSTREAM_UNAVAILABLE,
    FailureClass.DISPATCH_UNKNOWN: CircuitReason.TIMEOUT,
    FailureClass.CREDENTIAL_REJECTED: CircuitReason.CREDENTIAL_REJECTED,
}
_DEMOTION_REASONS: dict[FailureClass, CircuitReason] = {
    FailureClass.MODEL_UNAVAILABLE: CircuitReason.UPSTREAM_MODEL_UNAVAILABLE,
    FailureClass.RATE_LIMITED: CircuitReason.RATE_LIMITED,
    FailureClass.QUOTA: CircuitReason.RATE_LIMITED,
}


def circuit_reason(failure: FailureClass) -> CircuitReason | None:
    return _CIRCUIT_REASONS.get(failure)


def demotion_reason(failure: FailureClass) -> CircuitReason | None:
    return _DEMOTION_REASONS.get(failure)


def demotes(failure: FailureClass) -> bool:
    return failure in _DEMOTION_REASONS


# Answers only an accepted credential gets: the upstream judged the request itself (its model, its
# content, its size, the account's rate) after authenticating it. A probe of an assignment-wide
# circuit (credential_rejected) that ends in one of them has proven the credential (SPEC §7.1).
_CREDENTIAL_PROVEN = frozenset(
    {
        FailureClass.MODEL_UNAVAILABLE,
        FailureClass.MODEL_NOT_FOUND_CROSS,
        FailureClass.RATE_LIMITED,
        FailureClass.QUOTA,
        FailureClass.SAFETY_REFUSAL,
        FailureClass.CONTEXT_OVERFLOW,
        FailureClass.CLIENT_ERROR,
    }
)


def proves_credential(failure: FailureClass) -> bool:
    return failure in _CREDENTIAL_PROVEN


def dispatch_state(transport: TransportEvent | None, status: int | None) -> DispatchState:
    """What we know of whether the upstream executed the request."""
    if transport in NOT_SENT_EVENTS:
        return DispatchState.NOT_SENT
    if transport in SENT_EVENTS or transport in (
        TransportEvent.STREAM_TRUNCATED,
        TransportEvent.CANCELLED,
        TransportEvent.DEADLINE,
    ):
        return DispatchState.UNKNOWN
    if transport is TransportEvent.STREAM_ERROR_EVENT:
        return DispatchState.REJECTED
    if status is None or status in DISPATCH_UNKNOWN_STATUSES:
        return DispatchState.UNKNOWN
    if 200 <= status < 300:
        return DispatchState.COMPLETED
    return DispatchState.REJECTED
