"""SPEC §11: websocket close codes and frame limits, and a client that stops reading, behave the same under
every server the README names. The same tests run against real server processes: uvicorn as `make run`
serves it (`python -m gatewaysite.server`) and daphne (Channels' server). The README names only the
servers that pass them for production; daphne's failures are kept here as strict xfails, so the day
daphne passes, this file says so.

Memory is read from the server's /proc (peak RSS)."""

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from websockets.asyncio.server import serve as ws_serve
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from devkit.behaviours import close_websocket, serve, slow_stream
from devkit.databases import Database
from devkit.gateway import GatewayProcess, gateway_config
from devkit.procfs import peak_rss_kb, peak_rss_reset
from devkit.upstream import FakeUpstream
from tests.loop_thread import stop_loop_thread
from tests.proxy.test_edge_processes import MIB, EndlessStream

KEY = "sk-gw-servers-test-key-0123456789"
UPSTREAM_KEY_ENV = "GATEWAY_UPSTREAM_SERVERS_KEY"
AUTH = {"authorization": f"Bearer {KEY}"}
MAX_BODY = 1 * MIB

UVICORN = ["-m", "gatewaysite.server"]
DAPHNE = ["-m", "daphne"]


def daphne_fails(reason: str):
    return pytest.param(DAPHNE, id="daphne", marks=pytest.mark.xfail(strict=True, reason=reason))


class EndlessWebsocket:
    """A Responses websocket upstream whose answer never ends: deltas written as fast as the connection
    takes them. `sent` counts the bytes the gateway accepted."""

    DELTA = json.dumps(
        {
            "type": "response.output_text.delta",
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": "x" * 4000,
        }
    )

    def __init__(self) -> None:
        self.sent = 0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def start() -> None:
            self.server = await ws_serve(self._serve, "127.0.0.1", 0, compression=None, max_size=None)
            self.port = self.server.sockets[0].getsockname()[1]

        self.loop.run_until_complete(start())
        self.ready.set()
        self.loop.run_forever()

    async def _serve(self, ws) -> None:
        try:
            async for _ in ws:
                await ws.send(
                    json.dumps(
                        {
                            "type": "response.created",
                            "response": {"id": "resp_endless", "status": "in_progress"},
                        }
                    )
                )
                while True:
                    await ws.send(self.DELTA)  # waits while the gateway does not read
                    self.sent += len(self.DELTA)
        except ConnectionClosed:
            pass

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        stop_loop_thread(self.loop, self.thread, self.server.close)


def _start(launcher: list[str], upstream_url: str, workdir: Path) -> tuple[GatewayProcess, Database]:
    """A gateway process whose one assignment is `upstream_url`, on a fresh database in `workdir`."""
    database = Database.create(workdir)
    process = GatewayProcess(
        database,
        workdir,
        launcher=launcher,
        env_extra={UPSTREAM_KEY_ENV: "sk-servers-upstream", "GATEWAY_MAX_BODY_BYTES": str(MAX_BODY)},
    )
    try:
        process.prepare(gateway_config({"a": upstream_url}, key=KEY, key_env=UPSTREAM_KEY_ENV))
        process.start()
    except BaseException:
        process.kill()
        database.drop()
        raise
    return process, database


@pytest.fixture
def start_gateway(tmp_path: Path) -> Iterator:
    """`start(launcher, upstream_url)`: a gateway process of the test's own whose one assignment is
    `upstream_url`; for the tests that measure memory (a process that served earlier tests could reuse
    memory they freed, and hide growth)."""
    started: list[tuple[GatewayProcess, Database]] = []

    def start(launcher: list[str], upstream_url: str) -> GatewayProcess:
        started.append(_start(launcher, upstream_url, tmp_path / str(len(started))))
        return started[-1][0]

    yield start
    for process, database in started:
        process.kill()
        database.drop()


@pytest.fixture(scope="module")
def _shared() -> Iterator[tuple[FakeUpstream, dict[str, tuple[GatewayProcess, Database]]]]:
    with FakeUpstream("a", ("gpt-5",)) as upstream:
        processes: dict[str, tuple[GatewayProcess, Database]] = {}
        yield upstream, processes
        for process, database in processes.values():
            process.kill()
            database.drop()


