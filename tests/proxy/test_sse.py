"""proxy/wire/sse.py: SSE framing, visibility per dialect (each client API's rule, `proxy.wire.apis`, through
`proxy.wire.apis.registry.classify`), pre-visible withholding (SPEC §6.2), encoders."""

from __future__ import annotations

import ast
import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.wire import sse
from proxy.wire.apis.registry import BY_DIALECT as API
from proxy.wire.apis.registry import classify
from proxy.wire.sse import (
    Action,
    Block,
    Classification,
    Decision,
    Dialect,
    SSEBlockTooLarge,
    SSEParser,
    StreamError,
    Visibility,
    Withholder,
    WithholderClosedError,
    encode_block,
)

NV = Visibility.NOT_VISIBLE
VIS = Visibility.VISIBLE
OK = Visibility.TERMINAL_SUCCESS
FAIL = Visibility.TERMINAL_FAILURE


def parse_all(stream: bytes, chunks: list[bytes] | None = None, **kwargs: int) -> list[Block]:
    parser = SSEParser(**kwargs)
    blocks: list[Block] = []
    for chunk in chunks if chunks is not None else [stream]:
        blocks += parser.feed(chunk)
    final = parser.flush()
    return [*blocks, final] if final is not None else blocks


def one_block(text: str) -> Block:
    """The single block of an SSE text written with `\\n` line ends (the blank line is added)."""
    blocks = parse_all(text.encode() + b"\n\n")
    assert len(blocks) == 1, blocks
    return blocks[0]


def event(name: str | None, payload: object) -> str:
    head = f"event: {name}\n" if name else ""
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"{head}data: {data}"


# ---------------------------------------------------------------------------------------------------
# Parser: framing and fields


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"], ids=["lf", "crlf", "cr"])
def test_parse_each_line_ending_style(eol: str) -> None:
    text = eol.join(
        [
            ": keep-alive",
            "",
            "event: response.created",
            'data: {"type":"response.created"}',
            "",
            "data: first",
            "data:second",
            "data:  third",
            "",
            "",
        ]
    )
    stream = text.encode()

    blocks = parse_all(stream)

    assert [(b.event, b.data, b.comment_only, b.terminated) for b in blocks] == [
        (None, None, True, True),
        ("response.created", '{"type":"response.created"}', False, True),
        (None, "first\nsecond\n third", False, True),
    ]
    assert [b.raw for b in blocks] == [
        f": keep-alive{eol}{eol}".encode(),
        f'event: response.created{eol}data: {{"type":"response.created"}}{eol}{eol}'.encode(),
        f"data: first{eol}data:second{eol}data:  third{eol}{eol}".encode(),
    ]


@pytest.mark.parametrize(
    ("text", "event_name", "data"),
    [
        ("data", None, ""),  # a field name without a colon has an empty value
        ("data:", None, ""),
        ("data: ", None, ""),
        ("data\ndata", None, "\n"),
        ("data: a:b: c", None, "a:b: c"),  # only the first colon separates
        ("event: a\nevent: b\ndata: x", "b", "x"),  # the last event line wins
        ("event:\ndata: x", None, "x"),  # an empty event name is the default type
        ("event: ping", "ping", None),  # no data line at all
        ("id: 7\nretry: 1000\nfoo: bar\ndata: x", None, "x"),  # other fields do not disturb data
        ("DATA: x", None, None),  # field names are case-sensitive
    ],
)
def test_fields_follow_eventsource_rules(text: str, event_name: str | None, data: str | None) -> None:
    block = one_block(text)

    assert (block.event, block.data) == (event_name, data)


@pytest.mark.parametrize(
    ("text", "comment_only"),
    [
        (": keep-alive", True),
        (":", True),
        (": a\n: b", True),
        (": a\ndata: x", False),
        ("retry: 10", False),
        ("data: : not a comment", False),
    ],
)
def test_comment_only_blocks(text: str, comment_only: bool) -> None:
    assert one_block(text).comment_only is comment_only


def test_stray_blank_lines_belong_to_the_next_block() -> None:
    stream = b"\n\r\ndata: a\n\n\n\ndata: b\n\n"

    blocks = parse_all(stream)

    assert [b.raw for b in blocks] == [b"\n\r\ndata: a\n\n", b"\n\ndata: b\n\n"]
    assert [b.data for b in blocks] == ["a", "b"]


def test_leading_bom_is_ignored_only_at_stream_start() -> None:
    stream = "\ufeffevent: e\ndata: x\n\n\ufeffdata: y\n\n".encode()

    blocks = parse_all(stream)

    assert [(b.event, b.data) for b in blocks] == [("e", "x"), (None, None)]
    assert b"".join(b.raw for b in blocks) == stream


def test_invalid_utf8_is_replaced_in_fields_but_kept_in_raw() -> None:
    stream = b"data: a\xff\xfeb\n\n"

    (block,) = parse_all(stream)

    assert block.data == "a\ufffd\ufffdb"
    assert block.raw == stream


