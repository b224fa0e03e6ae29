"""Chat Completions <-> Gemini generateContent translation (proxy.wire.providers.gemini_translate): pure."""

import json

import pytest

from proxy.wire.providers.gemini_translate import (
    GeminiToChatStream,
    chat_error,
    chat_to_gemini_request,
    gemini_to_chat_response,
)
from proxy.wire.sse import SSEParser
from proxy.wire.translations.translate import RequestTranslationError, ResponseTranslationError

USER = {"role": "user", "content": "hi"}
CALL = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"path": "a"}'}}


def test_system_turns_tools_and_generation_settings_are_carried():
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "s1"},
            {"role": "developer", "content": [{"type": "text", "text": "s2"}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}},
                ],
            },
            {"role": "assistant", "content": "ok", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "result text"},
        ],
        "max_completion_tokens": 9,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": "END",
        "seed": 7,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object"}},
        },
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "read",
                    "description": "d",
                    "parameters": {"type": "object"},
                    "strict": True,
                },
            }
        ],
        "tool_choice": "auto",
        "user": "u-1",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    out = chat_to_gemini_request(body)
    assert out["systemInstruction"] == {"parts": [{"text": "s1"}, {"text": "s2"}]}
    assert out["contents"] == [
        {
            "role": "user",
            "parts": [{"text": "look"}, {"inlineData": {"mimeType": "image/png", "data": "QUJD"}}],
        },
        {
            "role": "model",
            "parts": [
                {"text": "ok"},
                # A call no Gemini answer signed (another model's step) carries Google's stand-in signature.
                {
                    "functionCall": {"id": "c1", "name": "read", "args": {"path": "a"}},
                    "thoughtSignature": "skip_thought_signature_validator",
                },
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"id": "c1", "name": "read", "response": {"content": "result text"}}}
            ],
        },
    ]
    assert out["generationConfig"] == {
        "maxOutputTokens": 9,
        "temperature": 0.5,
        "topP": 0.9,
        "seed": 7,
        "stopSequences": ["END"],
        "responseMimeType": "application/json",
        "responseJsonSchema": {"type": "object"},
    }
    assert out["tools"] == [
        {
            "functionDeclarations": [
                {"name": "read", "description": "d", "parametersJsonSchema": {"type": "object"}}
            ]
        }
    ]
    assert out["toolConfig"] == {"functionCallingConfig": {"mode": "VALIDATED"}}


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"logit_bias": {"1": 2}}, "logit_bias"),
        ({"n": 2}, "n"),
        (
            {"parallel_tool_calls": False, "tools": [{"type": "function", "function": {"name": "f"}}]},
            "parallel_tool_calls",
        ),
        ({"audio": {"voice": "x"}}, "audio"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}],
                    }
                ]
            },
            "messages[0].content[0].image_url.url",
        ),
        (
            {"messages": [USER, {"role": "tool", "tool_call_id": "nope", "content": "r"}]},
            "messages[1].tool_call_id",
        ),
        ({"messages": [USER, {"role": "assistant", "content": "prefill"}]}, "messages[1].role"),
        (
            {
                "messages": [
                    USER,
                    {
                        "role": "assistant",
                        "tool_calls": [{**CALL, "function": {"name": "read", "arguments": "[1]"}}],
                    },
                ]
            },
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            {
                "tool_choice": {"type": "allowed_tools"},
                "tools": [{"type": "function", "function": {"name": "f"}}],
            },
            "tool_choice.type",
        ),
    ],
)
def test_what_gemini_cannot_carry_is_refused_naming_the_field(change, param):
    with pytest.raises(RequestTranslationError) as refused:
        chat_to_gemini_request({"model": "m", "messages": [USER], **change})
    assert str(refused.value) == param


