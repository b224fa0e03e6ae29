"""Translation between OpenAI Chat Completions and Amazon Bedrock's Converse API: requests, answers and
ConverseStream events (a Chat client served by a `bedrock` account).

PURE: standard library and `proxy.wire.sse` only; the event-stream frames are decoded by botocore before they
come here (`proxy.wire.providers.bedrock`). The rules are `proxy.wire.translations.translate`'s:

- Roles survive: Chat `system`/`developer` messages become Converse's `system` blocks (in order), user
  and assistant turns keep their roles. A tool result stays a tool result: a Chat `tool` message becomes a
  `toolResult` block (in a user turn, as Converse requires) whose text is carried verbatim, never parsed,
  split or promoted; tool calls stay `toolUse` blocks. Tool ids become valid Converse ids by the same
  deterministic rewrite as Anthropic's, so calls and results still pair.
- Requests are strict (`chat_request`), within `inferenceConfig`'s ranges: `temperature` and `top_p`
  from 0 to 1 (OpenAI takes a temperature up to 2), at most 2500 stop sequences; out of range, the field
  is refused naming it before dispatch, so a `ValidationException` after dispatch still means the model
  (SPEC §5.6). `seed` and the penalties have no Converse field and are dropped
  as sampling hints; a JSON response format, `tool_choice: "none"` (Converse has no such mode),
  `parallel_tool_calls: false`, a strict tool schema (`function.strict: true`, which Converse cannot
  enforce), an image by URL or of a format Converse does not take, and a final
  assistant message (Converse would continue it) are refused naming the field. An Anthropic client's
  `top_k` and `thinking` (carried beside the Chat body, `AnthropicChat`) are refused naming the field:
  an Anthropic client reaches Converse only on a model that is not Anthropic's (on Claude its own body
  goes to InvokeModel, see `bedrock`), which would answer a terminal `ValidationException`; refused
  here, another account serves.
- Answers: `stopReason` `guardrail_intervened` and `content_filtered` are Chat's `content_filter` (a
  safety refusal); usage is `inputTokens` (plus cache reads and writes) and `outputTokens`; reasoning
  (`reasoningContent`) has no Chat field and is not relayed (its tokens are in `outputTokens`).
- Stream: `messageStart` opens the Chat stream, text and tool-use deltas become Chat deltas,
  `messageStop` the finish reason and `metadata` the usage-only chunk and `[DONE]`; an exception frame
  becomes a Chat error chunk naming only the exception and the HTTP status it stands for.
"""

from __future__ import annotations

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
from proxy.wire.sse import Block, encode_block
from proxy.wire.translations.messages_over_chat import AnthropicChat
from proxy.wire.translations.translate import (
    RequestTranslationError,
    ResponseTranslationError,
    anthropic_tool_id,
    chat_function,
    chat_named_choice,
    chat_part,
    chat_tool_call,
)

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
        "seed",  # sampling hints without a Converse field: dropped
        "presence_penalty",
        "frequency_penalty",
        "response_format",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    }
)
_MOST_STOPS = 2500  # Converse's `inferenceConfig.stopSequences` limit (API reference)
_IMAGE_FORMATS = {"image/png": "png", "image/jpeg": "jpeg", "image/gif": "gif", "image/webp": "webp"}
_TOOL_CHOICE: dict[str, dict[str, Any]] = {"auto": {"auto": {}}, "required": {"any": {}}}
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "guardrail_intervened": "content_filter",
    "content_filtered": "content_filter",
}
# The HTTP status each ConverseStream exception stands for (the API reference's).
STREAM_EXCEPTION_STATUS = {
    "internalServerException": 500,
    "modelStreamErrorException": 500,
    "validationException": 400,
    "throttlingException": 429,
    "serviceUnavailableException": 503,
}


