"""Readers of upstream payloads (what the ledger records of an answer: usage, finish reason, response
id; never content).

Pure: JSON values and `proxy.sse.Block`s in, plain values out. They know every provider's shape at
once; the provider registry is where they belong per provider.
"""

import json

from proxy.sse import Block
from routing.types import AFFINITY_KEY_MAX


def usage(payload: object) -> tuple[int | None, int | None]:
    if not isinstance(payload, dict):
        return None, None
    found = payload.get("usage")
    for holder in ("response", "message"):  # a Responses or Anthropic stream's opening event
        if not isinstance(found, dict) and isinstance(payload.get(holder), dict):
            found = payload[holder].get("usage")
    if not isinstance(found, dict):
        return None, None
    prompt = found.get("prompt_tokens", found.get("input_tokens"))
    completion = found.get("completion_tokens", found.get("output_tokens"))
    if completion is None and isinstance(prompt, int) and found.get("total_tokens") == prompt:
        completion = 0  # an embeddings answer: its whole usage is input, so its cost is known
    return (
        prompt if isinstance(prompt, int) else None,
        completion if isinstance(completion, int) else None,
    )


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
    if isinstance(payload.get("response"), dict):
        payload = payload["response"]
    for holder in (payload, payload.get("delta")):
        if isinstance(holder, dict) and isinstance(holder.get("stop_reason"), str):
            return holder["stop_reason"]
    choices = payload.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reason = choices[0].get("finish_reason")
        return reason if isinstance(reason, str) else None
    details = payload.get("incomplete_details")
    if isinstance(details, dict) and isinstance(details.get("reason"), str):
        return details["reason"]
    return None


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
