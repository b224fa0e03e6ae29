"""A Chat Completions client on an Anthropic Messages upstream: its request as Messages, the Messages answer
and stream back as Chat.

PURE: standard library and `proxy.wire.sse` only, no I/O, no clock. The contract (role separation, strict
requests, lenient answers, tool ids) is `proxy.wire.translations.translate`'s, and so is the key-by-key
reading of
each Chat message, part, tool call and tool (`chat_message` and its siblings): a participant's `name`, an
assistant's `audio` or `function_call` are refused naming their path.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from proxy.wire.sse import Block, encode_block
from proxy.wire.translations.translate import (
    _DONE,
    _JOIN,
    _KEEP_ALIVE,
    CHAT_PART_HINTS,
    RequestTranslationError,
    ResponseTranslationError,
    _arguments,
    _array,
    _boolean,
    _chat_finish,
    _chat_id,
    _chat_usage_from_anthropic,
    _integer,
    _json,
    _number,
    _object,
    _payload,
    _present,
    _refuse,
    _string,
    _text_of_parts,
    anthropic_tool_id,
    block_fields,
    chat_function,
    chat_message,
    chat_named_choice,
    chat_part,
    chat_tool_call,
)

# Anthropic requires `max_tokens`; Chat does not. 4096 is within every Claude model's output limit, so
# the default never makes the upstream reject the request, and it is long enough for an ordinary answer
# or tool call. A client that needs more says so (and then eligibility sees its number too).
DEFAULT_MAX_TOKENS = 4096

# Anthropic's temperature range is [0, 1]; Chat's is [0, 2]. A hotter request is clamped rather than
# refused: it is a sampling preference, not a change to what the answer may contain or do.
_ANTHROPIC_MAX_TEMPERATURE = 1.0


# ---------------------------------------------------------------------------------------------------
# Chat Completions request -> Anthropic Messages request

_CHAT_TRANSLATED = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "stream",
        "stream_options",
        "temperature",
        "top_p",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "user",
    }
)
# Hints: sampling knobs without an Anthropic counterpart, caching and storage on the OpenAI side,
# latency tier, reasoning effort and verbosity. `store` and `metadata` only ask OpenAI to keep the
# completion: not keeping it is never a privacy regression.
_CHAT_DROPPED = frozenset(
    {
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "service_tier",
        "store",
        "metadata",
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
        "prediction",
        "reasoning_effort",
        "verbosity",
    }
)


def _neutral_response_format(value: object) -> bool:
    return isinstance(value, Mapping) and dict(value) == {"type": "text"}


# Chat fields that clients often send with their default value. Only the default is accepted: any other
# value (several choices, log probabilities, token bans, JSON mode, audio) is an output contract that
# Anthropic cannot honour.
_CHAT_NEUTRAL: Mapping[str, Callable[[object], bool]] = {
    "n": lambda value: value == 1 and not isinstance(value, bool),
    "logprobs": lambda value: value is False,
    "top_logprobs": lambda value: value == 0 and not isinstance(value, bool),
    "logit_bias": lambda value: value == {},
    "response_format": _neutral_response_format,
    "modalities": lambda value: value == ["text"],
    "functions": lambda value: value == [],
}
_OBFUSCATION = frozenset({"include_obfuscation"})
_CHAT_TOOL_CHOICE = {"auto": "auto", "required": "any", "none": "none"}
_DATA_URL = re.compile(r"data:(?P<media_type>[^;,]+);base64,(?P<data>.*)", re.DOTALL)


def chat_to_anthropic_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Chat Completions request body as an Anthropic Messages request body (module docstring)."""
    body = _present(_object(body, "body"))
    for key, value in body.items():
        if key in _CHAT_NEUTRAL:
            if not _CHAT_NEUTRAL[key](value):
                _refuse(key)
        elif key not in _CHAT_TRANSLATED and key not in _CHAT_DROPPED:
            _refuse(key)
    out: dict[str, Any] = {}
    if "model" in body:
        out["model"] = body["model"]

    system, turns = _chat_turns(_array(body.get("messages"), "messages"))
    if system:
        out["system"] = system[0] if len(system) == 1 else [{"type": "text", "text": text} for text in system]
    out["messages"] = [{"role": role, "content": _compact(blocks)} for role, blocks, _ in turns]

    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    out["max_tokens"] = DEFAULT_MAX_TOKENS if limit is None else _integer(limit, name)
    if "stop" in body:
        stop = body["stop"]
        stops = [stop] if isinstance(stop, str) else _array(stop, "stop")
        out["stop_sequences"] = [_string(item, "stop") for item in stops]
    if "temperature" in body:
        out["temperature"] = min(_number(body["temperature"], "temperature"), _ANTHROPIC_MAX_TEMPERATURE)
    if "top_p" in body:
        out["top_p"] = _number(body["top_p"], "top_p")
    if "user" in body:
        out["metadata"] = {"user_id": _string(body["user"], "user")}
    tools = [
        _chat_tool_to_anthropic(tool, f"tools[{i}]")
        for i, tool in enumerate(_array(body.get("tools", []), "tools"))
    ]
    if tools:
        out["tools"] = tools
        choice = _chat_tool_choice_to_anthropic(body.get("tool_choice"))
        parallel = body.get("parallel_tool_calls")
        if parallel is not None and not _boolean(parallel, "parallel_tool_calls"):
            choice = choice or {"type": "auto"}
            if choice["type"] != "none":
                choice["disable_parallel_tool_use"] = True
        if choice is not None:
            out["tool_choice"] = choice
    if "stream" in body and _boolean(body["stream"], "stream"):
        out["stream"] = True
    if "stream_options" in body:
        # The relay reads `include_usage`; `include_obfuscation` pads OpenAI's stream events against
        # length side channels, which an Anthropic stream does not have: dropped.
        options = ("include_usage",)
        block_fields(body["stream_options"], "stream_options", frozenset(options), dropped=_OBFUSCATION)
    return out


