"""Translation between Anthropic Messages and OpenAI Chat Completions: requests, responses and streams.

PURE: standard library and `proxy.sse` only, no I/O, no clock. The relay calls it when the client's API
and the candidate's adapter differ (Anthropic client -> `openai`/`openrouter` assignment, Chat client ->
`anthropic` assignment); same-API routes never come here.

Contract:

- Role separation survives every translation (seed 002). Instructions stay instructions: Anthropic's
  top-level `system` becomes the first Chat `system` message, and Chat `system`/`developer` messages
  become Anthropic's top-level `system` (joined in order). Third-party content stays third-party: an
  Anthropic `tool_result` block becomes a Chat `tool` message and back, its text carried verbatim as
  that message's content. Nothing inside a tool result is ever parsed, re-labelled, split into turns or
  promoted to a user or system turn, whatever it claims to be. Tool calls stay tool calls.
- Request translation is strict. A top-level field is translated, dropped, or refused:
  * dropped only when it is a hint that cannot change what the answer may contain or do (sampling,
    caching, latency tier, reasoning budget): `_ANTHROPIC_DROPPED`, `_CHAT_DROPPED`;
  * every other field, and any content the other API cannot represent faithfully, raises
    `RequestTranslationError(param)` (SPEC §11: unknown fields get a typed error). A field whose value
    is null is treated as absent. A Chat field with its neutral value (`n: 1`, `logprobs: false`,
    `response_format: {"type": "text"}`, ...) is dropped; any other value of it is refused.
  The translation happens before dispatch, so a refusal sends nothing upstream.
- Decisions, each documented where it is made:
  images inside a tool result are refused for Chat (a Chat `tool` message carries text only; a
  placeholder would silently change the evidence the model acts on, and moving the image to a user turn
  would break role separation); a Chat request without a token limit gets `DEFAULT_MAX_TOKENS` for
  Anthropic (which requires one); a final assistant message is refused in both directions (Anthropic
  continues it as a prefill, Chat answers after it: the two APIs ask different things); Anthropic
  `thinking` blocks in the history are dropped for Chat (their signatures mean nothing there); an
  Anthropic tool result's `is_error` flag has no Chat field and is dropped, its text kept.
- Tool ids become valid Anthropic ids (`[A-Za-z0-9_-]+`) by one deterministic rewrite, applied the same
  way to `tool_calls`, `tool_call_id`, responses and streams, so pairs still match across turns.
- Responses and streams are translated leniently (missing usage reads as 0, unknown content blocks and
  reasoning are dropped) except where a value cannot be carried: a Chat tool call whose arguments are
  not a JSON object raises `ResponseTranslationError`, because Anthropic's `tool_use.input` is an object
  and guessing the input of a tool call (possibly a write) is worse than failing.
- Stream translators take the upstream's SSE blocks (from `SSEParser`) one at a time and return bytes of
  valid SSE in the client's dialect. They never raise on upstream content: error events and non-JSON
  data produce nothing (the relay intercepts terminal failures before translating), SSE comments become
  one keep-alive comment. The closing events are emitted when the upstream's own terminator arrives;
  `finish()` at EOF closes a stream that already reported how it ended, and otherwise returns nothing
  with `ended` False, so the caller sends its own error event instead of a counterfeit success.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from proxy.sse import Block, encode_block

# Anthropic requires `max_tokens`; Chat does not. 4096 is within every Claude model's output limit, so
# the default never makes the upstream reject the request, and it is long enough for an ordinary answer
# or tool call. A client that needs more says so (and then eligibility sees its number too).
DEFAULT_MAX_TOKENS = 4096

# Anthropic's temperature range is [0, 1]; Chat's is [0, 2]. A hotter request is clamped rather than
# refused: it is a sampling preference, not a change to what the answer may contain or do.
_ANTHROPIC_MAX_TEMPERATURE = 1.0

_KEEP_ALIVE = b": keep-alive\n\n"
_DONE = "[DONE]"


# ---------------------------------------------------------------------------------------------------
# Errors


class TranslationError(Exception):
    """A body that cannot be carried faithfully into the other API.

    `param` says where, as a path such as `messages[2].tool_calls[0].function.arguments`; it never holds
    any of the body's content, so it is safe to return to the client and to record.
    """

    def __init__(self, param: str) -> None:
        super().__init__(param)
        self.param = param


class RequestTranslationError(TranslationError):
    """The client's request: answer 400 `invalid_request` with `param`; nothing was dispatched."""


