"""InvokeModel for Anthropic models on Bedrock (pure): which calls take it, and its stream's frames read
as Messages SSE events."""

import base64
import json

import pytest

from proxy.wire.providers.bedrock import InvokeChunks, anthropic_model
from proxy.wire.sse import Block


def chunk(event: dict) -> Block:
    data = json.dumps({"bytes": base64.b64encode(json.dumps(event).encode()).decode(), "p": "abc"})
    return Block(raw=b"", event="chunk", data=data, comment_only=False)


@pytest.mark.parametrize(
    ("model", "invoked"),
    [
        ("anthropic.claude-sonnet-4-5-v1:0", True),
        ("us.anthropic.claude-opus-4-1-v1:0", True),  # an inference profile
        ("meta.llama3-70b-instruct-v1:0", False),
        ("amazon.nova-pro-v1:0", False),
    ],
)
def test_only_an_anthropic_model_or_its_profile_takes_invoke_model(model, invoked):
    assert anthropic_model(model) is invoked


def test_each_chunk_is_one_messages_event_and_the_stream_ends_at_message_stop():
    chunks = InvokeChunks()
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}}
    out = chunks.feed(chunk(delta))
    assert (
        out == b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":'
        b'{"type":"text_delta","text":"hi"}}\n\n'
    )
    assert not chunks.ended
    assert chunks.feed(chunk({"type": "message_stop"})).startswith(b"event: message_stop\n")
    assert chunks.ended
    assert chunks.feed(chunk(delta)) == b""  # nothing after the end
    assert chunks.finish() == b""


@pytest.mark.parametrize(
    ("exception", "kind"),
    [
        ("throttlingException", "rate_limit_error"),
        ("serviceUnavailableException", "overloaded_error"),
        ("modelStreamErrorException", "api_error"),
        ("internalServerException", "api_error"),
    ],
)
def test_an_exception_frame_ends_the_stream_with_a_messages_error_of_its_kind(exception, kind):
    chunks = InvokeChunks()
    out = chunks.feed(
        Block(raw=b"", event="exception", data=json.dumps({"type": exception}), comment_only=False)
    )
    event, data = out.decode().split("\n")[:2]
    assert event == "event: error"
    assert json.loads(data.removeprefix("data: "))["error"]["type"] == kind
    assert chunks.ended


def test_a_frame_that_is_not_a_messages_event_is_skipped():
    chunks = InvokeChunks()
    assert (
        chunks.feed(Block(raw=b"", event="chunk", data='{"bytes": "not base64!"}', comment_only=False)) == b""
    )
    assert chunks.feed(chunk({"no": "type"})) == b""
    assert not chunks.ended
