"""Block-level strictness of request translation (issue 18 point 2): every key of a content block, message,
part, tool call, tool and tool choice is carried, dropped by a documented decision or refused naming its
path, in both directions (Messages -> Chat, Chat -> Messages) and into Gemini and Converse. Pure code."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from proxy.wire.providers.bedrock_translate import chat_to_converse_request
from proxy.wire.providers.gemini_translate import chat_to_gemini_request
from proxy.wire.translations.chat_over_messages import chat_to_anthropic_request
from proxy.wire.translations.messages_over_chat import anthropic_to_chat_request
from proxy.wire.translations.translate import RequestTranslationError

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
PNG = "iVBORw0KGgo="
CACHE = {"type": "ephemeral"}

# ---------------------------------------------------------------------------------------------------
# Anthropic Messages -> Chat


def anthropic_body() -> dict[str, Any]:
    """An Anthropic request touching every block type the translation carries."""
    return {
        "model": "m",
        "max_tokens": 64,
        "system": [{"type": "text", "text": "Be brief."}],
        "tools": [{"name": "read", "description": "Read.", "input_schema": SCHEMA}],
        "tool_choice": {"type": "auto"},
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look."},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Reading."},
                    {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "A"}],
                    }
                ],
            },
        ],
    }


def claude_code_like() -> dict[str, Any]:
    """The same request as Claude Code and the SDK send it: cache breakpoints on blocks and tools, nulls
    where a response block echoed back had nothing, neutral tool-search and caller fields."""
    body = anthropic_body()
    body["system"][0]["cache_control"] = CACHE
    body["tools"][0] |= {"cache_control": CACHE, "defer_loading": False, "eager_input_streaming": True}
    body["tools"][0]["allowed_callers"] = ["direct"]
    user, assistant, results = body["messages"]
    user["content"][0] |= {"cache_control": CACHE, "citations": None}
    user["content"][1]["cache_control"] = CACHE
    assistant["content"][0]["citations"] = None
    assistant["content"][1] |= {"cache_control": CACHE, "caller": {"type": "direct"}}
    results["content"][0] |= {"cache_control": CACHE, "is_error": False}
    results["content"][0]["content"][0]["cache_control"] = CACHE
    return body


def test_anthropic_hints_and_neutral_values_change_nothing() -> None:
    assert anthropic_to_chat_request(claude_code_like()) == anthropic_to_chat_request(anthropic_body())


def _set(path: list[Any], value: object) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        target: Any = body
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value

    return change


CITATION = [{"type": "char_location", "cited_text": "x", "document_index": 0, "start_char_index": 0}]


@pytest.mark.parametrize(
    ("change", "param"),
    [
        (_set(["system", 0, "citations"], CITATION), "system[0].citations"),
        (_set(["messages", 0, "content", 0, "citations"], CITATION), "messages[0].content[0].citations"),
        (_set(["messages", 0, "content", 1, "title"], "t"), "messages[0].content[1].title"),
        (
            _set(["messages", 0, "content", 1, "source", "detail"], "low"),
            "messages[0].content[1].source.detail",
        ),
        (_set(["messages", 1, "content", 0, "citations"], CITATION), "messages[1].content[0].citations"),
        (
            _set(
                ["messages", 1, "content", 1, "caller"], {"type": "code_execution_20250825", "tool_id": "x"}
            ),
            "messages[1].content[1].caller",
        ),
        (_set(["messages", 2, "content", 0, "title"], "t"), "messages[2].content[0].title"),
        (
            _set(["messages", 2, "content", 0, "content", 0, "citations"], CITATION),
            "messages[2].content[0].content[0].citations",
        ),
        (_set(["tools", 0, "input_examples"], [{"path": "a"}]), "tools[0].input_examples"),
        (_set(["tools", 0, "allowed_callers"], ["code_execution_20250825"]), "tools[0].allowed_callers"),
        (_set(["tool_choice", "name"], "read"), "tool_choice.name"),
        (
            _set(["tool_choice"], {"type": "none", "disable_parallel_tool_use": True}),
            "tool_choice.disable_parallel_tool_use",
        ),
    ],
)
def test_anthropic_unknown_block_keys_are_refused_by_path(
    change: Callable[[dict[str, Any]], None], param: str
) -> None:
    body = claude_code_like()
    change(body)
    with pytest.raises(RequestTranslationError) as info:
        anthropic_to_chat_request(body)
    assert info.value.param == param


# ---------------------------------------------------------------------------------------------------
# Chat Completions -> Anthropic Messages, Gemini and Converse: one reading of the Chat shapes


def chat_body() -> dict[str, Any]:
    """A Chat request touching every message, part and tool shape the translations carry."""
    return {
        "model": "m",
        "tools": [{"type": "function", "function": {"name": "read", "parameters": SCHEMA}}],
        "tool_choice": {"type": "function", "function": {"name": "read"}},
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look."},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                ],
            },
            {
                "role": "assistant",
                "content": "Reading.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "read", "arguments": '{"path":"a"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "A"}]},
        ],
    }


def sdk_like() -> dict[str, Any]:
    """The same request with the hints the openai SDK's types allow and nulls for absent keys."""
    body = chat_body()
    _, user, assistant, tool = body["messages"]
    user["content"][0]["prompt_cache_breakpoint"] = {"mode": "explicit"}
    user["content"][1]["image_url"]["detail"] = "high"
    # As the SDK echoes an answer's message back: `annotations: []` and nulls.
    assistant |= {"refusal": None, "audio": None, "function_call": None, "name": None, "annotations": []}
    tool["name"] = "read"  # legacy: the call id already names the call
    return body