class ResponseTranslationError(TranslationError):
    """The upstream's answer: an upstream failure (its content is never relayed)."""


def _refuse(param: str) -> NoReturn:
    raise RequestTranslationError(param)


# ---------------------------------------------------------------------------------------------------
# Shared helpers


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _present(body: Mapping[str, Any]) -> dict[str, Any]:
    # A null field is absent in both APIs' eyes; dropping it up front keeps the field checks simple.
    return {key: value for key, value in body.items() if value is not None}


def _object(value: object, param: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        _refuse(param)
    return value


def _array(value: object, param: str) -> list[Any]:
    if not isinstance(value, list):
        _refuse(param)
    return value


def _string(value: object, param: str) -> str:
    if not isinstance(value, str):
        _refuse(param)
    return value


def _integer(value: object, param: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        _refuse(param)
    return value


def _number(value: object, param: str) -> float | int:
    if not isinstance(value, int | float) or isinstance(value, bool):
        _refuse(param)
    return value


def _boolean(value: object, param: str) -> bool:
    if not isinstance(value, bool):
        _refuse(param)
    return value


def _check_fields(body: Mapping[str, Any], known: frozenset[str], *, prefix: str = "") -> None:
    for key in body:
        if key not in known:
            _refuse(f"{prefix}{key}")


_ANTHROPIC_ID = re.compile(r"[A-Za-z0-9_-]+")
_ANTHROPIC_ID_BAD = re.compile(r"[^A-Za-z0-9_-]")


def anthropic_tool_id(value: str) -> str:
    """`value` as a valid Anthropic tool-use id; unchanged when it already is one.

    Chat-side ids may hold `.` or `:` (some providers send `functions.name:0`). The rewrite keeps the
    readable part and adds a digest of the original, so two ids differing only in such characters stay
    distinct, and the same id always maps to the same result (tool_use and tool_result still pair).
    """
    if _ANTHROPIC_ID.fullmatch(value):
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:12]
    return f"{_ANTHROPIC_ID_BAD.sub('_', value)}_{digest}"


def _text_of_parts(content: object, param: str, *, kinds: frozenset[str] = frozenset({"text"})) -> list[str]:
    """The texts of a string or a list of text parts (Chat) / text blocks (Anthropic)."""
    if isinstance(content, str):
        return [content]
    texts = []
    for index, part in enumerate(_array(content, param)):
        part = _object(part, f"{param}[{index}]")
        kind = part.get("type")
        if not isinstance(kind, str) or kind not in kinds:
            _refuse(f"{param}[{index}].type")
        # A refusal part keeps its text under `refusal`.
        texts.append(_string(part.get(kind), f"{param}[{index}].{kind}"))
    return texts


# Separate text blocks of one message are separate paragraphs.
_JOIN = "\n\n"


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
    }
)
# Hints: sampling (`top_k` has no Chat counterpart), caching, latency tier, reasoning budget. The answer
# may contain and do the same things without them. Everything else (`container`, `mcp_servers`,
# `context_management`, `inference_geo`, ...) adds tools, data or constraints Chat cannot honour.
_ANTHROPIC_DROPPED = frozenset({"top_k", "thinking", "service_tier", "cache_control", "speed"})
_ANTHROPIC_OUTPUT_CONFIG_DROPPED = frozenset({"effort"})  # `format` is a structured-output contract
_ANTHROPIC_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}
# Assistant history blocks that carry the model's own reasoning, meaningless to another provider.
_ANTHROPIC_REASONING_BLOCKS = frozenset({"thinking", "redacted_thinking"})


