"""An Anthropic Messages client on a Chat Completions upstream: its request as Chat, the Chat answer and
stream back as Anthropic Messages.

PURE: standard library and `proxy.wire.sse` only, no I/O, no clock. The contract (role separation, strict
requests, lenient answers, tool ids) is `proxy.wire.translations.translate`'s.

Anthropic fields without a Chat counterpart, each carried, refused or dropped by decision, never lost:

- `top_k` and `thinking` (`{"type": "enabled", "budget_tokens": n}` or `{"type": "adaptive"}`) change
  how the answer is sampled and reasoned. They ride beside the Chat body (`AnthropicChat.carried`, not a
  JSON field a client could send) to the providers whose own API takes them (`gemini_translate`,
  `bedrock_translate`). An OpenAI-shaped upstream (`chat_only`) has no field for `top_k` (refused naming
  it: another account may serve the request); how hard to reason it takes as `reasoning_effort` on its
  reasoning models (`reasoning_model`): `output_config.effort` as given (`max` is `high`, OpenAI's
  highest everywhere), else a thinking budget by its size (below 4,096 tokens `low`, below 16,384
  `medium`, else `high`), `adaptive` leaving the model's own default; on other models both are dropped
  (how hard a model reasons never changes what its answer may contain or do). `thinking: {"type":
  "disabled"}` is the neutral value: dropped; so is `display: "omitted"` (no thinking is shown, which is
  what the bridge does anyway). Any other form of `thinking` (`display: "summarized"`, which asks for
  reasoning these upstreams' answers do not bring back, or another type) is refused naming the field.
  The reasoning is not brought back as thinking blocks: a thinking block carries a signature the
  Anthropic API verifies, and one the gateway made up would fail the client's next turn on an
  `anthropic` account.
- `context_management` edits of type `clear_thinking_*` are dropped: the bridge drops every thinking
  block of the history already, which is all any such edit clears. Any other edit (`clear_tool_uses_*`
  would remove tool results the model would otherwise see) is refused naming its `type`.
- A tool with `defer_loading: true` is left out of the Chat tools: on Anthropic its definition is not
  shown to the model until a tool search loads it, and a Chat upstream has no tool search (a search's
  `tool_reference` result is refused like any block Chat has no place for), so the model sees the same
  tools either way (Claude Code sends a deferred placeholder on every request).
- Dropped by decision, because they change price, latency or capacity and never what the answer may
  contain or do: `cache_control` (top-level and on any block: another provider caches by its own rules),
  `service_tier` and `speed` (Anthropic's capacity tiers: the account's arrangement with its provider,
  not the client's to choose across providers), and `output_config.effort` where no `reasoning_effort`
  takes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.wire.sse import encode_block
from proxy.wire.translations.chat_chunks import ChatChunkReader
from proxy.wire.translations.translate import (
    _JOIN,
    ResponseTranslationError,
    _anthropic_stop,
    _anthropic_usage_from_chat,
    _arguments,
    _array,
    _boolean,
    _check_fields,
    _integer,
    _json,
    _message_id,
    _number,
    _object,
    _present,
    _refuse,
    _string,
    _text_of_parts,
    anthropic_tool_id,
    block_fields,
)

# ---------------------------------------------------------------------------------------------------
# Anthropic Messages request -> Chat Completions request

_ANTHROPIC_TRANSLATED = frozenset(
    {
        "model",
        "messages",
        "system",
        "max_tokens",
        "metadata",
        "stop_sequences",
        "stream",
        "temperature",
        "top_p",
        "tools",
        "tool_choice",
        "output_config",
        "context_management",
    }
)
# Fields without a Chat counterpart, carried beside the Chat body (`AnthropicChat`, module docstring).
_ANTHROPIC_CARRIED = frozenset({"top_k", "thinking"})
# Price, latency and capacity hints, dropped by decision (module docstring). Everything else
# (`container`, `mcp_servers`, `context_management`, `inference_geo`, ...) adds tools, data or
# constraints Chat cannot honour.
_ANTHROPIC_DROPPED = frozenset({"service_tier", "cache_control", "speed"})
_THINKING_TYPES = frozenset({"enabled", "adaptive", "disabled"})
_THINKING_DISPLAY_NEUTRAL: Mapping[str, object] = {"display": "omitted"}
# Anthropic's effort levels as OpenAI's `reasoning_effort` (module docstring); another value is dropped.
_EFFORT = {"low": "low", "medium": "medium", "high": "high", "max": "high"}
_BUDGET_EFFORT = ((4096, "low"), (16384, "medium"))
_CLEARED_BY_THE_BRIDGE = "clear_thinking_"
_ANTHROPIC_OUTPUT_CONFIG_DROPPED = frozenset({"effort"})  # `format` is a structured-output contract
_ANTHROPIC_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}
# Assistant history blocks that carry the model's own reasoning, meaningless to another provider.
_ANTHROPIC_REASONING_BLOCKS = frozenset({"thinking", "redacted_thinking"})
# The keys of each block, tool and tool choice (anthropic-sdk-python `types/*_param.py`), read by
# `block_fields`: carried, dropped as a hint (module docstring) or at a neutral value, else refused naming
# the path. Refused: `citations` on a text block (citations of documents Chat cannot be given), a tool's
# `input_examples` (content Chat has no place for), `defer_loading: true` and `allowed_callers` other
# than direct (tool search and programmatic calling run at Anthropic), a tool use's `caller` other
# than direct.
_ANTHROPIC_HINTS = frozenset({"cache_control"})
_TEXT_KEYS = frozenset({"type", "text"})
_TOOL_KEYS = frozenset({"type", "name", "input_schema", "description", "strict"})
# `eager_input_streaming` only changes how the call's input is streamed, never what it is.
_TOOL_DROPPED = _ANTHROPIC_HINTS | {"eager_input_streaming"}
_TOOL_NEUTRAL: Mapping[str, object] = {"defer_loading": False, "allowed_callers": ["direct"]}
_DIRECT_CALLER: Mapping[str, object] = {"caller": {"type": "direct"}}
_IMAGE_SOURCE_KEYS = {"base64": frozenset({"type", "media_type", "data"}), "url": frozenset({"type", "url"})}
_TOOL_CHOICE_KEYS = {
    "auto": frozenset({"type", "disable_parallel_tool_use"}),
    "any": frozenset({"type", "disable_parallel_tool_use"}),
    "tool": frozenset({"type", "name", "disable_parallel_tool_use"}),
    "none": frozenset({"type"}),
}


class AnthropicChat(dict[str, Any]):
    """A Chat Completions body translated from an Anthropic Messages request, and `carried`: the Anthropic
    fields Chat has no counterpart for (`top_k`, `thinking`, as the client gave them), for a provider whose
    own API takes them; `effort`: how hard the client asked the model to reason, as OpenAI's
    `reasoning_effort` (None: the model's default). A copy (`{**body}`) is a plain Chat body without them:
    an upstream that takes Chat as it is gets `chat_only(body, model)`."""

    def __init__(
        self, body: Mapping[str, Any], carried: Mapping[str, Any], effort: str | None = None
    ) -> None:
        super().__init__(body)
        self.carried = dict(carried)
        self.effort = effort


def reasoning_model(model: str) -> bool:
    """Whether `model` is one of OpenAI's reasoning models, which take `reasoning_effort` (the o-series,
    gpt-5 but its `-chat` variants, gpt-oss; OpenAI's reasoning guide), under any router prefix
    (`openai/gpt-5`). Any other model refuses the field, so it is never sent one."""
    name = model.rsplit("/", 1)[-1].lower()
    family = name.startswith(("o1", "o3", "o4", "gpt-5", "gpt-oss"))
    return family and "-chat" not in name


def chat_only(body: Mapping[str, Any], model: str) -> dict[str, Any]:
    """`body` as an OpenAI-shaped upstream serving `model` takes it: `top_k` refused (RequestTranslationError
    naming it), the reasoning asked for as `reasoning_effort` on a reasoning model (module docstring)."""
    if not isinstance(body, AnthropicChat):
        return dict(body)
    if "top_k" in body.carried:
        _refuse("top_k")
    chat = dict(body)
    if body.effort is not None and reasoning_model(model):
        chat["reasoning_effort"] = body.effort
    return chat


def anthropic_to_chat_request(body: Mapping[str, Any]) -> AnthropicChat:
    """An Anthropic Messages request body as a Chat Completions request body (module docstring)."""
    body = _present(_object(body, "body"))
    _check_fields(body, _ANTHROPIC_TRANSLATED | _ANTHROPIC_CARRIED | _ANTHROPIC_DROPPED)
    out: dict[str, Any] = {}
    if "model" in body:
        out["model"] = body["model"]

    messages: list[dict[str, Any]] = []
    if "system" in body:
        system = _anthropic_system_text(body["system"], "system")
        if system:
            # First, before any turn: the instruction position Chat models are trained on.
            messages.append({"role": "system", "content": system})
    turns = _array(body.get("messages"), "messages")
    for index, message in enumerate(turns):
        param = f"messages[{index}]"
        message = _present(_object(message, param))
        _check_fields(message, frozenset({"role", "content"}), prefix=f"{param}.")
        role = message.get("role")
        if role == "user":
            messages += _anthropic_user_to_chat(message.get("content"), param)
        elif role == "assistant":
            if index == len(turns) - 1:
                # An Anthropic prefill: the model continues this text. Chat would answer after it instead.
                _refuse(f"{param}.role")
            messages.append(_anthropic_assistant_to_chat(message.get("content"), param))
        elif role == "system":
            # A system turn inside the conversation keeps its authority and its place.
            text = _anthropic_system_text(message.get("content"), f"{param}.content")
            messages.append({"role": "system", "content": text})
        else:
            _refuse(f"{param}.role")
    out["messages"] = messages

    if "max_tokens" in body:
        out["max_completion_tokens"] = _integer(body["max_tokens"], "max_tokens")
    if "stop_sequences" in body:
        stops = _array(body["stop_sequences"], "stop_sequences")
        out["stop"] = [_string(stop, f"stop_sequences[{i}]") for i, stop in enumerate(stops)]
    for name in ("temperature", "top_p"):
        if name in body:
            out[name] = _number(body[name], name)
    if "metadata" in body:
        metadata = _present(_object(body["metadata"], "metadata"))
        _check_fields(metadata, frozenset({"user_id"}), prefix="metadata.")
        if "user_id" in metadata:
            out["user"] = _string(metadata["user_id"], "metadata.user_id")
    effort = None
    if "output_config" in body:
        config = _present(_object(body["output_config"], "output_config"))
        _check_fields(config, _ANTHROPIC_OUTPUT_CONFIG_DROPPED, prefix="output_config.")
        if "effort" in config:
            effort = _EFFORT.get(_string(config["effort"], "output_config.effort"))
    if "context_management" in body:
        _context_management(body["context_management"])
    tools = [
        _anthropic_tool_to_chat(tool, f"tools[{i}]")
        for i, tool in enumerate(_array(body.get("tools", []), "tools"))
        if _object(tool, f"tools[{i}]").get("defer_loading") is not True
    ]
    if tools:
        out["tools"] = tools
        if "tool_choice" in body:
            out.update(_anthropic_tool_choice_to_chat(body["tool_choice"]))
    elif "tool_choice" in body:
        # Chat refuses a tool_choice without tools; with no tools there is no choice to honour (it is
        # still read, so a malformed one is refused as it would be with tools).
        _anthropic_tool_choice_to_chat(body["tool_choice"])
    if "stream" in body and _boolean(body["stream"], "stream"):
        out["stream"] = True
        # Anthropic streams always report usage; Chat only when asked.
        out["stream_options"] = {"include_usage": True}
    carried = _carried(body)
    if effort is None and "thinking" in carried:
        effort = _thinking_effort(carried["thinking"])
    return AnthropicChat(out, carried, effort)


def _thinking_effort(thinking: Mapping[str, Any]) -> str | None:
    budget = thinking.get("budget_tokens")
    if budget is None:  # adaptive: the model decides, as OpenAI's default effort does
        return None
    return next((effort for below, effort in _BUDGET_EFFORT if budget < below), "high")


def _context_management(value: object) -> None:
    config = _present(_object(value, "context_management"))
    _check_fields(config, frozenset({"edits"}), prefix="context_management.")
    for index, edit in enumerate(_array(config.get("edits", []), "context_management.edits")):
        kind = _object(edit, f"context_management.edits[{index}]").get("type")
        if not isinstance(kind, str) or not kind.startswith(_CLEARED_BY_THE_BRIDGE):
            _refuse(f"context_management.edits[{index}].type")


def _carried(body: Mapping[str, Any]) -> dict[str, Any]:
    carried: dict[str, Any] = {}
    if "top_k" in body:
        carried["top_k"] = _integer(body["top_k"], "top_k")
    if "thinking" in body:
        thinking = _present(_object(body["thinking"], "thinking"))
        kind = thinking.get("type")
        if not isinstance(kind, str) or kind not in _THINKING_TYPES:
            _refuse("thinking.type")
        if kind != "disabled":
            thinking = block_fields(
                thinking, "thinking", frozenset(thinking), neutral=_THINKING_DISPLAY_NEUTRAL
            )
        if kind == "enabled":
            _check_fields(thinking, frozenset({"type", "budget_tokens"}), prefix="thinking.")
            budget = _integer(thinking.get("budget_tokens"), "thinking.budget_tokens")
            carried["thinking"] = {"type": kind, "budget_tokens": budget}
        else:
            _check_fields(thinking, frozenset({"type"}), prefix="thinking.")
            if kind == "adaptive":
                carried["thinking"] = {"type": kind}
    return carried


def _anthropic_system_text(content: object, param: str) -> str:
    return _JOIN.join(_text_of_parts(content, param, dropped=_ANTHROPIC_HINTS))


def _anthropic_user_to_chat(content: object, param: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tool_messages: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for index, block in enumerate(_array(content, f"{param}.content")):
        where = f"{param}.content[{index}]"
        block = _object(block, where)
        match block.get("type"):
            case "text":
                block = block_fields(block, where, _TEXT_KEYS, dropped=_ANTHROPIC_HINTS)
                parts.append({"type": "text", "text": _string(block.get("text"), f"{where}.text")})
            case "image":
                parts.append(_anthropic_image_to_chat(block, where))
            case "tool_result":
                # `is_error` has no Chat field: dropped, the text kept (`translate` docstring).
                known = frozenset({"type", "tool_use_id", "content"})
                block = block_fields(block, where, known, dropped=_ANTHROPIC_HINTS | {"is_error"})
                tool_messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": _string(block.get("tool_use_id"), f"{where}.tool_use_id"),
                        # Verbatim: whatever the result claims to be, it stays this tool message's content.
                        "content": _anthropic_tool_result_text(block.get("content"), f"{where}.content"),
                    }
                )
            case _:
                _refuse(f"{where}.type")
    if not tool_messages and not parts:
        _refuse(f"{param}.content")
    # Chat requires a tool message right after the assistant turn that called the tool, so the results
    # come first; Anthropic also requires them first in the user turn, so no order is lost.
    messages = tool_messages
    if parts:
        single_text = len(parts) == 1 and parts[0]["type"] == "text"
        messages.append({"role": "user", "content": parts[0]["text"] if single_text else parts})
    return messages


def _anthropic_tool_result_text(content: object, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    # An image (or any non-text block) cannot ride in a Chat tool message: refused, see docstring.
    return _JOIN.join(_text_of_parts(content, param, dropped=_ANTHROPIC_HINTS))


def _anthropic_image_to_chat(block: Mapping[str, Any], param: str) -> dict[str, Any]:
    block = block_fields(block, param, frozenset({"type", "source"}), dropped=_ANTHROPIC_HINTS)
    source = _object(block.get("source"), f"{param}.source")
    kind = source.get("type")
    if isinstance(kind, str) and kind in _IMAGE_SOURCE_KEYS:
        source = block_fields(source, f"{param}.source", _IMAGE_SOURCE_KEYS[kind])
    match kind:
        case "base64":
            media_type = _string(source.get("media_type"), f"{param}.source.media_type")
            data = _string(source.get("data"), f"{param}.source.data")
            url = f"data:{media_type};base64,{data}"
        case "url":
            url = _string(source.get("url"), f"{param}.source.url")
        case _:  # `file` (Files API ids) means nothing to another provider
            _refuse(f"{param}.source.type")
    return {"type": "image_url", "image_url": {"url": url}}


def _anthropic_assistant_to_chat(content: object, param: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for index, block in enumerate(_array(content, f"{param}.content")):
        where = f"{param}.content[{index}]"
        block = _object(block, where)
        kind = block.get("type")
        if kind == "text":
            block = block_fields(block, where, _TEXT_KEYS, dropped=_ANTHROPIC_HINTS)
            texts.append(_string(block.get("text"), f"{where}.text"))
        elif kind == "tool_use":
            known = frozenset({"type", "id", "name", "input"})
            block = block_fields(block, where, known, dropped=_ANTHROPIC_HINTS, neutral=_DIRECT_CALLER)
            tool_input = _object(block.get("input"), f"{where}.input")
            function = {"name": _string(block.get("name"), f"{where}.name"), "arguments": _json(tool_input)}
            calls.append(
                {"id": _string(block.get("id"), f"{where}.id"), "type": "function", "function": function}
            )
        elif not isinstance(kind, str) or kind not in _ANTHROPIC_REASONING_BLOCKS:
            _refuse(f"{where}.type")
    message: dict[str, Any] = {"role": "assistant", "content": _JOIN.join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    elif message["content"] is None:
        message["content"] = ""  # only reasoning blocks: Chat needs content or tool calls
    return message


def _anthropic_tool_to_chat(tool: object, param: str) -> dict[str, Any]:
    if _object(tool, param).get("type") not in (None, "custom"):
        # Anthropic-defined tools (bash, text editor, web search, computer use...) have no schema here,
        # and server tools run at Anthropic: neither exists on a Chat upstream.
        _refuse(f"{param}.type")
    tool = block_fields(tool, param, _TOOL_KEYS, dropped=_TOOL_DROPPED, neutral=_TOOL_NEUTRAL)
    function: dict[str, Any] = {
        "name": _string(tool.get("name"), f"{param}.name"),
        "parameters": dict(_object(tool.get("input_schema"), f"{param}.input_schema")),
    }
    if tool.get("description") is not None:
        function["description"] = _string(tool["description"], f"{param}.description")
    if tool.get("strict") is not None:
        function["strict"] = _boolean(tool["strict"], f"{param}.strict")
    return {"type": "function", "function": function}


def _anthropic_tool_choice_to_chat(choice: object) -> dict[str, Any]:
    kind = _object(choice, "tool_choice").get("type")
    if not isinstance(kind, str) or kind not in _TOOL_CHOICE_KEYS:
        _refuse("tool_choice.type")
    choice = block_fields(choice, "tool_choice", _TOOL_CHOICE_KEYS[kind])
    out: dict[str, Any] = {}
    if kind == "tool":
        name = _string(choice.get("name"), "tool_choice.name")
        out["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        out["tool_choice"] = _ANTHROPIC_TOOL_CHOICE[kind]
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None and _boolean(disable, "tool_choice.disable_parallel_tool_use") and kind != "none":
        out["parallel_tool_calls"] = False
    return out


def chat_to_anthropic_response(chat_json: Mapping[str, Any], *, model: str) -> dict[str, Any]:
    """A Chat Completions response as an Anthropic Message reporting `model`."""
    choices = chat_json.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise ResponseTranslationError("choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, Mapping):
        raise ResponseTranslationError("choices[0].message")
    content: list[dict[str, Any]] = []
    text = message.get("content")
    if isinstance(text, list):  # some upstreams answer with text parts
        text = "".join(p["text"] for p in text if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        content.append({"type": "text", "text": refusal})
    calls = message.get("tool_calls")
    for index, call in enumerate(calls if isinstance(calls, list) else []):
        where = f"choices[0].message.tool_calls[{index}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ResponseTranslationError(f"{where}.function")
        call_id = call.get("id")
        content.append(
            {
                "type": "tool_use",
                "id": anthropic_tool_id(call_id)
                if isinstance(call_id, str) and call_id
                else f"toolu_{index}",
                "name": function["name"],
                "input": _arguments(
                    function.get("arguments"), f"{where}.function.arguments", ResponseTranslationError
                ),
            }
        )
    called = any(block["type"] == "tool_use" for block in content)
    return {
        "id": _message_id(chat_json.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _anthropic_stop(choice.get("finish_reason"), called_tools=called),
        "stop_sequence": None,
        "usage": _anthropic_usage_from_chat(chat_json.get("usage")),
    }


class ChatToAnthropicStream(ChatChunkReader):
    """Chat Completions chunks in, Anthropic Messages events out (read by `ChatChunkReader`). One per
    upstream response.

    Chat sends the finish reason, then (when asked) usage, then `[DONE]`; Anthropic puts the stop reason
    and usage in one `message_delta`. So the finish reason closes the open content block at once, and
    `message_delta` + `message_stop` wait for `[DONE]` (or `finish()` at EOF). A refusal is text: a
    Messages answer has no other place for it.
    """

    def __init__(self, *, model: str, message_id: str | None = None) -> None:
        super().__init__()
        self._model = model
        self._message_id = message_id
        self._next_index = 0  # the next Anthropic content block index
        self._open: int | None = None  # the Anthropic index of the open block
        self._text_open = False  # whether the open block is a text block
        self._tools: dict[int, int] = {}  # Chat tool-call index -> Anthropic block index

    def _event(self, payload: dict[str, Any]) -> bytes:
        return encode_block(payload["type"], _json(payload))

    def _opening(self, chunk_id: object) -> bytes:
        if self._message_id is None:
            self._message_id = _message_id(chunk_id)
        message: dict[str, Any] = {
            "id": self._message_id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            # Chat reports usage only at the end; the final message_delta carries it.
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return self._event({"type": "message_start", "message": message})

    def _open_block(self, content_block: dict[str, Any]) -> bytes:
        out = self._closing()
        self._open = self._next_index
        self._next_index += 1
        self._text_open = content_block["type"] == "text"
        return out + self._event(
            {"type": "content_block_start", "index": self._open, "content_block": content_block}
        )

    def _closing(self) -> bytes:
        if self._open is None:
            return b""
        index, self._open, self._text_open = self._open, None, False
        return self._event({"type": "content_block_stop", "index": index})

    def _text(self, kind: str, text: str) -> bytes:
        out = b"" if self._text_open else self._open_block({"type": "text", "text": ""})
        assert self._open is not None
        delta = {"type": "text_delta", "text": text}
        return out + self._event({"type": "content_block_delta", "index": self._open, "delta": delta})

    def _tool(self, call: Mapping[str, Any]) -> bytes:
        position = call.get("index", 0)
        position = position if isinstance(position, int) else 0
        out = b""
        if position not in self._tools:
            function = call.get("function")
            function = function if isinstance(function, Mapping) else {}
            call_id = call.get("id")
            name = function.get("name")
            block = {
                "type": "tool_use",
                "id": anthropic_tool_id(call_id)
                if isinstance(call_id, str) and call_id
                else f"toolu_{position}",
                "name": name if isinstance(name, str) else "",
                "input": {},
            }
            out += self._open_block(block)
            assert self._open is not None
            self._tools[position] = self._open
        function = call.get("function")
        arguments = function.get("arguments") if isinstance(function, Mapping) else None
        if isinstance(arguments, str) and arguments:
            # Fragments go to their call's block even if another block opened since (OpenAI sends calls
            # one after another; SDKs accumulate by index either way).
            delta = {"type": "input_json_delta", "partial_json": arguments}
            out += self._event(
                {"type": "content_block_delta", "index": self._tools[position], "delta": delta}
            )
        return out

    def _ending(self) -> bytes:
        stop = _anthropic_stop(self._finish, called_tools=bool(self._tools))
        usage = _anthropic_usage_from_chat(self._usage)
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": usage,
        }
        return self._event(delta) + self._event({"type": "message_stop"})
