"""Responses websocket mode (SPEC §6.3) over real sockets: a websocket client (the `websockets`
library, and the openai SDK's `responses.connect()`) -> the gateway under uvicorn -> fake upstreams
that speak the websocket mode on loopback."""

import json

import pytest
from openai import OpenAI
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from devkit.behaviours import (
    close_websocket,
    fail_after_visible,
    fail_before_visible,
    model_not_found,
    serve,
    slow_stream,
    unavailable,
)
from proxy.ledger.models import Attempt, RequestRecord
from routing.models import Affinity, Circuit, Demotion
from tests.gateway_fixtures import GATEWAY_KEY
from tests.proxy.fixtures_e2e import AUTH, ledger_settled, post, wait_for

TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}
FAKE_WORDS = ("does not exist", "had an error", "Incorrect API key")  # the fakes' own messages


def ws_url(gateway: str) -> str:
    return gateway.replace("http://", "ws://") + "/v1/responses"


def open_ws(gateway: str, headers: dict[str, str] | None = None) -> ClientConnection:
    return connect(ws_url(gateway), additional_headers=AUTH if headers is None else headers, open_timeout=5)


def read_response(ws: ClientConnection) -> list[dict]:
    """The events of one response, through its terminal event. The gateway hands the response's
    ledger row over before its terminal event; waiting for the write keeps the test database (an
    SQLite shared cache with table locks) from being written by two threads at once."""
    events = []
    while True:
        event = json.loads(ws.recv(timeout=10))
        events.append(event)
        if event["type"] in TERMINAL:
            ledger_settled()
            return events


def create(ws: ClientConnection, **body) -> list[dict]:
    ws.send(json.dumps({"type": "response.create", "model": "gpt-5", "input": "hi", **body}))
    return read_response(ws)


def assert_nothing_more(ws: ClientConnection) -> None:
    with pytest.raises(TimeoutError):
        ws.recv(timeout=0.3)