def test_utf8_sequence_split_across_chunks() -> None:
    stream = "data: héllo 😀\n\n".encode()
    split_inside_e_acute = stream.index("é".encode()) + 1
    split_inside_emoji = stream.index("😀".encode()) + 2

    blocks = parse_all(
        stream,
        [
            stream[:split_inside_e_acute],
            stream[split_inside_e_acute:split_inside_emoji],
            stream[split_inside_emoji:],
        ],
    )

    assert [(b.data, b.raw) for b in blocks] == [("héllo 😀", stream)]


def test_cr_at_end_of_chunk_is_held_until_the_next_byte() -> None:
    parser = SSEParser()

    assert parser.feed(b"data: a\r\n\r") == []
    # The next byte completes a CRLF: it belongs to the block that just ended.
    assert parser.feed(b"\ndata: b\r\n\r") == [Block(b"data: a\r\n\r\n", None, "a", False)]
    # The next byte starts a new line: the lone CR ended the block.
    assert parser.feed(b"data: c\r\r") == [Block(b"data: b\r\n\r", None, "b", False)]
    assert parser.flush() == Block(b"data: c\r\r", None, "c", False, terminated=True)


def test_cr_then_lf_across_chunks_inside_a_block_is_one_line_end() -> None:
    blocks = parse_all(b"", [b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"])

    assert [(b.data, b.raw) for b in blocks] == [("a\nb", b"data: a\r\ndata: b\r\n\r\n")]


@pytest.mark.parametrize(
    ("stream", "final"),
    [
        (b"data: a\n\ndata: [DONE]", Block(b"data: [DONE]", None, "[DONE]", False, terminated=False)),
        (b"data: a\n\ndata: [DONE]\n", Block(b"data: [DONE]\n", None, "[DONE]", False, terminated=False)),
        (b"data: a\n\nevent: x\r", Block(b"event: x\r", "x", None, False, terminated=False)),
        (b"data: a\n\n: bye", Block(b": bye", None, None, True, terminated=False)),
        (b"data: a\n\n\n\n", Block(b"\n\n", None, None, False, terminated=False)),
        (b"data: a\n\ndata: b\r\r", Block(b"data: b\r\r", None, "b", False, terminated=True)),
    ],
)
def test_flush_returns_the_final_block_at_eof(stream: bytes, final: Block) -> None:
    parser = SSEParser()
    assert [b.data for b in parser.feed(stream)] == ["a"]

    assert parser.flush() == final
    assert parser.flush() is None


def test_flush_of_a_cleanly_ended_stream_returns_nothing() -> None:
    parser = SSEParser()
    parser.feed(b"data: a\n\n")

    assert parser.flush() is None


def test_parser_is_reusable_after_flush() -> None:
    parser = SSEParser()
    parser.feed(b"\xef\xbb\xbfevent: half")
    parser.flush()

    assert parser.feed(b"\xef\xbb\xbfdata: x\n\n") == [Block(b"\xef\xbb\xbfdata: x\n\n", None, "x", False)]


# ---------------------------------------------------------------------------------------------------
# Parser: the block size bound


def test_block_at_the_limit_is_accepted() -> None:
    stream = b"data: " + b"x" * 10 + b"\n\n"

    (block,) = parse_all(stream, max_block_bytes=len(stream))

    assert block.raw == stream


def test_complete_block_over_the_limit_is_a_protocol_error() -> None:
    stream = b"data: ok\n\ndata: " + b"x" * 11 + b"\n\n"
    parser = SSEParser(max_block_bytes=18)

    with pytest.raises(SSEBlockTooLarge) as caught:
        parser.feed(stream)

    assert (caught.value.size, caught.value.limit) == (19, 18)
    assert isinstance(caught.value, sse.SSEProtocolError)


def test_incomplete_block_over_the_limit_fails_before_its_end_arrives() -> None:
    parser = SSEParser(max_block_bytes=1024)
    parser.feed(b"data: ")

    with pytest.raises(SSEBlockTooLarge):
        for _ in range(100):
            parser.feed(b"x" * 100)  # no line end ever comes: the parser must not keep buffering

    assert parser.flush() is None  # the buffered bytes were dropped


def test_default_limit_is_one_mebibyte() -> None:
    big = b"data: " + b"x" * (1024 * 1024) + b"\n\n"

    with pytest.raises(SSEBlockTooLarge):
        SSEParser().feed(big)


@pytest.mark.parametrize("limit", [0, -1])
def test_nonpositive_block_limit_is_rejected(limit: int) -> None:
    with pytest.raises(ValueError):
        SSEParser(max_block_bytes=limit)


# ---------------------------------------------------------------------------------------------------
# Parser: any split of a stream gives the same blocks


@dataclass(frozen=True)
class Expected:
    event: str | None
    data: str | None
    comment_only: bool


_line_text = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=12)


@st.composite
def sse_streams(draw: st.DrawFn) -> tuple[bytes, list[Expected], list[bytes]]:
    eol = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    stream: list[str] = []
    expected: list[Expected] = []
    raws: list[bytes] = []
    for _ in range(draw(st.integers(0, 6))):
        kinds = draw(st.lists(st.sampled_from(["data", "event", "comment"]), min_size=1, max_size=4))
        lines = []
        event_name: str | None = None
        data: list[str] = []
        for kind in kinds:
            value = draw(_line_text)
            if kind == "data":
                lines.append(f"data: {value}")
                data.append(value)
            elif kind == "event":
                lines.append(f"event: {value}")
                event_name = value or None
            else:
                lines.append(f":{value}")
        strays = eol * draw(st.integers(0, 2))
        text = strays + "".join(line + eol for line in lines) + eol
        stream.append(text)
        raws.append(text.encode())
        has_fields = any(kind != "comment" for kind in kinds)
        expected.append(Expected(event_name, "\n".join(data) if data else None, not has_fields))
    return "".join(stream).encode(), expected, raws


@settings(max_examples=300, deadline=None)
@given(sample=sse_streams(), cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_any_split_yields_the_same_blocks(
    sample: tuple[bytes, list[Expected], list[bytes]], cuts: list[int]
) -> None:
    stream, expected, raws = sample
    points = sorted({cut % (len(stream) + 1) for cut in cuts} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(points)]

    blocks = parse_all(stream, chunks)

    assert [Expected(b.event, b.data, b.comment_only) for b in blocks] == expected
    assert [b.raw for b in blocks] == raws
    assert blocks == parse_all(stream)


@settings(max_examples=200, deadline=None)
@given(stream=st.binary(max_size=200), cuts=st.lists(st.integers(0, 200), max_size=8))
def test_arbitrary_bytes_split_anywhere_parse_identically_and_losslessly(
    stream: bytes, cuts: list[int]
) -> None:
    points = sorted({cut % (len(stream) + 1) for cut in cuts} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(points)]

    blocks = parse_all(stream, chunks)

    assert blocks == parse_all(stream)
    assert b"".join(b.raw for b in blocks) == stream


# ---------------------------------------------------------------------------------------------------
# Visibility tables (realistic upstream payloads)

_CHUNK = {
    "id": "chatcmpl-9",
    "object": "chat.completion.chunk",
    "created": 1730000000,
    "model": "gpt-4o-mini",
    "system_fingerprint": "fp_0ba0d124f1",
}


def chat_chunk(delta: dict[str, object], finish: str | None = None, **extra: object) -> str:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return event(None, {**_CHUNK, "choices": [choice], **extra})


CHAT_TABLE = [
    ("role only", chat_chunk({"role": "assistant", "content": "", "refusal": None}), NV),
    ("role, null content", chat_chunk({"role": "assistant", "content": None}), NV),
    ("empty content", chat_chunk({"content": ""}), NV),
    ("empty delta", chat_chunk({}), NV),
    (
        "empty logprobs",
        event(
            None,
            {
                **_CHUNK,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant"},
                        "logprobs": {"content": None, "refusal": None},
                        "finish_reason": None,
                    }
                ],
            },
        ),
        NV,
    ),
    (
        "usage only",
        event(
            None,
            {
                **_CHUNK,
                "choices": [],
                "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
            },
        ),
        NV,
    ),
    (
        "azure prompt filter",
        event(
            None,
            {
                "id": "",
                "object": "",
                "created": 0,
                "model": "",
                "choices": [],
                "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}],
            },
        ),
        NV,
    ),
    ("comment", ": OPENROUTER PROCESSING", NV),
    ("content", chat_chunk({"content": "Hello"}), VIS),
    ("whitespace content", chat_chunk({"content": " "}), VIS),
    ("role and content", chat_chunk({"role": "assistant", "content": "Hi"}), VIS),
    (
        "tool call",
        chat_chunk(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_abc",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ],
            }
        ),
        VIS,
    ),
    (
        "tool call arguments",
        chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}),
        VIS,
    ),
    ("refusal", chat_chunk({"refusal": "I can't help with that."}), VIS),
    (
        "reasoning content",
        chat_chunk({"role": "assistant", "content": "", "reasoning_content": "Let me"}),
        VIS,
    ),
    ("unknown delta field", chat_chunk({"audio": {"id": "audio_1", "data": "UklGR"}}), VIS),
    ("finish stop", chat_chunk({}, "stop"), VIS),
    ("finish content filter", chat_chunk({}, "content_filter"), VIS),
    (
        "second choice has content",
        event(
            None,
            {
                **_CHUNK,
                "choices": [
                    {"index": 0, "delta": {"role": "assistant"}, "finish_reason": None},
                    {"index": 1, "delta": {"content": "B"}, "finish_reason": None},
                ],
            },
        ),
        VIS,
    ),
    ("not a chunk", event(None, {"object": "something.new"}), VIS),
    ("json array", event(None, "[1, 2]"), VIS),
    ("not json", event(None, "hello there"), VIS),
    ("done", "data: [DONE]", OK),
    (
        "error chunk",
        event(
            None,
            {
                "error": {
                    "message": "The server had an error.",
                    "type": "server_error",
                    "param": None,
                    "code": None,
                }
            },
        ),
        FAIL,
    ),
    ("error event name", event("error", {"message": "boom"}), FAIL),
    ("error event without data", "event: error", FAIL),
]


