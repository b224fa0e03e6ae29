"""Bad input at the websocket edge (SPEC §6.3, §11), fuzzed: whatever a client sends on websocket
`/v1/responses`, it gets a typed `error` event (the connection stays usable), a served response, or a
close with one of the codes the consumer documents (proxy/consumers.py) or the websocket protocol
defines; never a crash (1011), never an upstream call for a bad frame, and never a disturbance to the
other clients: a well-behaved "bystander" client, connected to the same gateway for the whole test,
has a response in flight across every example and must get it completed.

The gateway is the real ASGI app under uvicorn on a loopback socket (tests/gateway_fixtures.py), in
front of two fake upstreams. Frames go through the `websockets` client library; handshakes whose
bytes no client library sends (CRLF in a header value, oversized headers) go over a raw socket, with
the library's sans-I/O protocol doing the framing once the connection is upgraded.
"""

import base64
import json
import math
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import TypeVar

import pytest
from django.conf import settings as django_settings
from hypothesis import currently_in_test_context, event, given, settings
from hypothesis import strategies as st
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.frames import Opcode
from websockets.protocol import State
from websockets.sync.client import ClientConnection, connect
from websockets.uri import parse_uri

from devkit.behaviours import slow_stream
from devkit.upstream import FakeUpstream
from pools.models import GatewayKey
from proxy.consumers import MAX_PENDING
from proxy.ledger import recorder as ledger
from proxy.ledger.models import RequestRecord
from routing.models import Circuit, Demotion
from tests.factories import GatewayKeyFactory
from tests.gateway_fixtures import GATEWAY_KEY
from tests.proxy.fixtures_e2e import AUTH, wait_for
from tests.reliability.fuzzing import fuzz_settings

FUZZ = fuzz_settings(max_examples=20)
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}
# What a frame may be answered with when it is not served: the gateway's typed codes (SPEC §4).
TYPED_CODES = {
    "invalid_request",
    "request_too_large",
    "permission_denied",
    "model_not_found",
    "no_eligible_backend",
    "pin_unavailable",
    "gateway_unavailable",
    "file_assignment_conflict",
    # Sent, then cut (a client's tiny x-gateway-deadline-ms): the upstream may have executed it.
    "upstream_dispatch_unknown",
}
BAD_FRAME = ("invalid_request_error", "invalid_request", 400)
TOO_LARGE = ("invalid_request_error", "request_too_large", 413)
CLOSE_INVALID_KEY = (4401, "invalid gateway key")
CLOSE_TOO_MANY_PENDING = (1008, "too many pending frames")
# Closes from the websocket protocol itself (RFC 6455), sent by the ASGI server before the consumer
# sees the frame: invalid UTF-8 in a text frame, and a message over the server's size limit.
CLOSE_INVALID_PAYLOAD = 1007
CLOSE_MESSAGE_TOO_BIG = 1009
UVICORN_WS_MAX_SIZE = 16 * 1024 * 1024  # uvicorn's default `ws_max_size`, which the test server keeps
VALID = {"type": "response.create", "model": "gpt-5", "input": "hi"}
BYSTANDER_INPUT = "bystander: is the gateway still there?"
BYSTANDER_TEXT = "steady as she goes"
BYSTANDER_KEY = "sk-gw-bystander-key-0123456789"  # its own key: a test may disable the fuzz clients' one
T = TypeVar("T")


def ws_url(gateway: str) -> str:
    return gateway.replace("http://", "ws://") + "/v1/responses"


# --- the bystander and the upstream ledger ------------------------------------------------------


@dataclass
class Edge:
    """The live gateway, its two fake upstreams, and the bystander's open connection."""

    url: str
    upstreams: tuple[FakeUpstream, FakeUpstream]
    bystander: ClientConnection

    def fuzz_hits(self) -> list:
        """Every upstream call so far that was not the bystander's."""
        hits = self.upstreams[0].hits + self.upstreams[1].hits
        return [h for h in hits if not (isinstance(h.body, dict) and h.body.get("input") == BYSTANDER_INPUT)]

    def upstream_connections(self) -> int:
        return sum(u.ws_connections for u in self.upstreams)


