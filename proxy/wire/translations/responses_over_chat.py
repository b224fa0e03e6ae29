"""An OpenAI Responses client on a Chat Completions upstream: its request as Chat here, the Chat answer and
stream back as a Responses `response` object (`proxy.wire.translations.responses_over_chat_answer`) and the
Responses event sequence (`proxy.wire.translations.responses_over_chat_stream`). A Messages-shaped upstream
is reached through Chat (`proxy.wire.translations.chat_over_messages`), so one contract covers both.

PURE: standard library and `proxy.wire.sse` only, no I/O, no clock. The contract (role separation, strict
requests, lenient answers) is `proxy.wire.translations.translate`'s. Decisions of this pair:

- Roles: `instructions` is the first `system` message; `system`/`developer` input messages keep their
  role and place; a `function_call` item is an assistant tool call (consecutive ones are one assistant
  turn), a `function_call_output` item a `tool` message carrying its output verbatim, never promoted to
  a user or system turn. Images inside a function output are refused (as for Chat tool messages).
- Carried: `model`, `input`, `instructions`, `max_output_tokens`, `temperature`, `top_p`, function
  `tools`, `tool_choice`, `parallel_tool_calls`, `text.format` (`json_schema`, `json_object`), `user`,
  `stream`.
- Dropped hints (the answer may contain and do the same things without them): `reasoning` (effort and
  summary: no reasoning items are produced), `reasoning` items in `input` (another provider's signed
  reasoning means nothing here), `include: ["reasoning.encrypted_content"]` (nothing to include),
  `store` and `metadata` (they only ask OpenAI to keep the response; `metadata` is echoed back),
  `client_metadata` (the client's own ids for OpenAI's logs, as `metadata`),
  `service_tier`, `prompt_cache_key`, `prompt_cache_retention`, `safety_identifier`, `text.verbosity`,
  `stream_options`, `truncation: "disabled"`, `background: false`, `top_logprobs: 0`.
- Tools: a `function` tool is a Chat function; the functions of a `namespace` tool are Chat functions
  named `<namespace>__<name>` (Chat has no namespaces; Codex sends one on every request); an
  `additional_tools` input item (tools declared inside the conversation, Codex's code mode) adds its
  tools the same way. A call of such a function comes back as the client declared it (`name` and
  `namespace`, `namespaced`), and a `function_call` input item with a `namespace` is flattened again.
  Hosted tools (`web_search`, `web_search_preview`, `tool_search`, `file_search`, `code_interpreter`,
  `image_generation`, `mcp`) run at OpenAI: they are dropped, so the model answers
  from what it has without looking anything up; choosing one in `tool_choice` is refused. A `custom`
  tool is refused: its call is free text rather than JSON arguments, and a grammar-defined one
  (`format.type: grammar`, Codex's `exec` and `apply_patch`) constrains that text in a way no Chat or
  Messages upstream can enforce, refused naming its `format`.
- Refused (typed 400 naming the field): `previous_response_id` (the gateway keeps no conversation state
  over HTTP; the websocket mode keeps its own connection's, `proxy.ws_relay`), `conversation`, `prompt`,
  `background: true`, `truncation: "auto"`, `max_tool_calls`, `top_logprobs` above 0, any other
  `include`, tools other than `function`, `allowed_tools` and hosted-tool choices, file inputs, image
  file ids, item references, and every field this module does not know.
- Answers: a Chat `length` finish is an `incomplete` response (`max_output_tokens`), `content_filter`
  an `incomplete` one (`content_filter`); text is an `output_text` part, a refusal a `refusal` part,
  each tool call a `function_call` item whose `call_id` is the Chat tool call id. The response id is the
  gateway's (`response_id`, minted per call by `proxy.ledger.exchange.new_response_id`), never derived
  from the upstream's: an upstream that repeats its ids (Bedrock's `chatcmpl-bedrock`, a fallback id)
  must not make two answers one response (issue 45).

A Chat-side refusal of the translated body (a Chat-shaped provider's own translation, or Chat ->
Messages) names a Chat field; `ChatRequest.refusals()` renames it to the Responses field it came from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from proxy.wire.translations.translate import (
    RequestTranslationError,
    _array,
    _boolean,
    _integer,
    _number,
    _object,
    _present,
    _refuse,
    _string,
)

# ---------------------------------------------------------------------------------------------------
# Responses request -> Chat Completions request

_TRANSLATED = frozenset(
    {
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "temperature",
        "top_p",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "text",
        "user",
        "stream",
    }
)
_DROPPED = frozenset(
    {
        "reasoning",
        "store",
        "metadata",
        "service_tier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
        "stream_options",
        "client_metadata",
    }
)
# Tools run by OpenAI (module docstring): dropped.
_HOSTED_TOOLS = frozenset(
    {
        "web_search",
        "web_search_preview",
        "tool_search",
        "file_search",
        "code_interpreter",
        "image_generation",
        "mcp",
    }
)
# Fields accepted only with their neutral value.
_NEUTRAL: Mapping[str, Callable[[object], bool]] = {
    "truncation": lambda value: value == "disabled",
    "background": lambda value: value is False,
    "top_logprobs": lambda value: value == 0 and not isinstance(value, bool),
    "include": lambda value: (
        isinstance(value, list) and all(v == "reasoning.encrypted_content" for v in value)
    ),
}
_TOOL_CHOICE = frozenset({"auto", "none", "required"})
_ITEM_KEYS = frozenset({"type", "id", "status"})  # an output item replayed as input keeps its id and status


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """The Chat body of a Responses request, and where each Chat field came from."""

    body: dict[str, Any]
    # Chat param prefix -> (Responses param, whether the rest of the Chat param is kept after it).
    origins: dict[str, tuple[str, bool]] = field(default_factory=dict)

    def origin(self, param: str) -> str:
        """The Responses field a Chat param `param` came from (the longest known prefix)."""
        best = ""
        for prefix in self.origins:
            if len(prefix) > len(best) and (
                param == prefix or param.startswith((prefix + ".", prefix + "["))
            ):
                best = prefix
        if not best:
            return param
        target, keep_rest = self.origins[best]
        rest = param[len(best) :]
        return target + rest if keep_rest else target

    @contextmanager
    def refusals(self) -> Iterator[None]:
        """A refusal of the translated body, renamed to the client's field."""
        try:
            yield
        except RequestTranslationError as refused:
            raise RequestTranslationError(self.origin(refused.param)) from None