TRANSLATORS: dict[str, Callable[[dict[str, Any]], object]] = {
    "anthropic": chat_to_anthropic_request,
    "gemini": chat_to_gemini_request,
    "converse": chat_to_converse_request,
}


@pytest.mark.parametrize("translate", TRANSLATORS.values(), ids=TRANSLATORS.keys())
def test_chat_hints_and_nulls_change_nothing(translate: Callable[[dict[str, Any]], object]) -> None:
    assert translate(sdk_like()) == translate(chat_body())


@pytest.mark.parametrize("translate", TRANSLATORS.values(), ids=TRANSLATORS.keys())
@pytest.mark.parametrize(
    ("change", "param"),
    [
        (_set(["messages", 0, "name"], "boss"), "messages[0].name"),
        (_set(["messages", 0, "content", 0, "cache_control"], CACHE), "messages[0].content[0].cache_control"),
        (_set(["messages", 1, "name"], "alice"), "messages[1].name"),
        (_set(["messages", 1, "content", 0, "extra"], 1), "messages[1].content[0].extra"),
        (_set(["messages", 1, "content", 1, "extra"], 1), "messages[1].content[1].extra"),
        (
            _set(["messages", 1, "content", 1, "image_url", "extra"], 1),
            "messages[1].content[1].image_url.extra",
        ),
        (_set(["messages", 2, "name"], "bot"), "messages[2].name"),
        (_set(["messages", 2, "audio"], {"id": "audio_1"}), "messages[2].audio"),
        (
            _set(["messages", 2, "function_call"], {"name": "read", "arguments": "{}"}),
            "messages[2].function_call",
        ),
        (_set(["messages", 2, "annotations"], [{"type": "url_citation"}]), "messages[2].annotations"),
        (_set(["messages", 2, "tool_calls", 0, "extra"], 1), "messages[2].tool_calls[0].extra"),
        (
            _set(["messages", 2, "tool_calls", 0, "function", "extra"], 1),
            "messages[2].tool_calls[0].function.extra",
        ),
        (_set(["messages", 3, "extra"], 1), "messages[3].extra"),
        (_set(["messages", 3, "content", 0, "extra"], 1), "messages[3].content[0].extra"),
        (_set(["tools", 0, "extra"], 1), "tools[0].extra"),
        (_set(["tools", 0, "function", "extra"], 1), "tools[0].function.extra"),
        (_set(["tool_choice", "extra"], 1), "tool_choice.extra"),
        (_set(["tool_choice", "function", "extra"], 1), "tool_choice.function.extra"),
    ],
)
def test_chat_unknown_block_keys_are_refused_by_path(
    translate: Callable[[dict[str, Any]], object], change: Callable[[dict[str, Any]], None], param: str
) -> None:
    body = copy.deepcopy(sdk_like())
    change(body)
    with pytest.raises(RequestTranslationError) as info:
        translate(body)
    assert info.value.param == param


def test_converse_refuses_strict_tools_it_cannot_enforce() -> None:
    body = chat_body()
    body["tools"][0]["function"]["strict"] = False  # the neutral value
    assert TRANSLATORS["converse"](body) == TRANSLATORS["converse"](chat_body())
    body["tools"][0]["function"]["strict"] = True
    with pytest.raises(RequestTranslationError) as info:
        TRANSLATORS["converse"](body)
    assert info.value.param == "tools[0].function.strict"
    # Carried where the upstream enforces it.
    assert chat_to_anthropic_request(body)["tools"][0]["strict"] is True


def test_nested_request_objects_are_read_strictly_too() -> None:
    # Chat's stream options: the relay reads include_usage; include_obfuscation is a dropped hint.
    streamed = chat_body() | {"stream": True}
    options = {"include_usage": True, "include_obfuscation": False}
    assert chat_to_anthropic_request(streamed | {"stream_options": options}) == chat_to_anthropic_request(
        streamed
    )
    with pytest.raises(RequestTranslationError) as info:
        chat_to_anthropic_request(streamed | {"stream_options": {"include_usage": True, "extra": 1}})
    assert info.value.param == "stream_options.extra"
    # An Anthropic tool choice without tools is still read.
    body = anthropic_body()
    del body["tools"]
    body["tool_choice"] = {"type": "auto", "name": "read"}
    with pytest.raises(RequestTranslationError) as info:
        anthropic_to_chat_request(body)
    assert info.value.param == "tool_choice.name"


def test_gemini_json_schema_keeps_the_schema_and_refuses_what_the_model_would_read() -> None:
    spec = {"name": "answer", "strict": True, "schema": SCHEMA}
    body = chat_body() | {"response_format": {"type": "json_schema", "json_schema": spec}}
    assert chat_to_gemini_request(body)["generationConfig"]["responseJsonSchema"] == SCHEMA
    for change, param in [
        (
            {"json_schema": spec | {"description": "Only the path."}},
            "response_format.json_schema.description",
        ),
        ({"extra": 1}, "response_format.extra"),
    ]:
        with pytest.raises(RequestTranslationError) as info:
            chat_to_gemini_request(body | {"response_format": body["response_format"] | change})
        assert info.value.param == param