@pytest.fixture
def edge(gateway, two_assignments) -> Iterator[Edge]:
    a, b, (acct_a, _) = two_assignments
    GatewayKeyFactory(name="bystander", raw_key=BYSTANDER_KEY, pools=[acct_a.pool])
    # Every gpt-5 response streams a little: the bystander's is in flight while each example runs.
    a.script("gpt-5", slow_stream(0.003, BYSTANDER_TEXT))
    headers = {"authorization": f"Bearer {BYSTANDER_KEY}"}
    with connect(ws_url(gateway), additional_headers=headers, open_timeout=5) as bystander:
        edge = Edge(gateway, (a, b), bystander)
        bystander.send(json.dumps({**VALID, "input": BYSTANDER_INPUT}))
        _assert_bystander_served(edge)  # its upstream connection is now live, for the whole test
        yield edge


def _assert_bystander_served(edge: Edge) -> None:
    try:
        events = read_answer(edge.bystander)
    except ConnectionClosed as closed:
        pytest.fail(f"the bystander's connection closed: {closed.rcvd}", pytrace=False)
    assert events[-1]["type"] == "response.completed", f"the bystander got {events[-1]}"
    assert text_of(events) == BYSTANDER_TEXT


@dataclass
class Case:
    """What one example did to the upstreams, checked when it ends."""

    hits_before: int
    connections_before: int
    records_before: int
    served: int = 0  # responses the fuzz client got completed: each is one upstream call
    cut: int = 0  # frames that may have reached an upstream without their response being completed
    new_connections: int | None = 0  # upstream connections those opened; None: do not check
    records: int | None = None  # ledger rows the example's frames must leave; None: do not check


@contextmanager
def alongside_bystander(edge: Edge) -> Iterator[Case]:
    """Run one example while the bystander's next response is in flight, then check that the
    bystander got it completed, and that the upstreams saw exactly what the example says was served."""
    case = Case(len(edge.fuzz_hits()), edge.upstream_connections(), _records())
    edge.bystander.send(json.dumps({**VALID, "input": BYSTANDER_INPUT}))
    yield case
    _assert_bystander_served(edge)
    new_hits = edge.fuzz_hits()[case.hits_before :]
    calls = f"upstream calls {[h.body for h in new_hits]!r:.500}"
    assert case.served <= len(new_hits) <= case.served + case.cut, calls
    for hit in new_hits:
        assert hit.headers["authorization"] == "Bearer sk-upstream-credential-canary-42"
        assert "x-injected" not in hit.headers
    if case.new_connections is not None:
        assert edge.upstream_connections() - case.connections_before == case.new_connections
    # SQLite's shared-cache test database: the ledger writer finishes before the next example reads.
    ledger.writer.flush(timeout=10)
    if case.records is not None:
        # SPEC §11: every frame leaves its own ledger row (the bystander's response one more).
        expected = case.records_before + case.records + 1
        wait_for(lambda: _records() >= expected, what=f"{expected} websocket ledger rows")
        assert _records() == expected


def db_read(query: Callable[..., T], **kwargs: object) -> T:
    """`query(**kwargs)` once the ledger writer is idle, retried while SQLite's shared-cache test
    database has a table locked by the gateway's own writes."""
    ledger.writer.flush(timeout=10)
    return wait_for(lambda: (query(**kwargs),), what="a database query")[0]


def _records() -> int:
    return db_read(RequestRecord.objects.filter(route="/v1/responses").count)


def assert_no_health_state_changed() -> None:
    """Bad input says nothing about an upstream's health (SPEC §11: no state but its ledger row)."""
    assert db_read(Circuit.objects.count) == 0
    assert db_read(Demotion.objects.count) == 0


# --- reading answers -----------------------------------------------------------------------------


def read_answer(ws: ClientConnection, timeout: float = 10) -> list[dict]:
    """The events answering one frame, through its terminal event (frames are answered in order)."""
    events = []
    while True:
        event = json.loads(ws.recv(timeout=timeout))
        events.append(event)
        if event["type"] in TERMINAL:
            return events


