"""The Anthropic Messages client API (`/v1/messages`, `/v1/messages/count_tokens`): the turn's requirements
from a Messages body, and the Anthropic error envelope.

PURE.

Contract:

- `turn_requirements` is SPEC §5.3 for a Messages body, the counterpart of the OpenAI adapter's.
- `error_body` builds `{"type": "error", "error": {"type", "message"}}` (SPEC §4); the message must be the
  gateway's own words. `error_type` maps the gateway's typed codes, and an upstream's sanitized status,
  to the Anthropic error type an Anthropic SDK expects (table below). Anthropic errors have no `code`
  or `param`: the status and the type are all a client can act on.
- `visibility` is SPEC §6.2 for a Messages event: `ping`, a blank `message_start` and blank content
  block starts and deltas show nothing; `message_stop` ends the message, `error` fails it.
"""

import json
from collections.abc import Mapping
from typing import Any

from proxy.wire.apis.base import Json
from proxy.wire.apis.chat import compact_json
from proxy.wire.sse import Block, Dialect, Visibility, encode_block, event_kind, part_blank, parts_blank
from proxy.wire.translations.token_estimate import media, prompt_estimate
from routing.policy.errors import ErrorCode
from routing.policy.types import Requirements

# The gateway's typed codes (SPEC §4, `routing.policy.errors.ErrorCode`) -> Anthropic error types. Anthropic
# has no conflict type, so a 409 reads as a request the client must change; `upstream_dispatch_unknown`
# is Anthropic's own 504 `timeout_error`; a gateway that cannot reach its database is an `api_error`.
# `no_eligible_backend` is decided in `error_type`: its meaning depends on the excluding condition.
ERROR_TYPES: Mapping[str, str] = {
    ErrorCode.INVALID_REQUEST: "invalid_request_error",
    ErrorCode.AUTHENTICATION_ERROR: "authentication_error",
    ErrorCode.PERMISSION_DENIED: "permission_error",
    ErrorCode.MODEL_NOT_FOUND: "not_found_error",
    ErrorCode.FILE_NOT_FOUND: "not_found_error",
    ErrorCode.PREVIOUS_RESPONSE_NOT_FOUND: "invalid_request_error",  # a Responses route's only
    ErrorCode.FILE_ASSIGNMENT_CONFLICT: "invalid_request_error",
    ErrorCode.REQUEST_TOO_LARGE: "request_too_large",
    ErrorCode.RATE_LIMIT_EXCEEDED: "rate_limit_error",  # the key's own limits (proxy.limits)
    ErrorCode.BUDGET_EXCEEDED: "rate_limit_error",  # the key's own budget (SPEC §7.4)
    ErrorCode.PIN_UNAVAILABLE: "api_error",
    ErrorCode.GATEWAY_UNAVAILABLE: "api_error",
    ErrorCode.UPSTREAM_DISPATCH_UNKNOWN: "timeout_error",
    ErrorCode.REQUEST_TIMEOUT: "timeout_error",  # the client sent its body too slowly (proxy.edge)
    ErrorCode.UPSTREAM_RESPONSE_TOO_LARGE: "api_error",
    # A path or method the API does not serve: Anthropic answers both as not_found_error.
    ErrorCode.NOT_FOUND: "not_found_error",
    ErrorCode.METHOD_NOT_ALLOWED: "not_found_error",
    ErrorCode.INTERNAL_ERROR: "api_error",
}

# An upstream failure relayed to an Anthropic client after sanitizing keeps its status; its type
# follows the status the way Anthropic's own API assigns it (an OpenAI type such as `server_error`
# means nothing to an Anthropic SDK).
STATUS_ERROR_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}

# Every error type an Anthropic client knows: an upstream's own Anthropic type is kept as it came.
ERROR_TYPE_NAMES = frozenset(
    {*ERROR_TYPES.values(), *STATUS_ERROR_TYPES.values(), "api_error", "overloaded_error"}
)

# `no_eligible_backend` with `param == "circuit_open"` means every candidate is cooling down: capacity
# that will come back, which Anthropic clients know as `overloaded_error` and retry. Any other excluding
# condition (capability, privacy, region, budget...) does not heal by retrying, so it is a plain
# `api_error` rather than an invitation to hammer the gateway.
_CIRCUIT_OPEN = "circuit_open"


