"""Sanitized upstream error fields (SPEC §4, the last row of the typed outcomes; §11).

Contract: an upstream's `type`, `code` and `param` reach the client, the ledger, the log, the metrics
and the admin only through `sanitized(error, failure)`. Each field is kept when it is a string of 1 to
64 characters of `[A-Za-z0-9_.:-]`; an absent field stays absent; anything else (too long, other
characters, a credential an upstream wrote there) is replaced by the failure class's canonical value.
So nothing an upstream writes in those fields can carry text, and no ledger column can overflow.
Classification is unaffected: it matches exact enumerated values, which are all valid fields.
"""

import re

from routing.policy.errors import ErrorCode
from routing.policy.failures import CanonicalError, FailureClass

MAX_FIELD = 64
_FIELD = re.compile(r"[A-Za-z0-9_.:\-]{1,64}")

# (type, code, param) that stand in for an invalid field of each failure class.
CANONICAL: dict[str, tuple[str, str, str | None]] = {
    "model_unavailable": ("invalid_request_error", ErrorCode.MODEL_NOT_FOUND, "model"),
    "model_not_found_cross": ("not_found_error", ErrorCode.MODEL_NOT_FOUND, "model"),
    "rate_limited": ("rate_limit_error", ErrorCode.RATE_LIMIT_EXCEEDED, None),
    "quota": ("insufficient_quota", "insufficient_quota", None),
    "unavailable": ("server_error", "upstream_unavailable", None),
    "credential_rejected": ("upstream_error", "upstream_credential_rejected", None),
    "safety_refusal": ("invalid_request_error", "content_filter", None),
    "context_overflow": ("invalid_request_error", "context_length_exceeded", "messages"),
    "dispatch_unknown": ("upstream_error", ErrorCode.UPSTREAM_DISPATCH_UNKNOWN, None),
    "client_error": ("invalid_request_error", "upstream_client_error", None),
}
_DEFAULT = ("upstream_error", "upstream_error", None)


def valid(value: object) -> bool:
    return isinstance(value, str) and _FIELD.fullmatch(value) is not None


def _field(value: str | None, canonical: str | None) -> str | None:
    if value is None or valid(value):
        return value
    return canonical


def sanitized(error: CanonicalError, failure: FailureClass | str | None) -> CanonicalError:
    type_, code, param = CANONICAL.get(str(failure), _DEFAULT) if failure else _DEFAULT
    return CanonicalError(
        type=_field(error.type, type_),
        code=_field(error.code, code),
        param=_field(error.param, param),
    )