def text_of(events: list[dict]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


def assert_typed_or_served(events: list[dict], frame: object) -> str:
    """A completed response, or one typed gateway `error` event in the SPEC §4 shape (never a bare 500,
    never a stack trace). Returns "served" or the error code."""
    label = f"{frame!r:.300} -> {events!r:.500}"
    last = events[-1]
    if last["type"] == "response.completed":
        return "served"
    assert events == [last], label  # a gateway error comes alone: nothing was relayed before it
    assert last["type"] == "error", label
    error = last["error"]
    assert set(error) == {"message", "type", "code", "param"}, label
    assert error["code"] in TYPED_CODES, label
    assert (last["code"], last["message"], last["param"]) == (error["code"], error["message"], error["param"])
    assert isinstance(error["message"], str) and error["message"], label
    assert "Traceback" not in error["message"] and 'File "' not in error["message"], label
    assert isinstance(last["status"], int) and 400 <= last["status"] < 600 and last["status"] != 500, label
    return error["code"]


def assert_bad_frame(events: list[dict], frame: object, expected: tuple[str, str, int] = BAD_FRAME) -> dict:
    """The typed answer to a frame that is not a usable response.create (proxy/consumers.py)."""
    assert_typed_or_served(events, frame)
    (event,) = events
    assert (event["error"]["type"], event["error"]["code"], event["status"]) == expected, (frame, event)
    return event


def note(outcome: str) -> None:
    """Count an outcome in hypothesis' statistics (`--hypothesis-show-statistics`): the examples
    should reach past parsing, not only be refused."""
    if currently_in_test_context():
        event(outcome)


def converse(edge: Edge, frames: list[str | bytes]) -> list[list[dict]]:
    """Open a connection, send `frames` back to back (then a valid frame, which must be served: the
    connection is still usable), and return the answer to each, in order."""
    with connect(ws_url(edge.url), additional_headers=AUTH, open_timeout=5, max_size=None) as ws:
        for frame in frames:
            ws.send(frame)
        ws.send(json.dumps(VALID))
        try:
            answers = [read_answer(ws) for _ in range(len(frames) + 1)]
        except ConnectionClosed as closed:
            pytest.fail(
                f"the gateway closed the connection: {closed.rcvd} for {frames!r:.300}", pytrace=False
            )
    assert answers[-1][-1]["type"] == "response.completed", answers[-1]
    assert text_of(answers[-1]) == BYSTANDER_TEXT
    return answers


def run_frames(edge: Edge, frames: list[str | bytes]) -> list[list[dict]]:
    """`converse` alongside the bystander, with the upstream ledger checked: one upstream call per
    served response, all on the one upstream connection the first of them opened, and one ledger row
    per frame."""
    with alongside_bystander(edge) as case:
        answers = converse(edge, frames)
        outcomes = [
            assert_typed_or_served(events, frame) for events, frame in zip(answers, frames, strict=False)
        ]
        for outcome in outcomes:
            note(outcome)
        case.served = outcomes.count("served") + 1  # the sentinel
        case.cut = outcomes.count("upstream_dispatch_unknown")
        # The first frame served opens the one upstream connection the others reuse, unless one was cut.
        case.new_connections = None if case.cut else 1
        case.records = len(frames) + 1
    return answers


# --- random frames -------------------------------------------------------------------------------


def json_trees(*, finite: bool = False) -> st.SearchStrategy:
    """Any JSON value; `finite` leaves out NaN and the infinities (which refuse a whole frame)."""
    edges = [1.7976931348623157e308, 5e-324, -0.0, 2**63, -(2**63) - 1]
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(10**40), max_value=10**40)
        | st.floats(allow_nan=not finite, allow_infinity=not finite)
        | st.sampled_from(edges if finite else [*edges, math.nan, math.inf, -math.inf])
        | st.text(max_size=30)
    )
    return st.recursive(
        scalars,
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
        ),
        max_leaves=20,
    )


json_values = json_trees()
# Event types a Responses (or Realtime) client might send, near misses of response.create, and noise.
event_types = st.one_of(
    st.sampled_from(
        [
            "response.create",
            "response.cancel",
            "session.update",
            "conversation.item.create",
            "input_audio_buffer.append",
            "Response.Create",
            "response.create ",
            "response.create\u0000",
            "response.created",
            "error",
            "",
        ]
    ),
    st.text(max_size=20),
    json_values,
)
FIELDS = ["type", "model", "input", "stream", "tools", "max_output_tokens", "previous_response_id", "store"]
field_names = st.sampled_from(FIELDS) | st.text(max_size=12)
finite_values = json_trees(finite=True)
mutations = st.dictionaries(field_names, json_values | event_types, min_size=1, max_size=3)
finite_extras = st.dictionaries(field_names, finite_values, max_size=3)
frame_objects = st.one_of(
    # A valid frame with one to three fields replaced or added: most get past parsing into routing.
    st.builds(lambda changes: {**VALID, **changes}, finite_extras),
    st.builds(lambda changes: {**VALID, **changes}, mutations),
    st.builds(lambda kind: {**VALID, "type": kind}, event_types),
    st.dictionaries(field_names, finite_values, max_size=5),
    finite_values,  # any top-level JSON value: a list, a string, a number...
    json_values,
)
frame_texts = st.one_of(
    st.builds(json.dumps, frame_objects),  # NaN and Infinity as Python writes them, as a client could
    st.text(max_size=80),  # not JSON, mostly
)