def _chat_turns(messages: list[Any]) -> tuple[list[str], list[tuple[str, list[dict[str, Any]], int]]]:
    """Chat's messages as Anthropic's system texts and alternating turns (each a role, its blocks and the
    index of its last message); refused when no turn is left or the last is the assistant's."""
    system: list[str] = []
    turns: list[tuple[str, list[dict[str, Any]], int]] = []  # role, blocks, index of the last message
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        message = chat_message(message, param)
        role = message.get("role")
        if role in ("system", "developer"):
            # Hoisted to Anthropic's one instruction position, in order. Their place among the turns is
            # lost; their authority is not, and nothing else can reach that position.
            texts = _text_of_parts(message.get("content"), f"{param}.content", dropped=CHAT_PART_HINTS)
            system += [text for text in texts if text]
            continue
        if role == "user":
            blocks = _chat_user_blocks(message, param)
        elif role == "assistant":
            blocks = _chat_assistant_blocks(message, param)
        elif role == "tool":
            role, blocks = "user", [_chat_tool_result(message, param)]
        else:
            _refuse(f"{param}.role")  # including the legacy `function` role
        if not blocks:
            continue  # Anthropic refuses empty turns; an empty message says nothing
        if turns and turns[-1][0] == role:
            # Anthropic turns alternate: consecutive tool results (parallel calls) and any user text after
            # them become one user turn, results first as Anthropic requires.
            turns[-1] = (role, turns[-1][1] + blocks, index)
        else:
            turns.append((role, blocks, index))
    if not turns:
        _refuse("messages")
    if turns[-1][0] == "assistant":
        # Anthropic would continue this text as a prefill; Chat asks for an answer after it.
        _refuse(f"messages[{turns[-1][2]}].role")
    return system, turns


def _compact(blocks: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    return blocks[0]["text"] if len(blocks) == 1 and blocks[0]["type"] == "text" else blocks


def _chat_user_blocks(message: Mapping[str, Any], param: str) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for index, part in enumerate(_array(content, f"{param}.content")):
        where = f"{param}.content[{index}]"
        part = chat_part(part, where)
        match part.get("type"):
            case "text":
                text = _string(part.get("text"), f"{where}.text")
                if text:  # Anthropic refuses empty text blocks
                    blocks.append({"type": "text", "text": text})
            case "image_url":
                blocks.append(_chat_image_to_anthropic(part, where))
            case _:  # input_audio, file: nothing Anthropic Messages can take as the same input
                _refuse(f"{where}.type")
    return blocks


def _chat_image_to_anthropic(part: Mapping[str, Any], param: str) -> dict[str, Any]:
    image = part.get("image_url")
    # The SDKs send an object; a bare string URL is the older shorthand some clients still use.
    url = (
        image
        if isinstance(image, str)
        else _string(_object(image, f"{param}.image_url").get("url"), f"{param}.image_url.url")
    )
    if match := _DATA_URL.fullmatch(url):
        source = {"type": "base64", "media_type": match["media_type"], "data": match["data"]}
    elif url.startswith(("https://", "http://")):
        source = {"type": "url", "url": url}
    else:
        _refuse(f"{param}.image_url.url")
    return {"type": "image", "source": source}


def _chat_assistant_blocks(message: Mapping[str, Any], param: str) -> list[dict[str, Any]]:
    texts: list[str] = []
    if "content" in message:
        kinds = frozenset({"text", "refusal"})
        texts += _text_of_parts(message["content"], f"{param}.content", kinds=kinds, dropped=CHAT_PART_HINTS)
    if "refusal" in message:
        texts.append(_string(message["refusal"], f"{param}.refusal"))
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text} for text in texts if text]
    for index, call in enumerate(_array(message.get("tool_calls", []), f"{param}.tool_calls")):
        where = f"{param}.tool_calls[{index}]"
        call_id, name, arguments = chat_tool_call(call, where)
        tool_input = _arguments(arguments, f"{where}.function.arguments", RequestTranslationError)
        blocks.append(
            {"type": "tool_use", "id": anthropic_tool_id(call_id), "name": name, "input": tool_input}
        )
    return blocks


