"""Bad input at the HTTP edge (SPEC §4, §11), fuzzed: whatever a client sends, the gateway answers with
a typed error in the `{"error": {...}}` shape or a well-formed answer, never a 500, and stays up (a
normal request right after each example is served).

The gateway is the real ASGI app under uvicorn on a loopback socket (tests/gateway_fixtures.py), in
front of two fake upstreams. Header injection and oversized headers go over a raw socket, since HTTP
clients refuse to send them.
"""

import json
import math
import socket
import time
from dataclasses import dataclass

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from devkit.behaviours import serve
from proxy.ledger import recorder as ledger
from proxy.ledger.models import RequestRecord
from tests.gateway_fixtures import GATEWAY_KEY
from tests.proxy.fixtures_e2e import AUTH, CHAT, RESPONSES, ledger_settled, sse_events, wait_for
from tests.reliability.fuzzing import fuzz_settings

CHAT_PATH, RESPONSES_PATH = "/v1/chat/completions", "/v1/responses"
FUZZ = fuzz_settings(max_examples=50)
TIMEOUT = httpx.Timeout(20.0)


# --- what every answer must look like ----------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # lowercased names
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def assert_typed_or_answer(answer: Answer, case: object) -> None:
    """A well-formed answer (JSON object or an SSE stream ending in one terminal event) or a typed
    error in the SPEC §4 OpenAI shape; never a 500."""
    label = f"{case!r:.300}: {answer.status} {answer.text()[:300]!r}"
    if answer.status >= 500 and answer.status not in (502, 503, 504):
        pytest.fail(f"a {answer.status} from the gateway for {label}", pytrace=False)
    ctype = answer.headers.get("content-type", "")
    if answer.status == 200 and ctype.startswith("text/event-stream"):
        events = sse_events(answer.text())
        assert events, label
        last = events[-1]
        terminal = last.data == "[DONE]" or last.type in {
            "response.completed",
            "response.incomplete",
            "response.failed",
            "error",
        }
        assert terminal or (isinstance(last.data, dict) and "error" in last.data), label
        return
    assert ctype.startswith("application/json"), label
    body = json.loads(answer.body)
    assert isinstance(body, dict), label
    if answer.status == 200:
        return
    assert set(body) == {"error"}, label
    error = body["error"]
    assert set(error) == {"message", "type", "code", "param"}, label
    assert isinstance(error["message"], str) and error["message"], label
    assert isinstance(error["type"], str) and error["type"], label
    assert error["code"] is None or isinstance(error["code"], str), label
    assert error["param"] is None or isinstance(error["param"], str), label


def assert_still_serving(gateway: str) -> None:
    response = httpx.post(f"{gateway}{CHAT_PATH}", json=CHAT, headers=AUTH, timeout=TIMEOUT)
    assert response.status_code == 200, f"the gateway stopped serving: {response.status_code} {response.text}"
    # The SQLite test database is one shared in-memory cache: let the ledger writer finish before the
    # next example, so a table lock of the test's own making is never mistaken for the gateway's.
    ledger.writer.flush(timeout=10)


def post_bytes(gateway: str, path: str, content: bytes, headers: dict[str, str] | None = None) -> Answer:
    response = httpx.post(
        f"{gateway}{path}",
        content=content,
        headers={**AUTH, "content-type": "application/json", **(headers or {})},
        timeout=TIMEOUT,
    )
    return Answer(response.status_code, dict(response.headers), response.content)


# --- random JSON shapes ------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats()
    # JSON's edges, more often than plain st.floats() reaches them: Python's json writes the
    # non-finite ones as bare NaN/Infinity, and reads them back (as the gateway does).
    | st.sampled_from(
        [math.nan, math.inf, -math.inf, 1.7976931348623157e308, 5e-324, -0.0, 2**63, -(2**63) - 1]
    )
    | st.text(max_size=30)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=25,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "developer"]) | json_values},
        optional={"content": st.text(max_size=50) | json_values, "tool_call_id": json_values},
    ),
    max_size=4,
)
FIELDS = [
    "model",
    "stream",
    "messages",
    "input",
    "tools",
    "max_tokens",
    "max_output_tokens",
    "stream_options",
    "previous_response_id",
    "temperature",
]
# A valid request with one to three fields replaced (or added) with any JSON value, so that most
# examples get past validation into routing, the relay and the upstream; plus wholly random objects.
valid_bodies = st.fixed_dictionaries(
    {
        "model": st.just("gpt-5"),
        "messages": messages,
        "input": st.text(max_size=40),
        "stream": st.booleans(),
    }
)
mutations = st.dictionaries(
    st.sampled_from(FIELDS) | st.text(max_size=12),
    json_values | st.integers(min_value=-(10**30), max_value=10**30),
    min_size=1,
    max_size=3,
)
bodies = st.one_of(
    st.builds(lambda body, changes: {**body, **changes}, valid_bodies, mutations),
    st.builds(lambda body, changes: {**body, **changes}, valid_bodies, mutations),
    st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=12), json_values, max_size=6),
)