def text_of(events: list[dict]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


def ws_records(count: int) -> list[RequestRecord]:
    """The websocket ledger rows, oldest first, once `count` are written."""

    def probe() -> list[RequestRecord] | None:
        ledger_settled()
        rows = list(RequestRecord.objects.filter(route="/v1/responses").order_by("started_at", "id"))
        return rows if len(rows) >= count else None

    rows = wait_for(probe, what=f"{count} websocket request records")
    assert len(rows) == count, [r.outcome for r in rows]
    return rows


def attempts(record: RequestRecord) -> list[tuple[str, str]]:
    rows = Attempt.objects.filter(request=record).order_by("ordinal")
    return list(rows.values_list("status", "route_class"))


@pytest.mark.parametrize(
    "rejection",
    [model_not_found(), fail_before_visible("response.failed"), fail_before_visible("error")],
    ids=["error-event", "response.failed-after-lifecycle", "error-after-lifecycle"],
)
def test_first_assignment_rejects_and_the_second_serves_in_one_connection(
    gateway, two_assignments, rejection
):
    a, b, (acct_a, acct_b) = two_assignments
    a.script("gpt-5", rejection)
    b.script("gpt-5", serve("served by b"))
    with open_ws(gateway) as ws:
        events = create(ws)
        assert_nothing_more(ws)
    assert text_of(events) == "served by b"
    assert events[-1]["type"] == "response.completed"
    # No trace of the failed attempt: no error, and every event belongs to b's one response.
    assert not [e for e in events if e["type"] in ("error", "response.failed")]
    ids = {e["response"]["id"] for e in events if "response" in e}
    assert ids == {events[-1]["response"]["id"]}
    assert (a.ws_connections, b.ws_connections) == (1, 1)
    assert (a.hit_count(model="gpt-5"), b.hit_count(model="gpt-5")) == (1, 1)
    assert a.hits[0].headers["authorization"] == "Bearer sk-upstream-credential-canary-42"
    assert a.hits[0].body == {"type": "response.create", "model": "gpt-5", "input": "hi"}
    (record,) = ws_records(1)
    assert (record.transport, record.outcome, record.retry_count) == ("websocket", "ok", 1)
    assert record.served_model == "gpt-5"
    assert attempts(record) == [("retryable_failed", "websocket"), ("succeeded", "websocket")]
    circuit = Circuit.objects.get(assignment=acct_a)
    assert (circuit.route_class, circuit.reason, circuit.consecutive_failures) == (
        "websocket",
        "upstream_model_unavailable",
        1,
    )
    assert Demotion.objects.filter(assignment=acct_a, model="gpt-5").exists()
    assert not Circuit.objects.filter(assignment=acct_b).exists()
    # The failed upstream connection was closed before b was tried; b's stays open (live) until the
    # client leaves, then closes too.
    assert wait_for(lambda: a.ws_open == 0 and b.ws_open == 0, what="upstream connections closed")


def test_a_refused_upstream_connection_fails_over_before_any_frame(gateway, two_assignments):
    """A refused connection (nothing listening) is `not_sent`: the next candidate serves."""
    a, b, (acct_a, _) = two_assignments
    acct_a.base_url = "http://127.0.0.1:9/v1"  # the discard port: nothing listens
    acct_a.save(update_fields=["base_url"])
    b.script("gpt-5", serve("from b"))
    with open_ws(gateway) as ws:
        assert text_of(create(ws)) == "from b"
    (record,) = ws_records(1)
    assert attempts(record) == [("retryable_failed", "websocket"), ("succeeded", "websocket")]
    first = Attempt.objects.get(request=record, ordinal=1)
    assert (first.failure_class, first.dispatch_state) == ("unavailable", "not_sent")
    assert a.ws_connections == 0


def test_a_failure_after_visible_output_is_relayed_sanitized_and_never_retried(gateway, two_assignments):
    a, b, _ = two_assignments
    a.script("gpt-5", fail_after_visible())
    with open_ws(gateway) as ws:
        events = create(ws)
        assert_nothing_more(ws)
    types = [e["type"] for e in events]
    assert "response.output_text.delta" in types
    assert types[-1] == "error" and types.count("error") == 1
    error = events[-1]["error"]
    assert error["type"] == "server_error"
    assert not any(words in error["message"] for words in FAKE_WORDS)
    assert b.ws_connections == 0 and b.hits == []
    (record,) = ws_records(1)
    assert (record.outcome, record.retry_count) == ("upstream_error_after_output", 0)
    assert attempts(record) == [("failed", "websocket")]


def test_the_live_pin_holds_when_the_pinned_upstream_later_rejects(gateway, two_assignments):
    a, b, (acct_a, _) = two_assignments
    a.script("gpt-5", serve("first"), model_not_found(), serve("third"))
    b.script("gpt-5", serve("from b"))
    with open_ws(gateway) as ws:
        first = create(ws)
        second = create(ws)
        assert_nothing_more(ws)
        third = create(ws)  # the connection, and the pin, survive a rejection
    assert text_of(first) == "first" and text_of(third) == "third"
    assert [e["type"] for e in second] == ["error"]
    assert (second[0]["status"], second[0]["error"]["code"]) == (404, "model_not_found")
    assert not any(words in second[0]["error"]["message"] for words in FAKE_WORDS)
    assert a.ws_connections == 1  # all three on the one live upstream connection
    assert b.ws_connections == 0 and b.hits == []  # never failed over, though b would serve
    records = ws_records(3)
    assert [r.outcome for r in records] == ["ok", "model_not_found", "ok"]
    assert attempts(records[1]) == [("failed", "websocket")]
    assert records[1].retry_count == 0
    # A model_unavailable outcome on a pinned candidate still records its circuit failure (SPEC §7.1);
    # the third response's success then resolves it.
    assert Attempt.objects.get(request=records[1]).failure_class == "model_unavailable"
    assert Circuit.objects.filter(assignment=acct_a, route_class="websocket").exists()


@pytest.mark.parametrize("withheld", [False, True], ids=["error-event", "after-lifecycle"])
def test_shortlist_exhaustion_sends_one_sanitized_terminal_event(gateway, two_assignments, withheld):
    a, b, _ = two_assignments
    rejection = fail_before_visible("error") if withheld else model_not_found()
    a.script("gpt-5", rejection)
    b.script("gpt-5", rejection)
    with open_ws(gateway) as ws:
        events = create(ws)
        assert_nothing_more(ws)
        still_usable = create(ws, model="no-such-model")
    types = [e["type"] for e in events]
    # Only the last candidate's withheld lifecycle (once), then one gateway error event.
    lifecycle = ["response.created", "response.in_progress"]
    lifecycle += ["response.output_item.added", "response.content_part.added"]
    assert types == ([*lifecycle, "error"] if withheld else ["error"])
    error = events[-1]["error"]
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    assert not any(words in error["message"] for words in FAKE_WORDS)
    assert (a.ws_connections, b.ws_connections) == (1, 1)
    assert wait_for(lambda: a.ws_open == 0 and b.ws_open == 0, what="both failed connections closed")
    assert [e["error"]["code"] for e in still_usable] == ["model_not_found"]
    first, _ = ws_records(2)
    assert attempts(first) == [("retryable_failed", "websocket"), ("failed", "websocket")]


def test_a_client_disconnect_mid_response_closes_the_upstream_and_records_cancelled(gateway, two_assignments):
    a, b, _ = two_assignments
    a.script("gpt-5", slow_stream(0.1, " ".join(["word"] * 20)))  # ~3 s in all
    with open_ws(gateway) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "gpt-5", "input": "hi"}))
        while json.loads(ws.recv(timeout=10))["type"] != "response.output_text.delta":
            pass
    # The rest of the response is read for its usage (issue 45 finding 6), then the upstream connection
    # is closed with the client's.
    assert wait_for(lambda: a.ws_open == 0, timeout=10, what="the upstream connection closed")
    (record,) = ws_records(1)
    assert record.outcome == "cancelled"
    attempt = Attempt.objects.get(request=record)
    assert (attempt.status, attempt.failure_class, attempt.dispatch_state) == (
        "cancelled",
        "cancelled",
        "completed",
    )
    assert (attempt.input_tokens, attempt.output_tokens) == (10, 20)
    assert b.hits == []
    assert not Circuit.objects.exists()  # a disconnect says nothing about the upstream's health