def frame_is_json(text: str) -> bool:
    try:
        json.loads(text, parse_constant=lambda constant: 1 / 0)
    except (ValueError, ZeroDivisionError):
        return False
    return True


def surely_bad(text: str) -> bool:
    """A frame the gateway must refuse before routing (a strict subset of what it refuses)."""
    try:
        frame = json.loads(text)
    except ValueError:
        return True
    return not isinstance(frame, dict) or frame.get("type") != "response.create" or "model" not in frame


@settings(FUZZ, max_examples=40)
@given(frames=st.lists(frame_texts, min_size=1, max_size=3))
def test_random_json_frames_get_a_typed_error_or_a_response(edge, frames):
    answers = run_frames(edge, frames)
    for frame, events in zip(frames, answers, strict=False):
        if surely_bad(frame):
            assert_bad_frame(events, frame)


@FUZZ
@given(kind=event_types.filter(lambda kind: kind != "response.create"), extra=finite_extras)
def test_unknown_event_types_are_refused_naming_the_type(edge, kind, extra):
    frame = json.dumps({**VALID, **extra, "type": kind})
    if not frame_is_json(frame):
        return  # a non-finite number in `kind` refuses the frame before its type is read
    (answer, _) = run_frames(edge, [frame])
    event = assert_bad_frame(answer, frame)
    assert event["error"]["param"] == "type"


# Values at the edges of what a JSON parser accepts and what the path to an upstream can encode.
EDGE_FRAMES = {
    "nan": '{"type": "response.create", "model": "gpt-5", "input": "hi", "temperature": NaN}',
    "infinity": '{"type": "response.create", "model": "gpt-5", "input": "hi", "top_p": -Infinity}',
    "float-overflow": '{"type": "response.create", "model": "gpt-5", "input": "hi", "temperature": 1e999}',
    "huge-integer": '{"type": "response.create", "model": "gpt-5", "max_output_tokens": 1' + "0" * 5000 + "}",
    "lone-surrogate-input": '{"type": "response.create", "model": "gpt-5", "input": "\\ud800"}',
    "lone-surrogate-type": '{"type": "response.create\\udfff", "model": "gpt-5", "input": "hi"}',
    "trailing-garbage": '{"type": "response.create", "model": "gpt-5", "input": "hi"} {}',
    "two-frames-in-one": json.dumps(VALID) + json.dumps(VALID),
    "bom": "\ufeff" + json.dumps(VALID),
    "single-quotes": "{'type': 'response.create', 'model': 'gpt-5'}",
    "empty": "",
    "whitespace": " \t\r\n",
    "null": "null",
    "array-of-frames": json.dumps([VALID, VALID]),
    "string-of-a-frame": json.dumps(json.dumps(VALID)),
    "type-as-list": '{"type": ["response.create"], "model": "gpt-5"}',
    "model-missing": '{"type": "response.create", "input": "hi"}',
    "model-a-number": '{"type": "response.create", "model": 5, "input": "hi"}',
    "model-nul": '{"type": "response.create", "model": "gpt-5\\u0000", "input": "hi"}',
    "model-huge": json.dumps({**VALID, "model": "g" * 100_000}),
    "stream-a-string": '{"type": "response.create", "model": "gpt-5", "stream": "yes"}',
}


@pytest.mark.parametrize("case", sorted(EDGE_FRAMES))
def test_edge_values_in_frames_get_a_typed_invalid_request(edge, case):
    frame = EDGE_FRAMES[case]
    (answer, _) = run_frames(edge, [frame])
    assert_bad_frame(answer, case)
    assert_no_health_state_changed()


def _nested(depth: int, opener: str) -> str:
    if opener == "[":
        return "[" * depth + '"x"' + "]" * depth
    return '{"a":' * depth + "{}" + "}" * depth


@FUZZ
@given(
    depth=st.integers(min_value=1, max_value=20_000) | st.sampled_from([900, 990, 1000, 1100, 100_000]),
    opener=st.sampled_from(["[", "{"]),
    where=st.sampled_from(["input", "tools", "metadata", "frame"]),
)
def test_any_nesting_depth_gets_a_typed_error_or_a_response(edge, depth, opener, where):
    if where == "frame":
        frame = _nested(depth, opener)
    else:
        frame = json.dumps({**VALID, where: "N"}).replace('"N"', _nested(depth, opener))
    (answer, _) = run_frames(edge, [frame])
    if where == "frame":
        assert_bad_frame(answer, (depth, opener))