def _chat_tool_result(message: Mapping[str, Any], param: str) -> dict[str, Any]:
    call_id = _string(message.get("tool_call_id"), f"{param}.tool_call_id")
    # Verbatim: whatever the result claims to be, it stays this tool_result block's content.
    text = _JOIN.join(_text_of_parts(message.get("content", ""), f"{param}.content", dropped=CHAT_PART_HINTS))
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": anthropic_tool_id(call_id)}
    if text:
        block["content"] = text  # Anthropic refuses an empty text block; an absent content is valid
    return block


def _chat_tool_to_anthropic(tool: object, param: str) -> dict[str, Any]:
    function = chat_function(tool, param)  # custom (free-form grammar) tools have no Anthropic counterpart
    out: dict[str, Any] = {"name": _string(function.get("name"), f"{param}.function.name")}
    if function.get("description") is not None:
        out["description"] = _string(function["description"], f"{param}.function.description")
    parameters = function.get("parameters")
    # Chat allows omitting parameters (a tool without arguments); Anthropic requires a schema.
    out["input_schema"] = (
        {"type": "object", "properties": {}}
        if parameters is None
        else dict(_object(parameters, f"{param}.function.parameters"))
    )
    if function.get("strict") is not None:
        out["strict"] = _boolean(function["strict"], f"{param}.function.strict")
    return out


def _chat_tool_choice_to_anthropic(choice: object) -> dict[str, Any] | None:
    if choice is None:
        return None
    if isinstance(choice, str):
        if choice not in _CHAT_TOOL_CHOICE:
            _refuse("tool_choice")
        return {"type": _CHAT_TOOL_CHOICE[choice]}
    return {"type": "tool", "name": chat_named_choice(choice)}


def anthropic_to_chat_response(msg_json: Mapping[str, Any], *, model: str, created: int) -> dict[str, Any]:
    """An Anthropic Message as a Chat Completions response reporting `model` (`created`: Unix seconds)."""
    blocks = msg_json.get("content")
    if not isinstance(blocks, list):
        raise ResponseTranslationError("content")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for index, block in enumerate(blocks):
        if not isinstance(block, Mapping):
            raise ResponseTranslationError(f"content[{index}]")
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input"), Mapping):
                raise ResponseTranslationError(f"content[{index}]")
            call_id = block.get("id") if isinstance(block.get("id"), str) else f"call_{index}"
            function = {"name": block["name"], "arguments": _json(block["input"])}
            calls.append({"id": call_id, "type": "function", "function": function})
        # Thinking blocks are the model's reasoning with a signature only Anthropic can verify; Chat has
        # no standard field for them. Other block types come only with server tools, never requested.
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if texts else None,
        "refusal": None,
    }
    if calls:
        message["tool_calls"] = calls
    usage = msg_json.get("usage")
    return {
        "id": _chat_id(msg_json.get("id")),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": _chat_finish(msg_json.get("stop_reason")),
            }
        ],
        "usage": _chat_usage_from_anthropic(usage if isinstance(usage, Mapping) else {}),
    }


