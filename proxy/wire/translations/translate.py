"""Translation between Anthropic Messages and OpenAI Chat Completions: the contract both directions keep,
their typed errors and the helpers they share. The directions are
`proxy.wire.translations.messages_over_chat` (an
Anthropic client on a Chat upstream) and `proxy.wire.translations.chat_over_messages` (a Chat client on an
Anthropic upstream), each with its request, answer and stream translation.

PURE: standard library and `proxy.wire.sse` only, no I/O, no clock. The providers use it when the client's API
and the candidate's differ (`proxy.wire.providers`); same-API routes never come here.

Contract:

- Role separation survives every translation (seed 002). Instructions stay instructions: Anthropic's
  top-level `system` becomes the first Chat `system` message, and Chat `system`/`developer` messages
  become Anthropic's top-level `system` (joined in order). Third-party content stays third-party: an
  Anthropic `tool_result` block becomes a Chat `tool` message and back, its text carried verbatim as
  that message's content. Nothing inside a tool result is ever parsed, re-labelled, split into turns or
  promoted to a user or system turn, whatever it claims to be. Tool calls stay tool calls.
- Request translation is strict. A top-level field is translated, dropped, or refused:
  * dropped only when it is a hint that cannot change what the answer may contain or do (Chat's
    sampling and reasoning hints; Anthropic's caching, latency and capacity tiers): `_CHAT_DROPPED`,
    `_ANTHROPIC_DROPPED`, each an explicit decision of its module's docstring;
  * carried beside the Chat body when the other API has no field for it but the provider's own API
    does (Anthropic `top_k` and `thinking` to Gemini and Bedrock, `messages_over_chat.AnthropicChat`),
    and refused by an upstream that takes Chat as it is;
  * every other field, and any content the other API cannot represent faithfully, raises
    `RequestTranslationError(param)` (SPEC §11: unknown fields get a typed error). A field whose value
    is null is treated as absent. A Chat field with its neutral value (`n: 1`, `logprobs: false`,
    `response_format: {"type": "text"}`, ...) is dropped; any other value of it is refused.
  The same rule holds inside the body (`block_fields`, applied per block type): every key of a content
  block, message, part, tool call, tool and tool choice is carried, dropped as a documented hint
  (`cache_control`, ...), accepted at its neutral value, or refused naming its path, e.g.
  `messages[2].content[0].citations`. The key inventories are the clients' wire types (anthropic-sdk-python
  `types/*_param.py`, in `messages_over_chat`; openai-python `types/chat`, here: `chat_message` and its
  siblings, shared with `proxy.wire.providers.chat_request`). A block of a type the translation does not take
  is refused by its `type` before its keys are read.
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
from collections.abc import Mapping
from typing import Any, NoReturn

from proxy.wire.sse import Block

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


_NO_KEYS: frozenset[str] = frozenset()


def block_fields(
    value: object,
    param: str,
    known: frozenset[str],
    *,
    dropped: frozenset[str] = _NO_KEYS,
    neutral: Mapping[str, object] | None = None,
) -> dict[str, Any]:
    """`value`, a content block, message, tool or part, read strictly: the JSON object without its null
    keys, its `dropped` keys (hints, each a documented decision) and the keys at their `neutral` value;
    any other key not in `known` is refused naming its path, `param.key` (the block-level `_check_fields`)."""
    read: dict[str, Any] = {}
    for key, item in _object(value, param).items():
        if item is None or key in dropped:
            continue
        if (
            neutral is not None
            and key in neutral
            and item == neutral[key]
            and type(item) is type(neutral[key])
        ):
            continue
        if key not in known:
            _refuse(f"{param}.{key}")
        read[key] = item
    return read


# The Chat Completions request shapes (openai-python `types/chat`), read the same way by every translator
# of a Chat request. Refused, because another API cannot carry them: a participant's `name` on a system,
# developer, user or assistant message (the model reads it), an assistant's `audio` and legacy
# `function_call`, and the non-empty `annotations` (web citations) of an assistant message echoed back
# from an answer (the SDK's answer object carries `annotations: []`, the neutral value). Dropped by
# decision: a `tool` message's `name` (legacy; its `tool_call_id` already names the call),
# `prompt_cache_breakpoint` on a part (caching) and an image's `detail` (how many tokens OpenAI spends on
# it; the image itself is carried whole).
_CHAT_MESSAGE_KEYS = {
    "system": frozenset({"role", "content"}),
    "developer": frozenset({"role", "content"}),
    "user": frozenset({"role", "content"}),
    "assistant": frozenset({"role", "content", "refusal", "tool_calls"}),
    "tool": frozenset({"role", "content", "tool_call_id"}),
}
_NO_ANNOTATIONS: Mapping[str, object] = {"annotations": []}
_CHAT_PART_KEYS = {
    "text": frozenset({"type", "text"}),
    "refusal": frozenset({"type", "refusal"}),
    "image_url": frozenset({"type", "image_url"}),
}
CHAT_PART_HINTS = frozenset({"prompt_cache_breakpoint"})
_IMAGE_DETAIL = frozenset({"detail"})


def chat_message(message: object, param: str) -> dict[str, Any]:
    """A Chat message read strictly for its role (an unknown role is the caller's to refuse)."""
    read = _object(message, param)
    role = read.get("role")
    known = _CHAT_MESSAGE_KEYS.get(role) if isinstance(role, str) else None
    if known is None:
        return _present(read)
    dropped = frozenset({"name"}) if role == "tool" else _NO_KEYS
    return block_fields(read, param, known, dropped=dropped, neutral=_NO_ANNOTATIONS)


def chat_part(part: object, param: str) -> dict[str, Any]:
    """A Chat content part read strictly for its type (an unknown type is the caller's to refuse); an
    `image_url` part's image is read too, an image given as a bare URL string kept as it is."""
    read = _object(part, param)
    kind = read.get("type")
    known = _CHAT_PART_KEYS.get(kind) if isinstance(kind, str) else None
    if known is None:
        return _present(read)
    read = block_fields(read, param, known, dropped=CHAT_PART_HINTS)
    if kind == "image_url" and isinstance(read.get("image_url"), Mapping):
        where = f"{param}.image_url"
        read["image_url"] = block_fields(read["image_url"], where, frozenset({"url"}), dropped=_IMAGE_DETAIL)
    return read


def chat_tool_call(call: object, param: str) -> tuple[str, str, object]:
    """A Chat assistant's tool call read strictly: its id, function name and raw arguments."""
    if _object(call, param).get("type", "function") != "function":
        _refuse(f"{param}.type")  # custom (free-form grammar) calls have no counterpart
    read = block_fields(call, param, frozenset({"id", "type", "function"}))
    function = block_fields(read.get("function"), f"{param}.function", frozenset({"name", "arguments"}))
    call_id = _string(read.get("id"), f"{param}.id")
    return call_id, _string(function.get("name"), f"{param}.function.name"), function.get("arguments")


def chat_function(tool: object, param: str) -> dict[str, Any]:
    """The `function` of a Chat tool read strictly; other tool types (custom grammars) are refused."""
    if _object(tool, param).get("type") != "function":
        _refuse(f"{param}.type")
    read = block_fields(tool, param, frozenset({"type", "function"}))
    known = frozenset({"name", "description", "parameters", "strict"})
    return block_fields(read.get("function"), f"{param}.function", known)


def chat_named_choice(choice: object) -> str:
    """The function name of a Chat `tool_choice` object; other forms (allowed_tools, custom) are refused."""
    if _object(choice, "tool_choice").get("type") != "function":
        _refuse("tool_choice.type")
    read = block_fields(choice, "tool_choice", frozenset({"type", "function"}))
    function = block_fields(read.get("function"), "tool_choice.function", frozenset({"name"}))
    return _string(function.get("name"), "tool_choice.function.name")


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


def _text_of_parts(
    content: object, param: str, *, kinds: frozenset[str] = frozenset({"text"}), dropped: frozenset[str]
) -> list[str]:
    """The texts of a string or a list of text parts (Chat) / text blocks (Anthropic), each read strictly
    (`block_fields`) with its API's `dropped` hints."""
    if isinstance(content, str):
        return [content]
    texts = []
    for index, part in enumerate(_array(content, param)):
        kind = _object(part, f"{param}[{index}]").get("type")
        if not isinstance(kind, str) or kind not in kinds:
            _refuse(f"{param}[{index}].type")
        part = block_fields(part, f"{param}[{index}]", frozenset({"type", kind}), dropped=dropped)
        # A refusal part keeps its text under `refusal`.
        texts.append(_string(part.get(kind), f"{param}[{index}].{kind}"))
    return texts


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


# Separate text blocks of one message are separate paragraphs.
_JOIN = "\n\n"


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
    details = details if isinstance(details, Mapping) else {}
    cached = _count(details.get("cached_tokens")) or 0
    written = _count(details.get("cache_write_tokens")) or 0  # OpenRouter's and Bedrock's Chat wire
    # Chat's prompt count includes cached tokens; Anthropic's input count excludes cache reads and writes.
    out = {
        "input_tokens": max(prompt - cached - written, 0),
        "output_tokens": _count(usage.get("completion_tokens")) or 0,
    }
    if cached:
        out["cache_read_input_tokens"] = cached
    if written:
        out["cache_creation_input_tokens"] = written
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
    if cache_read or cache_write:  # writes named as OpenRouter names them, so a Responses client sees them
        out["prompt_tokens_details"] = {"cached_tokens": cache_read}
        if cache_write:
            out["prompt_tokens_details"]["cache_write_tokens"] = cache_write
    return out


def _message_id(chat_id: object) -> str:
    return f"msg_{anthropic_tool_id(chat_id)}" if isinstance(chat_id, str) and chat_id else "msg_gateway"


def _chat_id(message_id: object) -> str:
    return f"chatcmpl-{message_id}" if isinstance(message_id, str) and message_id else "chatcmpl-gateway"


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
