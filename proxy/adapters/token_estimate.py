"""The gateway's own `count_tokens` estimate (SPEC §4), answered when no Anthropic-shaped account is
eligible: `{"input_tokens": N}` with `x-gateway-token-count: estimated`.

PURE. Method: Claude's tokenizer is not public, so the estimate counts about four UTF-8 bytes of text
per token (English prose and JSON run 3.5 to 4.5), plus the request's framing (3 tokens, and 3 per
message), plus, when tools are offered, the tool-use system prompt Anthropic documents for Claude 4
models (346 tokens, 313 when `tool_choice` forces a tool) and each tool's JSON definition at the same
rate. An image counts 1,600 tokens (Anthropic's bound for an image of about 1.15 megapixels); another
non-text block (a document, a tool result's JSON) counts by its JSON size. It is meant to be close or
slightly high, never a provider's exact count: tests/proxy/test_count_tokens.py holds it within 10% of
the counts Anthropic's own documentation shows for its examples.
"""

import json
import math
from collections.abc import Mapping

BYTES_PER_TOKEN = 4
FRAMING_TOKENS = 3
PER_MESSAGE_TOKENS = 3
TOOL_SYSTEM_PROMPT_TOKENS = 346  # tool_choice auto / none (Claude 4 models)
TOOL_SYSTEM_PROMPT_FORCED_TOKENS = 313  # tool_choice any / tool
IMAGE_TOKENS = 1600


def _text(value: str) -> int:
    return math.ceil(len(value.encode("utf-8")) / BYTES_PER_TOKEN)


def _json(value: object) -> int:
    return _text(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


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
        elif block.get("type") == "image":
            total += IMAGE_TOKENS
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