@FUZZ
@given(body=bodies, path=st.sampled_from([CHAT_PATH, RESPONSES_PATH]))
def test_random_json_shapes_get_a_typed_error_or_an_answer(gateway, two_assignments, body, path):
    content = json.dumps(body).encode()  # NaN and Infinity as Python writes them, as a client could
    assert_typed_or_answer(post_bytes(gateway, path, content), body)
    assert_still_serving(gateway)


# Values that sit at the edges of what a JSON parser accepts and what the rest of the path can encode.
EDGE_BODIES = {
    "nan": b'{"model": "gpt-5", "messages": [], "temperature": NaN}',
    "infinity": b'{"model": "gpt-5", "messages": [], "top_p": -Infinity}',
    "float-overflow": b'{"model": "gpt-5", "messages": [], "temperature": 1e999}',
    "huge-integer": b'{"model": "gpt-5", "messages": [], "max_tokens": 1' + b"0" * 5000 + b"}",
    "big-max-tokens": b'{"model": "gpt-5", "messages": [], "max_tokens": 1' + b"0" * 100 + b"}",
    "lone-surrogate-content": b'{"model": "gpt-5", "messages": [{"role": "user", "content": "\\ud800"}]}',
    "lone-surrogate-model": b'{"model": "gpt-\\udfff", "messages": []}',
    "nul-in-model": b'{"model": "gpt-5\\u0000", "messages": []}',
    "nul-in-content": b'{"model": "gpt-5", "messages": [{"role": "user", "content": "a\\u0000b"}]}',
    "duplicate-keys": b'{"model": "gpt-5", "model": 5, "messages": []}',
    "bom": b'\xef\xbb\xbf{"model": "gpt-5", "messages": []}',
    "utf16": '{"model": "gpt-5", "messages": []}'.encode("utf-16"),
    "trailing-garbage": b'{"model": "gpt-5", "messages": []} {}',
    "tools-a-string": b'{"model": "gpt-5", "messages": [], "tools": "everything"}',
    "messages-of-numbers": b'{"model": "gpt-5", "messages": [1, 2, 3]}',
    "stream-null": b'{"model": "gpt-5", "messages": [], "stream": null}',
}


@pytest.mark.parametrize("path", [CHAT_PATH, RESPONSES_PATH])
@pytest.mark.parametrize("case", sorted(EDGE_BODIES))
def test_edge_values_get_a_typed_answer_and_their_own_ledger_row(gateway, two_assignments, path, case):
    answer = post_bytes(gateway, path, EDGE_BODIES[case])
    assert_typed_or_answer(answer, case)
    # SPEC §11: a bad input changes no state except its own ledger row, which it does get.
    request_id = answer.headers["x-gateway-request-id"]
    wait_for(
        lambda: ledger_settled() or RequestRecord.objects.filter(request_id=request_id).exists(),
        what=f"the RequestRecord of the {case!r} request",
    )
    assert_still_serving(gateway)


# --- deep nesting and invalid UTF-8 ------------------------------------------------------------


def _nested(depth: int, opener: str = "[") -> str:
    closer = {"[": "]", "{": "}"}[opener]
    inner = '"x"' if opener == "[" else "{}"
    if opener == "[":
        return "[" * depth + inner + "]" * depth
    return '{"a":' * depth + inner + closer * depth