def _response(status: str, **fields: object) -> dict[str, object]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1730000000,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "model": "gpt-5",
        "output": [],
        "usage": None,
        **fields,
    }


def typed(name: str, **fields: object) -> str:
    return event(name, {"type": name, "sequence_number": 3, **fields})


_AT = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
_MESSAGE = {"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}

RESPONSES_TABLE = [
    ("created", typed("response.created", response=_response("in_progress")), NV),
    ("in progress", typed("response.in_progress", response=_response("in_progress")), NV),
    ("queued", typed("response.queued", response=_response("queued")), NV),
    ("keepalive", typed("keepalive"), NV),
    (
        "codex rate limits",
        typed(
            "codex.rate_limits",
            plan_type="plus",
            rate_limits={"primary": {"used_percent": 12.5, "window_minutes": 300, "resets_at": 1730003600}},
        ),
        NV,
    ),
    ("message item added", typed("response.output_item.added", output_index=0, item=_MESSAGE), NV),
    (
        "message item with empty part",
        typed(
            "response.output_item.added",
            output_index=0,
            item={**_MESSAGE, "content": [{"type": "output_text", "text": "", "annotations": []}]},
        ),
        NV,
    ),
    (
        "reasoning item added",
        typed(
            "response.output_item.added",
            output_index=0,
            item={"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": None},
        ),
        NV,
    ),
    (
        "empty text part",
        typed(
            "response.content_part.added",
            **_AT,
            part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
        ),
        NV,
    ),
    (
        "empty refusal part",
        typed("response.content_part.added", **_AT, part={"type": "refusal", "refusal": ""}),
        NV,
    ),
    (
        "empty summary part",
        typed(
            "response.reasoning_summary_part.added",
            item_id="rs_1",
            output_index=0,
            summary_index=0,
            part={"type": "summary_text", "text": ""},
        ),
        NV,
    ),
    ("empty text delta", typed("response.output_text.delta", **_AT, delta="", logprobs=[]), NV),
    ("no data", "event: response.created\nretry: 1000", NV),
    ("type from event name", event("response.in_progress", {"response": _response("in_progress")}), NV),
    ("comment", ": keep-alive", NV),
    ("text delta", typed("response.output_text.delta", **_AT, delta="Hello", logprobs=[]), VIS),
    (
        "reasoning summary delta",
        typed(
            "response.reasoning_summary_text.delta",
            item_id="rs_1",
            output_index=0,
            summary_index=0,
            delta="**Planning**",
        ),
        VIS,
    ),
    (
        "reasoning text delta",
        typed(
            "response.reasoning_text.delta", item_id="rs_1", output_index=0, content_index=0, delta="First,"
        ),
        VIS,
    ),
    (
        "function call item",
        typed(
            "response.output_item.added",
            output_index=1,
            item={
                "id": "fc_1",
                "type": "function_call",
                "status": "in_progress",
                "call_id": "call_1",
                "name": "shell",
                "arguments": "",
            },
        ),
        VIS,
    ),
    (
        "web search item",
        typed(
            "response.output_item.added",
            output_index=0,
            item={"id": "ws_1", "type": "web_search_call", "status": "in_progress"},
        ),
        VIS,
    ),
    (
        "message item with text",
        typed(
            "response.output_item.added",
            output_index=0,
            item={**_MESSAGE, "content": [{"type": "output_text", "text": "Hi", "annotations": []}]},
        ),
        VIS,
    ),
    (
        "function arguments delta",
        typed("response.function_call_arguments.delta", item_id="fc_1", output_index=1, delta='{"cmd":'),
        VIS,
    ),
    ("refusal delta", typed("response.refusal.delta", **_AT, delta="I can't"), VIS),
    (
        "text part with text",
        typed(
            "response.content_part.added",
            **_AT,
            part={"type": "output_text", "text": "Hi", "annotations": []},
        ),
        VIS,
    ),
    (
        "item done",
        typed("response.output_item.done", output_index=0, item={**_MESSAGE, "status": "completed"}),
        VIS,
    ),
    ("unknown type", typed("response.something_new", detail="x"), VIS),
    ("not json", "event: response.output_text.delta\ndata: Hello", VIS),
    ("completed", typed("response.completed", response=_response("completed")), OK),
    (
        "incomplete",
        typed(
            "response.incomplete",
            response=_response("incomplete", incomplete_details={"reason": "max_output_tokens"}),
        ),
        OK,
    ),
    ("done sentinel", "data: [DONE]", OK),
    (
        "failed",
        typed(
            "response.failed",
            response=_response("failed", error={"code": "server_error", "message": "The model failed."}),
        ),
        FAIL,
    ),
    (
        "error nested",
        typed(
            "error",
            error={
                "type": "invalid_request_error",
                "code": "model_not_found",
                "message": "The model does not exist.",
                "param": "model",
            },
        ),
        FAIL,
    ),
    ("error flat", typed("error", code="ERR_SOMETHING", message="Something went wrong", param=None), FAIL),
    ("untyped error object", event(None, {"error": {"message": "x", "type": "server_error"}}), FAIL),
]

_MESSAGE_START = {
    "type": "message_start",
    "message": {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 25, "output_tokens": 1},
    },
}

