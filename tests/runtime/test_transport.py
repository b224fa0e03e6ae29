"""runtime.httpx_backend's contract with httpx and httpcore: the pool it replaces is the one httpx sends
through, built from the arguments it passes, and httpx still maps httpcore's errors."""

import inspect
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpcore
import httpx
import pytest

from runtime.httpx_backend import transport_through


class Recording(httpcore.SyncBackend):
    def __init__(self, refuse: bool = False) -> None:
        self.connected: list[tuple[str, int]] = []
        self.refuse = refuse

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        self.connected.append((host, port))
        if self.refuse:
            raise httpcore.ConnectError("refused by the backend")
        return super().connect_tcp(host, port, timeout, local_address, socket_options)


class Ok(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def test_httpx_keeps_its_httpcore_pool_where_the_transport_replaces_it():
    assert isinstance(httpx.HTTPTransport(trust_env=False)._pool, httpcore.ConnectionPool)
    assert {"ssl_context", "network_backend"} <= set(inspect.signature(httpcore.ConnectionPool).parameters)


def test_every_connection_goes_through_the_given_backend(server):
    backend = Recording()
    with httpx.Client(transport=transport_through(backend)) as client:
        response = client.get(server)
    assert (response.status_code, response.text) == (200, "ok")
    assert backend.connected == [("127.0.0.1", int(server.rsplit(":", 1)[1].strip("/")))]


def test_a_backends_refusal_is_still_httpxs_connect_error(server):
    backend = Recording(refuse=True)
    with httpx.Client(transport=transport_through(backend)) as client, pytest.raises(httpx.ConnectError):
        client.get(server)
    assert len(backend.connected) == 1