_TOP_ORIGINS = {
    "messages": ("input", False),
    "max_completion_tokens": ("max_output_tokens", False),
    "response_format": ("text.format", False),
    "tool_choice": ("tool_choice", False),
}


def responses_to_chat_request(body: Mapping[str, Any], *, stream_usage: bool) -> ChatRequest:
    """A Responses request body as a Chat Completions request (module docstring). `stream_usage`: a
    stream asks the upstream for usage (`stream_options.include_usage`), which every Responses stream
    reports."""
    body = _present(_object(body, "body"))
    for key, value in body.items():
        if key in _NEUTRAL:
            if not _NEUTRAL[key](value):
                _refuse(key)
        elif key not in _TRANSLATED and key not in _DROPPED:
            _refuse(key)
    request = ChatRequest({}, dict(_TOP_ORIGINS))
    out = request.body
    if "model" in body:
        out["model"] = body["model"]
    messages: list[dict[str, Any]] = []
    if "instructions" in body:
        request.origins["messages[0]"] = ("instructions", False)
        messages.append({"role": "system", "content": _string(body["instructions"], "instructions")})
    declared = _input_to_chat(body.get("input"), messages, request.origins)
    out["messages"] = messages
    if "max_output_tokens" in body:
        out["max_completion_tokens"] = _integer(body["max_output_tokens"], "max_output_tokens")
    for name in ("temperature", "top_p"):
        if name in body:
            out[name] = _number(body[name], name)
    if "user" in body:
        out["user"] = _string(body["user"], "user")
    offered = [(tool, f"tools[{i}]") for i, tool in enumerate(_array(body.get("tools", []), "tools"))]
    chat_tools: list[dict[str, Any]] = []
    for tool, param in offered + declared:
        for function, origin in _tools_to_chat(tool, param):
            request.origins[f"tools[{len(chat_tools)}].function"] = (origin, True)
            chat_tools.append(function)
    if chat_tools:
        out["tools"] = chat_tools
    if "tool_choice" in body:
        out["tool_choice"] = _tool_choice_to_chat(body["tool_choice"])
    if "parallel_tool_calls" in body:
        out["parallel_tool_calls"] = _boolean(body["parallel_tool_calls"], "parallel_tool_calls")
    if "text" in body:
        response_format = _text_to_chat(body["text"])
        if response_format is not None:
            out["response_format"] = response_format
    if "stream" in body and _boolean(body["stream"], "stream"):
        out["stream"] = True
        if stream_usage:
            out["stream_options"] = {"include_usage": True}
    return request


