"""Readers of upstream payloads (what the ledger records of an answer: usage, finish reason, response
id; never content).

Pure: JSON values and `proxy.wire.sse.Block`s in, plain values out. They know every provider's shape at
once; the provider registry is where they belong per provider.
"""

import json
from dataclasses import dataclass

from proxy.wire.sse import Block
from routing.policy.types import AFFINITY_KEY_MAX

COUNT_MAX = 2**31 - 1  # the ledger's integer columns: an upstream's number never breaks its batch


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts an answer (or one stream event) reports; None where it names none.

    `input` is every input token the provider counted, cached or not (OpenAI's `prompt_tokens`,
    Responses' `input_tokens`, Gemini's `promptTokenCount` already include their cached part;
    Anthropic's `input_tokens` excludes cache reads and writes, which are added here), so the column
    means the same whatever the provider. `cached_read` and `cached_write` are parts of `input`."""

    input: int | None = None
    output: int | None = None
    cached_read: int | None = None
    cached_write: int | None = None


NO_USAGE = Usage()


def _count(value: object) -> int | None:
    """An upstream's count, clamped to what the ledger stores: a negative one is 0, a huge one the
    column's maximum; anything but an integer (a bool, a string, a float) is not a count."""
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    return min(max(value, 0), COUNT_MAX)


def _detail(found: dict[str, object], holder: str, name: str) -> int | None:
    details = found.get(holder)
    return _count(details.get(name)) if isinstance(details, dict) else None


def usage(payload: object) -> Usage:
    if not isinstance(payload, dict):
        return NO_USAGE
    found = payload.get("usage")
    for holder in ("response", "message"):  # a Responses or Anthropic stream's opening event
        if not isinstance(found, dict) and isinstance(payload.get(holder), dict):
            found = payload[holder].get("usage")
    if not isinstance(found, dict):
        return NO_USAGE
    if "prompt_tokens" in found or "completion_tokens" in found:  # Chat (and the Chat wire of others)
        prompt, completion = _count(found.get("prompt_tokens")), _count(found.get("completion_tokens"))
        read = _detail(found, "prompt_tokens_details", "cached_tokens")
        write = _detail(found, "prompt_tokens_details", "cache_write_tokens")  # OpenRouter, Bedrock
    else:
        prompt, completion = _count(found.get("input_tokens")), _count(found.get("output_tokens"))
        read = _count(found.get("cache_read_input_tokens"))  # Anthropic
        write = _count(found.get("cache_creation_input_tokens"))
        if read is None and write is None:  # Responses: its input_tokens include the cached part
            read = _detail(found, "input_tokens_details", "cached_tokens")
            write = _detail(found, "input_tokens_details", "cache_write_tokens")
        elif prompt is not None:  # Anthropic's input_tokens exclude cache reads and writes
            prompt = min(prompt + (read or 0) + (write or 0), COUNT_MAX)
    if completion is None and prompt is not None and _count(found.get("total_tokens")) == prompt:
        completion = 0  # an embeddings answer: its whole usage is input, so its cost is known
    return Usage(prompt, completion, read, write)


def usage_only_chunk(block: Block) -> bool:
    """The Chat chunk that carries only usage (`choices: []`), sent because the gateway asked for it."""
    if block.data is None or b'"usage"' not in block.raw or b'"choices"' not in block.raw:
        return False
    try:
        payload = json.loads(block.data)
    except ValueError:
        return False
    return (
        isinstance(payload, dict) and payload.get("choices") == [] and isinstance(payload.get("usage"), dict)
    )


def finish_reason(payload: object) -> str | None:
    """finish_reason (chat), incomplete reason (Responses, plain or in a stream event), stop_reason."""
    if not isinstance(payload, dict):
        return None
    body: dict[str, object] = payload
    inner = body.get("response")
    if isinstance(inner, dict):
        body = inner
    for holder in (body, body.get("delta")):
        stop = holder.get("stop_reason") if isinstance(holder, dict) else None
        if isinstance(stop, str):
            return stop
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reason = choices[0].get("finish_reason")
        return reason if isinstance(reason, str) else None
    details = body.get("incomplete_details")
    why = details.get("reason") if isinstance(details, dict) else None
    return why if isinstance(why, str) else None


def response_id(payload: object) -> str | None:
    """The id of a Responses object, plain (`{"id": "resp_..."}`) or in a stream event's `response`."""
    if not isinstance(payload, dict):
        return None
    inner = payload.get("response")
    source = inner if isinstance(inner, dict) else payload
    if source.get("object") not in (None, "response"):
        return None
    value = source.get("id")
    return value if isinstance(value, str) and 0 < len(value) <= AFFINITY_KEY_MAX else None
