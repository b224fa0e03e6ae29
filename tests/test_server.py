"""`python -m gatewaysite.server`'s command line, as uvicorn itself parses it."""

import asyncio

import uvicorn
from uvicorn.server import ServerState

from gatewaysite.server import CoalescedTransport, HttpToolsProtocol, command


def parsed(args: list[str]) -> dict:
    return uvicorn.main.make_context("gatewaysite.server", command(args)).params


def test_uvicorns_access_line_is_off_unless_the_operator_turns_it_on():
    # The gateway logs one structured line per request itself (SPEC §10); uvicorn's would be a second.
    assert parsed([])["access_log"] is False
    assert parsed(["--access-log"])["access_log"] is True


def test_the_operators_options_are_kept():
    params = parsed(["--port", "8123", "--workers", "3", "--ws-max-size", "1024"])
    assert (params["port"], params["workers"], params["ws_max_size"]) == (8123, 3, 1024)
    assert params["http"] == "gatewaysite.server:HttpToolsProtocol"


def test_each_worker_freezes_its_startup_heap_before_serving(monkeypatch):
    """What a worker holds at startup leaves the collector's full collections (gatewaysite.asgi)."""
    import asyncio
    import gc

    from gatewaysite.asgi import lifespan
    from proxy import shutdown

    monkeypatch.setattr(shutdown, "install", lambda: None)  # no signal handlers in the test process
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    frozen_at_startup: list[int] = []

    async def receive() -> dict:
        return next(messages)

    async def send(message: dict) -> None:
        if message["type"] == "lifespan.startup.complete":
            frozen_at_startup.append(gc.get_freeze_count())

    gc.unfreeze()
    try:
        asyncio.run(lifespan({"type": "lifespan"}, receive, send))
    finally:
        gc.unfreeze()
    assert frozen_at_startup and frozen_at_startup[0] > 10_000


class _Socket(asyncio.Transport):
    """What the coalesced transport hands to the socket, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, bytes]] = []
        self.closing = False

    def write(self, data) -> None:
        self.calls.append(("write", bytes(data)))

    def close(self) -> None:
        self.calls.append(("close", b""))
        self.closing = True

    def abort(self) -> None:
        self.calls.append(("abort", b""))
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 7


def _coalesced(steps):
    """Run `steps(transport)` on a loop, as one step, then two more steps: what reached the socket."""

    async def run() -> list[tuple[str, bytes]]:
        socket = _Socket()
        transport = CoalescedTransport(socket, asyncio.get_running_loop())
        steps(transport, socket)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return socket.calls

    return asyncio.run(run())


def test_a_responses_head_and_body_reach_the_socket_as_one_write_when_the_body_is_written():
    def steps(transport, socket):
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        assert socket.calls == []  # the head waits for its body
        assert transport.get_write_buffer_size() == 7 + 19
        transport.write(bytearray(b"{}"))
        assert socket.calls == [("write", b"HTTP/1.1 200 OK\r\n\r\n{}")]  # at once, not at the step's end
        transport.write(b"more")  # held in turn, until the step ends

    assert _coalesced(steps) == [("write", b"HTTP/1.1 200 OK\r\n\r\n{}"), ("write", b"more")]


def test_writes_of_different_steps_are_not_held_past_their_step():
    async def run() -> list[tuple[str, bytes]]:
        socket = _Socket()
        transport = CoalescedTransport(socket, asyncio.get_running_loop())
        transport.write(b"head")
        await asyncio.sleep(0)
        assert socket.calls == [("write", b"head")]  # an SSE head goes out before the first event
        transport.write(b"event")
        await asyncio.sleep(0)
        return socket.calls

    assert asyncio.run(run()) == [("write", b"head"), ("write", b"event")]


def test_closing_sends_what_is_held_first_and_aborting_drops_it():
    def closed(transport, socket):
        transport.write(b"bye")
        transport.close()

    def aborted(transport, socket):
        transport.write(b"lost")
        transport.abort()

    assert _coalesced(closed) == [("write", b"bye"), ("close", b"")]
    assert _coalesced(aborted) == [("abort", b"")]


def test_what_is_held_when_the_connection_is_already_closing_is_dropped():
    def gone(transport, socket):
        transport.write(b"late")
        socket.closing = True  # the client went away within the step

    assert _coalesced(gone) == []


def test_the_gateways_protocol_writes_through_a_coalesced_transport():
    async def app(scope, receive, send) -> None:
        pass

    async def run() -> None:
        config = uvicorn.Config(app, lifespan="off")
        config.load()
        protocol = HttpToolsProtocol(config, ServerState(), app_state={}, _loop=asyncio.get_running_loop())
        socket = _Socket()
        socket.get_extra_info = lambda name, default=None: default  # type: ignore[method-assign]
        protocol.connection_made(socket)
        assert isinstance(protocol.transport, CoalescedTransport)
        protocol.transport.write(b"x")
        protocol.connection_lost(None)

    asyncio.run(run())