class AnthropicToChatStream:
    """Anthropic Messages events in, Chat Completions chunks out. One per upstream response.

    `include_usage` is the client's `stream_options.include_usage`: the usage chunk (with `choices: []`)
    is sent only when asked, as OpenAI does, because clients that did not ask may not expect it.
    `created` (Unix seconds) is every chunk's, as OpenAI gives all chunks of one completion the same.
    """

    def __init__(self, *, model: str, include_usage: bool, created: int) -> None:
        self._model = model
        self._include_usage = include_usage
        self._created = created
        self._id = _chat_id(None)
        self._started = False
        self._ended = False
        self._blocks: dict[int, int | None] = {}  # Anthropic index -> Chat tool-call index (None: text)
        self._tool_count = 0
        self._start_input: dict[int, Mapping[str, Any]] = {}  # tool_use input given whole in its start
        self._stop: str | None = None
        self._usage: dict[str, Any] = {}

    @property
    def ended(self) -> bool:
        """Whether `[DONE]` has been emitted: the client saw a complete completion."""
        return self._ended

    def feed(self, block: Block) -> bytes:
        if self._ended:
            return b""
        if block.data is None:
            return _KEEP_ALIVE if block.comment_only else b""
        payload = _payload(block)
        if payload is None:
            return b""
        kind = payload.get("type") if isinstance(payload.get("type"), str) else block.event
        match kind:
            case "message_start":
                message = payload.get("message")
                message = message if isinstance(message, Mapping) else {}
                self._id = _chat_id(message.get("id"))
                self._take_usage(message.get("usage"))
                return self._role()
            case "content_block_start":
                return self._role() + self._block_start(payload)
            case "content_block_delta":
                return self._role() + self._block_delta(payload)
            case "content_block_stop":
                return self._block_stop(payload)
            case "message_delta":
                delta = payload.get("delta")
                if isinstance(delta, Mapping) and isinstance(delta.get("stop_reason"), str):
                    self._stop = delta["stop_reason"]
                self._take_usage(payload.get("usage"))
                return b""
            case "message_stop":
                return self._close()
            case "ping":
                return _KEEP_ALIVE
        return b""  # `error` is the relay's to handle; unknown events show nothing

    def finish(self) -> bytes:
        """At upstream EOF: the closing chunks if the upstream said how the answer ended, else b""."""
        if self._ended or self._stop is None:
            return b""
        return self._close()

    def _chunk(self, delta: Mapping[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        chunk: dict[str, Any] = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [choice],
        }
        if self._include_usage:
            chunk["usage"] = None  # as OpenAI sends every chunk but the last when usage is requested
        return encode_block(None, _json(chunk))

    def _role(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return self._chunk({"role": "assistant", "content": ""})

    def _take_usage(self, usage: object) -> None:
        if isinstance(usage, Mapping):
            # message_delta counts are cumulative totals: later values replace earlier ones.
            self._usage.update({key: value for key, value in usage.items() if value is not None})

    def _block_start(self, payload: Mapping[str, Any]) -> bytes:
        index = payload.get("index")
        block = payload.get("content_block")
        if not isinstance(index, int) or not isinstance(block, Mapping):
            return b""
        match block.get("type"):
            case "text":
                self._blocks[index] = None
                text = block.get("text")
                return self._chunk({"content": text}) if isinstance(text, str) and text else b""
            case "tool_use":
                position = self._tool_count
                self._tool_count += 1
                self._blocks[index] = position
                tool_input = block.get("input")
                if isinstance(tool_input, Mapping) and tool_input:
                    self._start_input[index] = tool_input
                name = block.get("name") if isinstance(block.get("name"), str) else ""
                call_id = block.get("id") if isinstance(block.get("id"), str) else f"call_{position}"
                call = {
                    "index": position,
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }
                return self._chunk({"tool_calls": [call]})
        return b""  # thinking and other blocks: not carried (see anthropic_to_chat_response)

    def _block_delta(self, payload: Mapping[str, Any]) -> bytes:
        index = payload.get("index")
        delta = payload.get("delta")
        if not isinstance(index, int) or index not in self._blocks or not isinstance(delta, Mapping):
            return b""
        position = self._blocks[index]
        match delta.get("type"):
            case "text_delta" if position is None:
                text = delta.get("text")
                return self._chunk({"content": text}) if isinstance(text, str) and text else b""
            case "input_json_delta" if position is not None:
                self._start_input.pop(index, None)  # the deltas carry the input; the start's is a stub
                fragment = delta.get("partial_json")
                if not isinstance(fragment, str) or not fragment:
                    return b""
                return self._chunk({"tool_calls": [{"index": position, "function": {"arguments": fragment}}]})
        return b""

    def _block_stop(self, payload: Mapping[str, Any]) -> bytes:
        index = payload.get("index")
        position = self._blocks.get(index) if isinstance(index, int) else None
        tool_input = self._start_input.pop(index, None) if isinstance(index, int) else None
        if position is None or tool_input is None:
            return b""
        # Some Anthropic-compatible upstreams send the whole input in the start and no deltas.
        return self._chunk(
            {"tool_calls": [{"index": position, "function": {"arguments": _json(tool_input)}}]}
        )

    def _close(self) -> bytes:
        out = self._role() + self._chunk({}, _chat_finish(self._stop))
        if self._include_usage:
            usage = {
                "id": self._id,
                "object": "chat.completion.chunk",
                "created": self._created,
                "model": self._model,
                "choices": [],
                "usage": _chat_usage_from_anthropic(self._usage),
            }
            out += encode_block(None, _json(usage))
        self._ended = True
        return out + encode_block(None, _DONE)