ANTHROPIC_TABLE = [
    ("message start", event("message_start", _MESSAGE_START), NV),
    ("ping", event("ping", {"type": "ping"}), NV),
    (
        "empty text block",
        event(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        NV,
    ),
    (
        "empty thinking block",
        event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""},
            },
        ),
        NV,
    ),
    (
        "empty text delta",
        event(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ""}},
        ),
        NV,
    ),
    ("comment", ": ping", NV),
    (
        "text delta",
        event(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}},
        ),
        VIS,
    ),
    (
        "thinking delta",
        event(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "thinking_delta", "thinking": "Let me think"},
            },
        ),
        VIS,
    ),
    (
        "tool input delta",
        event(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '{"location": "Paris'},
            },
        ),
        VIS,
    ),
    (
        "tool use block",
        event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {}},
            },
        ),
        VIS,
    ),
    (
        "redacted thinking block",
        event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "redacted_thinking", "data": "EmwKAhgB"},
            },
        ),
        VIS,
    ),
    ("block stop", event("content_block_stop", {"type": "content_block_stop", "index": 0}), VIS),
    (
        "message delta refusal",
        event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "refusal", "stop_sequence": None},
                "usage": {"output_tokens": 3},
            },
        ),
        VIS,
    ),
    (
        "prefilled message start",
        event(
            "message_start",
            {
                **_MESSAGE_START,
                "message": {**_MESSAGE_START["message"], "content": [{"type": "text", "text": "Sure"}]},
            },
        ),
        VIS,
    ),
    ("unknown event", event("content_block_future", {"type": "content_block_future"}), VIS),
    ("not json", "event: content_block_delta\ndata: {oops", VIS),
    ("message stop", event("message_stop", {"type": "message_stop"}), OK),
    (
        "error",
        event("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        FAIL,
    ),
]