def _input_to_chat(
    value: object, messages: list[dict[str, Any]], origins: dict[str, tuple[str, bool]]
) -> list[tuple[object, str]]:
    """Appends the input's messages; returns the tools its `additional_tools` items declare (with their
    params)."""
    declared: list[tuple[object, str]] = []
    if isinstance(value, str):
        origins[f"messages[{len(messages)}]"] = ("input", False)
        messages.append({"role": "user", "content": value})
        return declared
    items = _array(value, "input")
    if not items:
        _refuse("input")
    for index, item in enumerate(items):
        param = f"input[{index}]"
        item = _present(_object(item, param))
        kind = item.get("type", "message")
        at = f"messages[{len(messages)}]"
        match kind:
            case "message":
                origins[at] = (param, True)
                messages.append(_message_to_chat(item, param))
            case "function_call":
                call = _function_call_to_chat(item, param)
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                    position, at = len(last["tool_calls"]), f"messages[{len(messages) - 1}]"
                    last["tool_calls"].append(call)
                elif last is not None and last["role"] == "assistant":
                    # The text the model said before calling: one assistant turn, as Chat has it.
                    position, at = 0, f"messages[{len(messages) - 1}]"
                    last["tool_calls"] = [call]
                else:
                    position = 0
                    origins[at] = (param, False)
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
                origins[f"{at}.tool_calls[{position}]"] = (param, False)
                origins[f"{at}.tool_calls[{position}].function.arguments"] = (f"{param}.arguments", False)
            case "function_call_output":
                origins[at] = (param, False)
                origins[f"{at}.content"] = (f"{param}.output", False)
                messages.append(_function_output_to_chat(item, param))
            case "reasoning":
                # The model's own reasoning from an earlier turn, signed for its provider: dropped.
                continue
            case "additional_tools":
                _check_keys(item, frozenset({"role", "tools"}), param)
                tools = _array(item.get("tools"), f"{param}.tools")
                declared += [(tool, f"{param}.tools[{i}]") for i, tool in enumerate(tools)]
            case _:
                _refuse(f"{param}.type")
    return declared


def _check_keys(item: Mapping[str, Any], known: frozenset[str], param: str) -> None:
    for key in item:
        if key not in known and key not in _ITEM_KEYS:
            _refuse(f"{param}.{key}")


def _message_to_chat(item: Mapping[str, Any], param: str) -> dict[str, Any]:
    _check_keys(item, frozenset({"role", "content"}), param)
    role = item.get("role")
    content = item.get("content")
    if role not in ("user", "system", "developer", "assistant"):
        _refuse(f"{param}.role")
    if isinstance(content, str):
        return {"role": role, "content": content}
    parts = _array(content, f"{param}.content")
    if role == "assistant":
        texts = []
        for index, part in enumerate(parts):
            where = f"{param}.content[{index}]"
            part = _object(part, where)
            kind = part.get("type")
            if kind not in ("output_text", "refusal", "input_text"):
                _refuse(f"{where}.type")
            texts.append(_string(part.get("refusal" if kind == "refusal" else "text"), f"{where}.{kind}"))
        return {"role": "assistant", "content": "".join(texts)}
    chat_parts = []
    for index, part in enumerate(parts):
        where = f"{param}.content[{index}]"
        part = _object(part, where)
        match part.get("type"):
            case "input_text":
                chat_parts.append({"type": "text", "text": _string(part.get("text"), f"{where}.text")})
            case "input_image" if role == "user":
                chat_parts.append(_image_to_chat(part, where))
            case _:  # input_file, input_audio, images in an instruction: nothing Chat takes the same way
                _refuse(f"{where}.type")
    if role != "user" or (len(chat_parts) == 1 and chat_parts[0]["type"] == "text"):
        text = "".join(part["text"] for part in chat_parts)
        return {"role": role, "content": text}
    return {"role": role, "content": chat_parts}


def _image_to_chat(part: Mapping[str, Any], param: str) -> dict[str, Any]:
    part = _present(part)
    if "file_id" in part:
        _refuse(f"{param}.file_id")  # a Files API id means nothing to another provider
    image: dict[str, Any] = {"url": _string(part.get("image_url"), f"{param}.image_url")}
    if "detail" in part:
        image["detail"] = _string(part["detail"], f"{param}.detail")
    return {"type": "image_url", "image_url": image}


def _function_call_to_chat(item: Mapping[str, Any], param: str) -> dict[str, Any]:
    _check_keys(item, frozenset({"call_id", "name", "namespace", "arguments"}), param)
    name = _string(item.get("name"), f"{param}.name")
    if "namespace" in item:
        name = _flat(_string(item["namespace"], f"{param}.namespace"), name)
    function = {
        "name": name,
        "arguments": _string(item.get("arguments"), f"{param}.arguments"),
    }
    return {"id": _string(item.get("call_id"), f"{param}.call_id"), "type": "function", "function": function}


