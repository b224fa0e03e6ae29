"""SPEC §11 at the edge, against the gateway as `make run` serves it (`python -m gatewaysite.server`, a real
uvicorn process on its own database), over raw sockets, with memory read from the server's /proc:

- a client without a key costs no more than its headers: a 256 MiB body is never read;
- an over-limit `content-length` is refused before the body, an over-limit chunked body as soon as it
  passes the limit;
- a client that drips its headers or its body is dropped after the client timeout;
- a client that stops reading a stream holds a bounded buffer: backpressure reaches the upstream.
"""

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from devkit.databases import Database
from devkit.gateway import GatewayProcess, gateway_config
from devkit.procfs import peak_rss_kb, peak_rss_reset
from tests.loop_thread import stop_loop_thread
from tests.proxy.fixtures_e2e import CHAT

KEY = "sk-gw-edge-test-key-0123456789"
UPSTREAM_KEY_ENV = "GATEWAY_UPSTREAM_EDGE_KEY"
MIB = 1 << 20
CLIENT_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 3.0


class EndlessStream:
    """An upstream that answers every request with a Chat Completions stream that never ends, written
    as fast as the connection takes it (a provider's huge answer): `sent` counts the bytes the gateway
    accepted from it."""

    CHUNK = (
        "data: "
        + json.dumps(
            {
                "id": "chatcmpl-endless",
                "object": "chat.completion.chunk",
                "model": "gpt-5",
                "choices": [{"index": 0, "delta": {"content": "x" * 4000}, "finish_reason": None}],
            }
        )
        + "\n\n"
    ).encode()

    def __init__(self) -> None:
        self.sent = 0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
            while True:
                writer.write(self.CHUNK)
                await writer.drain()
                self.sent += len(self.CHUNK)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # cancelled: stopped (`stop`), which asyncio's server would log as an error otherwise
        finally:
            writer.close()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        stop_loop_thread(self.loop, self.thread, self.server.close)


@pytest.fixture(scope="module")
def endless() -> Iterator[EndlessStream]:
    upstream = EndlessStream()
    yield upstream
    upstream.stop()


@pytest.fixture(scope="module")
def served(tmp_path_factory, endless) -> Iterator[GatewayProcess]:
    """The gateway started by `python -m gatewaysite.server` with short client timeouts, one pool whose
    one assignment is the endless upstream, and the key KEY. One process for the module: each test is
    one client connection that ends with the test, and measures memory from a peak reset of its own."""
    workdir = tmp_path_factory.mktemp("served")
    database = Database.create(workdir)
    process = GatewayProcess(
        database,
        workdir,
        env_extra={
            UPSTREAM_KEY_ENV: "sk-edge-upstream",
            "GATEWAY_CLIENT_TIMEOUT_S": str(CLIENT_TIMEOUT_S),
            "GATEWAY_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
        },
    )
    process.prepare(gateway_config({"a": endless.base_url}, key=KEY, key_env=UPSTREAM_KEY_ENV))
    process.start()
    yield process
    process.kill()
    database.drop()