@FUZZ
@given(
    payload=st.one_of(
        st.binary(max_size=200),
        st.builds(lambda obj: json.dumps(obj).encode(), frame_objects),
        st.just(json.dumps(VALID).encode()),  # a perfect frame, but binary
        st.just(json.dumps(VALID).encode("utf-16")),
    ),
)
def test_binary_frames_are_refused_whatever_they_hold(edge, payload):
    (answer, _) = run_frames(edge, [payload])
    event = assert_bad_frame(answer, payload)
    assert event["error"]["param"] is None


@FUZZ
@given(
    prefix=st.binary(max_size=30),
    junk=st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\xc0\xaf", b"\x80"]),
    suffix=st.binary(max_size=30),
)
def test_invalid_utf8_in_a_text_frame_is_closed_by_the_protocol(edge, prefix, junk, suffix):
    """Invalid UTF-8 cannot be a text frame (RFC 6455): the server closes with 1007 before the consumer
    sees it. Sent as bytes flagged as text, which the client library allows, after a frame that must
    still be answered first."""
    payload = b'{"type": "response.create", "model": "gpt-5", "input": "' + prefix + junk + suffix + b'"}'
    if _is_utf8(payload):
        return  # the junk completed a valid sequence: not this test's case
    with alongside_bystander(edge) as case:
        with connect(ws_url(edge.url), additional_headers=AUTH, open_timeout=5) as ws:
            ws.send("[1]")
            assert_bad_frame(read_answer(ws), "[1]")
            ws.send(payload, text=True)
            with pytest.raises(ConnectionClosed) as closed:
                read_answer(ws)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == CLOSE_INVALID_PAYLOAD
        case.records = 1  # the [1] frame's: the invalid one never reached the gateway


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


FRAGMENTED = {
    # A valid frame in fragments is one message: served.
    "text-fragments": ([json.dumps(VALID)[:7], json.dumps(VALID)[7:20], json.dumps(VALID)[20:]], None),
    "binary-fragments": ([b'{"type": ', b'"response.create", "model": "gpt-5"}'], BAD_FRAME),
    "one-byte-text-fragments": (list('{"type": "response.cancel"}'), BAD_FRAME),
}


@pytest.mark.parametrize("shape", sorted(FRAGMENTED))
def test_fragmented_messages_are_one_frame(edge, shape):
    fragments, expected = FRAGMENTED[shape]
    with alongside_bystander(edge) as case:
        with connect(ws_url(edge.url), additional_headers=AUTH, open_timeout=5) as ws:
            ws.ping()  # a control frame between messages is no frame of the API
            ws.send(fragments)
            answer = read_answer(ws)
        if expected is None:
            assert assert_typed_or_served(answer, shape) == "served"
            case.served, case.new_connections = 1, 1
        else:
            assert_bad_frame(answer, shape, expected)
        case.records = 1


# --- size ----------------------------------------------------------------------------------------

LIMIT = 4096  # GATEWAY_MAX_BODY_BYTES for these tests: small, so examples are quick