def _table_params(dialect: Dialect, table: list[tuple[str, str, Visibility]]) -> list[object]:
    return [pytest.param(dialect, text, expected, id=f"{dialect}-{name}") for name, text, expected in table]


@pytest.mark.parametrize(
    ("dialect", "text", "expected"),
    [
        *_table_params(Dialect.CHAT, CHAT_TABLE),
        *_table_params(Dialect.RESPONSES, RESPONSES_TABLE),
        *_table_params(Dialect.ANTHROPIC, ANTHROPIC_TABLE),
    ],
)
def test_visibility_tables(dialect: Dialect, text: str, expected: Visibility) -> None:
    assert classify(dialect, one_block(text)).visibility is expected


@pytest.mark.parametrize("dialect", list(Dialect))
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (": keep-alive", NV),
        ("retry: 5000", NV),
        ("data: [DONE]", OK),
        ("data: definitely not json", VIS),
        ("data: " + "[" * 100_000 + "]" * 100_000, VIS),  # nesting too deep to parse: relayed, not a crash
        ("data: 42", VIS),
    ],
)
def test_dialect_independent_rules(dialect: Dialect, text: str, expected: Visibility) -> None:
    assert classify(dialect, one_block(text)).visibility is expected


def test_classification_carries_the_parsed_payload() -> None:
    result = classify(
        Dialect.RESPONSES, one_block(typed("response.created", response=_response("in_progress")))
    )

    assert result.payload["response"]["id"] == "resp_1"


# ---------------------------------------------------------------------------------------------------
# Terminal failures: the error's canonical fields, never its message


