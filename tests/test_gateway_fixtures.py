"""The live gateway's server (tests/gateway_fixtures.py) steps around uvicorn's main loop and shutdown;
this holds what they rely on (`servers`, `server_state.connections` and `.tasks`, each connection's
`shutdown()`): a server left stops listening, finishes the response in flight and closes the
connections a client kept open, as uvicorn's own shutdown does."""

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