@FUZZ
@given(
    size=st.integers(min_value=LIMIT - 40, max_value=LIMIT + 40),
    char=st.sampled_from(["x", "é", "€", "😀"]),
    binary=st.booleans(),
)
def test_frames_around_the_size_limit(edge, settings, size, char, binary):
    """Over GATEWAY_MAX_BODY_BYTES (in UTF-8 bytes, not characters): a typed request_too_large; at or
    under it: served. A binary frame is refused as binary whatever its size."""
    settings.GATEWAY_MAX_BODY_BYTES = LIMIT
    head = json.dumps({**VALID, "input": ""}, ensure_ascii=False).encode()
    room = max(size - len(head), 0)
    text = char * (room // len(char.encode()))
    frame = json.dumps({**VALID, "input": text}, ensure_ascii=False)
    assert abs(len(frame.encode()) - size) < 4 or room == 0
    (answer, _) = run_frames(edge, [frame.encode() if binary else frame])
    if binary:
        assert_bad_frame(answer, "binary")
    elif len(frame.encode()) > LIMIT:
        assert_bad_frame(answer, len(frame.encode()), TOO_LARGE)
    else:
        assert assert_typed_or_served(answer, len(frame.encode())) == "served"


def test_a_frame_over_the_default_limit_is_request_too_large(edge):
    limit = django_settings.GATEWAY_MAX_BODY_BYTES
    assert limit == 8 * 1024 * 1024  # SPEC §4's default
    frame = json.dumps({**VALID, "input": "x" * limit})
    (answer, _) = run_frames(edge, [frame])
    assert_bad_frame(answer, "over 8 MiB", TOO_LARGE)


def test_a_frame_over_the_servers_message_limit_is_closed_by_the_protocol(edge):
    """Past the ASGI server's own websocket limit the frame never reaches the gateway: 1009."""
    with alongside_bystander(edge) as case:
        with connect(ws_url(edge.url), additional_headers=AUTH, open_timeout=5, max_size=None) as ws:
            ws.send("x" * (UVICORN_WS_MAX_SIZE + 1))
            with pytest.raises(ConnectionClosed) as closed:
                read_answer(ws)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == CLOSE_MESSAGE_TOO_BIG
        case.records = 0


# --- floods --------------------------------------------------------------------------------------


@FUZZ
@given(count=st.integers(min_value=1, max_value=MAX_PENDING) | st.integers(MAX_PENDING + 2, 4 * MAX_PENDING))
def test_frames_sent_faster_than_answered_wait_their_turn_up_to_the_limit(edge, count):
    """Up to MAX_PENDING frames wait behind a streaming response and are answered in order; a client
    that keeps sending is closed with 1008, having had every answer before the close complete."""
    frames = [json.dumps(VALID) if i % 2 == 0 else "not json" for i in range(count)]
    with alongside_bystander(edge) as case:
        with connect(ws_url(edge.url), additional_headers=AUTH, open_timeout=5) as ws:
            answers: list[list[dict]] = []
            close = None
            try:
                for frame in frames:
                    ws.send(frame)  # the gateway may close the connection before the last is sent
                for _ in frames:
                    answers.append(read_answer(ws))  # answers that came before a close still arrive
            except ConnectionClosed:
                try:
                    while True:
                        answers.append(read_answer(ws))
                except ConnectionClosed as closed:
                    close = closed.rcvd
        for i, events in enumerate(answers):
            outcome = assert_typed_or_served(events, frames[i])
            assert outcome == ("served" if i % 2 == 0 else "invalid_request"), (i, events)
        if count <= MAX_PENDING:
            assert close is None and len(answers) == count
        else:
            assert close is not None and (close.code, close.reason) == CLOSE_TOO_MANY_PENDING
            assert len(answers) < count
        case.served = sum(1 for events in answers if events[-1]["type"] == "response.completed")
        case.cut = 1 if close is not None else 0  # the response in flight when the close came
        case.new_connections = None  # that one may have opened a connection, then dropped it


# --- the handshake: headers no client library sends, over a raw socket ----------------------------


@dataclass
class Conversation:
    """What a raw-socket client saw: the handshake's status (None: no answer, or the server closed
    the connection), then, once upgraded, the JSON events and the close frame."""

    status: int | None
    events: list[dict] = field(default_factory=list)
    close: tuple[int, str] | None = None


def raw_conversation(
    gateway: str,
    header_lines: list[bytes],
    frame: str | None = None,
    timeout: float = 5.0,
    path: bytes = b"/v1/responses",
) -> Conversation:
    """Send a websocket handshake for `path` with `header_lines` as they are, and, once upgraded,
    `frame`; read until a terminal event or a close."""
    host, port = gateway.removeprefix("http://").split(":")
    key = base64.b64encode(os.urandom(16))
    head = [
        b"GET " + path + b" HTTP/1.1",
        f"host: {host}:{port}".encode(),
        b"upgrade: websocket",
        b"connection: Upgrade",
        b"sec-websocket-key: " + key,
        b"sec-websocket-version: 13",
        *header_lines,
    ]
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(b"\r\n".join(head) + b"\r\n\r\n")
        buffer = b""
        try:
            while b"\r\n\r\n" not in buffer:
                chunk = sock.recv(65536)
                if not chunk:
                    return Conversation(None)
                buffer += chunk
        except TimeoutError:
            return Conversation(None)
        response_head, rest = buffer.split(b"\r\n\r\n", 1)
        status = int(response_head.split(b" ", 2)[1])
        if status != 101:
            return Conversation(status)
        conversation = Conversation(status)
        protocol = ClientProtocol(parse_uri(ws_url(gateway)), state=State.OPEN, max_size=None)
        if frame is not None:
            protocol.send_text(frame.encode())
            # The server may have closed first (a refused key): its close frame is still to read.
            with suppress(OSError):
                sock.sendall(b"".join(protocol.data_to_send()))
        protocol.receive_data(rest)
        while True:
            for event in protocol.events_received():
                if event.opcode is Opcode.TEXT:
                    conversation.events.append(json.loads(event.data))
                    if conversation.events[-1]["type"] in TERMINAL:
                        return conversation
                elif event.opcode is Opcode.CLOSE:
                    assert protocol.close_rcvd is not None
                    conversation.close = (protocol.close_rcvd.code, protocol.close_rcvd.reason)
                    return conversation
            chunk = sock.recv(65536)
            if not chunk:
                return conversation
            protocol.receive_data(chunk)


AUTH_LINE = f"authorization: Bearer {GATEWAY_KEY}".encode()
GATEWAY_HEADERS = [
    "x-gateway-session",
    "x-gateway-requirements",
    "x-gateway-deadline-ms",
    "authorization",
    "x-api-key",
    "sec-websocket-protocol",
    "origin",
]
header_values = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=255), max_size=60),
    st.text(max_size=20),  # sent as UTF-8 bytes
    st.sampled_from(
        [
            "1\r\nx-injected: 1",
            "abc\r\n\r\n" + json.dumps(VALID),
            "abc\nx-injected: 1",
            "abc\rx-injected: 1",
            f"Bearer {GATEWAY_KEY}\r\nx-injected: 1",
            "a\x00b",
            "-5",
            "9" * 5000,
            "region=eu, vision, zero_retention",
            "min_quality=NaN",
            "write_tools\r\n",
        ]
    ),
)