@pytest.mark.parametrize(
    ("dialect", "text", "expected"),
    [
        pytest.param(
            Dialect.RESPONSES,
            typed(
                "response.failed",
                response=_response(
                    "failed", error={"code": "server_error", "message": "secret provider words"}
                ),
            ),
            StreamError(code="server_error"),
            id="response.failed",
        ),
        pytest.param(
            Dialect.RESPONSES,
            typed(
                "error",
                error={
                    "type": "invalid_request_error",
                    "code": "model_not_found",
                    "message": "secret provider words",
                    "param": "model",
                },
            ),
            StreamError("invalid_request_error", "model_not_found", "model"),
            id="responses nested error",
        ),
        pytest.param(
            Dialect.RESPONSES,
            typed("error", code="context_length_exceeded", message="secret provider words", param="input"),
            StreamError(None, "context_length_exceeded", "input"),
            id="responses flat error",
        ),
        pytest.param(
            Dialect.RESPONSES,
            event(
                "error",
                {
                    "type": "error",
                    "status": 429,
                    "error": {
                        "type": "requests",
                        "code": "rate_limit_exceeded",
                        "message": "secret provider words",
                    },
                },
            ),
            StreamError("requests", "rate_limit_exceeded", None, 429),
            id="websocket-style status",
        ),
        pytest.param(
            Dialect.RESPONSES,
            typed(
                "response.failed",
                response=_response("failed"),
                status_details={"error": {"type": "server_error", "code": "overloaded"}},
            ),
            StreamError("server_error", "overloaded"),
            id="status_details.error",
        ),
        pytest.param(
            Dialect.RESPONSES,
            typed(
                "response.failed",
                response=_response("failed", error={"code": "model_not_found"}),
                error={"code": "server_error"},
            ),
            StreamError(code="model_not_found"),
            id="response.error looked up first",
        ),
        pytest.param(
            Dialect.RESPONSES,
            typed("response.failed", response=_response("failed")),
            None,
            id="response.failed without error object",
        ),
        pytest.param(Dialect.RESPONSES, "event: error", None, id="error event without data"),
        pytest.param(
            Dialect.CHAT,
            event(
                None,
                {
                    "error": {
                        "message": "secret provider words",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": "model_not_found",
                    }
                },
            ),
            StreamError("invalid_request_error", "model_not_found"),
            id="chat",
        ),
        pytest.param(
            Dialect.CHAT,
            event(None, {"error": {"message": "secret provider words", "code": 502}}),
            StreamError(),
            id="non-string code is not a code",
        ),
        pytest.param(
            Dialect.ANTHROPIC,
            event(
                "error",
                {"type": "error", "error": {"type": "not_found_error", "message": "secret provider words"}},
            ),
            StreamError("not_found_error"),
            id="anthropic",
        ),
    ],
)
def test_terminal_failure_carries_canonical_error_fields(
    dialect: Dialect, text: str, expected: StreamError | None
) -> None:
    result = classify(dialect, one_block(text))

    assert result.visibility is FAIL
    assert result.error == expected
    assert "secret provider words" not in repr(result)


@pytest.mark.parametrize(
    ("dialect", "text"),
    [
        (Dialect.CHAT, CHAT_TABLE[8][1]),
        (Dialect.RESPONSES, RESPONSES_TABLE[0][1]),
        (Dialect.ANTHROPIC, ANTHROPIC_TABLE[0][1]),
        (Dialect.RESPONSES, "data: [DONE]"),
    ],
)
def test_non_failures_carry_no_error(dialect: Dialect, text: str) -> None:
    assert classify(dialect, one_block(text)).error is None


# ---------------------------------------------------------------------------------------------------
# Withholder (SPEC §6.2)


def blk(name: str) -> Block:
    return Block(f"data: {name}\n\n".encode(), None, name, False)


HIDDEN = Classification(NV)
SHOWN = Classification(VIS)
DONE = Classification(OK)
BROKEN = Classification(FAIL, error=StreamError("server_error", "overloaded"))


@pytest.mark.parametrize("leading", [0, 1, 5, 31, 32])
def test_leading_lifecycle_blocks_are_released_with_the_first_visible_one(leading: int) -> None:
    w = Withholder()
    lifecycle = [blk(f"l{i}") for i in range(leading)]

    assert [w.feed(b, HIDDEN).action for b in lifecycle] == [Action.WITHHOLD] * leading
    assert not w.released
    first = blk("visible")
    decision = w.feed(first, SHOWN)

    assert decision.action is Action.RELEASE
    assert decision.write == (*lifecycle, first)
    assert w.released
    after = blk("next")
    assert w.feed(after, SHOWN).write == (after,)


def test_the_33rd_leading_block_is_released_without_any_visible_one() -> None:
    w = Withholder(limit=32)
    lifecycle = [blk(f"l{i}") for i in range(33)]

    decisions = [w.feed(b, HIDDEN) for b in lifecycle]

    assert [d.action for d in decisions] == [Action.WITHHOLD] * 32 + [Action.RELEASE]
    assert decisions[-1].write == tuple(lifecycle)
    later = blk("later")
    assert w.feed(later, HIDDEN) == Decision(Action.PASS, (later,))


@pytest.mark.parametrize("limit", [0, 1, 3])
def test_withhold_limit_is_configurable(limit: int) -> None:
    w = Withholder(limit=limit)

    actions = [w.feed(blk(str(i)), HIDDEN).action for i in range(limit + 2)]

    assert actions == [Action.WITHHOLD] * limit + [Action.RELEASE, Action.PASS]