NESTINGS = {
    "10000-lists": _nested(10_000).encode(),
    "10000-objects": _nested(10_000, "{").encode(),
    "100000-open-brackets": b"[" * 100_000,
    "messages-980-deep": json.dumps({"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]})
    .replace('"hi"', _nested(980))
    .encode(),
    "messages-5000-deep": json.dumps({"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]})
    .replace('"hi"', _nested(5000))
    .encode(),
    "tools-900-deep": json.dumps({"model": "gpt-5", "messages": [], "tools": "T"})
    .replace('"T"', _nested(900, "{"))
    .encode(),
    "input-600-deep": json.dumps({"model": "gpt-5", "input": "I"}).replace('"I"', _nested(600)).encode(),
}


@pytest.mark.parametrize("path", [CHAT_PATH, RESPONSES_PATH])
@pytest.mark.parametrize("case", sorted(NESTINGS))
def test_deep_nesting_gets_a_typed_error_or_an_answer(gateway, two_assignments, path, case):
    assert_typed_or_answer(post_bytes(gateway, path, NESTINGS[case]), case)
    assert_still_serving(gateway)


@FUZZ
@given(depth=st.integers(min_value=1, max_value=20_000), opener=st.sampled_from(["[", "{"]))
def test_any_nesting_depth_inside_a_request_is_handled(gateway, two_assignments, depth, opener):
    body = json.dumps({"model": "gpt-5", "messages": [{"role": "user", "content": "N"}]})
    content = body.replace('"N"', _nested(depth, opener)).encode()
    assert_typed_or_answer(post_bytes(gateway, CHAT_PATH, content), f"depth {depth} {opener}")
    assert_still_serving(gateway)


@FUZZ
@given(
    prefix=st.binary(max_size=40),
    junk=st.binary(min_size=1, max_size=40).filter(lambda b: _not_utf8(b)),
    path=st.sampled_from([CHAT_PATH, RESPONSES_PATH]),
)
def test_invalid_utf8_gets_a_typed_400(gateway, two_assignments, prefix, junk, path):
    content = b'{"model": "gpt-5", "messages": [{"role": "user", "content": "' + prefix + junk + b'"}]}'
    if not _not_utf8(content):
        return
    answer = post_bytes(gateway, path, content)
    assert_typed_or_answer(answer, content)
    assert answer.status == 400, answer.text()
    assert_still_serving(gateway)


def _not_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


# --- headers: injection and size (raw socket) --------------------------------------------------


def raw_request(gateway: str, head: bytes, body: bytes = b"", timeout: float = 20.0) -> Answer | None:
    """Send `head` (request line and header lines, without the final blank line) and `body` as is,
    and read the first response; None if the server closed the connection without one."""
    host, port = gateway.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head + b"\r\n\r\n" + body)
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            chunk = sock.recv(65536)
            if not chunk:
                return None
            buffer += chunk
        raw_head, rest = buffer.split(b"\r\n\r\n", 1)
        lines = raw_head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return Answer(status, headers, _read_body(sock, headers, rest))


def _read_body(sock: socket.socket, headers: dict[str, str], rest: bytes) -> bytes:
    def more() -> bytes:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed mid-body")
        return chunk

    if headers.get("transfer-encoding", "").lower() == "chunked":
        body, buffer = b"", rest
        while True:
            while b"\r\n" not in buffer:
                buffer += more()
            size_line, buffer = buffer.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            while len(buffer) < size + 2:
                buffer += more()
            body, buffer = body + buffer[:size], buffer[size + 2 :]
            if size == 0:
                return body
    length = int(headers.get("content-length", "0"))
    body = rest
    while len(body) < length:
        body += more()
    return body[:length]


def _head(path: str, extra: list[bytes], body: bytes) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1".encode(),
        b"host: 127.0.0.1",
        f"authorization: Bearer {GATEWAY_KEY}".encode(),
        b"content-type: application/json",
        f"content-length: {len(body)}".encode(),
        b"connection: close",
        *extra,
    ]
    return b"\r\n".join(lines)


def assert_rejected_or_typed(answer: Answer | None, case: object) -> None:
    """What a malformed HTTP request may get: the gateway's typed answer, or (when the bytes are not
    HTTP at all) the HTTP server's own 400/413/431 or a closed connection; never a 500."""
    if answer is None:
        return
    if "x-gateway-request-id" in answer.headers:
        assert_typed_or_answer(answer, case)
        return
    assert answer.status in (400, 413, 414, 431), f"{case!r:.200}: {answer.status} {answer.text()[:200]!r}"


GATEWAY_HEADERS = ["x-gateway-session", "x-gateway-requirements", "x-gateway-deadline-ms"]
header_values = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=255), max_size=60),
    st.sampled_from(
        [
            "1\r\nx-gateway-requirements: region=eu",
            "abc\r\n\r\nGET /admin/ HTTP/1.1",
            "abc\nx-injected: 1",
            "abc\rx-injected: 1",
            "a\x00b",
            "-5",
            "0",
            "1e3",
            "9" * 5000,
            "\uff11\uff12\uff13",  # fullwidth digits: not ASCII, not a number here
            "region=eu, vision, zero_retention",
            "min_quality=NaN",
            "min_quality=1e309",
            ",,,,",
            "write_tools\r\n",
        ]
    ),
)