def test_an_idle_client_leaving_closes_its_live_upstream_connection(gateway, two_assignments):
    a, _, _ = two_assignments
    with open_ws(gateway) as ws:
        create(ws)
        assert a.ws_open == 1  # live, held for the next response.create
    assert wait_for(lambda: a.ws_open == 0, timeout=3, what="the live upstream connection closed")


def test_the_live_upstream_closing_mid_request_closes_the_client_with_a_reason(gateway, two_assignments):
    a, b, _ = two_assignments
    a.script("gpt-5", serve("first"), close_websocket(code=1011))
    with open_ws(gateway) as ws:
        create(ws)
        second = create(ws)
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
    # The frame was sent, then the upstream closed: it may have executed, so it is not replayed.
    assert [(e["status"], e["error"]["code"]) for e in second] == [(504, "upstream_dispatch_unknown")]
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1014, "upstream connection closed")
    assert b.ws_connections == 0
    assert [r.outcome for r in ws_records(2)] == ["ok", "upstream_dispatch_unknown"]


def test_the_live_upstream_closing_while_idle_closes_the_client_with_a_reason(gateway, two_assignments):
    a, b, _ = two_assignments
    with open_ws(gateway) as ws:
        create(ws)
        a.stop()  # closes its websockets (going away)
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1014, "upstream connection closed")
    assert b.ws_connections == 0


def test_an_unavailable_first_upstream_hands_over_and_the_second_becomes_live(gateway, two_assignments):
    a, b, _ = two_assignments
    a.script("gpt-5", unavailable(503))
    b.script("gpt-5", serve("one"), serve("two"))
    with open_ws(gateway) as ws:
        assert text_of(create(ws)) == "one"
        assert text_of(create(ws)) == "two"
    assert (a.hit_count(), b.hit_count()) == (1, 2)
    assert (a.ws_connections, b.ws_connections) == (1, 1)
    first, second = ws_records(2)
    assert first.retry_count == 1 and second.retry_count == 0
    assert attempts(second) == [("succeeded", "websocket")]


