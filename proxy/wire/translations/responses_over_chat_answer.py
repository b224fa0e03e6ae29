"""An OpenAI Responses client on a Chat Completions upstream: the Chat answer as a Responses `response`
object, and the pieces its stream (`proxy.wire.translations.responses_over_chat_stream`) and the
websocket's prewarm build theirs from (the echoed request fields, usage, status, items).

PURE: standard library only, no I/O, no clock. The decisions (statuses, ids, usage) are
`proxy.wire.translations.responses_over_chat`'s, the contract (lenient answers) is
`proxy.wire.translations.translate`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.wire.translations.translate import ResponseTranslationError, _count, anthropic_tool_id


def echo(body: Mapping[str, Any]) -> dict[str, Any]:
    """What a Responses object repeats of its request (`tools`, `tool_choice`, ...), as the client sent it."""
    return {
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") if isinstance(body.get("metadata"), dict) else {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "temperature": body.get("temperature"),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") if isinstance(body.get("tools"), list) else [],
        "top_p": body.get("top_p"),
    }


def _usage(usage: object) -> dict[str, Any] | None:
    """Chat's usage as Responses has it; None when the upstream reported none (never zeros)."""
    if not isinstance(usage, Mapping):
        return None
    prompt = _count(usage.get("prompt_tokens")) or 0
    completion = _count(usage.get("completion_tokens")) or 0
    prompt_details = usage.get("prompt_tokens_details")
    completion_details = usage.get("completion_tokens_details")
    prompt_details = prompt_details if isinstance(prompt_details, Mapping) else {}
    cached = _count(prompt_details.get("cached_tokens"))
    written = _count(prompt_details.get("cache_write_tokens"))  # OpenRouter's and Bedrock's Chat wire
    reasoning = (
        _count(completion_details.get("reasoning_tokens"))
        if isinstance(completion_details, Mapping)
        else None
    )
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached or 0, "cache_write_tokens": written or 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning or 0},
        "total_tokens": prompt + completion,
    }


def _status(finish: object) -> tuple[str, dict[str, str] | None]:
    match finish:
        case "length":
            return "incomplete", {"reason": "max_output_tokens"}
        case "content_filter":
            return "incomplete", {"reason": "content_filter"}
    return "completed", None


def _response(
    response_id: str, model: str, created: int, status: str, echoed: Mapping[str, Any], **fields: Any
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "model": model,
        "output": [],
        "usage": None,
        **echoed,
        **fields,
    }


def prewarmed(body: Mapping[str, Any], *, model: str, created: int, response_id: str) -> list[dict[str, Any]]:
    """The events a Responses websocket answers a `generate: false` frame (a prewarm) with, as OpenAI
    does: `response.created`, then `response.completed` with no output and no usage (nothing was
    generated), each with its `sequence_number`."""
    echoed = echo(body)
    return [
        {
            "type": "response.created",
            "sequence_number": 0,
            "response": _response(response_id, model, created, "in_progress", echoed),
        },
        {
            "type": "response.completed",
            "sequence_number": 1,
            "response": _response(response_id, model, created, "completed", echoed),
        },
    ]


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _function_item(
    call_id: str, name: str, arguments: str, status: str, names: Mapping[str, tuple[str, str]]
) -> dict[str, Any]:
    """A `function_call` item; `names`: `namespaced(request)`, a namespaced call's name as the client
    declared it."""
    item = {
        "id": f"fc_{anthropic_tool_id(call_id)}",
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }
    if name in names:
        item["namespace"], item["name"] = names[name]
    return item


def chat_to_responses_response(
    chat_json: Mapping[str, Any],
    *,
    model: str,
    echoed: Mapping[str, Any],
    created: int,
    response_id: str,
    names: Mapping[str, tuple[str, str]],
) -> dict[str, Any]:
    """A Chat Completions answer as Responses object `response_id` reporting `model`, created at `created`
    (Unix seconds); `echoed`: `echo(request)`, `names`: `namespaced(request)`."""
    choices = chat_json.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise ResponseTranslationError("choices")
    message = choices[0].get("message")
    if not isinstance(message, Mapping):
        raise ResponseTranslationError("choices[0].message")
    parts: list[dict[str, Any]] = []
    text = message.get("content")
    if isinstance(text, list):  # some upstreams answer with text parts
        text = "".join(p["text"] for p in text if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    if isinstance(text, str) and text:
        parts.append(_text_part(text))
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        parts.append({"type": "refusal", "refusal": refusal})
    status, details = _status(choices[0].get("finish_reason"))
    output: list[dict[str, Any]] = []
    if parts:
        item_status = "completed" if status == "completed" else "incomplete"
        output.append(_message_item(response_id, item_status, parts))
    calls = message.get("tool_calls")
    for index, call in enumerate(calls if isinstance(calls, list) else []):
        where = f"choices[0].message.tool_calls[{index}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ResponseTranslationError(f"{where}.function")
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            raise ResponseTranslationError(f"{where}.function.arguments")
        call_id = call.get("id") if isinstance(call.get("id"), str) and call["id"] else f"call_{index}"
        output.append(_function_item(call_id, function["name"], arguments, "completed", names))
    return _response(
        response_id,
        model,
        created,
        status,
        echoed,
        output=output,
        incomplete_details=details,
        usage=_usage(chat_json.get("usage")),
    )


def _message_item(response_id: str, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": f"msg_{response_id.removeprefix('resp_')}",
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }
