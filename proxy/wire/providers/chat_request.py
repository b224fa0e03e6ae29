"""Strict reading of a Chat Completions request for providers whose own API it is translated into
(`gemini_translate`, `bedrock_translate`).

PURE: standard library and `proxy.wire.translations.translate` only.

The field policy is `proxy.wire.translations.translate`'s: a top-level field is translated by the provider,
dropped as a hint that cannot change what the answer may contain or do (`DROPPED`), accepted only at
its neutral value (`NEUTRAL`), or refused with `RequestTranslationError(param)`, `param` naming the field
and never holding any of the body's content. Messages, parts, tool calls and tools are read by the same
block-level rules as every Chat request (`proxy.wire.translations.translate.chat_message` and its siblings):
an
unknown key is refused naming its path, e.g. `messages[2].name`.
"""

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from proxy.wire.translations.translate import RequestTranslationError, chat_message, chat_part

# Hints and OpenAI-side storage/caching: the answer may contain and do the same without them.
DROPPED = frozenset(
    {
        "user",
        "service_tier",
        "store",
        "metadata",
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
        "reasoning_effort",
        "verbosity",
        "stream_options",  # these providers always report usage; the relay decides what the client sees
    }
)
# Fields clients often send at their default: only the default is accepted.
NEUTRAL: Mapping[str, Callable[[object], bool]] = {
    "n": lambda v: v == 1 and not isinstance(v, bool),
    "logprobs": lambda v: v is False,
    "top_logprobs": lambda v: v == 0 and not isinstance(v, bool),
    "logit_bias": lambda v: v == {},
    "modalities": lambda v: v == ["text"],
    "functions": lambda v: v == [],
}
DATA_URL = re.compile(r"data:(?P<mime>[^;,]+);base64,(?P<data>.*)", re.DOTALL)


def refuse(param: str) -> NoReturn:
    raise RequestTranslationError(param)


def kind(value: object, expected: type | tuple[type, ...], param: str) -> Any:
    """`value` when it is of the `expected` JSON type (a bool is never a number), else refused."""
    if not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool):
        refuse(param)
    return value


def present(value: object, param: str) -> dict[str, Any]:
    """A JSON object without its null fields (null is absent in every API's eyes)."""
    return {k: v for k, v in kind(value, Mapping, param).items() if v is not None}


def check_fields(body: Mapping[str, Any], translated: frozenset[str]) -> None:
    for key, value in body.items():
        if key in NEUTRAL:
            if not NEUTRAL[key](value):
                refuse(key)
        elif key not in translated and key not in DROPPED:
            refuse(key)


def texts(content: object, param: str) -> list[str]:
    """The texts of a string or a list of text (or refusal) parts."""
    if isinstance(content, str):
        return [content]
    found = []
    for index, part in enumerate(kind(content, list, param)):
        part = chat_part(part, f"{param}[{index}]")
        if part.get("type") not in ("text", "refusal"):
            refuse(f"{param}[{index}].type")
        found.append(kind(part.get(part["type"]), str, f"{param}[{index}].{part['type']}"))
    return found


# One Chat message as one upstream turn: (role, message, its param) -> (the upstream's role, its items).
TurnOf = Callable[[str, Mapping[str, Any], str], tuple[str, list[Any]]]


def turns(body: Mapping[str, Any], items: str, turn_of: TurnOf) -> tuple[list[str], list[dict[str, Any]]]:
    """The system texts and the turns of a Chat body's `messages`, for an API whose turns alternate
    (Converse, Gemini): `system`/`developer` texts in order; each `user`, `assistant` or `tool` message as
    `turn_of` gives it, a message with no items skipped, and consecutive items of one upstream role joined
    into one turn under `items` (parallel tool results, and text after them, are one user turn). No turn,
    another role, or a final assistant message (the upstream would continue it; Chat asks for an answer
    after it) is refused."""
    system: list[str] = []
    found: list[dict[str, Any]] = []
    last_role = ""
    for index, message in enumerate(kind(body.get("messages"), list, "messages")):
        param = f"messages[{index}]"
        message = chat_message(message, param)
        role = message.get("role")
        if role in ("system", "developer"):
            system += [t for t in texts(message.get("content"), f"{param}.content") if t]
            continue
        if role not in ("user", "assistant", "tool"):
            refuse(f"{param}.role")
        upstream_role, added = turn_of(role, message, param)
        last_role = role
        if not added:
            continue
        if found and found[-1]["role"] == upstream_role:
            found[-1][items] += added
        else:
            found.append({"role": upstream_role, items: added})
    if not found:
        refuse("messages")
    if last_role == "assistant":
        refuse(f"messages[{len(body['messages']) - 1}].role")
    return system, found


def image_data(part: Mapping[str, Any], param: str) -> tuple[str, str]:
    """(media type, base64 data) of an `image_url` part; an image by URL is refused (these providers
    fetch no arbitrary URL, so the same input cannot be given)."""
    image = part.get("image_url")
    url = image if isinstance(image, str) else kind(image, Mapping, f"{param}.image_url").get("url")
    found = DATA_URL.fullmatch(kind(url, str, f"{param}.image_url.url"))
    if found is None:
        refuse(f"{param}.image_url.url")
    return found["mime"], found["data"]


def arguments(value: object, param: str, error: type[Exception]) -> dict[str, Any]:
    """A tool call's arguments (a JSON string) as an object; anything else raises `error(param)`."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            raise error(param) from None
        if isinstance(parsed, dict):
            return parsed
    raise error(param)


def in_range(body: Mapping[str, Any], name: str, low: float, high: float | None = None) -> Any:
    """`body[name]`, a number from `low` to `high` (inclusive; None: unbounded), else refused naming it:
    a value the target API cannot take is refused before dispatch, so another account may carry it and
    the target's own rejection after dispatch keeps meaning what SPEC §5.6 says it means."""
    value = kind(body[name], (int, float), name)
    if value < low or (high is not None and value > high):
        refuse(name)
    return value


def stops(body: Mapping[str, Any], most: int) -> list[str]:
    """The stop sequences, at most `most` of them (the target's limit), else `stop` is refused."""
    value = body["stop"]
    found = [kind(s, str, "stop") for s in ([value] if isinstance(value, str) else kind(value, list, "stop"))]
    return found if len(found) <= most else refuse("stop")


def max_tokens(body: Mapping[str, Any]) -> int | None:
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    if name not in body:
        return None
    limit: int = kind(body[name], int, name)
    return limit if limit > 0 else refuse(name)