@FUZZ
@given(
    name=st.sampled_from(GATEWAY_HEADERS),
    value=header_values,
    path=st.sampled_from([CHAT_PATH, RESPONSES_PATH]),
)
def test_header_injection_in_gateway_headers_gets_a_typed_answer(gateway, two_assignments, name, value, path):
    body = json.dumps(CHAT if path == CHAT_PATH else RESPONSES).encode()
    raw_value = value.encode("utf-8") if any(ord(c) > 255 for c in value) else value.encode("latin-1")
    answer = raw_request(gateway, _head(path, [name.encode() + b": " + raw_value], body), body)
    assert_rejected_or_typed(answer, (name, value))
    assert_still_serving(gateway)


@pytest.mark.parametrize(
    "case",
    [
        "session-64KiB",
        "requirements-64KiB",
        "deadline-64KiB",
        "session-1MiB",
        "2000-headers",
        "one-long-header-name",
    ],
)
def test_oversized_headers_get_a_typed_answer_or_a_protocol_rejection(gateway, two_assignments, case):
    body = json.dumps(CHAT).encode()
    if case == "2000-headers":
        extra = [f"x-filler-{i}: {'v' * 20}".encode() for i in range(2000)]
    elif case == "one-long-header-name":
        extra = [b"x-" + b"n" * 65536 + b": 1"]
    else:
        which, size = case.split("-")
        value = b"9" * (
            1024 * int(size.removesuffix("KiB").removesuffix("MiB")) * (1024 if "MiB" in size else 1)
        )
        extra = [f"x-gateway-{which if which != 'deadline' else 'deadline-ms'}: ".encode() + value]
    try:
        answer = raw_request(gateway, _head(CHAT_PATH, extra, body), body)
    except ConnectionError:
        answer = None  # the server closed the connection mid-request: a protocol-level refusal
    assert_rejected_or_typed(answer, case)
    assert_still_serving(gateway)


# --- oversized bodies --------------------------------------------------------------------------

NINE_MIB = 9 * 1024 * 1024


@pytest.mark.parametrize("case", ["content-length", "chunked", "valid-json-with-huge-string"])
def test_oversized_bodies_get_a_typed_413(gateway, two_assignments, case):
    if case == "valid-json-with-huge-string":
        content = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * NINE_MIB}]}).encode()
        answer = post_bytes(gateway, CHAT_PATH, content)
    elif case == "content-length":
        answer = post_bytes(gateway, CHAT_PATH, b"[" + b" " * NINE_MIB + b"]")
    else:

        def chunks():
            for _ in range(9):
                yield b" " * (1024 * 1024)

        response = httpx.post(
            f"{gateway}{CHAT_PATH}",
            content=chunks(),
            headers={**AUTH, "content-type": "application/json"},
            timeout=TIMEOUT,
        )
        answer = Answer(response.status_code, dict(response.headers), response.content)
    assert_typed_or_answer(answer, case)
    assert answer.status == 413, answer.text()[:300]
    assert json.loads(answer.body)["error"]["code"] == "request_too_large"
    assert_still_serving(gateway)


# --- a slow reader -----------------------------------------------------------------------------


def test_a_client_reading_one_byte_per_second_does_not_stall_other_requests(gateway, two_assignments):
    a, _, _ = two_assignments
    # A long stream for the slow reader (megabytes: far more than the socket buffers hold), then
    # ordinary answers for everyone else.
    a.script("gpt-5", serve(" ".join(["word"] * 60_000)), serve())
    host, port = gateway.removeprefix("http://").split(":")
    body = json.dumps({**CHAT, "stream": True}).encode()
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect((host, int(port)))
    try:
        slow.sendall(_head(CHAT_PATH, [], body) + b"\r\n\r\n" + body)
        assert slow.recv(1).startswith(b"H")  # the response began
        for second in range(5):
            started = time.monotonic()
            plain = httpx.post(f"{gateway}{CHAT_PATH}", json=CHAT, headers=AUTH, timeout=TIMEOUT)
            streamed = httpx.post(
                f"{gateway}{RESPONSES_PATH}",
                json={**RESPONSES, "stream": True},
                headers=AUTH,
                timeout=TIMEOUT,
            )
            took = time.monotonic() - started
            assert (plain.status_code, streamed.status_code) == (200, 200), (
                second,
                plain.text,
                streamed.text,
            )
            # A stall behind the slow reader would last as long as its megabytes take at one byte per
            # second (hours); the bound only has to tell that from a loaded machine's slow answer.
            assert took < 10.0, f"other requests took {took:.1f} s while a client read one byte per second"
            assert sse_events(streamed.text)[-1].type == "response.completed"
            time.sleep(max(0.0, 1.0 - took))
            assert len(slow.recv(1)) == 1  # still reading, one byte per second
    finally:
        slow.close()
    assert_still_serving(gateway)
