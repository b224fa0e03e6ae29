"""The Responses client API (`/v1/responses`, `/v1/responses/compact`, and its websocket mode): Chat's turn
requirements and OpenAI's error envelope; a stream's terminal error is a Responses `error` event.

PURE. `visibility` is SPEC §6.2 for a Responses event: lifecycle events, blank announced message and
reasoning items and parts, and empty deltas show nothing; `response.completed` and `response.incomplete`
end the response, `error` and `response.failed` fail it.
"""

from typing import Any

from proxy.wire.apis.chat import Chat, compact_json
from proxy.wire.sse import Block, Dialect, Visibility, encode_block, event_kind, part_blank, parts_blank

NOT_VISIBLE = frozenset(
    {
        "response.created",
        "response.queued",
        "response.in_progress",
        # Undocumented heartbeat on long Responses streams: {"type": "keepalive", "sequence_number": n}.
        "keepalive",
        # Rate-limit information events (ChatGPT Codex backend).
        "codex.rate_limits",
    }
)
SUCCESS = frozenset({"response.completed", "response.incomplete"})
FAILURE = frozenset({"error", "response.failed"})
# Parts announced before their text streams in; with blank fields they show nothing yet.
PART_ADDED = frozenset({"response.content_part.added", "response.reasoning_summary_part.added"})


def visibility(block: Block, payload: dict[str, Any]) -> Visibility:
    """How a Responses event counts for withholding (`proxy.wire.sse.classify`)."""
    kind = event_kind(block, payload)
    if kind in FAILURE or (kind is None and payload.get("error")):
        return Visibility.TERMINAL_FAILURE
    if kind in SUCCESS:
        # `response.incomplete` ends a response cut by max_output_tokens (the client's own limit) or by
        # the content filter (a safety refusal, terminal per SPEC §5.6): relayed, never failed over.
        return Visibility.TERMINAL_SUCCESS
    if kind in NOT_VISIBLE:
        return Visibility.NOT_VISIBLE
    if kind == "response.output_item.added" and _item_blank(payload.get("item")):
        return Visibility.NOT_VISIBLE
    if kind in PART_ADDED and part_blank(payload.get("part")):
        return Visibility.NOT_VISIBLE
    if kind is not None and kind.endswith(".delta") and payload.get("delta") == "":
        return Visibility.NOT_VISIBLE
    return Visibility.VISIBLE


def _item_blank(item: object) -> bool:
    # Only message and reasoning items are blank when announced; any other item (a function, tool,
    # search or image call) tells the agent an action started, which is output.
    if not isinstance(item, dict):
        return False
    match item.get("type"):
        case "message":
            return parts_blank(item.get("content"))
        case "reasoning":
            # encrypted_content is opaque to the user; only summary and content text can show.
            return parts_blank(item.get("summary")) and parts_blank(item.get("content"))
    return False


def responses_error_event(
    *,
    type: str,  # shadows the builtin on purpose: it is the wire name of the field
    code: str | None,
    param: str | None,
    message: str,
    status: int | None = None,
) -> dict[str, Any]:
    """The gateway's Responses `error` event (the SSE block's data, or one websocket frame).

    The documented ResponseErrorEvent puts code/message/param at the top level, while OpenAI actually
    sends them nested under `error` with the error type (which also makes the openai SDK raise). Both,
    so either kind of client finds them. `status`: the HTTP status the error stands for, as the
    websocket mode's `error` events carry it.
    """
    error = {"type": type, "code": code, "message": message, "param": param}
    body: dict[str, Any] = {"type": "error", "code": code, "message": message, "param": param, "error": error}
    if status is not None:
        body["status"] = status
    return body


class Responses(Chat):
    dialect = Dialect.RESPONSES
    forwarded_headers: tuple[str, ...] = ()

    def visibility(self, block: Block, payload: dict[str, Any]) -> Visibility:
        return visibility(block, payload)

    def error_event(
        self, *, type: str, code: str | None, param: str | None, message: str, status: int | None
    ) -> bytes:
        # An SSE error event names no status (the stream's own status was 200).
        body = responses_error_event(type=type, code=code, param=param, message=message)
        return encode_block("error", compact_json(body))


API = Responses()
