"""proxy/wire/translations/responses_over_chat.py, responses_over_chat_stream.py, responses_over_messages.py
and the
providers that carry Responses through them (anthropic, openai_compatible, gemini, bedrock): requests,
typed refusals named by the client's field, answers and event streams checked against the openai SDK's
own types, and the adversarial fixture (seed 002) through every new pair."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from proxy.wire.providers.registry import CARRIERS, provider
from proxy.wire.sse import Block, SSEParser, encode_block
from proxy.wire.translations.responses_over_chat import responses_to_chat_request
from proxy.wire.translations.responses_over_chat_answer import chat_to_responses_response, echo
from proxy.wire.translations.responses_over_chat_stream import ChatToResponsesStream
from proxy.wire.translations.responses_over_messages import (
    AnthropicToResponsesStream,
    anthropic_to_responses_response,
    responses_to_anthropic_request,
)
from proxy.wire.translations.translate import RequestTranslationError
from routing.policy.route import Target
from routing.policy.types import Requirements
from tests.proxy.test_translate import DELETE_SCHEMA, FORGED, INSTRUCTION, READ_ARGS, READ_SCHEMA

EVENTS = TypeAdapter(ResponseStreamEvent)

# The adversarial fixture (seed 002) in Responses form: an instruction, a write tool, and a function
# output that forges a human turn and role labels.
RESPONSES_ADVERSARIAL: dict[str, Any] = {
    "model": "gpt-test-1",
    "instructions": INSTRUCTION,
    "max_output_tokens": 512,
    "input": [
        {"role": "user", "content": "Tidy up /tmp/notes.txt"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Reading it first."}],
        },
        {"type": "function_call", "call_id": "call_01", "name": "read_file", "arguments": READ_ARGS},
        {"type": "function_call_output", "call_id": "call_01", "output": FORGED},
    ],
    "tools": [
        {"type": "function", "name": "read_file", "description": "Read a file.", "parameters": READ_SCHEMA},
        {"type": "function", "name": "delete_file", "description": "Delete it.", "parameters": DELETE_SCHEMA},
    ],
}
BRIDGED = ("anthropic", "openai_compatible", "gemini", "bedrock")


def call(adapter: str, body: dict[str, Any]):
    target = Target(1, "acct", 1, adapter, "http://127.0.0.1:9/v1", "NO_SUCH_ENV_VAR")
    return provider(adapter).call(
        "/responses", target, body, model="m", requirements=Requirements(), credential="key:secret", created=0
    )


def test_every_chat_or_messages_shaped_provider_carries_responses():
    assert set(BRIDGED) | {"openai", "openrouter", "azure_openai"} <= CARRIERS["/responses"]


def test_a_request_becomes_chat_with_roles_tools_and_limits():
    body = {
        **RESPONSES_ADVERSARIAL,
        "stream": True,
        "temperature": 0.2,
        "tool_choice": {"type": "function", "name": "read_file"},
        "parallel_tool_calls": False,
        "text": {
            "format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True}
        },
        # Hints, dropped: the answer may contain and do the same things without them.
        "reasoning": {"effort": "high", "summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "store": False,
        "metadata": {"team": "a"},
    }
    chat = responses_to_chat_request(body, stream_usage=True).body
    assert chat == {
        "model": "gpt-test-1",
        "messages": [
            {"role": "system", "content": INSTRUCTION},
            {"role": "user", "content": "Tidy up /tmp/notes.txt"},
            {
                "role": "assistant",
                "content": "Reading it first.",
                "tool_calls": [
                    {
                        "id": "call_01",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": READ_ARGS},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_01", "content": FORGED},
        ],
        "max_completion_tokens": 512,
        "temperature": 0.2,
        "tools": [
            {
                "type": "function",
                "function": {"name": "read_file", "description": "Read a file.", "parameters": READ_SCHEMA},
            },
            {
                "type": "function",
                "function": {"name": "delete_file", "description": "Delete it.", "parameters": DELETE_SCHEMA},
            },
        ],
        "tool_choice": {"type": "function", "function": {"name": "read_file"}},
        "parallel_tool_calls": False,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True},
        },
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_images_and_a_string_input_are_carried():
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}
    body = {"input": [{"role": "user", "content": [{"type": "input_text", "text": "what?"}, image]}]}
    assert responses_to_chat_request(body, stream_usage=False).body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
            ],
        }
    ]
    assert responses_to_chat_request({"input": "hi"}, stream_usage=False).body == {
        "messages": [{"role": "user", "content": "hi"}]
    }


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"truncation": "auto"}, "truncation"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"tools": [{"type": "computer_use_preview"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "allowed_tools", "tools": []}}, "tool_choice.type"),
        ({"text": {"format": {"type": "grammar"}}}, "text.format.type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]},
            "input[0].content[0].file_id",
        ),
        (
            {
                "input": [
                    {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}]}
                ]
            },
            "input[0].output[0].type",
        ),
        ({"unknown_field": 1}, "unknown_field"),
    ],
)
@pytest.mark.parametrize("adapter", BRIDGED)
def test_what_cannot_be_carried_is_refused_by_its_responses_name(adapter, change, param):
    with pytest.raises(RequestTranslationError) as refused:
        call(adapter, {"model": "m", "input": "hi", **change})
    assert refused.value.param == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        # Anthropic would continue a final assistant message as a prefill; Responses answers after it.
        (
            {"input": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure,"}]},
            "input[1].role",
        ),
        (
            {
                "input": [
                    {"role": "user", "content": "hi"},
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"},
                    {"type": "function_call_output", "call_id": "c", "output": "ok"},
                ]
            },
            "input[1].arguments",
        ),
        ({"input": "hi", "text": {"format": {"type": "json_object"}}}, "text.format"),
    ],
)
def test_the_messages_step_refuses_by_the_responses_name_too(body, param):
    with pytest.raises(RequestTranslationError) as refused:
        responses_to_anthropic_request(body)
    assert refused.value.param == param


@pytest.mark.parametrize("adapter", BRIDGED)
def test_the_adversarial_fixture_keeps_role_separation_on_every_bridged_provider(adapter):
    sent = call(adapter, RESPONSES_ADVERSARIAL).payload
    text = json.dumps(sent)
    # The forged text is carried once, verbatim, and the instruction once: nothing promoted or flattened.
    assert text.count(json.dumps(FORGED)[1:-1]) == 1 and text.count(INSTRUCTION) == 1
    assert "delete_file" in text
    match adapter:
        case "anthropic":
            assert sent["system"] == INSTRUCTION
            assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
            (result,) = sent["messages"][2]["content"]
            assert (result["type"], result["content"]) == ("tool_result", FORGED)
        case "openai_compatible":
            assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool"]
            assert sent["messages"][3]["content"] == FORGED
        case "gemini":
            assert sent["systemInstruction"] == {"parts": [{"text": INSTRUCTION}]}
            assert [c["role"] for c in sent["contents"]] == ["user", "model", "user"]
            assert sent["contents"][2]["parts"][0]["functionResponse"]["response"] == {"content": FORGED}
        case "bedrock":
            assert sent["system"] == [{"text": INSTRUCTION}]
            assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
            assert sent["messages"][2]["content"][0]["toolResult"]["content"] == [{"text": FORGED}]


# ---------------------------------------------------------------------------------------------------
# Answers

CHAT_ANSWER = {
    "id": "chatcmpl-42",
    "object": "chat.completion",
    "created": 1700000000,
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Reading it.",
                "tool_calls": [
                    {
                        "id": "call_9",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": READ_ARGS},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
}


def test_a_chat_answer_is_a_responses_object_the_sdk_reads():
    answer = chat_to_responses_response(
        CHAT_ANSWER,
        model="m",
        echoed=echo(RESPONSES_ADVERSARIAL),
        created=0,
        response_id="resp_test",
        names={},
    )
    parsed = Response.model_validate(answer)
    assert (parsed.id, parsed.status, parsed.model, parsed.output_text) == (
        "resp_test",
        "completed",
        "m",
        "Reading it.",
    )
    call_item = parsed.output[1]
    assert (call_item.type, call_item.call_id, call_item.name, call_item.arguments) == (
        "function_call",
        "call_9",
        "read_file",
        READ_ARGS,
    )
    assert parsed.usage is not None
    assert (parsed.usage.input_tokens, parsed.usage.output_tokens, parsed.usage.total_tokens) == (12, 5, 17)
    assert [tool.name for tool in parsed.tools] == ["read_file", "delete_file"]  # echoed as sent


@pytest.mark.parametrize(
    ("finish", "reason"), [("length", "max_output_tokens"), ("content_filter", "content_filter")]
)
def test_a_cut_answer_is_incomplete(finish, reason):
    chat = {**CHAT_ANSWER, "choices": [{"index": 0, "message": {"content": "par"}, "finish_reason": finish}]}
    answer = chat_to_responses_response(
        chat, model="m", echoed=echo({}), created=0, response_id="resp_test", names={}
    )
    assert (answer["status"], answer["incomplete_details"]) == ("incomplete", {"reason": reason})
    assert answer["output"][0]["status"] == "incomplete"


def test_an_anthropic_answer_with_a_tool_call_is_a_function_call_item():
    message = {
        "id": "msg_1",
        "type": "message",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "/tmp/x"}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 3, "output_tokens": 4},
    }
    parsed = Response.model_validate(
        anthropic_to_responses_response(
            message, model="m", echoed=echo({}), created=0, response_id="resp_test", names={}
        )
    )
    (item,) = parsed.output
    assert (item.type, item.call_id, json.loads(item.arguments)) == (
        "function_call",
        "toolu_1",
        {"path": "/tmp/x"},
    )
    assert parsed.id == "resp_test"  # the gateway's id, not the upstream's


# ---------------------------------------------------------------------------------------------------
# Streams


def blocks(raw: bytes) -> list[Block]:
    return SSEParser().feed(raw)


def events(out: bytes) -> list[Any]:
    parsed = []
    for block in blocks(out):
        assert block.data is not None
        event = EVENTS.validate_python(json.loads(block.data))
        assert block.event == event.type  # the SSE event name is the event's type
        parsed.append(event)
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    return parsed


def chat_chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return encode_block(None, json.dumps({"id": "chatcmpl-7", "created": 5, "choices": [choice], **extra}))


CHAT_STREAM = b"".join(
    [
        chat_chunk({"role": "assistant", "content": ""}),
        chat_chunk({"content": "Hel"}),
        chat_chunk({"content": "lo"}),
        chat_chunk(
            {"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "read_file", "arguments": ""}}]}
        ),
        chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"path":'}}]}),
        chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"/tmp"}'}}]}),
        chat_chunk({}, "tool_calls"),
        encode_block(
            None,
            json.dumps(
                {"id": "chatcmpl-7", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}
            ),
        ),
        encode_block(None, "[DONE]"),
    ]
)
EXPECTED_TYPES = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.output_item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
    "response.completed",
]


def test_a_chat_stream_is_the_responses_event_sequence():
    translator = ChatToResponsesStream(
        model="m", echoed=echo({}), created=0, response_id="resp_test", names={}
    )
    out = b"".join(translator.feed(block) for block in blocks(CHAT_STREAM))
    parsed = events(out)
    assert [e.type for e in parsed] == EXPECTED_TYPES
    assert translator.ended and translator.response_id == "resp_test"
    final = parsed[-1].response
    assert final.output_text == "Hello"
    assert (final.output[1].call_id, final.output[1].arguments) == ("call_1", '{"path":"/tmp"}')
    assert final.usage is not None and (final.usage.input_tokens, final.usage.output_tokens) == (9, 4)
    assert parsed[12].arguments == '{"path":"/tmp"}'


def test_a_stream_cut_before_its_end_is_never_completed():
    translator = ChatToResponsesStream(
        model="m", echoed=echo({}), created=0, response_id="resp_test", names={}
    )
    out = b"".join(
        translator.feed(block)
        for block in blocks(
            CHAT_STREAM.split(
                b'data: {"id": "chatcmpl-7", "created": 5, "choices": [{"index": 0, "delta": {}'
            )[0]
        )
    )
    assert b"response.completed" not in out + translator.finish() and not translator.ended


def test_a_length_finish_ends_with_response_incomplete_at_eof():
    translator = ChatToResponsesStream(
        model="m", echoed=echo({}), created=0, response_id="resp_test", names={}
    )
    raw = chat_chunk({"content": "par"}) + chat_chunk({}, "length")
    out = b"".join(translator.feed(block) for block in blocks(raw)) + translator.finish()
    final = events(out)[-1]
    assert (final.type, final.response.incomplete_details.reason) == (
        "response.incomplete",
        "max_output_tokens",
    )


def anthropic_event(kind: str, **fields: Any) -> bytes:
    return encode_block(kind, json.dumps({"type": kind, **fields}))


def test_an_anthropic_stream_with_a_tool_call_is_the_responses_event_sequence():
    message = {
        "id": "msg_5",
        "type": "message",
        "role": "assistant",
        "content": [],
        "usage": {"input_tokens": 8},
    }
    raw = b"".join(
        [
            anthropic_event("message_start", message=message),
            anthropic_event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
            anthropic_event("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hello"}),
            anthropic_event("content_block_stop", index=0),
            anthropic_event(
                "content_block_start",
                index=1,
                content_block={"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {}},
            ),
            anthropic_event(
                "content_block_delta", index=1, delta={"type": "input_json_delta", "partial_json": '{"path":'}
            ),
            anthropic_event(
                "content_block_delta", index=1, delta={"type": "input_json_delta", "partial_json": '"/tmp"}'}
            ),
            anthropic_event("content_block_stop", index=1),
            anthropic_event("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 4}),
            anthropic_event("message_stop"),
        ]
    )
    translator = AnthropicToResponsesStream(
        model="m", echoed=echo({}), created=0, response_id="resp_test", names={}
    )
    out = b"".join(translator.feed(block) for block in blocks(raw))
    parsed = events(out)
    # One text delta (the Chat stream above has two), else the same sequence.
    assert [e.type for e in parsed] == EXPECTED_TYPES[:4] + EXPECTED_TYPES[5:]
    final = parsed[-1].response
    assert (final.output_text, final.output[1].call_id, final.output[1].arguments) == (
        "Hello",
        "toolu_1",
        '{"path":"/tmp"}',
    )
    assert final.usage is not None and (final.usage.input_tokens, final.usage.output_tokens) == (8, 4)
    assert translator.ended and translator.response_id == "resp_test"


def test_adversarial_model_output_stays_assistant_output_across_a_continuation():
    forged_call = {
        "id": "call_f",
        "type": "function",
        "function": {"name": "delete_file", "arguments": json.dumps({"path": FORGED})},
    }
    chat = {
        "id": "chatcmpl-adv",
        "choices": [
            {
                "index": 0,
                "message": {"content": FORGED, "tool_calls": [forged_call]},
                "finish_reason": "tool_calls",
            }
        ],
    }
    output = chat_to_responses_response(
        chat, model="m", echoed=echo({}), created=0, response_id="resp_test", names={}
    )["output"]
    assert [(item["type"], item.get("role")) for item in output] == [
        ("message", "assistant"),
        ("function_call", None),
    ]
    assert output[0]["content"][0]["text"] == FORGED and json.loads(output[1]["arguments"]) == {
        "path": FORGED
    }
    # Replayed as the next turn's input (what a client, or the websocket memory, sends back): the text
    # is still the assistant's, the call still a call, and the forged labels never make a turn.
    replay = {
        "input": [
            {"role": "user", "content": "go"},
            *output,
            {"type": "function_call_output", "call_id": "call_f", "output": FORGED},
        ]
    }
    messages = responses_to_chat_request(replay, stream_usage=False).body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["content"] == FORGED and messages[2]["content"] == FORGED
    sent = responses_to_anthropic_request(replay)
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
    assert "system" not in sent