def _function_output_to_chat(item: Mapping[str, Any], param: str) -> dict[str, Any]:
    _check_keys(item, frozenset({"call_id", "output"}), param)
    output = item.get("output")
    if not isinstance(output, str):
        texts = []
        for index, part in enumerate(_array(output, f"{param}.output")):
            where = f"{param}.output[{index}]"
            part = _object(part, where)
            if part.get("type") != "input_text":  # an image cannot ride in a Chat tool message
                _refuse(f"{where}.type")
            texts.append(_string(part.get("text"), f"{where}.text"))
        output = "".join(texts)
    # Verbatim: whatever the output claims to be, it stays this tool message's content.
    return {
        "role": "tool",
        "tool_call_id": _string(item.get("call_id"), f"{param}.call_id"),
        "content": output,
    }


def _tools_to_chat(tool: object, param: str, namespace: str = "") -> list[tuple[dict[str, Any], str]]:
    """The Chat functions of one Responses tool, each with the param it came from (module docstring)."""
    tool = _present(_object(tool, param))
    kind = tool.get("type")
    if kind in _HOSTED_TOOLS:
        return []
    if kind == "namespace" and not namespace:
        _check_keys(tool, frozenset({"name", "description", "tools"}), param)
        name = _string(tool.get("name"), f"{param}.name")
        inner = _array(tool.get("tools"), f"{param}.tools")
        return [
            found for i, t in enumerate(inner) for found in _tools_to_chat(t, f"{param}.tools[{i}]", name)
        ]
    if (
        kind == "custom"
        and isinstance(tool.get("format"), Mapping)
        and tool["format"].get("type") == "grammar"
    ):
        _refuse(f"{param}.format")
    function = _tool_to_chat(tool, param)
    if namespace:
        function["function"]["name"] = _flat(namespace, function["function"]["name"])
    return [(function, param)]


def _flat(namespace: str, name: str) -> str:
    """A namespaced function's Chat name (module docstring)."""
    return f"{namespace}__{name}"


def namespaced(body: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """The Chat name of each namespaced function a Responses request declares (in `tools` and in its
    `additional_tools` items) -> (namespace, name): how its calls reach the client. `body` is one
    `responses_to_chat_request` took."""
    items = body.get("input")
    declared = [
        tool
        for item in (items if isinstance(items, list) else [])
        if isinstance(item, Mapping) and item.get("type") == "additional_tools"
        for tool in item.get("tools") or []
    ]
    found: dict[str, tuple[str, str]] = {}
    for tool in [*(body.get("tools") or []), *declared]:
        if isinstance(tool, Mapping) and tool.get("type") == "namespace":
            for inner in tool.get("tools") or []:
                if isinstance(inner, Mapping) and isinstance(inner.get("name"), str):
                    found[_flat(tool["name"], inner["name"])] = (tool["name"], inner["name"])
    return found


def _tool_to_chat(tool: Mapping[str, Any], param: str) -> dict[str, Any]:
    if tool.get("type") != "function":
        _refuse(f"{param}.type")
    _check_keys(tool, frozenset({"name", "description", "parameters", "strict"}), param)
    function: dict[str, Any] = {"name": _string(tool.get("name"), f"{param}.name")}
    if "description" in tool:
        function["description"] = _string(tool["description"], f"{param}.description")
    if "parameters" in tool:
        function["parameters"] = dict(_object(tool["parameters"], f"{param}.parameters"))
    if "strict" in tool:
        function["strict"] = _boolean(tool["strict"], f"{param}.strict")
    return {"type": "function", "function": function}


def _tool_choice_to_chat(choice: object) -> str | dict[str, Any]:
    if isinstance(choice, str):
        if choice not in _TOOL_CHOICE:
            _refuse("tool_choice")
        return choice
    choice = _object(choice, "tool_choice")
    if choice.get("type") != "function":
        _refuse("tool_choice.type")  # allowed_tools, hosted tools, custom
    return {"type": "function", "function": {"name": _string(choice.get("name"), "tool_choice.name")}}


def _text_to_chat(text: object) -> dict[str, Any] | None:
    text = _present(_object(text, "text"))
    for key in text:
        if key not in ("format", "verbosity"):
            _refuse(f"text.{key}")
    if "format" not in text:
        return None
    fmt = _present(_object(text["format"], "text.format"))
    match fmt.get("type"):
        case "text":
            return None
        case "json_object":
            return {"type": "json_object"}
        case "json_schema":
            schema: dict[str, Any] = {
                "name": _string(fmt.get("name"), "text.format.name"),
                "schema": dict(_object(fmt.get("schema"), "text.format.schema")),
            }
            if "description" in fmt:
                schema["description"] = _string(fmt["description"], "text.format.description")
            if "strict" in fmt:
                schema["strict"] = _boolean(fmt["strict"], "text.format.strict")
            return {"type": "json_schema", "json_schema": schema}
    _refuse("text.format.type")