@pytest.fixture
def shared_gateway(_shared, tmp_path_factory) -> tuple[FakeUpstream, Callable[[list[str]], GatewayProcess]]:
    """(a, gateway): the module's fake upstream `a`, reset for this test, and `gateway(launcher)`, one
    process per server for the whole module, whose one assignment is `a`: the close-code tests only read
    what one connection of their own is told, so they need no gateway of their own."""
    upstream, processes = _shared
    upstream.reset()

    def gateway(launcher: list[str]) -> GatewayProcess:
        name = launcher[-1]
        if name not in processes:
            processes[name] = _start(launcher, upstream.base_url, tmp_path_factory.mktemp(f"shared-{name}"))
        return processes[name][0]

    return upstream, gateway


def _ws(process: GatewayProcess, **kwargs):
    return connect(
        f"ws://127.0.0.1:{process.port}/v1/responses", additional_headers=AUTH, open_timeout=10, **kwargs
    )


def _create(ws, **body) -> None:
    ws.send(json.dumps({"type": "response.create", "model": "gpt-5", "input": "hi", **body}))


def _until_terminal(ws) -> list[dict]:
    events = []
    while not events or events[-1]["type"] not in ("response.completed", "response.failed", "error"):
        events.append(json.loads(ws.recv(timeout=15)))
    return events