def test_bad_frames_get_typed_errors_reach_no_upstream_and_the_connection_stays_usable(
    gateway, two_assignments, settings
):
    a, b, _ = two_assignments
    settings.GATEWAY_MAX_BODY_BYTES = 2000
    frames: list[str | bytes] = [
        b'{"type": "response.create", "model": "gpt-5"}',
        "{not json",
        "[1, 2]",
        '{"type": "response.create", "model": "gpt-5", "temperature": NaN}',
        '{"type": "response.cancel"}',
        '{"model": "gpt-5"}',
        '{"type": "response.create"}',
        '{"type": "response.create", "model": "gpt-5", "stream": "yes"}',
        json.dumps({"type": "response.create", "model": "gpt-5", "input": "x" * 3000}),
        json.dumps({"type": "response.create", "model": "gpt-5", "input": "é" * 1200}),  # 2400 bytes
    ]
    expected = [
        ("invalid_request", None),
        ("invalid_request", None),
        ("invalid_request", None),
        ("invalid_request", None),
        ("invalid_request", "type"),
        ("invalid_request", "type"),
        ("invalid_request", "model"),
        ("invalid_request", "stream"),
        ("request_too_large", None),
        ("request_too_large", None),
    ]
    with open_ws(gateway) as ws:
        answers = []
        for frame in frames:
            ws.send(frame)
            answers.append(read_response(ws))
        assert_nothing_more(ws)
        assert a.hits == [] and a.ws_connections == 0 and b.hits == []
        served = create(ws)
    for events, (code, param) in zip(answers, expected, strict=True):
        assert len(events) == 1
        (event,) = events
        assert event["type"] == "error"
        assert event["error"]["type"] == "invalid_request_error"
        assert (event["error"]["code"], event["error"]["param"]) == (code, param)
        assert event["status"] == (413 if code == "request_too_large" else 400)
    assert served[-1]["type"] == "response.completed"
    records = ws_records(len(frames) + 1)
    assert [r.outcome for r in records] == [code for code, _ in expected] + ["ok"]
    assert {r.transport for r in records} == {"websocket"}
    assert not Attempt.objects.filter(request__in=records[:-1]).exists()


@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer sk-gw-wrong-key-0123456789"}, {"x-api-key": "nope"}],
    ids=["no-key", "wrong-bearer", "wrong-x-api-key"],
)
def test_a_bad_key_is_refused_with_a_clear_close_code(gateway, two_assignments, headers):
    a, b, _ = two_assignments
    with open_ws(gateway, headers) as ws, pytest.raises(ConnectionClosed) as closed:
        ws.send(json.dumps({"type": "response.create", "model": "gpt-5"}))
        ws.recv(timeout=5)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4401, "invalid gateway key")
    assert a.hits == [] and b.hits == []


def test_x_api_key_authenticates_the_handshake(gateway, two_assignments):
    with open_ws(gateway, {"x-api-key": GATEWAY_KEY}) as ws:
        assert create(ws)[-1]["type"] == "response.completed"


def test_a_websocket_response_id_pins_a_later_http_continuation(gateway, two_assignments):
    """Response ids relayed over the websocket feed the previous_response_id affinity (SPEC §7.2)."""
    a, b, (_, acct_b) = two_assignments
    a.script("gpt-5", model_not_found(), serve())
    with open_ws(gateway) as ws:
        events = create(ws)
    response_id = events[-1]["response"]["id"]
    ws_records(1)
    assert Affinity.objects.get(key=response_id).assignment_id == acct_b.pk
    response = post(
        gateway, "/v1/responses", {"model": "gpt-5", "input": "more", "previous_response_id": response_id}
    )
    assert response.status_code == 200
    assert (a.hit_count(path="/v1/responses"), b.hit_count(path="/v1/responses")) == (1, 2)


# The SDK's own use of websockets 17 warns; nothing the gateway does.
@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")
def test_the_openai_sdk_websocket_mode_fails_over_inside_its_connection(gateway, two_assignments):
    a, b, _ = two_assignments
    a.script("gpt-5", model_not_found())
    b.script("gpt-5", serve("hello from the sdk"), serve("and again"))
    client = OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, max_retries=0)
    texts = []
    with client.responses.connect() as connection:
        for _ in range(2):
            connection.response.create(model="gpt-5", input="hi")
            text = ""
            for event in connection:
                if event.type == "response.output_text.delta":
                    text += event.delta
                if event.type in TERMINAL:
                    assert event.type == "response.completed"
                    break
            texts.append(text)
    assert texts == ["hello from the sdk", "and again"]
    assert (a.ws_connections, b.ws_connections) == (1, 1)
    assert [r.retry_count for r in ws_records(2)] == [1, 0]
