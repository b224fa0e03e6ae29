"""The Responses client API (`/v1/responses`, `/v1/responses/compact`, and its websocket mode): Chat's turn
requirements and OpenAI's error envelope; a stream's terminal error is a Responses `error` event.

PURE.
"""

from typing import Any

from proxy.apis.chat import Chat, compact_json
from proxy.sse import Dialect, encode_block


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

    def error_event(
        self, *, type: str, code: str | None, param: str | None, message: str, status: int | None
    ) -> bytes:
        # An SSE error event names no status (the stream's own status was 200).
        body = responses_error_event(type=type, code=code, param=param, message=message)
        return encode_block("error", compact_json(body))


API = Responses()