def test_default_limit_is_32() -> None:
    assert sse.WITHHOLD_LIMIT == 32
    w = Withholder()
    assert [w.feed(blk(str(i)), HIDDEN).action for i in range(33)][-2:] == [Action.WITHHOLD, Action.RELEASE]


def test_negative_limit_is_rejected() -> None:
    with pytest.raises(ValueError):
        Withholder(limit=-1)


def test_terminal_success_before_any_visible_block_releases() -> None:
    w = Withholder()
    created = blk("created")
    w.feed(created, HIDDEN)
    completed = blk("completed")

    assert w.feed(completed, DONE) == Decision(Action.RELEASE, (created, completed))


def test_pre_visible_failure_keeps_the_buffer_for_the_exhausted_plan() -> None:
    w = Withholder()
    lifecycle = [blk("created"), blk("in_progress"), blk("rate_limits")]
    for b in lifecycle:
        w.feed(b, HIDDEN)

    decision = w.feed(blk("upstream error"), BROKEN)

    assert decision == Decision(Action.PRE_VISIBLE_FAILURE, (), StreamError("server_error", "overloaded"))
    assert not w.released
    assert w.withheld() == tuple(lifecycle)  # the upstream's own error block is not among them


def test_withheld_blocks_are_handed_over_once() -> None:
    w = Withholder()
    created = blk("created")
    w.feed(created, HIDDEN)
    w.feed(blk("error"), BROKEN)

    assert w.withheld() == (created,)
    assert w.withheld() == ()


def test_no_block_is_accepted_after_a_failure() -> None:
    w = Withholder()
    w.feed(blk("error"), BROKEN)

    with pytest.raises(WithholderClosedError):
        w.feed(blk("late"), SHOWN)


def test_taking_withheld_blocks_on_early_eof_settles_the_attempt() -> None:
    w = Withholder()
    created = blk("created")
    w.feed(created, HIDDEN)

    assert w.withheld() == (created,)
    with pytest.raises(WithholderClosedError):
        w.feed(blk("late"), SHOWN)  # would otherwise be written after blocks already handed over


def test_post_visible_failure_writes_nothing_and_forbids_retry() -> None:
    w = Withholder()
    w.feed(blk("created"), HIDDEN)
    w.feed(blk("delta"), SHOWN)

    decision = w.feed(blk("upstream error"), BROKEN)

    assert decision == Decision(Action.POST_VISIBLE_FAILURE, (), StreamError("server_error", "overloaded"))
    assert w.released
    assert w.withheld() == ()


def test_non_visible_blocks_after_release_pass_through() -> None:
    w = Withholder()
    w.feed(blk("delta"), SHOWN)
    keepalive = blk("keepalive")

    assert w.feed(keepalive, HIDDEN) == Decision(Action.PASS, (keepalive,))


_VISIBILITIES = st.sampled_from([HIDDEN, SHOWN, DONE, BROKEN])


@settings(max_examples=300, deadline=None)
@given(kinds=st.lists(_VISIBILITIES, max_size=45), limit=st.integers(0, 34), take_twice=st.booleans())
def test_every_block_is_written_at_most_once_and_in_order(
    kinds: list[Classification], limit: int, take_twice: bool
) -> None:
    w = Withholder(limit=limit)
    fed: list[Block] = []
    written: list[Block] = []
    for i, classification in enumerate(kinds):
        block = blk(f"b{i}")
        fed.append(block)
        decision = w.feed(block, classification)
        written += decision.write
        if decision.action in (Action.PRE_VISIBLE_FAILURE, Action.POST_VISIBLE_FAILURE):
            failure = block
            break
    else:
        failure = None
    written += w.withheld()
    if take_twice:
        written += w.withheld()

    assert written == [b for b in fed if b is not failure]
    if failure is not None and any(c.visibility in (VIS, OK) for c in kinds[: fed.index(failure)]):
        assert w.released


def run_attempt(dialect: Dialect, stream: bytes) -> tuple[list[bytes], Withholder, Decision | None]:
    """What the relay does with one upstream attempt: the bytes it writes, and how the attempt ended."""
    parser, w, out = SSEParser(), Withholder(), []
    for block in parser.feed(stream):
        decision = w.feed(block, classify(dialect, block))
        out += [b.raw for b in decision.write]
        if decision.action in (Action.PRE_VISIBLE_FAILURE, Action.POST_VISIBLE_FAILURE):
            return out, w, decision
    return out, w, None


