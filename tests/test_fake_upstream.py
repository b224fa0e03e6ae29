"""The fake upstream itself, over real sockets: shapes, behaviours per transport, recording, lifecycle."""

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from devkit.behaviours import (
    Behaviour,
    close_websocket,
    codeless_404,
    cut_stream,
    error,
    fail_after_visible,
    fail_before_visible,
    generic_404,
    hang,
    model_not_found,
    quota,
    rate_limited,
    refusal,
    serve,
    slow_stream,
    unavailable,
)
from devkit.upstream import FakeUpstream
from tests.upstream_fixtures import MakeFake

MODEL_NOT_FOUND = {
    "message": "The model does not exist or you do not have access to it.",
    "type": "invalid_request_error",
    "param": "model",
    "code": "model_not_found",
}


def sse_events(client: httpx.Client, path: str, body: dict[str, Any]) -> list[tuple[str | None, Any]]:
    """POST a streaming request and parse the SSE blocks into (event name, data) pairs."""
    with client.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        return parse_sse(response.read().decode())


def parse_sse(text: str) -> list[tuple[str | None, Any]]:
    events = []
    for block in text.split("\n\n"):
        if not block:
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        data = fields["data"]
        events.append((fields.get("event"), data if data == "[DONE]" else json.loads(data)))
    return events


def read_until_cut(client: httpx.Client, path: str, body: dict[str, Any]) -> str:
    """Read a stream that must end without a complete HTTP body; return what arrived before the cut."""
    received = []
    with pytest.raises(httpx.RemoteProtocolError), client.stream("POST", path, json=body) as response:
        for chunk in response.iter_text():
            received.append(chunk)
    return "".join(received)


async def ws_events(ws: ClientConnection, body: dict[str, Any], until: set[str]) -> list[dict[str, Any]]:
    """Send one response.create frame and collect the events up to one whose type is in `until`."""
    await ws.send(json.dumps({"type": "response.create", **body}))
    events = []
    while not events or events[-1]["type"] not in until:
        events.append(json.loads(await ws.recv()))
    return events


@pytest.fixture
def fake(fake_upstream: FakeUpstream) -> FakeUpstream:
    """The default fake "a" serving gpt-5, under a short name."""
    return fake_upstream


@pytest.fixture
def client(fake: FakeUpstream) -> Iterator[httpx.Client]:
    # verify=False: plain-http loopback, and loading the CA bundle costs ~0.15 s per client.
    with httpx.Client(base_url=fake.base_url, timeout=5, verify=False) as client:
        yield client


# -- successful shapes ----------------------------------------------------------------------------------


def test_urls_name_the_loopback_port(fake: FakeUpstream) -> None:
    assert fake.base_url == f"http://127.0.0.1:{fake.port}/v1"
    assert fake.ws_url == f"ws://127.0.0.1:{fake.port}/v1/responses"


def test_chat_completion_json(client: httpx.Client) -> None:
    body = client.post("/chat/completions", json={"model": "gpt-5", "messages": []}).json()

    assert body["id"].startswith("chatcmpl-")
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == "hello from a"
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}


def test_chat_sse_with_usage(client: httpx.Client) -> None:
    events = sse_events(
        client, "/chat/completions", {"model": "gpt-5", "stream_options": {"include_usage": True}}
    )
    chunks = [data for _, data in events[:-1]]

    assert all(name is None for name, _ in events)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "hello from a"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    assert events[-1] == (None, "[DONE]")


def test_chat_sse_without_usage_option_sends_no_usage(client: httpx.Client) -> None:
    events = sse_events(client, "/chat/completions", {"model": "gpt-5"})

    assert all("usage" not in data for _, data in events[:-1])
    assert events[-2][1]["choices"][0]["finish_reason"] == "stop"