def _user_blocks(content: object, param: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for index, part in enumerate(kind(content, list, param)):
        where = f"{param}[{index}]"
        part = chat_part(part, where)
        if part.get("type") == "text":
            if text := kind(part.get("text"), str, f"{where}.text"):
                blocks.append({"text": text})
        elif part.get("type") == "image_url":
            mime, data = image_data(part, where)
            if mime not in _IMAGE_FORMATS:
                refuse(f"{where}.image_url.url")
            blocks.append({"image": {"format": _IMAGE_FORMATS[mime], "source": {"bytes": data}}})
        else:
            refuse(f"{where}.type")
    return blocks


def _assistant_blocks(message: Mapping[str, Any], param: str) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if "content" in message:
        blocks += [{"text": t} for t in texts(message["content"], f"{param}.content") if t]
    if "refusal" in message:
        blocks.append({"text": kind(message["refusal"], str, f"{param}.refusal")})
    for index, call in enumerate(kind(message.get("tool_calls", []), list, f"{param}.tool_calls")):
        where = f"{param}.tool_calls[{index}]"
        call_id, name, raw = chat_tool_call(call, where)
        use = {
            "toolUseId": anthropic_tool_id(call_id),
            "name": name,
            "input": arguments(raw, f"{where}.function.arguments", RequestTranslationError),
        }
        blocks.append({"toolUse": use})
    return blocks


def _tool_result(message: Mapping[str, Any], param: str) -> dict[str, Any]:
    call_id = kind(message.get("tool_call_id"), str, f"{param}.tool_call_id")
    text = "\n\n".join(texts(message.get("content", ""), f"{param}.content"))
    return {"toolResult": {"toolUseId": anthropic_tool_id(call_id), "content": [{"text": text}]}}


def _tool(tool: object, param: str) -> dict[str, Any]:
    function = chat_function(tool, param)
    spec: dict[str, Any] = {"name": kind(function.get("name"), str, f"{param}.function.name")}
    if function.get("description") is not None:
        spec["description"] = kind(function["description"], str, f"{param}.function.description")
    parameters = function.get("parameters")
    schema = (
        {"type": "object", "properties": {}}
        if parameters is None
        else dict(kind(parameters, Mapping, f"{param}.function.parameters"))
    )
    spec["inputSchema"] = {"json": schema}
    if function.get("strict") is not None and kind(function["strict"], bool, f"{param}.function.strict"):
        refuse(f"{param}.function.strict")  # Converse has no strict tool schemas: not enforceable
    return {"toolSpec": spec}


def _tool_choice(choice: object) -> dict[str, Any]:
    if choice is None:
        return _TOOL_CHOICE["auto"]
    if isinstance(choice, str):
        return _TOOL_CHOICE.get(choice) or refuse("tool_choice")
    return {"tool": {"name": chat_named_choice(choice)}}


def chat_to_converse_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Chat Completions body as a Converse body (the model and streaming are in the URL)."""
    if isinstance(body, AnthropicChat) and body.carried:
        refuse(next(iter(body.carried)))
    body = present(body, "body")
    check_fields(body, _TRANSLATED)

    def turn_of(role: str, message: Mapping[str, Any], param: str) -> tuple[str, list[Any]]:
        if role == "user":
            return "user", _user_blocks(message.get("content"), f"{param}.content")
        if role == "assistant":
            return "assistant", _assistant_blocks(message, param)
        return "user", [_tool_result(message, param)]  # Converse carries tool results in user turns

    system_texts, turns = chat_turns(body, "content", turn_of)
    system = [{"text": text} for text in system_texts]
    out: dict[str, Any] = {"messages": turns}
    if system:
        out["system"] = system
    config: dict[str, Any] = {}
    if (limit := max_tokens(body)) is not None:
        config["maxTokens"] = limit
    if "temperature" in body:
        config["temperature"] = in_range(body, "temperature", 0, 1)
    if "top_p" in body:
        config["topP"] = in_range(body, "top_p", 0, 1)
    if "stop" in body:
        config["stopSequences"] = stops(body, _MOST_STOPS)
    if config:
        out["inferenceConfig"] = config
    fmt = body.get("response_format")
    if fmt is not None and dict(kind(fmt, Mapping, "response_format")) != {"type": "text"}:
        refuse("response_format")
    if tools := body.get("tools"):
        out["toolConfig"] = {
            "tools": [_tool(tool, f"tools[{i}]") for i, tool in enumerate(kind(tools, list, "tools"))],
            "toolChoice": _tool_choice(body.get("tool_choice")),
        }
    if body.get("parallel_tool_calls") is False:
        refuse("parallel_tool_calls")  # Converse may call several tools at once: not enforceable
    return out


# ---------------------------------------------------------------------------------------------------
# Answers


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _chat_usage(usage: object) -> dict[str, Any]:
    """Converse's usage on the Chat wire: `inputTokens` excludes the cache reads and writes, Chat's
    prompt includes them; reads are `prompt_tokens_details.cached_tokens`, writes `cache_write_tokens`
    (as OpenRouter reports them), so the ledger prices each at its rate."""
    usage = usage if isinstance(usage, Mapping) else {}
    read, write = _count(usage.get("cacheReadInputTokens")), _count(usage.get("cacheWriteInputTokens"))
    prompt = _count(usage.get("inputTokens")) + read + write
    completion = _count(usage.get("outputTokens"))
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if read or write:
        out["prompt_tokens_details"] = {"cached_tokens": read, "cache_write_tokens": write}
    return out


def _finish(stop: object) -> str:
    return _FINISH.get(stop, "stop") if isinstance(stop, str) else "stop"


def _call(block: Mapping[str, Any], index: int) -> dict[str, Any]:
    use = block["toolUse"]
    if not isinstance(use, Mapping) or not isinstance(use.get("name"), str):
        raise ResponseTranslationError(f"output.message.content[{index}].toolUse")
    call_id = use.get("toolUseId") if isinstance(use.get("toolUseId"), str) else f"call_{index}"
    arguments_json = json.dumps(use.get("input", {}), separators=(",", ":"), ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": use["name"], "arguments": arguments_json}}


def converse_to_chat_response(
    payload: Mapping[str, Any], *, model: str, request_id: str = "bedrock", created: int
) -> dict[str, Any]:
    """A Converse answer as a Chat Completions response reporting `model`."""
    output = payload.get("output")
    message = output.get("message") if isinstance(output, Mapping) else None
    content = message.get("content") if isinstance(message, Mapping) else None
    blocks = [b for b in content if isinstance(b, Mapping)] if isinstance(content, list) else []
    text = "".join(b["text"] for b in blocks if isinstance(b.get("text"), str))
    calls = [_call(b, i) for i, b in enumerate(blocks) if "toolUse" in b]
    chat_message: dict[str, Any] = {"role": "assistant", "content": text or None, "refusal": None}
    if calls:
        chat_message["tool_calls"] = calls
    finish = _finish(payload.get("stopReason"))
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": chat_message, "logprobs": None, "finish_reason": finish}],
        "usage": _chat_usage(payload.get("usage")),
    }


def chat_error(name: str | None, status: int | None) -> dict[str, Any]:
    """An AWS error as the Chat wire's: the exception's name as the type (a credential refusal also
    coded so, SPEC §5.6), the HTTP status; never its message."""
    code = "permission_denied" if name in CREDENTIAL_EXCEPTIONS else None
    out: dict[str, Any] = {"error": {"type": name, "code": code}}
    if status is not None:
        out["status"] = status
    return out


# 403s about the account's credential or its access, not the client's request.
CREDENTIAL_EXCEPTIONS = frozenset(
    {
        "AccessDeniedException",
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "ExpiredTokenException",
    }
)


class ConverseToChatStream:
    """Decoded ConverseStream events (`:event-type` or `:exception-type`, JSON payload) in, Chat
    Completions SSE bytes out. One per upstream response."""

    def __init__(self, *, model: str, created: int) -> None:
        self._model = model
        self._created = created
        self._tools: dict[int, int] = {}  # Converse content block index -> Chat tool-call index
        self._ended = False
        self._finish: str | None = None

    @property
    def ended(self) -> bool:
        return self._ended

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        chunk = {
            "id": "chatcmpl-bedrock",
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
        """One decoded frame (`proxy.framing.EventStreamSource`): a block named by its event type, or
        `exception` with `{"type": <the exception's name>}`."""
        try:
            payload = json.loads(block.data) if block.data is not None else None
        except (ValueError, RecursionError):
            payload = None
        if not isinstance(payload, dict):
            return b""
        if block.event == "exception":
            name = payload.get("type")
            return self.exception(name if isinstance(name, str) and name else "internalServerException")
        return self.event(block.event or "", payload)

    def event(self, name: str, payload: Mapping[str, Any]) -> bytes:
        if self._ended:
            return b""
        index = payload.get("contentBlockIndex")
        match name:
            case "messageStart":
                return self._delta({"role": "assistant", "content": ""})
            case "contentBlockStart":
                start = payload.get("start")
                use = start.get("toolUse") if isinstance(start, Mapping) else None
                if not isinstance(use, Mapping) or not isinstance(index, int):
                    return b""
                position = self._tools.setdefault(index, len(self._tools))
                call = {
                    "index": position,
                    "id": use.get("toolUseId"),
                    "type": "function",
                    "function": {"name": use.get("name"), "arguments": ""},
                }
                return self._delta({"tool_calls": [call]})
            case "contentBlockDelta":
                delta = payload.get("delta")
                delta = delta if isinstance(delta, Mapping) else {}
                if isinstance(delta.get("text"), str) and delta["text"]:
                    return self._delta({"content": delta["text"]})
                use = delta.get("toolUse")
                if isinstance(use, Mapping) and isinstance(use.get("input"), str) and index in self._tools:
                    call = {"index": self._tools[index], "function": {"arguments": use["input"]}}
                    return self._delta({"tool_calls": [call]})
                return b""  # reasoning content: no Chat field
            case "messageStop":
                self._finish = _finish(payload.get("stopReason"))
                return self._delta({}, self._finish)
            case "metadata":
                self._ended = True
                return self._chunk([], usage=_chat_usage(payload.get("usage"))) + encode_block(None, "[DONE]")
        return b""

    def exception(self, name: str) -> bytes:
        """An exception frame: the stream ends with a Chat error chunk naming it."""
        self._ended = True
        error = chat_error(name[:1].upper() + name[1:], STREAM_EXCEPTION_STATUS.get(name, 500))
        return encode_block(None, json.dumps(error))

    def finish(self) -> bytes:
        """At EOF: `[DONE]` if the stream said how it ended (usage may never come), else nothing."""
        if self._ended or self._finish is None:
            return b""
        self._ended = True
        return encode_block(None, "[DONE]")