def _close_of(ws, timeout: float = 6) -> tuple[int, str] | None:
    """The close frame the server sent (None: the connection stayed open for `timeout`; a close the
    server sends at all comes within a second, so the bound is what a strict xfail waits out)."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ws.recv(timeout=max(deadline - time.monotonic(), 0.01))
    except TimeoutError:
        return None
    except ConnectionClosed as closed:
        return (closed.rcvd.code, closed.rcvd.reason) if closed.rcvd is not None else (-1, "no close frame")
    return None


@pytest.mark.parametrize(
    "launcher",
    [
        pytest.param(UVICORN, id="uvicorn"),
        daphne_fails("daphne cannot send close code 1014: the client stays open"),
    ],
)
def test_the_live_upstream_closing_closes_the_client_with_1014(shared_gateway, launcher):
    a, gateway = shared_gateway
    a.script("gpt-5", serve("first"), close_websocket(code=1011))
    process = gateway(launcher)
    with _ws(process) as ws:
        _create(ws)
        assert _until_terminal(ws)[-1]["type"] == "response.completed"
        _create(ws)  # goes to the live upstream, which closes
        close = _close_of(ws)
    assert close == (1014, "upstream connection closed")


@pytest.mark.parametrize(
    "launcher",
    [
        pytest.param(UVICORN, id="uvicorn"),
        daphne_fails("daphne cannot send close code 1008: the client gets 1011"),
    ],
)
def test_a_client_flooding_frames_is_closed_with_1008(shared_gateway, launcher):
    a, gateway = shared_gateway
    a.script("gpt-5", slow_stream(0.2, " ".join(["word"] * 20)))
    process = gateway(launcher)
    with _ws(process) as ws:
        for _ in range(20):  # far more than may wait behind the streaming response
            try:
                _create(ws)
            except ConnectionClosed:
                break
        close = _close_of(ws)
    assert close == (1008, "too many pending frames")


@pytest.mark.parametrize(
    "launcher",
    [
        pytest.param(UVICORN, id="uvicorn"),
        daphne_fails("daphne drops the close reason (the code arrives alone)"),
    ],
)
def test_a_wrong_key_is_closed_with_4401(shared_gateway, launcher):
    a, gateway = shared_gateway
    process = gateway(launcher)
    with connect(
        f"ws://127.0.0.1:{process.port}/v1/responses",
        additional_headers={"authorization": "Bearer sk-gw-not-a-real-key-000000000"},
        open_timeout=10,
    ) as ws:
        close = _close_of(ws)
    assert close == (4401, "invalid gateway key")
    assert a.ws_connections == 0


@pytest.mark.parametrize(
    "launcher",
    [
        pytest.param(UVICORN, id="uvicorn"),
        daphne_fails("daphne takes in the 64 MiB message, then drops the connection without a close frame"),
    ],
)
def test_a_frame_over_the_limit_is_refused_before_it_is_read(start_gateway, fake_upstream_factory, launcher):
    a = fake_upstream_factory("a", models=("gpt-5",))
    process = start_gateway(launcher, a.base_url)
    peak_rss_reset(process.pid)
    before = peak_rss_kb(process.pid)
    huge = json.dumps({"type": "response.create", "model": "gpt-5", "input": "x" * (64 * MIB)})
    with _ws(process, max_size=None) as ws:
        try:
            ws.send(huge)
            answer = ws.recv(timeout=15)
            outcome = json.loads(answer)["error"]["code"]
        except ConnectionClosed as closed:
            outcome = closed.rcvd.code if closed.rcvd is not None else None
    grown = peak_rss_kb(process.pid) - before
    assert outcome in (1009, "request_too_large")
    assert a.hit_count() == 0 and a.ws_connections == 0
    assert grown < 16 * 1024, f"peak RSS grew by {grown} KiB"


# A relay with backpressure grows by its buffers, a few MiB (the tests' bounds: 8 and 4 MiB); one that
# buffers what its client does not read grows at the upstream's loopback rate, hundreds of MiB a second.
BUFFERING_KIB = 64 * 1024


def _stalled_growth(process: GatewayProcess, upstream_sent) -> tuple[int, int]:
    """With a stream running to a client that no longer reads: (peak RSS growth in KiB, bytes the
    upstream still got rid of after it first stalled). A server found buffering is not waited on."""
    peak_rss_reset(process.pid)
    before = peak_rss_kb(process.pid)
    stalled_at, last = None, -1
    for _ in range(40):  # a server with backpressure stalls within a second or two
        time.sleep(0.25)
        if upstream_sent() == last:
            stalled_at = upstream_sent()
            break
        last = upstream_sent()
        if peak_rss_kb(process.pid) - before > BUFFERING_KIB:
            break
    time.sleep(1.0)
    grown = peak_rss_kb(process.pid) - before
    if stalled_at is None:
        return grown, 1 << 40
    return grown, upstream_sent() - stalled_at


@pytest.mark.parametrize(
    "launcher",
    [
        pytest.param(UVICORN, id="uvicorn"),
        daphne_fails("daphne buffers everything written to a client that does not read"),
    ],
)
def test_a_websocket_client_that_stops_reading_holds_a_bounded_buffer(start_gateway, launcher):
    upstream = EndlessWebsocket()
    try:
        process = start_gateway(launcher, upstream.base_url)
        # The client's close cannot be answered through the backlog it left unread: no 10 s wait for it.
        with _ws(process, max_queue=1, close_timeout=0.5) as ws:
            _create(ws)
            ws.recv(timeout=15)  # the stream runs; from now on the client reads nothing
            grown, leaked = _stalled_growth(process, lambda: upstream.sent)
    finally:
        upstream.stop()
    assert leaked < MIB, "the gateway went on reading the upstream"
    assert grown < 8 * 1024, f"peak RSS grew by {grown} KiB"


@pytest.mark.parametrize(
    "launcher",
    [
        pytest.param(UVICORN, id="uvicorn"),
        daphne_fails("daphne buffers everything written to a client that does not read"),
    ],
)
def test_an_sse_client_that_stops_reading_holds_a_bounded_buffer(start_gateway, launcher):
    upstream = EndlessStream()
    try:
        process = start_gateway(launcher, upstream.base_url)
        body = json.dumps(
            {"model": "gpt-5", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        ).encode()
        sock = socket.create_connection(("127.0.0.1", process.port), timeout=15)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode()
        sock.sendall(head + body)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")  # from now on the client reads nothing
        grown, leaked = _stalled_growth(process, lambda: upstream.sent)
        sock.close()
    finally:
        upstream.stop()
    assert leaked < MIB, "the gateway went on reading the upstream"
    # A bounded relay's peak grows by 1.0-1.2 MiB here (the stream's first events, buffers until the
    # stall; upstream reads of at most proxy.upstream.READ_CHUNK_BYTES: with aiohttp's `iter_any`, which
    # hands over all it has buffered, 5-8.3 MiB); a server that buffered what the client does not read
    # would grow at the upstream's loopback rate, hundreds of MiB over this window.
    assert grown < 4 * 1024, f"peak RSS grew by {grown} KiB"
