"""One step of a Chat Completions tool conversation, plain or streamed, as the openai SDK gives it back:
the tool calls (streamed deltas joined by their index) and the text. Shared by the provider tests."""

import openai


def chat_step(
    client: openai.OpenAI, model: str, messages: list, tools: list[dict], stream: bool
) -> tuple[list[dict], str | None]:
    if not stream:
        message = client.chat.completions.create(model=model, messages=messages, tools=tools)
        message = message.choices[0].message
        return [
            c.model_dump(include={"id", "type", "function"}) for c in message.tool_calls or []
        ], message.content
    calls: dict[int, dict] = {}
    text = ""
    for chunk in client.chat.completions.create(model=model, messages=messages, tools=tools, stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        text += (delta.content or "") if delta else ""
        for call in (delta.tool_calls or []) if delta else []:
            slot = calls.setdefault(call.index, {"type": "function", "function": {"arguments": ""}})
            slot["id"] = call.id or slot.get("id")
            slot["function"]["name"] = call.function.name or slot["function"].get("name")
            slot["function"]["arguments"] += call.function.arguments or ""
    return [calls[i] for i in sorted(calls)], text or None
