"""Translation between OpenAI Chat Completions and Google Gemini's generateContent: requests, answers and
streams (a Chat client served by a `gemini` account).

PURE: standard library and `proxy.wire.sse` only. The rules are `proxy.wire.translations.translate`'s:

- Roles survive: Chat `system`/`developer` messages become `systemInstruction` (joined in order), user
  turns `user` contents, assistant turns `model` contents. A tool result stays a tool result: a Chat
  `tool` message becomes a `functionResponse` part (in a `user` content, as Gemini requires) carrying the
  text verbatim as `response.content`, paired with its call by id and by the call's name; it is never
  parsed, split or promoted. Tool calls stay `functionCall` parts.
- Requests are strict, within `generationConfig`'s ranges (`temperature` 0 to 2, `top_p` 0 to 1, the
  penalties -2 to 2, `top_k` from 1, at most 5 stop sequences; `n` only ever 1, `candidateCount`'s
  default): out of range, the field is refused naming it before dispatch. Every top-level field is
  translated, dropped as a hint that cannot change what the answer may contain or do, accepted only at
  its neutral value (`chat_request`), or refused with `RequestTranslationError(param)`; so is any content
  Gemini cannot take as the same input (an image by URL, audio, files, a final assistant message, a tool
  result whose call is not in the history). An Anthropic client's `top_k` and `thinking` (carried beside
  the Chat body, `AnthropicChat`) become `generationConfig.topK` and `thinkingConfig.thinkingBudget`
  (`adaptive` is Gemini's dynamic budget, -1).
- Answers: `finishReason` SAFETY, RECITATION, PROHIBITED_CONTENT, BLOCKLIST, SPII or IMAGE_SAFETY, and a
  prompt blocked by `promptFeedback.blockReason`, are Chat's `content_filter` (a safety refusal); a
  `thought` part (the model's reasoning summary) has no Chat field and is not relayed;
  MALFORMED_FUNCTION_CALL is a `ResponseTranslationError` (a guessed tool call is worse than a failure).
  A call Google gives no id gets one derived from the answer's id and its position (`tool_ids`), so ids
  never repeat across a conversation's answers; a call's `thoughtSignature` (Gemini 3 refuses the next
  step without it) rides inside the id the client is shown and is put back on that call's part, unchanged,
  when the client sends the history again: nothing is kept by the gateway. A step another provider took
  (no signature in its first call's id) gets Google's stand-in signature (`FOREIGN_STEP`).
  Usage: `promptTokenCount` is Chat's prompt, `candidatesTokenCount` + `thoughtsTokenCount` its
  completion (thinking is billed as output), `cachedContentTokenCount` its `cached_tokens`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from proxy.wire.providers.chat_request import (
    arguments,
    check_fields,
    image_data,
    in_range,
    kind,
    max_tokens,
    present,
    refuse,
    stops,
    texts,
)
from proxy.wire.providers.chat_request import turns as chat_turns
from proxy.wire.providers.tool_ids import derived_id, signed_id, split_id
from proxy.wire.sse import Block, encode_block
from proxy.wire.translations.messages_over_chat import AnthropicChat
from proxy.wire.translations.translate import (
    RequestTranslationError,
    ResponseTranslationError,
    block_fields,
    chat_function,
    chat_named_choice,
    chat_part,
    chat_tool_call,
)

REFUSALS = frozenset({"SAFETY", "RECITATION", "PROHIBITED_CONTENT", "BLOCKLIST", "SPII", "IMAGE_SAFETY"})
_FINISH = {"STOP": "stop", "MAX_TOKENS": "length", **{reason: "content_filter" for reason in REFUSALS}}
_TRANSLATED = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "stream",
        "temperature",
        "top_p",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "response_format",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    }
)
_MOST_STOPS = 5  # generationConfig.stopSequences: "up to 5" (API reference)
_TOOL_MODES = {"auto": "AUTO", "none": "NONE", "required": "ANY"}
_DYNAMIC = -1  # a thinking budget the model sets itself (Anthropic's `adaptive`)
# Google's documented stand-in signature for function calls Gemini did not make (history from another
# model): Gemini 3 requires one on each step's first call and skips its validation for this value.
FOREIGN_STEP = "skip_thought_signature_validator"


def _user_parts(content: object, param: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}] if content else []
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(kind(content, list, param)):
        where = f"{param}[{index}]"
        part = chat_part(part, where)
        if part.get("type") == "text":
            if text := kind(part.get("text"), str, f"{where}.text"):
                parts.append({"text": text})
        elif part.get("type") == "image_url":
            mime, data = image_data(part, where)
            parts.append({"inlineData": {"mimeType": mime, "data": data}})
        else:
            refuse(f"{where}.type")
    return parts


def _model_parts(message: Mapping[str, Any], param: str, names: dict[str, str]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    if message.get("content") is not None:
        parts += [{"text": t} for t in texts(message["content"], f"{param}.content") if t]
    if message.get("refusal") is not None:
        parts.append({"text": kind(message["refusal"], str, f"{param}.refusal")})
    for index, call in enumerate(kind(message.get("tool_calls") or [], list, f"{param}.tool_calls")):
        where = f"{param}.tool_calls[{index}]"
        call_id, name, raw = chat_tool_call(call, where)
        names[call_id] = name
        args = arguments(raw, f"{where}.function.arguments", RequestTranslationError)
        plain, signature = split_id(call_id)
        part: dict[str, Any] = {"functionCall": {"id": plain, "name": name, "args": args}}
        if signature is not None:  # back on the very part it came on, unchanged
            part["thoughtSignature"] = signature
        elif index == 0:  # a step another model took: Gemini 3 refuses its first call unsigned
            part["thoughtSignature"] = FOREIGN_STEP
        parts.append(part)
    return parts


def _tool_result(message: Mapping[str, Any], param: str, names: Mapping[str, str]) -> dict[str, Any]:
    call_id = kind(message.get("tool_call_id"), str, f"{param}.tool_call_id")
    if call_id not in names:  # Gemini pairs a result with its call by name: without the call, no pair
        refuse(f"{param}.tool_call_id")
    text = "\n\n".join(texts(message.get("content", ""), f"{param}.content"))
    response = {"content": text}
    return {"functionResponse": {"id": split_id(call_id)[0], "name": names[call_id], "response": response}}


def _tool(tool: object, param: str) -> tuple[dict[str, Any], bool]:
    function = chat_function(tool, param)
    out: dict[str, Any] = {"name": kind(function.get("name"), str, f"{param}.function.name")}
    if function.get("description") is not None:
        out["description"] = kind(function["description"], str, f"{param}.function.description")
    if function.get("parameters") is not None:
        # The JSON Schema as given (not Gemini's OpenAPI subset): nothing of the contract is lost.
        out["parametersJsonSchema"] = dict(
            kind(function["parameters"], Mapping, f"{param}.function.parameters")
        )
    strict = function.get("strict")
    return out, bool(strict is not None and kind(strict, bool, f"{param}.function.strict"))


def _tool_config(choice: object, strict: bool) -> dict[str, Any] | None:
    if choice is None:
        mode, names = "AUTO", None
    elif isinstance(choice, str):
        mode, names = _TOOL_MODES.get(choice) or refuse("tool_choice"), None
    else:
        mode, names = "ANY", [chat_named_choice(choice)]
    if strict and mode == "AUTO":
        mode = "VALIDATED"  # strict schemas: Gemini's schema-adherent calling
    config: dict[str, Any] = {"mode": mode}
    if names:
        config["allowedFunctionNames"] = names
    return {"functionCallingConfig": config}


def chat_to_gemini_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Chat Completions body as a generateContent body (the model and streaming are in the URL)."""
    carried = body.carried if isinstance(body, AnthropicChat) else {}
    body = present(body, "body")
    check_fields(body, _TRANSLATED)
    names: dict[str, str] = {}  # tool call id -> function name, from the history's calls

    def turn_of(role: str, message: Mapping[str, Any], param: str) -> tuple[str, list[Any]]:
        if role == "user":
            return "user", _user_parts(message.get("content"), f"{param}.content")
        if role == "assistant":
            return "model", _model_parts(message, param, names)
        return "user", [_tool_result(message, param, names)]

    system, contents = chat_turns(body, "parts", turn_of)
    out: dict[str, Any] = {"contents": contents}
    if system:
        out["systemInstruction"] = {"parts": [{"text": text} for text in system]}
    out["generationConfig"] = _generation_config(body) | _anthropic_config(carried)
    if tools := body.get("tools"):
        declared = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(kind(tools, list, "tools"))]
        out["tools"] = [{"functionDeclarations": [d for d, _ in declared]}]
        out["toolConfig"] = _tool_config(body.get("tool_choice"), any(strict for _, strict in declared))
    if body.get("parallel_tool_calls") is False:
        refuse("parallel_tool_calls")  # Gemini may call several functions at once: not enforceable
    return out


