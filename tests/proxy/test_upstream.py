"""The upstream client (`proxy.upstream`) over real loopback sockets: what a failure says about the
dispatch (SPEC §6.1: only a failure to connect is "not sent"), the request as the upstream receives it,
redirects never followed, and the connection pool (kept alive after a body read to its end, closed
under an abandoned one).

The servers here are raw asyncio sockets, so each can misbehave exactly once at the chosen moment."""

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from proxy import upstream
from proxy.transport import TransportFailure
from routing.policy.failures import TransportEvent

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """A loopback server running `handler` per connection; it keeps what each request sent."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.closed = 0  # connections the client closed (EOF read) while the server waited
        self.requests: list[tuple[bytes, bytes]] = []  # (head, body)

    async def __aenter__(self) -> "Server":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def request(self, reader: asyncio.StreamReader) -> bool:
        """Read one request; False at the client's EOF."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed += 1
            return False
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.lower().split(b"\r\n")
                if line.startswith(b"content-length:")
            ),
            0,
        )
        self.requests.append((head, await reader.readexactly(length)))
        return True


def answer(body: bytes, status: str = "200 OK", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-length: %d\r\n%s\r\n%s" % (status.encode(), len(body), extra, body)


@pytest.fixture
async def shared_client() -> AsyncIterator[None]:
    yield
    await upstream.close_client()


async def _event(url: str, read_timeout_s: float = 5.0) -> TransportEvent:
    with pytest.raises(TransportFailure) as failed:
        response = await upstream.open_stream(
            "POST", url, headers={}, json={"x": 1}, read_timeout_s=read_timeout_s
        )
        await upstream.read_body(response)
    return failed.value.event


async def test_a_closed_port_is_refused_nothing_sent(shared_client):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert await _event(f"http://127.0.0.1:{port}/v1/chat/completions") == TransportEvent.CONNECT_REFUSED


async def test_a_connection_never_accepted_is_a_connect_timeout(shared_client, settings):
    settings.GATEWAY_UPSTREAM_CONNECT_TIMEOUT_S = 0.2
    with socket.socket() as listener, socket.socket() as first:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)  # never accepted: once `first` fills the queue, a handshake gets no answer
        first.connect(listener.getsockname())
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1/chat/completions"
        assert await _event(url) == TransportEvent.CONNECT_TIMEOUT


async def test_silence_after_the_request_is_a_read_timeout(shared_client):
    async def silent(reader, writer):
        await server.request(reader)
        await reader.read()  # holds the connection until the client leaves

    async with Server(silent) as server:
        assert await _event(server.url, read_timeout_s=0.2) == TransportEvent.READ_TIMEOUT
    assert len(server.requests) == 1


@pytest.mark.parametrize("sent", [b"", b'HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"partial'])
async def test_a_disconnect_once_the_request_went_out_may_have_executed_it(shared_client, sent):
    async def drop(reader, writer):
        await server.request(reader)
        writer.write(sent)
        await writer.drain()

    async with Server(drop) as server:
        assert await _event(server.url) == TransportEvent.RESET_AFTER_SEND
    assert len(server.requests) == 1


async def test_the_request_offers_gzip_and_deflate_and_carries_compact_utf8_json(shared_client):
    async def ok(reader, writer):
        await server.request(reader)
        writer.write(answer(b"{}"))

    payload = {"model": "gpt-5", "messages": [{"role": "user", "content": "héllo"}]}
    async with Server(ok) as server:
        response = await upstream.open_stream(
            "POST",
            f"{server.url}/v1/chat/completions",
            headers={"authorization": "Bearer k"},
            json=payload,
            read_timeout_s=5,
        )
        assert (response.status, await upstream.read_body(response)) == (200, b"{}")
    [(head, body)] = server.requests
    assert body == json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    lines = head.decode().lower().split("\r\n")
    assert lines[0] == "post /v1/chat/completions http/1.1"
    assert {
        "accept-encoding: gzip, deflate",
        "content-type: application/json",
        "authorization: bearer k",
    } <= set(lines)


async def test_a_redirect_is_answered_as_it_came_never_followed(shared_client):
    async def elsewhere(reader, writer):
        await target.request(reader)
        writer.write(answer(b"{}"))

    async def redirect(reader, writer):
        await server.request(reader)
        writer.write(answer(b"", "307 Temporary Redirect", f"location: {target.url}/\r\n".encode()))

    async with Server(elsewhere) as target, Server(redirect) as server:
        response = await upstream.open_stream("POST", server.url, headers={}, json={}, read_timeout_s=5)
        assert response.status == 307
        await upstream.read_body(response)
    assert target.connections == 0


async def test_a_read_body_keeps_its_connection_and_an_abandoned_one_is_closed(shared_client):
    async def keep_alive(reader, writer):
        while await server.request(reader):
            if len(server.requests) == 2:  # a long answer, of which the client reads a part
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n" + b"x" * 10)
            else:
                writer.write(answer(b"whole"))
            await writer.drain()

    async with Server(keep_alive) as server:
        for expected in (b"whole", None, b"whole"):
            response = await upstream.open_stream("POST", server.url, headers={}, json={}, read_timeout_s=5)
            if expected is not None:
                assert await upstream.read_body(response) == expected
            else:
                assert await anext(response.chunks()) == b"x" * 10
                await response.aclose()
        for _ in range(100):  # the server notices the closed connection on its own time
            if server.closed:
                break
            await asyncio.sleep(0.01)
    # The first two requests shared one connection; the abandoned answer closed it; the third opened
    # another.
    assert (len(server.requests), server.connections, server.closed) == (3, 2, 1)


async def test_a_cookie_an_upstream_sets_is_never_sent_back(shared_client):
    """One client serves every account: a cookie one account's answer sets (a provider's edge sets
    load-balancer and bot-management cookies) must not ride along on another account's requests."""

    async def cookie(reader, writer):
        while await server.request(reader):
            writer.write(answer(b"{}", extra=b"set-cookie: __cf_bm=account-a-cookie; Path=/\r\n"))
            await writer.drain()

    async with Server(cookie) as server:
        by_name = server.url.replace("127.0.0.1", "localhost")  # a client's jar keeps no IP's cookies
        for _ in range(2):
            response = await upstream.open_stream(
                "POST", f"{by_name}/v1/chat/completions", headers={}, json={}, read_timeout_s=5
            )
            assert await upstream.read_body(response) == b"{}"
    assert len(server.requests) == 2
    assert b"cookie" not in server.requests[1][0].lower()
