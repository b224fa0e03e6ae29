"""OpenAI-shaped client APIs (Chat Completions, Responses): the turn's requirements from the body."""

from routing.types import Requirements


def _has_image(value: object) -> bool:
    # Iterative: a client's nesting depth must not be able to exhaust the stack.
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            if item.get("type") in {"image_url", "input_image", "image"}:
                return True
            pending.extend(v for v in item.values() if isinstance(v, list | dict))
        elif isinstance(item, list):
            pending.extend(v for v in item if isinstance(v, list | dict))
    return False


def _max_output(body: dict) -> int:
    for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def turn_requirements(body: dict, body_size: int) -> Requirements:
    """What this Chat Completions or Responses turn needs from any route (SPEC §5.3)."""
    items = body.get("messages") if isinstance(body.get("messages"), list) else body.get("input")
    items = items if isinstance(items, list) else []
    untrusted = any(
        isinstance(item, dict)
        and (item.get("role") == "tool" or item.get("type") in {"function_call_output", "tool_result"})
        for item in items
    )
    return Requirements(
        tools_offered=bool(body.get("tools")),
        untrusted_content=untrusted,
        vision=_has_image(items),
        # About four bytes of JSON per token: a deliberately generous estimate for the gate.
        prompt_tokens=body_size // 4,
        max_output_tokens=_max_output(body),
    )