def _anthropic_config(carried: Mapping[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if "top_k" in carried:
        config["topK"] = in_range(carried, "top_k", 1)
    if "thinking" in carried:
        budget = carried["thinking"].get("budget_tokens", _DYNAMIC)
        config["thinkingConfig"] = {"thinkingBudget": budget}
    return config


def _generation_config(body: Mapping[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if (limit := max_tokens(body)) is not None:
        config["maxOutputTokens"] = limit
    for chat_name, name, low, high in (
        ("temperature", "temperature", 0, 2),
        ("top_p", "topP", 0, 1),
        ("presence_penalty", "presencePenalty", -2, 2),
        ("frequency_penalty", "frequencyPenalty", -2, 2),
    ):
        if chat_name in body:
            config[name] = in_range(body, chat_name, low, high)
    if "seed" in body:
        config["seed"] = kind(body["seed"], int, "seed")
    if "stop" in body:
        config["stopSequences"] = stops(body, _MOST_STOPS)
    if "response_format" in body:
        fmt = block_fields(body["response_format"], "response_format", frozenset({"type", "json_schema"}))
        if fmt.get("type") == "json_object":
            config["responseMimeType"] = "application/json"
        elif fmt.get("type") == "json_schema":
            # `name` only labels the format; Gemini always holds the answer to the schema, `strict` or not.
            # A `description` the model would read has no Gemini field: refused naming its path.
            known = frozenset({"schema", "strict"})
            where = "response_format.json_schema"
            spec = block_fields(fmt.get("json_schema"), where, known, dropped=frozenset({"name"}))
            config["responseMimeType"] = "application/json"
            config["responseJsonSchema"] = dict(
                kind(spec.get("schema"), Mapping, "response_format.json_schema.schema")
            )
        elif fmt.get("type") != "text":
            refuse("response_format.type")
    return config


# ---------------------------------------------------------------------------------------------------
# Answers


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def usage(payload: object) -> tuple[int | None, int | None]:
    """(prompt, completion) tokens of a generateContent answer or stream chunk; None when absent."""
    meta = payload.get("usageMetadata") if isinstance(payload, Mapping) else None
    if not isinstance(meta, Mapping) or not isinstance(meta.get("promptTokenCount"), int):
        return None, None
    return _count(meta["promptTokenCount"]), _count(meta.get("candidatesTokenCount")) + _count(
        meta.get("thoughtsTokenCount")
    )


def _chat_usage(payload: Mapping[str, Any]) -> dict[str, Any]:
    """On the Chat wire; `cachedContentTokenCount` is part of `promptTokenCount` as `cached_tokens` is
    of Chat's prompt, so it carries over as it is."""
    prompt, completion = usage(payload)
    out: dict[str, Any] = {
        "prompt_tokens": prompt or 0,
        "completion_tokens": completion or 0,
        "total_tokens": (prompt or 0) + (completion or 0),
    }
    meta = payload.get("usageMetadata")
    if isinstance(meta, Mapping) and (cached := _count(meta.get("cachedContentTokenCount"))):
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


def finish_reason(payload: object) -> str | None:
    """The answer's end as Chat names it (`content_filter` for every safety block), None while open."""
    if not isinstance(payload, Mapping):
        return None
    feedback = payload.get("promptFeedback")
    if isinstance(feedback, Mapping) and isinstance(feedback.get("blockReason"), str):
        return "content_filter"
    candidates = payload.get("candidates")
    first = candidates[0] if isinstance(candidates, list) and candidates else None
    reason = first.get("finishReason") if isinstance(first, Mapping) else None
    if not isinstance(reason, str):
        return None
    if reason == "MALFORMED_FUNCTION_CALL":
        raise ResponseTranslationError("candidates[0].finishReason")
    return _FINISH.get(reason, "stop")


def _parts(payload: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    candidates = payload.get("candidates")
    first = candidates[0] if isinstance(candidates, list) and candidates else None
    content = first.get("content") if isinstance(first, Mapping) else None
    parts = content.get("parts") if isinstance(content, Mapping) else None
    return [p for p in parts if isinstance(p, Mapping)] if isinstance(parts, list) else []


def _call(part: Mapping[str, Any], response_id: str, ordinal: int) -> dict[str, Any] | None:
    call = part.get("functionCall")
    if call is None:
        return None
    if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
        raise ResponseTranslationError("candidates[0].content.parts.functionCall")
    args = call.get("args", {})
    if not isinstance(args, Mapping):
        raise ResponseTranslationError("candidates[0].content.parts.functionCall.args")
    given = call.get("id")
    call_id = given if isinstance(given, str) and given else derived_id(response_id, ordinal)
    return {
        "id": signed_id(call_id, part.get("thoughtSignature")),
        "type": "function",
        "function": {"name": call["name"], "arguments": json.dumps(args, separators=(",", ":"))},
    }


def _text(part: Mapping[str, Any]) -> str:
    # A thought part is the model's reasoning summary: Chat has no field for it.
    return part["text"] if isinstance(part.get("text"), str) and part.get("thought") is not True else ""


def _response_id(payload: Mapping[str, Any]) -> str:
    """The answer's id (tool-call ids derive from it); when Google gives none, a digest of the answer
    (each of its signatures is new, so two answers still differ)."""
    given = payload.get("responseId")
    if isinstance(given, str) and given:
        return given
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:24]


def gemini_to_chat_response(payload: Mapping[str, Any], *, model: str, created: int) -> dict[str, Any]:
    """A generateContent answer as a Chat Completions response reporting `model` (`created`: Unix
    seconds)."""
    parts = _parts(payload)
    response_id = _response_id(payload)
    found = [p for p in parts if p.get("functionCall") is not None]
    calls = [c for i, p in enumerate(found) if (c := _call(p, response_id, i)) is not None]
    text = "".join(_text(p) for p in parts)
    finish = finish_reason(payload) or "stop"
    message: dict[str, Any] = {"role": "assistant", "content": text or None, "refusal": None}
    if calls:
        message["tool_calls"] = calls
        finish = "tool_calls" if finish == "stop" else finish
    return {
        "id": f"chatcmpl-{response_id}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": _chat_usage(payload),
    }


class GeminiToChatStream:
    """streamGenerateContent SSE blocks in, Chat Completions SSE bytes out (one per upstream response).

    Each Gemini chunk is a partial answer: its text parts become content deltas, its function calls whole
    tool-call deltas, its `finishReason` the finish reason; the chunk that carries the finish reason
    carries the final usage, sent as Chat's usage-only chunk (the relay strips it when the client did not
    ask for usage), then `[DONE]`. An in-stream error becomes a Chat error chunk naming only Google's
    status (never its message), so the relay classifies it like any stream error."""

    def __init__(self, *, model: str, created: int) -> None:
        self._model = model
        self._id = "chatcmpl-gateway"
        self._response_id = ""
        self._created = created
        self._started = False
        self._calls = 0
        self._ended = False

    @property
    def ended(self) -> bool:
        return self._ended

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        chunk = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": choices,
            **extra,
        }
        return encode_block(None, json.dumps(chunk, separators=(",", ":"), ensure_ascii=False))

    def _delta(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        return self._chunk([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}])

    def feed(self, block: Block) -> bytes:
        if self._ended:
            return b""
        if block.data is None:
            return b": keep-alive\n\n" if block.comment_only else b""
        try:
            payload = json.loads(block.data)
        except (ValueError, RecursionError):
            return b""
        if not isinstance(payload, dict):
            return b""
        if isinstance(payload.get("error"), Mapping):
            self._ended = True
            return encode_block(None, json.dumps(chat_error(payload["error"])))
        out = bytearray()
        if not self._started:
            self._started = True
            self._response_id = _response_id(payload)
            self._id = f"chatcmpl-{self._response_id}"
            out += self._delta({"role": "assistant", "content": ""})
        for part in _parts(payload):
            if text := _text(part):
                out += self._delta({"content": text})
            call = _call(part, self._response_id, self._calls)
            if call is not None:
                out += self._delta({"tool_calls": [{"index": self._calls, **call}]})
                self._calls += 1
        try:
            finish = finish_reason(payload)
        except ResponseTranslationError:
            self._ended = True  # a malformed call: end without a counterfeit success
            return bytes(out) + encode_block(
                None, json.dumps(chat_error({"status": "INTERNAL", "code": 500}))
            )
        if finish is not None:
            out += self._delta({}, "tool_calls" if finish == "stop" and self._calls else finish)
            out += self._chunk([], usage=_chat_usage(payload))
            out += encode_block(None, "[DONE]")
            self._ended = True
        return bytes(out)

    def finish(self) -> bytes:
        return b""


# Google's error statuses that mean what a canonical type already names (SPEC §5.6); others keep theirs.
_CANONICAL_TYPES = {
    "NOT_FOUND": "not_found_error",  # the model is not served here: the bare 404 of another model
    "PERMISSION_DENIED": "permission_denied",  # this key or project may not use it: the credential's
}


def chat_error(error: Mapping[str, Any]) -> dict[str, Any]:
    """Google's error object as the Chat wire's: its status (as the type), the reason its ErrorInfo
    detail gives (as the code), its HTTP code; never its message."""
    status = error.get("status") if isinstance(error.get("status"), str) else None
    reason = None
    details = error.get("details")
    for detail in details if isinstance(details, list) else []:
        if isinstance(detail, Mapping) and isinstance(detail.get("reason"), str):
            reason = detail["reason"]
            break
    kind_name = _CANONICAL_TYPES.get(status, status) if status is not None else None
    out: dict[str, Any] = {"error": {"type": kind_name, "code": reason}}
    if isinstance(error.get("code"), int):
        out["status"] = error["code"]
    return out
