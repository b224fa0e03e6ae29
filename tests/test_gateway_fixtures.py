"""The live gateway's server (tests/gateway_fixtures.py) steps around uvicorn's main loop and shutdown;
this holds what they rely on (`servers`, `server_state.connections` and `.tasks`, each connection's
`shutdown()`): a server left stops listening, finishes the response in flight and closes the
connections a client kept open, as uvicorn's own shutdown does. It serves through the production
server's HTTP protocol (gatewaysite.server)."""

import asyncio
import contextlib
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import httpx

from tests.gateway_fixtures import live


def test_a_server_left_finishes_the_response_in_flight_and_closes_the_connections_kept_open():
    arrived, release = threading.Event(), threading.Event()

    async def app(scope, receive, send):
        if scope["path"] == "/slow":
            arrived.set()
            await asyncio.to_thread(release.wait, 10)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    server = contextlib.ExitStack()
    url = server.enter_context(live(app))
    address = (urlsplit(url).hostname, urlsplit(url).port)
    with ThreadPoolExecutor(2) as pool, socket.create_connection(address, timeout=10) as kept:
        kept.sendall(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
        answer = b""
        while not answer.endswith(b"ok"):
            answer += kept.recv(1024)
        slow = pool.submit(httpx.get, f"{url}/slow", timeout=10)
        assert arrived.wait(10)

        leaving = pool.submit(server.close)  # the server is left while /slow is in flight
        while not leaving.done():  # until it stops listening
            try:
                socket.create_connection(address, timeout=10).close()
            except (ConnectionRefusedError, ConnectionResetError):  # a reset: queued as it closed
                break
        release.set()
        leaving.result()

        assert (slow.result().status_code, slow.result().text) == (200, "ok")
        assert kept.recv(1024) == b""  # closed by the server


def test_the_live_server_serves_with_the_production_protocol_which_drops_unfinished_headers(settings):
    """`live` serves through gatewaysite.server's protocol, as production does: a client whose headers
    stop arriving is dropped after GATEWAY_CLIENT_TIMEOUT_S (plain uvicorn would keep it forever)."""
    settings.GATEWAY_CLIENT_TIMEOUT_S = 0.3

    async def app(scope, receive, send):  # never reached: the request's headers never complete
        raise AssertionError("served")

    with live(app) as url, socket.create_connection((urlsplit(url).hostname, urlsplit(url).port)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: test\r\n")  # no blank line: the headers go on
        sock.settimeout(5)
        assert sock.recv(1024) == b""  # closed by the server, well before the 5 s