def anthropic_to_chat_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages request body as a Chat Completions request body (module docstring)."""
    body = _present(_object(body, "body"))
    _check_fields(body, _ANTHROPIC_TRANSLATED | _ANTHROPIC_DROPPED)
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
    if "output_config" in body:
        config = _present(_object(body["output_config"], "output_config"))
        _check_fields(config, _ANTHROPIC_OUTPUT_CONFIG_DROPPED, prefix="output_config.")
    tools = [
        _anthropic_tool_to_chat(tool, f"tools[{i}]")
        for i, tool in enumerate(_array(body.get("tools", []), "tools"))
    ]
    if tools:
        out["tools"] = tools
        if "tool_choice" in body:
            out.update(_anthropic_tool_choice_to_chat(body["tool_choice"]))
    elif "tool_choice" in body:
        # Chat refuses a tool_choice without tools; with no tools there is no choice to honour.
        _object(body["tool_choice"], "tool_choice")
    if "stream" in body and _boolean(body["stream"], "stream"):
        out["stream"] = True
        # Anthropic streams always report usage; Chat only when asked.
        out["stream_options"] = {"include_usage": True}
    return out


def _anthropic_system_text(content: object, param: str) -> str:
    return _JOIN.join(_text_of_parts(content, param))


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
                parts.append({"type": "text", "text": _string(block.get("text"), f"{where}.text")})
            case "image":
                parts.append(_anthropic_image_to_chat(block, where))
            case "tool_result":
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
    texts = []
    for index, block in enumerate(_array(content, param)):
        block = _object(block, f"{param}[{index}]")
        # An image (or any non-text block) cannot ride in a Chat tool message: refused, see docstring.
        if block.get("type") != "text":
            _refuse(f"{param}[{index}].type")
        texts.append(_string(block.get("text"), f"{param}[{index}].text"))
    return _JOIN.join(texts)


def _anthropic_image_to_chat(block: Mapping[str, Any], param: str) -> dict[str, Any]:
    source = _object(block.get("source"), f"{param}.source")
    match source.get("type"):
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
            texts.append(_string(block.get("text"), f"{where}.text"))
        elif kind == "tool_use":
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
    tool = _object(tool, param)
    if tool.get("type") not in (None, "custom"):
        # Anthropic-defined tools (bash, text editor, web search, computer use...) have no schema here,
        # and server tools run at Anthropic: neither exists on a Chat upstream.
        _refuse(f"{param}.type")
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
    choice = _object(choice, "tool_choice")
    kind = choice.get("type")
    out: dict[str, Any] = {}
    if kind == "tool":
        name = _string(choice.get("name"), "tool_choice.name")
        out["tool_choice"] = {"type": "function", "function": {"name": name}}
    elif isinstance(kind, str) and kind in _ANTHROPIC_TOOL_CHOICE:
        out["tool_choice"] = _ANTHROPIC_TOOL_CHOICE[kind]
    else:
        _refuse("tool_choice.type")
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None and _boolean(disable, "tool_choice.disable_parallel_tool_use") and kind != "none":
        out["parallel_tool_calls"] = False
    return out


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

    system: list[str] = []
    turns: list[tuple[str, list[dict[str, Any]], int]] = []  # role, blocks, index of the last message
    messages = _array(body.get("messages"), "messages")
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        message = _present(_object(message, param))
        role = message.get("role")
        if role in ("system", "developer"):
            # Hoisted to Anthropic's one instruction position, in order. Their place among the turns is
            # lost; their authority is not, and nothing else can reach that position.
            system += [text for text in _text_of_parts(message.get("content"), f"{param}.content") if text]
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
    return out


def _compact(blocks: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    return blocks[0]["text"] if len(blocks) == 1 and blocks[0]["type"] == "text" else blocks


def _chat_user_blocks(message: Mapping[str, Any], param: str) -> list[dict[str, Any]]:
    _check_fields(message, frozenset({"role", "content", "name"}), prefix=f"{param}.")
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for index, part in enumerate(_array(content, f"{param}.content")):
        where = f"{param}.content[{index}]"
        part = _object(part, where)
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
    _check_fields(
        message, frozenset({"role", "content", "name", "tool_calls", "refusal"}), prefix=f"{param}."
    )
    texts: list[str] = []
    if "content" in message:
        kinds = frozenset({"text", "refusal"})
        texts += _text_of_parts(message["content"], f"{param}.content", kinds=kinds)
    if "refusal" in message:
        texts.append(_string(message["refusal"], f"{param}.refusal"))
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text} for text in texts if text]
    for index, call in enumerate(_array(message.get("tool_calls", []), f"{param}.tool_calls")):
        where = f"{param}.tool_calls[{index}]"
        call = _object(call, where)
        if call.get("type", "function") != "function":
            _refuse(f"{where}.type")
        function = _object(call.get("function"), f"{where}.function")
        blocks.append(
            {
                "type": "tool_use",
                "id": anthropic_tool_id(_string(call.get("id"), f"{where}.id")),
                "name": _string(function.get("name"), f"{where}.function.name"),
                "input": _arguments(
                    function.get("arguments"), f"{where}.function.arguments", RequestTranslationError
                ),
            }
        )
    return blocks


def _arguments(value: object, param: str, error: type[TranslationError]) -> dict[str, Any]:
    """Chat's tool-call arguments (a JSON string) as Anthropic's `input` (a JSON object)."""
    if value is None or value == "":
        return {}  # a call of a tool without parameters
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            raise error(param) from None
        if isinstance(parsed, dict):
            return parsed
    raise error(param)


def _chat_tool_result(message: Mapping[str, Any], param: str) -> dict[str, Any]:
    _check_fields(message, frozenset({"role", "content", "tool_call_id", "name"}), prefix=f"{param}.")
    call_id = _string(message.get("tool_call_id"), f"{param}.tool_call_id")
    # Verbatim: whatever the result claims to be, it stays this tool_result block's content.
    text = _JOIN.join(_text_of_parts(message.get("content", ""), f"{param}.content"))
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": anthropic_tool_id(call_id)}
    if text:
        block["content"] = text  # Anthropic refuses an empty text block; an absent content is valid
    return block


def _chat_tool_to_anthropic(tool: object, param: str) -> dict[str, Any]:
    tool = _object(tool, param)
    if tool.get("type") != "function":
        _refuse(f"{param}.type")  # custom (free-form grammar) tools have no Anthropic counterpart
    function = _object(tool.get("function"), f"{param}.function")
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
    choice = _object(choice, "tool_choice")
    if choice.get("type") != "function":
        _refuse("tool_choice.type")  # allowed_tools, custom
    function = _object(choice.get("function"), "tool_choice.function")
    return {"type": "tool", "name": _string(function.get("name"), "tool_choice.function.name")}


# ---------------------------------------------------------------------------------------------------
# Responses (non-streaming)

_CHAT_TO_ANTHROPIC_STOP = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
_ANTHROPIC_TO_CHAT_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _anthropic_stop(finish: object, *, called_tools: bool) -> str:
    stop = _CHAT_TO_ANTHROPIC_STOP.get(finish, "end_turn") if isinstance(finish, str) else "end_turn"
    # Some Chat upstreams report `stop` after tool calls. Anthropic clients run tools only on `tool_use`,
    # so a call reported as a finished turn would be silently skipped.
    return "tool_use" if called_tools and stop == "end_turn" else stop


def _chat_finish(stop: object) -> str:
    return _ANTHROPIC_TO_CHAT_FINISH.get(stop, "stop") if isinstance(stop, str) else "stop"


def _anthropic_usage_from_chat(usage: object) -> dict[str, int]:
    usage = usage if isinstance(usage, Mapping) else {}
    prompt = _count(usage.get("prompt_tokens")) or 0
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, Mapping) else None
    # Chat's prompt count includes cached tokens; Anthropic's input count excludes cache reads.
    out = {
        "input_tokens": max(prompt - (cached or 0), 0),
        "output_tokens": _count(usage.get("completion_tokens")) or 0,
    }
    if cached:
        out["cache_read_input_tokens"] = cached
    return out


def _chat_usage_from_anthropic(usage: Mapping[str, Any]) -> dict[str, Any]:
    cache_read = _count(usage.get("cache_read_input_tokens")) or 0
    cache_write = _count(usage.get("cache_creation_input_tokens")) or 0
    prompt = (_count(usage.get("input_tokens")) or 0) + cache_read + cache_write
    completion = _count(usage.get("output_tokens")) or 0
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cache_read:
        out["prompt_tokens_details"] = {"cached_tokens": cache_read}
    return out


def _message_id(chat_id: object) -> str:
    return f"msg_{anthropic_tool_id(chat_id)}" if isinstance(chat_id, str) and chat_id else "msg_gateway"


def _chat_id(message_id: object) -> str:
    return f"chatcmpl-{message_id}" if isinstance(message_id, str) and message_id else "chatcmpl-gateway"


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


def anthropic_to_chat_response(
    msg_json: Mapping[str, Any], *, model: str, created: int = 0
) -> dict[str, Any]:
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


# ---------------------------------------------------------------------------------------------------
# Streams


def _payload(block: Block) -> dict[str, Any] | None:
    if block.data is None:
        return None
    try:
        payload = json.loads(block.data)
    except (ValueError, RecursionError):
        return None
    return payload if isinstance(payload, dict) else None


class ChatToAnthropicStream:
    """Chat Completions chunks in, Anthropic Messages events out. One per upstream response.

    Chat sends the finish reason, then (when asked) usage, then `[DONE]`; Anthropic puts the stop reason
    and usage in one `message_delta`. So the finish reason closes the open content block at once, and
    `message_delta` + `message_stop` wait for `[DONE]` (or `finish()` at EOF).
    """

    def __init__(self, *, model: str, message_id: str | None = None) -> None:
        self._model = model
        self._message_id = message_id
        self._started = False
        self._ended = False
        self._next_index = 0  # the next Anthropic content block index
        self._open: int | None = None  # the Anthropic index of the open block
        self._text_open = False  # whether the open block is a text block
        self._tools: dict[int, int] = {}  # Chat tool-call index -> Anthropic block index
        self._finish: str | None = None
        self._usage: Mapping[str, Any] | None = None

    @property
    def ended(self) -> bool:
        """Whether `message_stop` has been emitted: the client saw a complete message."""
        return self._ended

    def feed(self, block: Block) -> bytes:
        if self._ended:
            return b""
        if block.data is None:
            return _KEEP_ALIVE if block.comment_only else b""
        if block.data.strip() == _DONE:
            return self._close()
        payload = _payload(block)
        if payload is None or "error" in payload:
            return b""
        out = bytearray(self._start(payload.get("id")))
        if isinstance(payload.get("usage"), Mapping):
            self._usage = payload["usage"]
        choices = payload.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            # The request translation never asks for more than one choice.
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            delta = delta if isinstance(delta, Mapping) else {}
            for name in ("content", "refusal"):
                if isinstance(delta.get(name), str) and delta[name]:
                    out += self._text(delta[name])
            calls = delta.get("tool_calls")
            for call in calls if isinstance(calls, list) else []:
                if isinstance(call, Mapping):
                    out += self._tool(call)
            if isinstance(choice.get("finish_reason"), str):
                self._finish = choice["finish_reason"]
                out += self._close_block()
        return bytes(out)

    def finish(self) -> bytes:
        """At upstream EOF: the closing events if the upstream said how the answer ended, else b""."""
        if self._ended or self._finish is None:
            return b""
        return self._close()

    def _event(self, payload: dict[str, Any]) -> bytes:
        return encode_block(payload["type"], _json(payload))

    def _start(self, chunk_id: object) -> bytes:
        if self._started:
            return b""
        self._started = True
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
        out = self._close_block()
        self._open = self._next_index
        self._next_index += 1
        self._text_open = content_block["type"] == "text"
        return out + self._event(
            {"type": "content_block_start", "index": self._open, "content_block": content_block}
        )

    def _close_block(self) -> bytes:
        if self._open is None:
            return b""
        index, self._open, self._text_open = self._open, None, False
        return self._event({"type": "content_block_stop", "index": index})

    def _text(self, text: str) -> bytes:
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

    def _close(self) -> bytes:
        out = self._start(None) + self._close_block()
        stop = _anthropic_stop(self._finish, called_tools=bool(self._tools))
        usage = _anthropic_usage_from_chat(self._usage)
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": usage,
        }
        self._ended = True
        return out + self._event(delta) + self._event({"type": "message_stop"})


class AnthropicToChatStream:
    """Anthropic Messages events in, Chat Completions chunks out. One per upstream response.

    `include_usage` is the client's `stream_options.include_usage`: the usage chunk (with `choices: []`)
    is sent only when asked, as OpenAI does, because clients that did not ask may not expect it.
    """

    def __init__(self, *, model: str, include_usage: bool, created: int = 0) -> None:
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
