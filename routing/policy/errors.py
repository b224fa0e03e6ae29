"""The gateway's own typed errors (SPEC §4), PURE: each code with its HTTP status, the gateway's own
message and whether an identical retry may cure it (`x-should-retry`).

One type for every place a code is decided or read: the routing rules' refusals, every ingress (OpenAI
and Anthropic shapes, websocket events), the metrics' outcome labels and the ledger. A `StrEnum`, so a
code is its wire value (`ErrorCode.MODEL_NOT_FOUND == "model_not_found"`) wherever it is written or
compared; nowhere else in the product is a code spelled as a string (tests/test_vocabulary.py). A
provider's message never appears here.
"""

from enum import StrEnum


class ErrorCode(StrEnum):
    INVALID_REQUEST = "invalid_request"
    AUTHENTICATION_ERROR = "authentication_error"
    PERMISSION_DENIED = "permission_denied"
    MODEL_NOT_FOUND = "model_not_found"
    # Not in SPEC §4's table: an unknown file id, or one another key uploaded (the same answer).
    FILE_NOT_FOUND = "file_not_found"
    # Not in SPEC §4's table: OpenAI's answer for an unknown previous_response_id, which is also what a
    # response id another key created gets (SPEC §7.2).
    PREVIOUS_RESPONSE_NOT_FOUND = "previous_response_not_found"
    FILE_ASSIGNMENT_CONFLICT = "file_assignment_conflict"
    REQUEST_TOO_LARGE = "request_too_large"
    REQUEST_TIMEOUT = "request_timeout"
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
    # The key's own budget (SPEC §7.4): its condition, not an outage; the relay's answer names the amounts.
    BUDGET_EXCEEDED = "budget_exceeded"
    NO_ELIGIBLE_BACKEND = "no_eligible_backend"
    PIN_UNAVAILABLE = "pin_unavailable"
    GATEWAY_UNAVAILABLE = "gateway_unavailable"
    UPSTREAM_RESPONSE_TOO_LARGE = "upstream_response_too_large"
    UPSTREAM_DISPATCH_UNKNOWN = "upstream_dispatch_unknown"
    # Not in SPEC §4's table: the API's answers for a path or method it does not serve, and for a bug.
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    INTERNAL_ERROR = "internal_error"

    @property
    def status(self) -> int:
        """The HTTP status it is answered with."""
        return _STATUS_AND_MESSAGE[self][0]

    @property
    def message(self) -> str:
        """The gateway's own words for it."""
        return _STATUS_AND_MESSAGE[self][1]

    def about(self, model: str) -> str | None:
        """Its message naming `model`, for a refusal about one model (issue 47), if it has such a message."""
        template = _ABOUT_A_MODEL.get(self)
        return template.format(model) if template is not None and model else None

    def should_retry(self, param: str | None = None) -> bool:
        """Its `x-should-retry`: true where an identical retry may cure it; `no_eligible_backend` only
        while circuits cool down (its `param` is `circuit_open`)."""
        if self is ErrorCode.NO_ELIGIBLE_BACKEND:
            return param == "circuit_open"
        return self in _RETRYABLE


# Every code, for a membership test of a plain string (an `in` on the class needs Python 3.12).
CODES = frozenset(ErrorCode)

_STATUS_AND_MESSAGE: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.INVALID_REQUEST: (400, "The request is malformed."),
    ErrorCode.AUTHENTICATION_ERROR: (401, "A valid gateway key is required."),
    ErrorCode.PERMISSION_DENIED: (403, "This key may not use the model."),
    ErrorCode.MODEL_NOT_FOUND: (404, "No route serves this model."),
    ErrorCode.FILE_NOT_FOUND: (404, "No such file."),
    ErrorCode.PREVIOUS_RESPONSE_NOT_FOUND: (400, "No such previous response."),
    ErrorCode.FILE_ASSIGNMENT_CONFLICT: (
        409,
        "The assignment holding the referenced file is no longer in the pool.",
    ),
    ErrorCode.REQUEST_TOO_LARGE: (413, "The request body is too large."),
    ErrorCode.REQUEST_TIMEOUT: (408, "The request body did not arrive in time."),
    ErrorCode.RATE_LIMIT_EXCEEDED: (429, "This key's rate limit is reached."),
    ErrorCode.BUDGET_EXCEEDED: (429, "This key's budget cannot cover this request."),
    ErrorCode.NO_ELIGIBLE_BACKEND: (503, "No eligible backend can serve this request."),
    ErrorCode.PIN_UNAVAILABLE: (503, "The pinned upstream cannot serve this request."),
    ErrorCode.GATEWAY_UNAVAILABLE: (503, "The gateway cannot reach its database; try again shortly."),
    ErrorCode.UPSTREAM_RESPONSE_TOO_LARGE: (
        502,
        "The upstream's answer is larger than the gateway relays; it was not retried.",
    ),
    ErrorCode.UPSTREAM_DISPATCH_UNKNOWN: (
        504,
        "The upstream may have executed the request; it was not replayed.",
    ),
    ErrorCode.NOT_FOUND: (404, "No API route at this path."),
    ErrorCode.METHOD_NOT_ALLOWED: (405, "This API route does not accept this method."),
    ErrorCode.INTERNAL_ERROR: (500, "The gateway failed to handle the request; the failure is logged."),
}

# A refusal about one model names it (issue 47): the client sees which model its key may not use.
_ABOUT_A_MODEL: dict[ErrorCode, str] = {
    ErrorCode.PERMISSION_DENIED: "This key may not use the model {}.",
    ErrorCode.MODEL_NOT_FOUND: "No route serves the model {}.",
}

# Codes an identical retry may cure (SPEC §4 `x-should-retry: true`); every other is false.
_RETRYABLE = frozenset(
    {
        ErrorCode.GATEWAY_UNAVAILABLE,
        ErrorCode.RATE_LIMIT_EXCEEDED,
        ErrorCode.PIN_UNAVAILABLE,
        ErrorCode.INTERNAL_ERROR,
    }
)