def test_an_answer_with_text_calls_and_thoughts_becomes_a_chat_completion():
    answer = {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        {"text": "thinking...", "thought": True},
                        {"text": "done"},
                        {"functionCall": {"name": "read", "args": {"p": 1}}},
                    ],
                },
                "finishReason": "STOP",
            }
        ],
        "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 2, "thoughtsTokenCount": 3},
        "responseId": "r1",
    }
    chat = gemini_to_chat_response(answer, model="m", created=1)
    message = chat["choices"][0]["message"]
    assert message["content"] == "done"
    # An id of the gateway's, derived from the answer's responseId and the call's place: unique across the
    # conversation's answers, the same each time this answer is read.
    (call,) = message["tool_calls"]
    assert call["id"].startswith("call_") and call["id"] != "call_2"
    assert gemini_to_chat_response(answer, model="m", created=1)["choices"][0]["message"]["tool_calls"] == [
        call
    ]
    assert {k: call[k] for k in ("type", "function")} == {
        "type": "function",
        "function": {"name": "read", "arguments": '{"p":1}'},
    }
    assert chat["choices"][0]["finish_reason"] == "tool_calls"
    assert chat["usage"] == {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}


@pytest.mark.parametrize(
    "answer",
    [
        {"candidates": [{"finishReason": "SAFETY"}]},
        {"candidates": [{"finishReason": "PROHIBITED_CONTENT"}]},
        {"promptFeedback": {"blockReason": "SAFETY"}},
    ],
)
def test_safety_blocks_are_content_filter(answer):
    assert (
        gemini_to_chat_response(answer, model="m", created=0)["choices"][0]["finish_reason"]
        == "content_filter"
    )


def test_a_malformed_function_call_is_never_guessed():
    with pytest.raises(ResponseTranslationError):
        gemini_to_chat_response(
            {"candidates": [{"finishReason": "MALFORMED_FUNCTION_CALL"}]}, model="m", created=0
        )


def _blocks(*payloads):
    raw = b"".join(f"data: {json.dumps(p)}\r\n\r\n".encode() for p in payloads)
    return SSEParser().feed(raw)


def _chunks(out: bytes) -> list:
    return [b.data if b.data == "[DONE]" else json.loads(b.data) for b in SSEParser().feed(out)]


def test_a_stream_becomes_chat_chunks_with_usage_and_done():
    stream = GeminiToChatStream(model="m", created=1)
    out = b"".join(
        stream.feed(b)
        for b in _blocks(
            {"candidates": [{"content": {"parts": [{"text": "he"}]}}], "responseId": "r"},
            {
                "candidates": [{"content": {"parts": [{"text": "llo"}]}, "finishReason": "STOP"}],
                "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 2},
            },
        )
    )
    chunks = _chunks(out)
    assert [c["choices"][0]["delta"] for c in chunks[:3]] == [
        {"role": "assistant", "content": ""},
        {"content": "he"},
        {"content": "llo"},
    ]
    assert chunks[3]["choices"][0]["finish_reason"] == "stop"
    assert chunks[4]["choices"] == [] and chunks[4]["usage"]["completion_tokens"] == 2
    assert chunks[5] == "[DONE]" and stream.ended


def test_a_stream_error_names_only_googles_status():
    stream = GeminiToChatStream(model="m", created=1)
    error = {"error": {"code": 503, "message": "secret words", "status": "UNAVAILABLE"}}
    (chunk,) = _chunks(b"".join(stream.feed(b) for b in _blocks(error)))
    assert chunk == {"error": {"type": "UNAVAILABLE", "code": None}, "status": 503}


def test_google_errors_keep_status_and_reason_never_the_message():
    error = {
        "code": 400,
        "message": "API key not valid.",
        "status": "INVALID_ARGUMENT",
        "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}],
    }
    assert chat_error(error) == {
        "error": {"type": "INVALID_ARGUMENT", "code": "API_KEY_INVALID"},
        "status": 400,
    }
    assert chat_error({"code": 404, "status": "NOT_FOUND"})["error"]["type"] == "not_found_error"