def test_exhausted_plan_relays_the_last_candidates_withheld_blocks_once() -> None:
    created = typed("response.created", response=_response("in_progress")) + "\n\n"
    progress = typed("response.in_progress", response=_response("in_progress")) + "\n\n"
    failure = (
        typed("error", error={"type": "server_error", "code": "overloaded", "message": "secret"}) + "\n\n"
    )
    candidates = [(created + typed("keepalive") + "\n\n" + failure), (created + progress + failure)]
    gateway_error = API[Dialect.RESPONSES].error_event(
        type="server_error", code="overloaded", param=None, message="The upstream failed.", status=None
    )
    client: list[bytes] = []

    for index, stream in enumerate(candidates):
        written, w, outcome = run_attempt(Dialect.RESPONSES, stream.encode())
        client += written
        assert outcome is not None and outcome.action is Action.PRE_VISIBLE_FAILURE
        assert outcome.error == StreamError("server_error", "overloaded")
        if index == len(candidates) - 1:  # plan exhausted: the last candidate's blocks, then the error
            client += [b.raw for b in w.withheld()]
            client += [b.raw for b in w.withheld()]  # a careless second call must add nothing
            client.append(gateway_error)

    # Nothing from the first candidate, nothing twice, and never the upstream's own error block.
    assert client == [created.encode(), progress.encode(), gateway_error]


def test_relay_of_a_served_stream_is_byte_identical() -> None:
    stream = (
        b": keep-alive\r\n\r\n"
        b'event: response.created\r\ndata: {"type":"response.created"}\r\n\r\n'
        b"event: response.output_text.delta\r\n"
        b'data: {"type":"response.output_text.delta","delta":"Hi"}\r\n\r\n'
        b'event: response.completed\r\ndata: {"type":"response.completed"}\r\n\r\n'
    )

    written, w, outcome = run_attempt(Dialect.RESPONSES, stream)

    assert outcome is None and w.released
    assert b"".join(written) == stream


# ---------------------------------------------------------------------------------------------------
# Encoders


@pytest.mark.parametrize(
    ("dialect", "event_name", "body"),
    [
        (
            Dialect.CHAT,
            None,
            {
                "error": {
                    "message": "No upstream could serve the request.",
                    "type": "server_error",
                    "code": "overloaded",
                    "param": "model",
                }
            },
        ),
        (
            Dialect.RESPONSES,
            "error",
            {
                "type": "error",
                "code": "overloaded",
                "message": "No upstream could serve the request.",
                "param": "model",
                "error": {
                    "type": "server_error",
                    "code": "overloaded",
                    "message": "No upstream could serve the request.",
                    "param": "model",
                },
            },
        ),
        (
            Dialect.ANTHROPIC,
            "error",
            {
                "type": "error",
                "error": {"type": "server_error", "message": "No upstream could serve the request."},
            },
        ),
    ],
)
def test_error_event_shapes(dialect: Dialect, event_name: str | None, body: dict[str, object]) -> None:
    raw = API[dialect].error_event(
        type="server_error",
        code="overloaded",
        param="model",
        message="No upstream could serve the request.",
        status=503,
    )

    (block,) = parse_all(raw)
    assert block.raw == raw and raw.endswith(b"\n\n")
    assert block.event == event_name
    assert block.data is not None and json.loads(block.data) == body


@pytest.mark.parametrize(
    ("dialect", "expected"),
    [
        (Dialect.CHAT, StreamError("server_error", "overloaded", "model")),
        (Dialect.RESPONSES, StreamError("server_error", "overloaded", "model")),
        (Dialect.ANTHROPIC, StreamError("server_error")),  # Anthropic errors have no code or param
    ],
)
def test_gateway_error_event_classifies_as_a_terminal_failure(
    dialect: Dialect, expected: StreamError
) -> None:
    raw = API[dialect].error_event(
        type="server_error", code="overloaded", param="model", message="Failed.", status=None
    )

    result = classify(dialect, parse_all(raw)[0])

    assert (result.visibility, result.error) == (FAIL, expected)


def test_encode_block_bytes() -> None:
    assert encode_block("response.completed", '{"a":1}') == b'event: response.completed\ndata: {"a":1}\n\n'
    assert encode_block(None, "[DONE]") == b"data: [DONE]\n\n"


@pytest.mark.parametrize("data", ["", "x", " leading space", "a\nb", "a\r\nb\rc", "é😀", "\n"])
def test_encode_block_round_trips_through_the_parser(data: str) -> None:
    (block,) = parse_all(encode_block("e", data))

    assert (block.event, block.data) == ("e", data.replace("\r\n", "\n").replace("\r", "\n"))


@pytest.mark.parametrize("name", ["a\nb", "a\rb", "x\n\ndata: injected"])
def test_encode_block_rejects_line_breaks_in_the_event_name(name: str) -> None:
    with pytest.raises(ValueError):
        encode_block(name, "{}")


# ---------------------------------------------------------------------------------------------------
# Purity (STYLE.md: pure core, standard library only)


def test_module_imports_only_the_standard_library() -> None:
    tree = ast.parse(Path(sse.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }

    assert imported
    assert imported <= set(sys.stdlib_module_names)
