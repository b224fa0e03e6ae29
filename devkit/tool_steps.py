"""Multi-step tool turns for the fakes that speak Chat Completions, Responses, Anthropic Messages and Bedrock
Converse,
decided from the request alone as the Gemini fake decides them (devkit.gemini), so one conversation driver
runs on every provider (tests/providers/test_conformance.py).

A fake with `tool_steps` N > 0 answers a request that declares tools (and does not forbid them: Chat's
`tool_choice: "none"`, Messages' `{"type": "none"}`) from its current turn, the messages (a Responses
request's `input` items) after the last user message holding text:
- while the turn holds fewer than N assistant steps with tool calls, by calling every declared tool at once
  (parallel calls), each with the input `{"step": <this step's number>}`;
- then with the text `done: <the last tool result's text>`.
With `tool_steps` 0 (the default), or no tools, the answer is the behaviour's own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class Step:
    """One answer of a tool turn: the calls to make (name, input), or the closing text."""

    calls: tuple[tuple[str, JsonObject], ...] = ()
    text: str | None = None


Decide = Callable[[JsonObject, int], Step | None]  # a wire's rule: (request body, tool_steps) -> its step


def _decide(declared: list[str], steps_taken: int, results: list[str], steps: int) -> Step | None:
    if not declared or steps <= 0:
        return None
    if steps_taken < steps:
        return Step(calls=tuple((name, {"step": steps_taken + 1}) for name in declared))
    return Step(text=f"done: {results[-1]}") if results else None


def _text(content: object) -> str:
    """The text of a string or of a list of text parts."""
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))


def _turn(messages: Iterable[Any], opens: Callable[[JsonObject], bool]) -> list[JsonObject]:
    """The messages after the last one that `opens` a turn (a user's text)."""
    listed = [m for m in messages if isinstance(m, dict)]
    start = 0
    for index, message in enumerate(listed):
        if opens(message):
            start = index + 1
    return listed[start:]


def _blocks(message: JsonObject) -> list[JsonObject]:
    content = message.get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def chat(body: JsonObject, steps: int) -> Step | None:
    """A Chat Completions request's step."""
    if body.get("tool_choice") == "none":
        return None
    declared = [t["function"]["name"] for t in body.get("tools") or [] if isinstance(t.get("function"), dict)]
    turn = _turn(body.get("messages") or [], lambda m: m.get("role") == "user")
    taken = sum(1 for m in turn if m.get("role") == "assistant" and m.get("tool_calls"))
    results = [_text(m.get("content")) for m in turn if m.get("role") == "tool"]
    return _decide(declared, taken, results, steps)


def messages(body: JsonObject, steps: int) -> Step | None:
    """An Anthropic Messages request's step."""
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "none":
        return None
    declared = [t["name"] for t in body.get("tools") or [] if isinstance(t, dict) and "name" in t]

    def opens(message: JsonObject) -> bool:
        has_text = isinstance(message.get("content"), str) or any(
            b.get("type") == "text" for b in _blocks(message)
        )
        return message.get("role") == "user" and has_text

    turn = _turn(body.get("messages") or [], opens)
    taken = sum(
        1
        for m in turn
        if m.get("role") == "assistant" and any(b.get("type") == "tool_use" for b in _blocks(m))
    )
    results = [_text(b.get("content")) for m in turn for b in _blocks(m) if b.get("type") == "tool_result"]
    return _decide(declared, taken, results, steps)


def converse(body: JsonObject, steps: int) -> Step | None:
    """A Bedrock Converse request's step."""
    tools = (body.get("toolConfig") or {}).get("tools") or []
    declared = [
        t["toolSpec"]["name"] for t in tools if isinstance(t, dict) and isinstance(t.get("toolSpec"), dict)
    ]

    def opens(message: JsonObject) -> bool:
        return message.get("role") == "user" and any("text" in b for b in _blocks(message))

    turn = _turn(body.get("messages") or [], opens)
    taken = sum(1 for m in turn if m.get("role") == "assistant" and any("toolUse" in b for b in _blocks(m)))
    results = [
        _text(b["toolResult"].get("content"))
        for m in turn
        for b in _blocks(m)
        if isinstance(b.get("toolResult"), dict)
    ]
    return _decide(declared, taken, results, steps)


def responses(body: JsonObject, steps: int) -> Step | None:
    """A Responses request's step: its `input` items, a step being one run of `function_call` items."""
    if body.get("tool_choice") == "none":
        return None
    declared = [
        t["name"] for t in body.get("tools") or [] if isinstance(t, dict) and t.get("type") == "function"
    ]
    items = body.get("input")

    def opens(item: JsonObject) -> bool:
        content = item.get("content")
        has_text = isinstance(content, str) or any(b.get("type") == "input_text" for b in _blocks(item))
        return item.get("role") == "user" and has_text

    turn = _turn(items if isinstance(items, list) else [], opens)
    calls = [item.get("type") == "function_call" for item in turn]
    taken = sum(1 for n, call in enumerate(calls) if call and (n == 0 or not calls[n - 1]))
    results = [_text(item.get("output")) for item in turn if item.get("type") == "function_call_output"]
    return _decide(declared, taken, results, steps)