def _connect(process: GatewayProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", process.port), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    return sock


def _head(path: str, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _push_body(sock: socket.socket, total: int) -> int:
    """Send up to `total` bytes of body until the server stops taking them; the bytes sent."""
    chunk = b"x" * MIB
    sent = 0
    sock.settimeout(5)
    try:
        while sent < total:
            sent += sock.send(chunk[: min(len(chunk), total - sent)])
    except (TimeoutError, ConnectionError):
        pass
    return sent


def _answer(sock: socket.socket) -> tuple[int, dict]:
    """The status and JSON body of the server's (first) answer on `sock`."""
    sock.settimeout(15)
    data = b""
    while b"\r\n\r\n" not in data:
        part = sock.recv(65536)
        assert part, f"connection closed without an answer: {data!r}"
        data += part
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if "content-length" in headers:
        length = int(headers["content-length"])
        while len(rest) < length:
            part = sock.recv(65536)
            if not part:
                break
            rest += part
        return int(lines[0].split()[1]), json.loads(rest[:length])
    while not rest.endswith(b"0\r\n\r\n"):  # chunked, short: read to the last chunk
        part = sock.recv(65536)
        if not part:
            break
        rest += part
    payload, rest = b"", rest
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        payload, rest = payload + rest[:size], rest[size + 2 :]
    return int(lines[0].split()[1]), json.loads(payload)


def _closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """Whether the server closes `sock` (EOF or reset) within `within_s`, reading whatever it sends."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except ConnectionError:
            return True
    return False


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({"content-type": "application/json"}, id="no-key"),
        pytest.param({"authorization": "Bearer sk-gw-not-a-real-key-000000000"}, id="unknown-key"),
    ],
)
def test_an_unauthenticated_256_mib_body_is_answered_401_unread_and_costs_no_memory(served, headers):
    peak_rss_reset(served.pid)
    before = peak_rss_kb(served.pid)
    with _connect(served) as sock:
        sock.sendall(_head("/v1/chat/completions", {**headers, "content-length": str(256 * MIB)}))
        sent = _push_body(sock, 256 * MIB)
        status, body = _answer(sock)
    grown = peak_rss_kb(served.pid) - before
    assert (status, body["error"]["code"]) == (401, "authentication_error")
    assert sent < 256 * MIB, "the server read the whole body of a client without a key"
    assert grown < 16 * 1024, f"peak RSS grew by {grown} KiB"


@pytest.mark.parametrize(
    "length",
    [
        pytest.param({"content-length": str(256 * MIB)}, id="length"),
        pytest.param({"transfer-encoding": "chunked"}, id="chunked"),
    ],
)
def test_a_client_without_a_key_is_answered_401_before_it_sends_any_body(served, length):
    with _connect(served) as sock:
        sock.sendall(_head("/v1/chat/completions", {"content-type": "application/json", **length}))
        status, body = _answer(sock)  # not one byte of the body sent
    assert (status, body["error"]["code"]) == (401, "authentication_error")


def test_an_over_limit_content_length_is_refused_before_the_body(served):
    with _connect(served) as sock:
        sock.sendall(
            _head(
                "/v1/chat/completions", {"authorization": f"Bearer {KEY}", "content-length": str(256 * MIB)}
            )
        )
        status, body = _answer(sock)  # answered with no byte of the body sent
    assert (status, body["error"]["code"]) == (413, "request_too_large")


def test_an_over_limit_chunked_body_is_refused_once_past_the_limit_and_costs_no_memory(served):
    peak_rss_reset(served.pid)
    before = peak_rss_kb(served.pid)
    chunk = b"x" * MIB
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    with _connect(served) as sock:
        sock.sendall(
            _head("/v1/chat/completions", {"authorization": f"Bearer {KEY}", "transfer-encoding": "chunked"})
        )
        sock.settimeout(5)
        try:
            while sent < 256 * MIB:
                sock.sendall(frame)
                sent += len(chunk)
        except (TimeoutError, ConnectionError):
            pass
        status, body = _answer(sock)
    grown = peak_rss_kb(served.pid) - before
    assert (status, body["error"]["code"]) == (413, "request_too_large")
    assert sent < 256 * MIB
    assert grown < 16 * 1024, f"peak RSS grew by {grown} KiB"


def test_a_client_that_drips_its_headers_is_dropped(served):
    head = _head("/v1/chat/completions", {"authorization": f"Bearer {KEY}", "content-length": "2"})
    with _connect(served) as sock:
        dropped = False
        for byte in head[:-4]:  # never completes its headers, one byte every 0.2 s
            try:
                sock.send(bytes([byte]))
            except ConnectionError:
                dropped = True
                break
            if _closed_by_server(sock, 0.2):
                dropped = True
                break
        assert dropped, "a client dripping its headers was never dropped"


def _chat_head(body: bytes) -> bytes:
    return _head(
        "/v1/chat/completions",
        {
            "authorization": f"Bearer {KEY}",
            "content-type": "application/json",
            "content-length": str(len(body)),
        },
    )


def test_a_client_whose_body_stops_arriving_gets_a_typed_408_after_the_idle_limit(served):
    body = json.dumps(CHAT).encode()
    with _connect(served) as sock:
        sock.sendall(_chat_head(body) + body[: len(body) // 2])  # then nothing, nor a disconnect
        started = time.monotonic()
        sock.settimeout(BODY_TIMEOUT_S + 5)
        answered = b""
        try:
            while part := sock.recv(65536):  # to the end: the server closes the connection
                answered += part
        except TimeoutError:
            pass
        took = time.monotonic() - started
    assert answered.startswith(b"HTTP/1.1 408"), answered[:200]
    assert b'"request_timeout"' in answered
    assert took < BODY_TIMEOUT_S, f"answered after {took:.1f} s, not by the {CLIENT_TIMEOUT_S} s idle limit"


def test_a_client_that_drips_its_body_gets_a_typed_408_and_is_dropped(served):
    body = json.dumps(CHAT).encode()
    with _connect(served) as sock:
        sock.sendall(_chat_head(body))
        answered = None
        for byte in body:  # each part in time (0.5 s < 1 s), the whole never (3 s)
            try:
                sock.send(bytes([byte]))
            except ConnectionError:
                break
            sock.settimeout(0.5)
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            answered = data
            break
        assert answered is not None, "a client dripping its body was never answered"
        sock.settimeout(10)
        while part := sock.recv(65536):  # to the end: the server closes the connection
            answered += part
    assert answered.startswith(b"HTTP/1.1 408"), answered[:200]
    assert b'"request_timeout"' in answered


def test_a_client_that_stops_reading_a_stream_holds_a_bounded_buffer(served, endless):
    body = json.dumps({**CHAT, "stream": True}).encode()
    with _connect(served) as sock:
        sock.sendall(
            _head(
                "/v1/chat/completions",
                {
                    "authorization": f"Bearer {KEY}",
                    "content-type": "application/json",
                    "content-length": str(len(body)),
                },
            )
            + body
        )
        sock.settimeout(15)
        first = sock.recv(4096)
        assert first.startswith(b"HTTP/1.1 200"), first[:200]
        peak_rss_reset(served.pid)
        before = peak_rss_kb(served.pid)
        # The client reads nothing more. The upstream writes as fast as it is read: once the buffers
        # on the way are full it must stall, however long the client waits.
        stalled_at, last = None, -1
        for _ in range(60):
            time.sleep(0.25)
            if endless.sent == last:
                stalled_at = endless.sent
                break
            last = endless.sent
        assert stalled_at is not None, f"the upstream never stalled ({endless.sent} bytes sent)"
        time.sleep(2)
        grown = peak_rss_kb(served.pid) - before
        assert endless.sent - stalled_at < MIB, "the gateway went on reading the upstream"
    # Measured 0.8-1.2 MiB. Reading the upstream in unbounded batches (aiohttp's `iter_any`, not
    # proxy.upstream.READ_CHUNK_BYTES) held each batch several times over: 6.6-8.1 MiB. A relay that
    # buffers what its client leaves unread never lets the upstream stall (above).
    assert grown < 4 * 1024, f"peak RSS grew by {grown} KiB"


def test_answers_do_not_name_the_server_software(served):
    answer = httpx.post(
        f"http://127.0.0.1:{served.port}/v1/chat/completions",
        headers={"authorization": "Bearer sk-gw-not-a-key"},
        json={"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert answer.status_code == 401
    assert "server" not in answer.headers
    assert "date" in answer.headers  # HTTP's required header stays
