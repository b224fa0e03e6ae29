"""The gateway's own typed errors (SPEC §4): code -> (HTTP status, the gateway's own message).

Every ingress (OpenAI and Anthropic shapes, websocket events) and the metrics' outcome labels
read this one table; a provider's message never appears here or anywhere a client can see.
"""

TYPED_ERRORS: dict[str, tuple[int, str]] = {
    "invalid_request": (400, "The request is malformed."),
    "authentication_error": (401, "A valid gateway key is required."),
    "permission_denied": (403, "This key may not use the model."),
    "model_not_found": (404, "No route serves this model."),
    # Not in SPEC §4's table: an unknown file id, or one another key uploaded (the same answer).
    "file_not_found": (404, "No such file."),
    # Not in SPEC §4's table: OpenAI's answer for an unknown previous_response_id, which is also what a
    # response id another key created gets (SPEC §7.2).
    "previous_response_not_found": (400, "No such previous response."),
    "file_assignment_conflict": (409, "The assignment holding the referenced file is no longer in the pool."),
    "request_too_large": (413, "The request body is too large."),
    "request_timeout": (408, "The request body did not arrive in time."),
    "rate_limit_exceeded": (429, "This key's rate limit is reached."),
    # The key's own budget (SPEC §7.4): its condition, not an outage; the relay's answer names the amounts.
    "budget_exceeded": (429, "This key's budget cannot cover this request."),
    "no_eligible_backend": (503, "No eligible backend can serve this request."),
    "pin_unavailable": (503, "The pinned upstream cannot serve this request."),
    "gateway_unavailable": (503, "The gateway cannot reach its database; try again shortly."),
    "upstream_response_too_large": (
        502,
        "The upstream's answer is larger than the gateway relays; it was not retried.",
    ),
    "upstream_dispatch_unknown": (504, "The upstream may have executed the request; it was not replayed."),
    # Not in SPEC §4's table: the API's answers for a path or method it does not serve, and for a bug.
    "not_found": (404, "No API route at this path."),
    "method_not_allowed": (405, "This API route does not accept this method."),
    "internal_error": (500, "The gateway failed to handle the request; the failure is logged."),
}

# A refusal about one model names it (issue 47): the client sees which model its key may not use.
MODEL_MESSAGES: dict[str, str] = {
    "permission_denied": "This key may not use the model {}.",
    "model_not_found": "No route serves the model {}.",
}


def model_message(code: str, model: str) -> str | None:
    """The typed error `code`'s message naming `model` (the model the refusal is about), if it has one."""
    template = MODEL_MESSAGES.get(code)
    return template.format(model) if template is not None and model else None


# Typed codes an identical retry may cure (SPEC §4 `x-should-retry: true`); every other is false.
RETRYABLE = frozenset({"gateway_unavailable", "rate_limit_exceeded", "pin_unavailable", "internal_error"})


def should_retry(code: str, param: str | None = None) -> bool:
    """The `x-should-retry` of a typed error: `no_eligible_backend` only while circuits cool down."""
    if code == "no_eligible_backend":
        return param == "circuit_open"
    return code in RETRYABLE