def responses_stream(deltas: int) -> list[str]:
    """The event types of a served Responses stream with `deltas` visible text deltas."""
    lifecycle = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    done = [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    return [*lifecycle, *["response.output_text.delta"] * deltas, *done]


LEADING = responses_stream(0)[:4]  # the non-visible lifecycle events before the first delta


def test_responses_sse(client: httpx.Client) -> None:
    first = client.post("/responses", json={"model": "gpt-5", "input": "hi"}).json()["id"]
    events = sse_events(
        client, "/responses", {"model": "gpt-5", "input": "hi", "previous_response_id": first}
    )

    assert [name for name, _ in events] == responses_stream(3)
    assert all(data["type"] == name for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    completed = events[-1][1]["response"]
    assert completed["id"].startswith("resp_")
    assert completed["id"] == events[0][1]["response"]["id"]
    assert completed["previous_response_id"] == first
    assert completed["output"][0]["content"][0]["text"] == "hello from a"
    assert completed["usage"]["input_tokens"] == 10
    assert completed["usage"]["output_tokens"] == 3


def test_a_previous_response_this_account_never_created_is_not_found(client: httpx.Client) -> None:
    body = {"model": "gpt-5", "input": "hi", "previous_response_id": "resp_from_another_account"}
    response = client.post("/responses", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "previous_response_not_found",
        "previous_response_id",
    )


def test_responses_json_and_compact(client: httpx.Client) -> None:
    response = client.post("/responses", json={"model": "gpt-5", "input": "hi"}).json()
    compact = client.post("/responses/compact", json={"model": "gpt-5", "input": []}).json()

    assert response["object"] == "response"
    assert response["status"] == "completed"
    assert response["output"][0]["content"][0] == {
        "type": "output_text",
        "text": "hello from a",
        "annotations": [],
        "logprobs": [],
    }
    assert response["usage"]["input_tokens"] == 10
    assert compact["object"] == "response.compaction"
    assert compact["output"][0]["type"] == "compaction"


def test_serve_text_and_usage_are_scriptable(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script("gpt-5", serve("one two", input_tokens=7, output_tokens=40))

    body = client.post("/chat/completions", json={"model": "gpt-5"}).json()

    assert body["choices"][0]["message"]["content"] == "one two"
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 40, "total_tokens": 47}


def test_anthropic_messages_json_sse_and_count_tokens(client: httpx.Client) -> None:
    message = client.post("/messages", json={"model": "gpt-5", "max_tokens": 5}).json()
    events = sse_events(client, "/messages", {"model": "gpt-5", "max_tokens": 5})
    count = client.post("/messages/count_tokens", json={"model": "gpt-5", "messages": []}).json()

    assert message["id"].startswith("msg_")
    assert message["type"] == "message"
    assert message["content"] == [{"type": "text", "text": "hello from a"}]
    assert message["stop_reason"] == "end_turn"
    assert message["usage"] == {"input_tokens": 10, "output_tokens": 3}
    names = [name for name, _ in events]
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * 3,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta") == (
        "hello from a"
    )
    assert count == {"input_tokens": 10}


def test_models_list_and_scripted_failure(fake_upstream_factory: MakeFake) -> None:
    fake = fake_upstream_factory("b", ("gpt-5", "gpt-x"))

    listed = httpx.get(f"{fake.base_url}/models", verify=False).json()
    fake.models_behaviour = unavailable()
    failed = httpx.get(f"{fake.base_url}/models", verify=False)

    assert listed == {
        "object": "list",
        "data": [
            {"id": "gpt-5", "object": "model", "created": 0, "owned_by": "b"},
            {"id": "gpt-x", "object": "model", "created": 0, "owned_by": "b"},
        ],
    }
    assert failed.status_code == 503
    assert failed.json()["error"]["type"] == "server_error"


# -- rejections -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("behaviour", "status", "expected"),
    [
        (model_not_found(), 404, {"error": MODEL_NOT_FOUND}),
        (model_not_found(status=400), 400, {"error": MODEL_NOT_FOUND}),
        (
            codeless_404(),
            404,
            {
                "error": {
                    "message": "The model does not exist.",
                    "type": "invalid_request_error",
                    "param": "model",
                    "code": None,
                }
            },
        ),
        (
            generic_404(),
            404,
            {
                "error": {
                    "message": "Unknown request URL.",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "unknown_url",
                }
            },
        ),
        (
            error(404, {"response": {"error": {"code": "model_not_found", "message": "gone"}}}),
            404,
            {"response": {"error": {"code": "model_not_found", "message": "gone"}}},
        ),
        (
            error(
                400, {"__type": "ValidationException", "message": "The provided model identifier is invalid."}
            ),
            400,
            {"__type": "ValidationException", "message": "The provided model identifier is invalid."},
        ),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_rejection_is_an_http_error_before_any_stream(
    fake: FakeUpstream, client: httpx.Client, behaviour: Behaviour, status: int, expected: Any, stream: bool
) -> None:
    fake.script("gpt-5", behaviour)

    response = client.post("/responses", json={"model": "gpt-5", "stream": stream})

    assert response.status_code == status
    assert response.json() == expected


@pytest.mark.parametrize(
    ("behaviour", "status", "type_", "code"),
    [
        (rate_limited(), 429, "requests", "rate_limit_exceeded"),
        (quota(), 429, "insufficient_quota", "insufficient_quota"),
        (unavailable(), 503, "server_error", None),
        (unavailable(status=502), 502, "server_error", None),
    ],
)
def test_transient_rejections(
    fake: FakeUpstream, client: httpx.Client, behaviour: Behaviour, status: int, type_: str, code: str | None
) -> None:
    fake.script("gpt-5", behaviour)

    response = client.post("/chat/completions", json={"model": "gpt-5"})

    assert response.status_code == status
    assert (response.json()["error"]["type"], response.json()["error"]["code"]) == (type_, code)


def test_unknown_model_gets_openai_model_not_found(client: httpx.Client) -> None:
    response = client.post("/chat/completions", json={"model": "gpt-unknown"})

    assert response.status_code == 404
    assert response.json() == {"error": MODEL_NOT_FOUND}


def test_anthropic_routes_answer_in_the_anthropic_envelope(fake: FakeUpstream, client: httpx.Client) -> None:
    unknown = client.post("/messages", json={"model": "claude-nope", "max_tokens": 5})
    fake.script("gpt-5", rate_limited())
    limited = client.post("/messages/count_tokens", json={"model": "gpt-5"})

    assert unknown.status_code == 404
    assert unknown.json()["type"] == "error"
    assert unknown.json()["error"]["type"] == "not_found_error"
    assert limited.status_code == 429
    assert limited.json()["error"]["type"] == "rate_limit_error"


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]"])
def test_bad_json_body_is_invalid_request(client: httpx.Client, content: bytes) -> None:
    response = client.post("/chat/completions", content=content)

    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_sequence_rejects_then_serves_and_the_last_repeats(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script("gpt-5", model_not_found(), unavailable(), serve("ok"))

    statuses = [client.post("/chat/completions", json={"model": "gpt-5"}).status_code for _ in range(4)]

    assert statuses == [404, 503, 200, 200]


def test_a_scripted_model_need_not_be_listed(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script("gpt-unlisted", serve("yes"))

    body = client.post("/chat/completions", json={"model": "gpt-unlisted"}).json()

    assert body["choices"][0]["message"]["content"] == "yes"


# -- refusals -------------------------------------------------------------------------------------------


def test_refusal_shapes(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script("gpt-5", refusal())

    chat = client.post("/chat/completions", json={"model": "gpt-5"}).json()
    chat_stream = sse_events(client, "/chat/completions", {"model": "gpt-5"})
    response = client.post("/responses", json={"model": "gpt-5"}).json()
    response_stream = sse_events(client, "/responses", {"model": "gpt-5"})
    message = client.post("/messages", json={"model": "gpt-5"}).json()
    message_stream = sse_events(client, "/messages", {"model": "gpt-5"})

    assert chat["choices"][0]["finish_reason"] == "content_filter"
    assert chat_stream[-2][1]["choices"][0]["finish_reason"] == "content_filter"
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "content_filter"}
    assert response["output"][0]["content"][0]["type"] == "refusal"
    assert response_stream[-1][0] == "response.incomplete"
    assert "response.refusal.delta" in [name for name, _ in response_stream]
    assert message["stop_reason"] == "refusal"
    delta = next(data for name, data in message_stream if name == "message_delta")
    assert delta["delta"]["stop_reason"] == "refusal"


# -- stream failures ------------------------------------------------------------------------------------


def test_fail_after_visible_on_responses_sse(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script("gpt-5", fail_after_visible())

    events = sse_events(client, "/responses", {"model": "gpt-5"})

    assert [name for name, _ in events] == [*LEADING, "response.output_text.delta", "error"]
    assert events[-1][1]["error"]["type"] == "server_error"
    assert events[-1][1]["sequence_number"] == 5


def test_fail_after_visible_on_chat_sse(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script("gpt-5", fail_after_visible())

    events = sse_events(client, "/chat/completions", {"model": "gpt-5"})

    assert [data["choices"][0]["delta"] for _, data in events[:2]] == [
        {"role": "assistant", "content": "", "refusal": None},
        {"content": "hello"},
    ]
    assert events[2][1]["error"]["type"] == "server_error"
    assert len(events) == 3  # no [DONE] after a failure


def test_fail_after_visible_on_anthropic_sse(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script("gpt-5", fail_after_visible())

    events = sse_events(client, "/messages", {"model": "gpt-5"})

    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "error",
    ]
    assert events[-1][1]["error"]["type"] == "overloaded_error"


@pytest.mark.parametrize(
    "behaviour, path, body",
    [
        pytest.param(fail_after_visible, "/chat/completions", {"model": "gpt-5"}, id="fail-after-visible"),
        pytest.param(close_websocket, "/responses", {"model": "gpt-5", "stream": True}, id="close-websocket"),
    ],
)
def test_a_mid_stream_fault_on_plain_http_drops_the_connection(
    fake: FakeUpstream, client: httpx.Client, behaviour, path: str, body: dict
) -> None:
    fake.script("gpt-5", behaviour())

    with pytest.raises(httpx.RemoteProtocolError):
        client.post(path, json=body)


def test_fail_before_visible_on_responses_sse(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script("gpt-5", fail_before_visible(), fail_before_visible(terminal="error"))

    failed = sse_events(client, "/responses", {"model": "gpt-5"})
    errored = sse_events(client, "/responses", {"model": "gpt-5"})

    assert [name for name, _ in failed] == [*LEADING, "response.failed"]
    assert failed[-1][1]["response"]["status"] == "failed"
    assert failed[-1][1]["response"]["error"]["code"] == "model_not_found"
    assert [name for name, _ in errored] == [*LEADING, "error"]
    assert errored[-1][1]["error"] == MODEL_NOT_FOUND


def test_fail_before_visible_on_chat_and_anthropic_sse(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script("gpt-5", fail_before_visible())

    chat = sse_events(client, "/chat/completions", {"model": "gpt-5"})
    messages = sse_events(client, "/messages", {"model": "gpt-5"})

    assert chat[0][1]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    assert chat[1][1] == {"error": MODEL_NOT_FOUND}
    assert len(chat) == 2
    assert [name for name, _ in messages] == ["message_start", "content_block_start", "ping", "error"]
    assert messages[-1][1]["error"]["type"] == "not_found_error"


def test_fail_before_visible_on_plain_http_is_a_model_not_found(
    fake: FakeUpstream, client: httpx.Client
) -> None:
    fake.script("gpt-5", fail_before_visible())

    response = client.post("/responses", json={"model": "gpt-5"})

    assert response.status_code == 404
    assert response.json() == {"error": MODEL_NOT_FOUND}


@pytest.mark.parametrize(
    ("after_visible", "last_event"),
    [(True, "response.output_text.delta"), (False, "response.content_part.added")],
)
def test_cut_stream_closes_the_connection_without_a_terminal_event(
    fake: FakeUpstream, client: httpx.Client, after_visible: bool, last_event: str
) -> None:
    fake.script("gpt-5", cut_stream(after_visible=after_visible))

    received = parse_sse(read_until_cut(client, "/responses", {"model": "gpt-5", "stream": True}))

    assert received[-1][0] == last_event


# -- time -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_hang_sends_nothing_until_the_client_times_out(fake: FakeUpstream, stream: bool) -> None:
    fake.script("gpt-5", hang(seconds=2))
    started = time.monotonic()

    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{fake.base_url}/responses", json={"model": "gpt-5", "stream": stream}, timeout=0.5, verify=False
        )

    assert time.monotonic() - started < 1.5
    assert fake.hit_count(model="gpt-5") == 1  # the request was received: dispatch is unknown


def test_hang_ends_by_dropping_the_connection(fake: FakeUpstream) -> None:
    fake.script("gpt-5", hang(seconds=0.2))

    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(f"{fake.base_url}/chat/completions", json={"model": "gpt-5"}, timeout=2, verify=False)


def test_slow_stream_paces_events(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script("gpt-5", slow_stream(0.03, "a b"))
    started = time.monotonic()

    events = sse_events(client, "/chat/completions", {"model": "gpt-5"})

    assert len(events) == 5  # role, two deltas, finish, [DONE]: each after a pause
    assert time.monotonic() - started >= 5 * 0.03


# -- recording and auth ---------------------------------------------------------------------------------


def test_hits_record_each_request(fake: FakeUpstream, client: httpx.Client) -> None:
    client.post("/chat/completions", json={"model": "gpt-5"}, headers={"Authorization": "Bearer sk-a"})
    client.post("/responses", json={"model": "gpt-x", "stream": True}, headers={"X-Api-Key": "sk-b"})
    client.post("/messages", content=b"nope")

    chat, responses, bad = fake.hits
    assert (chat.path, chat.method, chat.model, chat.transport) == (
        "/v1/chat/completions",
        "POST",
        "gpt-5",
        "http",
    )
    assert chat.headers["authorization"] == "Bearer sk-a"
    assert chat.body == {"model": "gpt-5"}
    assert (responses.model, responses.transport, responses.headers["x-api-key"]) == ("gpt-x", "sse", "sk-b")
    assert (bad.model, bad.body) == (None, None)
    assert fake.hit_count() == 3
    assert fake.hit_count(model="gpt-x") == 1
    assert fake.hit_count(path="/v1/chat/completions") == 1
    assert fake.hit_count(model="gpt-5", path="/v1/responses") == 0


def test_reset_forgets_hits_and_scripts(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script("gpt-5", unavailable())
    client.post("/chat/completions", json={"model": "gpt-5"})

    fake.reset()

    assert fake.hits == []
    assert client.post("/chat/completions", json={"model": "gpt-5"}).status_code == 200


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/chat/completions", {"Authorization": "Bearer sk-right"}, 200),
        ("/messages", {"x-api-key": "sk-right"}, 200),
        ("/chat/completions", {"Authorization": "Bearer sk-wrong"}, 401),
        ("/messages", {}, 401),
    ],
)
def test_require_key(
    fake_upstream_factory: MakeFake, path: str, headers: dict[str, str], status: int
) -> None:
    fake = fake_upstream_factory(require_key="sk-right")

    response = httpx.post(f"{fake.base_url}{path}", json={"model": "gpt-5"}, headers=headers, verify=False)

    assert response.status_code == status
    assert fake.hit_count(model="gpt-5") == 1  # recorded even when refused


async def test_async_client_is_served(fake: FakeUpstream) -> None:
    async with httpx.AsyncClient(base_url=fake.base_url, verify=False) as client:
        response = await client.post("/chat/completions", json={"model": "gpt-5"})

    assert response.json()["choices"][0]["message"]["content"] == "hello from a"


# -- websocket ------------------------------------------------------------------------------------------


async def test_websocket_serves_several_responses_on_one_connection(fake: FakeUpstream) -> None:
    fake.script("gpt-5", serve("first"), serve("second"))

    async with connect(fake.ws_url, additional_headers={"Authorization": "Bearer sk-a"}) as ws:
        first = await ws_events(ws, {"model": "gpt-5"}, until={"response.completed"})
        second = await ws_events(ws, {"model": "gpt-5"}, until={"response.completed"})

    assert [event["type"] for event in first] == responses_stream(1)
    assert [event["sequence_number"] for event in first] == list(range(len(first)))
    assert first[-1]["response"]["output"][0]["content"][0]["text"] == "first"
    assert second[-1]["response"]["output"][0]["content"][0]["text"] == "second"
    assert fake.ws_connections == 1
    assert [(hit.transport, hit.model) for hit in fake.hits] == [("websocket", "gpt-5")] * 2
    assert fake.hits[0].headers["authorization"] == "Bearer sk-a"
    assert fake.hits[0].body == {"type": "response.create", "model": "gpt-5"}


async def test_websocket_rejection_is_an_error_event_and_the_connection_stays_open(
    fake: FakeUpstream,
) -> None:
    async with connect(fake.ws_url) as ws:
        rejected = await ws_events(ws, {"model": "gpt-unknown"}, until={"error"})
        served = await ws_events(ws, {"model": "gpt-5"}, until={"response.completed"})

    assert rejected == [{"type": "error", "status": 404, "error": MODEL_NOT_FOUND}]
    assert served[-1]["type"] == "response.completed"


async def test_websocket_raw_error_and_bad_frames(fake: FakeUpstream) -> None:
    fake.script(
        "gpt-5",
        error(400, {"error": {"type": "invalid_request_error", "code": "previous_response_not_found"}}),
    )

    async with connect(fake.ws_url) as ws:
        raw = await ws_events(ws, {"model": "gpt-5"}, until={"error"})
        await ws.send("{not json")
        bad = json.loads(await ws.recv())

    assert raw == [
        {
            "type": "error",
            "status": 400,
            "error": {"type": "invalid_request_error", "code": "previous_response_not_found"},
        }
    ]
    assert (bad["type"], bad["status"], bad["error"]["param"]) == ("error", 400, "type")


async def test_websocket_stream_failures(fake: FakeUpstream) -> None:
    fake.script("gpt-5", fail_after_visible(), fail_before_visible())

    async with connect(fake.ws_url) as ws:
        after = await ws_events(ws, {"model": "gpt-5"}, until={"error"})
        before = await ws_events(ws, {"model": "gpt-5"}, until={"response.failed"})

    assert [event["type"] for event in after] == [*LEADING, "response.output_text.delta", "error"]
    assert [event["type"] for event in before] == [*LEADING, "response.failed"]
    assert before[-1]["response"]["error"]["code"] == "model_not_found"


async def test_websocket_close_and_cut(fake: FakeUpstream) -> None:
    fake.script("gpt-5", close_websocket(code=1011), cut_stream())

    async with connect(fake.ws_url) as ws:
        await ws.send(json.dumps({"type": "response.create", "model": "gpt-5"}))
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
    async with connect(fake.ws_url) as ws:
        await ws.send(json.dumps({"type": "response.create", "model": "gpt-5"}))
        received = []
        with pytest.raises(ConnectionClosed) as cut:
            while True:
                received.append(json.loads(await ws.recv()))

    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1011
    assert cut.value.rcvd is None  # no close frame: the TCP connection just ended
    assert received[-1]["type"] == "response.output_text.delta"
    assert fake.ws_connections == 2


async def test_websocket_hang_sends_nothing(fake: FakeUpstream) -> None:
    fake.script("gpt-5", hang(seconds=0.6))

    async with connect(fake.ws_url) as ws:
        await ws.send(json.dumps({"type": "response.create", "model": "gpt-5"}))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(ws.recv(), 0.3)

    assert fake.hit_count(model="gpt-5") == 1


async def test_websocket_wrong_key_is_refused_before_upgrade(fake_upstream_factory: MakeFake) -> None:
    fake = fake_upstream_factory(require_key="sk-right")

    with pytest.raises(InvalidStatus) as refused:
        async with connect(fake.ws_url, additional_headers={"Authorization": "Bearer sk-wrong"}):
            pass

    assert refused.value.response.status_code == 401
    assert fake.ws_connections == 0
    assert fake.hits[0].headers["authorization"] == "Bearer sk-wrong"


# -- lifecycle ------------------------------------------------------------------------------------------


def fake_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("fake-upstream-")]


async def test_stop_closes_everything_promptly() -> None:
    fake = FakeUpstream("lifecycle").start()
    port = fake.port
    fake.script("gpt-5", hang(seconds=30))
    async with connect(fake.ws_url) as ws, httpx.AsyncClient(base_url=fake.base_url, verify=False) as client:
        await ws.send(json.dumps({"type": "response.create", "model": "gpt-5"}))
        pending = asyncio.ensure_future(client.post("/chat/completions", json={"model": "gpt-5"}))
        while fake.hit_count() < 2:
            await asyncio.sleep(0.01)
        started = time.monotonic()
        await asyncio.to_thread(fake.stop)

        assert time.monotonic() - started < 2
        with pytest.raises(httpx.RemoteProtocolError):
            await pending
        with pytest.raises(ConnectionClosed):
            await ws.recv()

    assert fake_threads() == []
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1)


def test_context_manager_starts_and_stops() -> None:
    with FakeUpstream("ctx") as fake:
        assert httpx.get(f"{fake.base_url}/models", verify=False).status_code == 200
        port = fake.port

    assert fake_threads() == []
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1)
    with pytest.raises(RuntimeError):
        _ = fake.base_url
