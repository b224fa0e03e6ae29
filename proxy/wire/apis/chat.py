"""The Chat Completions client API, whose turn requirements and error envelope OpenAI's other APIs share
(Responses, embeddings, files: `proxy.wire.apis.responses`, `proxy.wire.apis.registry`).

PURE. The error envelope is OpenAI's `{"error": {"message", "type", "code", "param"}}`; the gateway's
typed errors use their code as their type (SPEC §4). A stream's terminal error is a bare error chunk, as
OpenAI sends mid-stream (the openai SDK raises APIError on it). `visibility` is SPEC §6.2 for a chunk: the
role alone, a usage-only chunk and blank log-probabilities show nothing; any other delta field and any
finish reason are output.
"""

import json
from typing import Any

from proxy.wire.apis.base import Json
from proxy.wire.sse import Block, Dialect, Visibility, blank, encode_block, fields_blank
from proxy.wire.translations.token_estimate import media, prompt_estimate
from routing.policy.types import Requirements


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
    found = media(items)
    return Requirements(
        tools_offered=bool(body.get("tools")),
        untrusted_content=untrusted,
        vision=found.images > 0,
        prompt_tokens=prompt_estimate(body_size, found),
        max_output_tokens=_max_output(body),
    )


def compact_json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def error_body(*, message: str, type: str, code: str | None, param: str | None = None) -> bytes:
    """OpenAI's error envelope."""
    return json.dumps({"error": {"message": message, "type": type, "code": code, "param": param}}).encode()


def visibility(block: Block, payload: dict[str, Any]) -> Visibility:
    """How a Chat Completions chunk counts for withholding (`proxy.wire.sse.classify`)."""
    # The openai SDK raises on any truthy top-level `error` in a chunk; so does the gateway.
    if payload.get("error") or block.event == "error":
        return Visibility.TERMINAL_FAILURE
    choices = payload.get("choices")
    if not isinstance(choices, list):
        return Visibility.VISIBLE  # not a chunk shape we know
    # `choices: []` is a usage-only or prompt-filter chunk: metadata, not output.
    if all(_choice_blank(choice) for choice in choices):
        return Visibility.NOT_VISIBLE
    return Visibility.VISIBLE


def _choice_blank(choice: object) -> bool:
    if not isinstance(choice, dict):
        return False
    for key, value in choice.items():
        if key == "index":
            continue
        if key == "delta":
            # The role alone announces a message; any other non-empty delta field (content,
            # tool_calls, refusal, reasoning, audio, an unknown one) is output.
            if not isinstance(value, dict) or not fields_blank(value, ignore=("role",)):
                return False
        elif key == "logprobs":
            if not (blank(value) or (isinstance(value, dict) and fields_blank(value))):
                return False
        # A finish_reason (stop, length, tool_calls, content_filter) is the answer's outcome: an
        # empty completion or a refusal must be relayed, never retried.
        elif not blank(value):
            return False
    return True


class Chat:
    dialect = Dialect.CHAT
    forwarded_headers: tuple[str, ...] = ()

    def visibility(self, block: Block, payload: dict[str, Any]) -> Visibility:
        return visibility(block, payload)

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
