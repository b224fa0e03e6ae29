"""The gateway's own token estimates: a turn's prompt for the context-window gate (SPEC §5.3, every
client API: `prompt_estimate`), and the `count_tokens` answer (SPEC §4) when no Anthropic-shaped account
is eligible: `{"input_tokens": N}` with `x-gateway-token-count: estimated`.

PURE. Method: Claude's tokenizer is not public, so the estimate counts about four UTF-8 bytes of text
per token (English prose and JSON run 3.5 to 4.5), plus the request's framing (3 tokens, and 3 per
message), plus, when tools are offered, the tool-use system prompt Anthropic documents for Claude 4
models (346 tokens, 313 when `tool_choice` forces a tool) and each tool's JSON definition at the same
rate. An image or file part counts at its documented cost (IMAGE_TOKENS, FILE_TOKENS), never by its
size: a base64 image of 600 KB is about 1,600 tokens, not the 150,000 its bytes would say. Another
non-text block (a text document, a tool result's JSON) counts by its JSON size. It is meant to be close
or slightly high, never a provider's exact count: tests/proxy/test_count_tokens.py holds it within 10%
of the counts Anthropic's own documentation shows for its examples.
"""

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

BYTES_PER_TOKEN = 4
FRAMING_TOKENS = 3
PER_MESSAGE_TOKENS = 3
TOOL_SYSTEM_PROMPT_TOKENS = 346  # tool_choice auto / none (Claude 4 models)
TOOL_SYSTEM_PROMPT_FORCED_TOKENS = 313  # tool_choice any / tool
# One image, whatever its size, counted without decoding it: the larger of the providers' documented
# bounds. OpenAI (vision guide, "Calculating costs"): 85 + 170 per 512-px tile of the image scaled to fit
# 2048 x 2048 and then 768 px on its short side, at most 1,445 (8 tiles). Anthropic (vision guide, "Evaluate
# image size"): width x height / 750 of the image it resizes to about 1.15 megapixels, about 1,600.
IMAGE_TOKENS = 1600
# One file (a PDF, or another document a client attaches). Anthropic ("PDF support", "Estimate your
# costs"): each page costs its text, 1,500 to 3,000 tokens, plus the page as an image (IMAGE_TOKENS):
# 4,600 for a page at its densest. The page count is not known without parsing the file, so a file counts
# one such page: counting a long document low lets its upstream judge it (an overflow reaches the client
# in the words its API documents, and agents compact), where counting it by its bytes refused requests
# that fit, with no remedy (SPEC §5.3: never by the base64 length).
FILE_TOKENS = 3000 + IMAGE_TOKENS
IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})  # Chat, Responses, Messages
FILE_PARTS = frozenset({"file", "input_file", "document"})  # Chat, Responses, Messages
# A Messages document whose source is plain text or content blocks is text, and counted as text.
TEXT_SOURCES = frozenset({"text", "content"})


def _text(value: str) -> int:
    return math.ceil(len(value.encode("utf-8")) / BYTES_PER_TOKEN)


def _json(value: object) -> int:
    return _text(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def media_cost(part: Mapping[str, object]) -> int | None:
    """The documented token cost of an image or file part of any client API; None for another part."""
    kind = part.get("type")
    if kind in IMAGE_PARTS:
        return IMAGE_TOKENS
    source = part.get("source")
    if kind in FILE_PARTS and not (isinstance(source, Mapping) and source.get("type") in TEXT_SOURCES):
        return FILE_TOKENS
    return None


@dataclass(frozen=True, slots=True)
class Media:
    """The image and file parts of a request's turns."""

    chars: int = 0  # the characters of their strings (base64 data, URLs): what a body's size overcounts
    tokens: int = 0  # their documented cost
    images: int = 0


_CONTAINERS = (list, dict)


def _string_chars(value: object) -> int:
    total, pending = 0, [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, Mapping):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return total


def media(items: object) -> Media:
    """Every image and file part in `items` (a turn's messages or input), however deeply nested (a
    tool's result, a document's content). Iterative: a client's nesting depth cannot exhaust the stack.
    A body read from JSON holds dicts and lists: tested as such, each value costs a C type check where
    an abstract `Mapping` cost a Python call (every request walks its turns here)."""
    chars = tokens = images = 0
    pending = [items]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            cost = media_cost(item)
            if cost is not None:
                chars, tokens = chars + _string_chars(item), tokens + cost
                images += 1 if item.get("type") in IMAGE_PARTS else 0
                continue
            pending.extend(v for v in item.values() if isinstance(v, _CONTAINERS))
        elif isinstance(item, list):
            pending.extend(v for v in item if isinstance(v, _CONTAINERS))
    return Media(chars, tokens, images)


def prompt_estimate(body_size: int, found: Media) -> int:
    """A turn's prompt tokens for the gate: about four bytes of its JSON per token (deliberately
    generous), its image and file parts at their documented cost rather than by their size."""
    return max(body_size - found.chars, 0) // BYTES_PER_TOKEN + found.tokens


def _content(content: object) -> int:
    if isinstance(content, str):
        return _text(content)
    if not isinstance(content, list):
        return 0
    total = 0
    for block in content:
        if not isinstance(block, Mapping):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            total += _text(block["text"])
        elif (cost := media_cost(block)) is not None:
            total += cost
        elif block.get("type") == "tool_result":
            total += _content(block.get("content"))
        else:
            total += _json(block)
    return total


def estimate_input_tokens(body: Mapping[str, object]) -> int:
    """The estimated input tokens of an Anthropic Messages (count_tokens) body."""
    total = FRAMING_TOKENS + _content(body.get("system"))
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, Mapping):
            total += PER_MESSAGE_TOKENS + _content(message.get("content"))
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        choice = body.get("tool_choice")
        forced = isinstance(choice, Mapping) and choice.get("type") in ("any", "tool")
        total += TOOL_SYSTEM_PROMPT_FORCED_TOKENS if forced else TOOL_SYSTEM_PROMPT_TOKENS
        total += sum(_json(tool) for tool in tools)
    return total