def _blocks(message: object) -> list[Json]:
    if not isinstance(message, dict):
        return []
    content = message.get("content")
    return [block for block in content if isinstance(block, dict)] if isinstance(content, list) else []


def _is_tool_result(block: Json) -> bool:
    # `tool_result` for client tools; server tools' results (`web_search_tool_result`,
    # `mcp_tool_result`, ...) are third-party content just the same.
    kind = block.get("type")
    return isinstance(kind, str) and kind.endswith("tool_result")


def turn_requirements(body: Json, body_size: int) -> Requirements:
    """What this Anthropic Messages turn needs from any route (SPEC §5.3)."""
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    blocks = [block for message in messages for block in _blocks(message)]
    max_tokens = body.get("max_tokens")
    valid_max = isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0
    max_output = max_tokens if isinstance(max_tokens, int) and valid_max else 0
    # Images returned by a tool (a screenshot, a read image file) are image input all the same.
    found = media(messages)
    return Requirements(
        tools_offered=bool(body.get("tools")),
        untrusted_content=any(_is_tool_result(block) for block in blocks),
        vision=found.images > 0,
        prompt_tokens=prompt_estimate(body_size, found),
        max_output_tokens=max_output,
    )


def error_type(code: str | None, *, status: int, param: str | None = None) -> str:
    """The Anthropic error type for a gateway outcome `code`, or for an upstream failure's `status`."""
    if code == ErrorCode.NO_ELIGIBLE_BACKEND:
        return "overloaded_error" if param == _CIRCUIT_OPEN else "api_error"
    if code is not None and code in ERROR_TYPES:
        return ERROR_TYPES[code]
    if status in STATUS_ERROR_TYPES:
        return STATUS_ERROR_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def error_body(type: str, message: str) -> bytes:  # `type` is the wire name of the field
    """An Anthropic error envelope; `message` must be the gateway's own words (SPEC §4)."""
    return json.dumps({"type": "error", "error": {"type": type, "message": message}}).encode()


def visibility(block: Block, payload: dict[str, Any]) -> Visibility:
    """How an Anthropic Messages event counts for withholding (`proxy.wire.sse.classify`)."""
    kind = event_kind(block, payload)
    if kind == "error" or (kind is None and payload.get("error")):
        return Visibility.TERMINAL_FAILURE
    if kind == "message_stop":
        return Visibility.TERMINAL_SUCCESS
    if kind == "ping":
        return Visibility.NOT_VISIBLE
    if kind == "message_start":
        message = payload.get("message")
        if isinstance(message, dict) and parts_blank(message.get("content")):
            return Visibility.NOT_VISIBLE
        return Visibility.VISIBLE
    # An empty text or thinking block start shows nothing; tool_use and server_tool_use starts carry
    # an id and name, redacted_thinking carries data, so the generic blank-part rule keeps them visible.
    if kind == "content_block_start" and part_blank(payload.get("content_block")):
        return Visibility.NOT_VISIBLE
    if kind == "content_block_delta" and part_blank(payload.get("delta")):
        return Visibility.NOT_VISIBLE
    # message_delta carries the stop reason (a refusal must never be retried), content_block_stop
    # closes a block: both count as visible.
    return Visibility.VISIBLE


class Messages:
    dialect = Dialect.ANTHROPIC
    # Its beta flags: an Anthropic upstream (or Bedrock's and Vertex's Claude) enables them per request.
    forwarded_headers = ("anthropic-beta",)

    def visibility(self, block: Block, payload: dict[str, Any]) -> Visibility:
        return visibility(block, payload)

    def turn_requirements(self, body: Json, body_size: int) -> Requirements:
        return turn_requirements(body, body_size)

    def error_type(self, type: str, *, code: str | None, status: int, param: str | None) -> str:
        # An upstream's own Anthropic type is kept as it came; anything else is mapped.
        return type if type in ERROR_TYPE_NAMES else error_type(code, status=status, param=param)

    def error_body(self, *, type: str, code: str | None, param: str | None, message: str) -> bytes:
        return error_body(type, message)  # Anthropic errors have no code or param

    def error_event(
        self, *, type: str, code: str | None, param: str | None, message: str, status: int | None
    ) -> bytes:
        # Anthropic errors have no code or param.
        body = {"type": "error", "error": {"type": type, "message": message}}
        return encode_block("error", compact_json(body))


API = Messages()