def assert_refused_typed_or_served(conversation: Conversation, case: object) -> str:
    """A malformed handshake is refused by the HTTP layer (a 4xx, or a closed connection) or upgraded;
    an upgraded one then gets a served response, a typed error, or the consumer's 4401 close."""
    label = f"{case!r:.300}: {conversation}"
    if conversation.status is None:
        return "closed"
    if conversation.status != 101:
        assert 400 <= conversation.status < 500, label
        return "refused"
    if conversation.close is not None:
        assert conversation.close == CLOSE_INVALID_KEY, label
        assert conversation.events == [], label
        return "invalid key"
    assert conversation.events, label
    return assert_typed_or_served(conversation.events, case)


@FUZZ
@given(name=st.sampled_from(GATEWAY_HEADERS), value=header_values)
def test_header_injection_in_the_handshake(edge, name, value):
    raw = value.encode("utf-8") if any(ord(c) > 255 for c in value) else value.encode("latin-1")
    lines = [name.encode() + b": " + raw]
    if name not in ("authorization", "x-api-key"):
        lines.insert(0, AUTH_LINE)
    with alongside_bystander(edge) as case:
        conversation = raw_conversation(edge.url, lines, json.dumps(VALID))
        outcome = assert_refused_typed_or_served(conversation, (name, value))
        note(outcome)
        case.served, case.cut = int(outcome == "served"), int(outcome == "upstream_dispatch_unknown")
        case.new_connections = None if case.cut else case.served
        case.records = int(outcome not in ("closed", "refused", "invalid key"))


@FUZZ
@given(
    headers=st.fixed_dictionaries(
        {},
        optional={
            "authorization": st.text(max_size=60) | st.builds("Bearer {}".format, st.text(max_size=60)),
            "x-api-key": st.text(max_size=60),
        },
    ).filter(lambda h: not any(GATEWAY_KEY in v for v in h.values())),
)
def test_a_missing_or_wrong_key_is_closed_with_4401_and_nothing_relayed(edge, headers):
    lines = [name.encode() + b": " + value.encode() for name, value in headers.items()]
    with alongside_bystander(edge) as case:
        conversation = raw_conversation(edge.url, lines, json.dumps(VALID))
        outcome = assert_refused_typed_or_served(conversation, headers)
        note(outcome)
        assert outcome in ("refused", "invalid key"), (headers, conversation)
        if all(v.isascii() and v.isprintable() for v in headers.values()):
            # A well-formed header: only the HTTP parser may refuse a control character or a non-ASCII
            # byte it does not accept.
            assert outcome == "invalid key", (headers, conversation)
        case.records = 0


