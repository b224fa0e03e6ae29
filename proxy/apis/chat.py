"""The Chat Completions client API, whose turn requirements and error envelope OpenAI's other APIs share
(Responses, embeddings, files: `proxy.apis.responses`, `proxy.apis.registry`).

PURE. The error envelope is OpenAI's `{"error": {"message", "type", "code", "param"}}`; the gateway's
typed errors use their code as their type (SPEC §4). A stream's terminal error is a bare error chunk, as
OpenAI sends mid-stream (the openai SDK raises APIError on it).
"""

import json

from proxy.apis.base import Json
from proxy.sse import Dialect, encode_block
from routing.types import Requirements


def _has_image(value: object) -> bool:
    # Iterative: a client's nesting depth must not be able to exhaust the stack.
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            if item.get("type") in {"image_url", "input_image", "image"}:
                return True
            pending.extend(v for v in item.values() if isinstance(v, list | dict))
        elif isinstance(item, list):
            pending.extend(v for v in item if isinstance(v, list | dict))
    return False


def _max_output(body: Json) -> int:
    for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def turn_requirements(body: Json, body_size: int) -> Requirements:
    """What this Chat Completions or Responses turn needs from any route (SPEC §5.3)."""
    items = body.get("messages") if isinstance(body.get("messages"), list) else body.get("input")
    items = items if isinstance(items, list) else []
    untrusted = any(
        isinstance(item, dict)
        and (item.get("role") == "tool" or item.get("type") in {"function_call_output", "tool_result"})
        for item in items
    )
    return Requirements(
        tools_offered=bool(body.get("tools")),
        untrusted_content=untrusted,
        vision=_has_image(items),
        # About four bytes of JSON per token: a deliberately generous estimate for the gate.
        prompt_tokens=body_size // 4,
        max_output_tokens=_max_output(body),
    )


def compact_json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def error_body(*, message: str, type: str, code: str | None, param: str | None = None) -> bytes:
    """OpenAI's error envelope."""
    return json.dumps({"error": {"message": message, "type": type, "code": code, "param": param}}).encode()


class Chat:
    dialect = Dialect.CHAT

    def turn_requirements(self, body: Json, body_size: int) -> Requirements:
        return turn_requirements(body, body_size)

    def error_type(self, type: str, *, code: str | None, status: int, param: str | None) -> str:
        return type

    def error_body(self, *, type: str, code: str | None, param: str | None, message: str) -> bytes:
        return error_body(message=message, type=type, code=code, param=param)

    def error_event(
        self, *, type: str, code: str | None, param: str | None, message: str, status: int | None
    ) -> bytes:
        # A bare error chunk, as OpenAI sends mid-stream; the openai SDK raises APIError on it.
        body = {"error": {"message": message, "type": type, "code": code, "param": param}}
        return encode_block(None, compact_json(body))


API = Chat()