def test_a_key_disabled_while_connected_ends_the_connection_with_4401(edge):
    with alongside_bystander(edge) as case:
        with connect(ws_url(edge.url), additional_headers=AUTH, open_timeout=5) as ws:
            ws.send(json.dumps(VALID))
            assert read_answer(ws)[-1]["type"] == "response.completed"
            ledger.writer.flush(timeout=10)
            # The bystander has a key of its own, which stays valid.
            db_read(GatewayKey.objects.filter(name="e2e").update, enabled=False)
            try:
                ws.send(json.dumps(VALID))
                events = read_answer(ws)
                with pytest.raises(ConnectionClosed) as closed:
                    ws.recv(timeout=5)
            finally:
                db_read(GatewayKey.objects.filter(name="e2e").update, enabled=True)
        (event,) = events
        assert (event["error"]["code"], event["status"]) == ("authentication_error", 401)
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == CLOSE_INVALID_KEY
        case.served, case.new_connections, case.records = 1, 1, 2


@pytest.mark.parametrize("case", ["one-9KiB-header", "one-1MiB-header", "200-headers", "long-name"])
def test_an_oversized_handshake_is_never_upgraded(edge, case):
    lines = [AUTH_LINE]
    if case == "200-headers":
        lines += [f"x-filler-{i}: {'v' * 20}".encode() for i in range(200)]
    elif case == "long-name":
        lines += [b"x-" + b"n" * 65536 + b": 1"]
    else:
        size = {"one-9KiB-header": 9 * 1024, "one-1MiB-header": 1024 * 1024}
        lines += [b"x-gateway-session: " + b"9" * size[case]]
    with alongside_bystander(edge) as check:
        conversation = raw_conversation(edge.url, lines, json.dumps(VALID), timeout=1)
        assert conversation.status != 101, conversation
        assert_refused_typed_or_served(conversation, case)
        check.records = 0


# Not strict: the 431 did reach the client once (a CI run on 2026-12-02), so whether uvicorn's output is
# flushed depends on timing. What must hold whatever it does (never upgraded, the server unharmed) is
# test_an_oversized_handshake_is_never_upgraded's.
@pytest.mark.xfail(
    strict=False,
    reason="uvicorn's websockets-sansio protocol mostly never writes the 431 that websockets' parser "
    "prepares for an oversized handshake header (it only flushes output after a parsed request), so the "
    "client waits for an answer that never comes; not the gateway's code. Remove this mark when uvicorn "
    "answers every time.",
)
def test_an_oversized_handshake_header_is_answered_with_431(gateway):
    conversation = raw_conversation(gateway, [AUTH_LINE, b"x-gateway-session: " + b"9" * 9 * 1024], timeout=1)
    assert conversation.status == 431


@pytest.mark.parametrize("size", [1024, 8000], ids=["session-1KiB", "session-8000B"])
def test_a_large_but_parseable_gateway_header_gets_a_typed_answer(edge, size):
    lines = [AUTH_LINE, b"x-gateway-session: " + b"s" * size]
    with alongside_bystander(edge) as case:
        conversation = raw_conversation(edge.url, lines, json.dumps(VALID))
        assert conversation.status == 101, conversation
        outcome = assert_refused_typed_or_served(conversation, size)
        assert outcome in ("served", "invalid_request"), conversation
        case.served = case.new_connections = int(outcome == "served")
        case.records = 1


def test_bad_frames_of_every_kind_change_no_health_state(edge):
    """No circuit, no demotion: a client's bad frame says nothing about an upstream (SPEC §11)."""
    run_frames(edge, [b"\x00", "{", '{"type": "response.cancel"}', json.dumps({**VALID, "model": 5})])
    assert_no_health_state_changed()


@pytest.mark.parametrize("path", [b"/v1/responses?stream=true", b"//v1/responses"])
def test_the_route_ignores_a_query_string_and_a_doubled_slash(edge, path):
    with alongside_bystander(edge) as case:
        conversation = raw_conversation(edge.url, [AUTH_LINE], json.dumps(VALID), path=path)
        assert assert_refused_typed_or_served(conversation, path) == "served"
        case.served = case.new_connections = case.records = 1


@pytest.mark.parametrize(
    "path",
    [b"/v1/responses/", b"/v1/Responses", b"/v1/responses%00", b"/v1/chat/completions", b"/admin/"],
)
def test_a_websocket_to_another_path_is_refused_with_a_4xx(edge, path):
    with alongside_bystander(edge) as case:
        conversation = raw_conversation(edge.url, [AUTH_LINE], json.dumps(VALID), path=path)
        assert conversation.status is not None and 400 <= conversation.status < 500, conversation
        case.records = 0
