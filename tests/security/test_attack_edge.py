"""Bodies outside `/v1/` (issue 45 finding 5), against the production server (`served`): `/healthz`,
the admin's login, `/metrics` and unknown paths read a body under the API's limits and timeouts before
Django sees it. Threat (SECURITY.md, Anonymous client): a client without a key costs no more than its
headers and a bounded body, on every path."""

from __future__ import annotations

import socket
import time

import pytest

from tests.security.conftest import BODY_TIMEOUT_S, responsive

pytestmark = pytest.mark.attack
MIB = 1 << 20
GIB = 1 << 30
PATHS = ["/healthz", "/admin/login/", "/metrics", "/no/such/path"]


def _request(served, path: str, headers: dict[str, str]) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=10)
    lines = [f"POST {path} HTTP/1.1", "host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return sock


def _status(sock: socket.socket, within_s: float = 10) -> int | None:
    """The status of the server's answer, or None if it closed without one."""
    sock.settimeout(within_s)
    data = b""
    while b"\r\n" not in data:
        try:
            part = sock.recv(65536)
        except ConnectionError:
            return None
        if not part:
            return None
        data += part
    return int(data.split(b" ", 2)[1])


@pytest.mark.parametrize("path", PATHS)
def test_an_over_limit_content_length_is_refused_before_the_body_on_every_path(served, path):
    """1 GiB announced: Django used to spool all of it to a temporary file (1 GiB in 0.7 s)."""
    with _request(served, path, {"content-length": str(GIB), "content-type": "text/plain"}) as sock:
        assert _status(sock) == 413  # not one byte of the body sent
    assert responsive(served.url)


@pytest.mark.parametrize("path", PATHS)
def test_a_chunked_body_is_refused_once_past_the_limit_on_every_path(served, path):
    chunk = b"x" * MIB
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    with _request(served, path, {"transfer-encoding": "chunked"}) as sock:
        sock.settimeout(5)
        try:
            while sent < 256 * MIB:
                sock.sendall(frame)
                sent += len(chunk)
        except (TimeoutError, ConnectionError):
            pass
        status = _status(sock)
    assert status in (413, None)  # answered, or cut once it had the answer to read
    assert sent < 64 * MIB, f"the server read {sent >> 20} MiB of a body past its 8 MiB limit"


@pytest.mark.parametrize("path", PATHS)
def test_a_body_dripped_a_byte_at_a_time_is_dropped(served, path):
    """A byte every half second (under the per-read timeout): cut at the whole body's timeout."""
    started = time.monotonic()
    with _request(served, path, {"content-length": "1000", "content-type": "text/plain"}) as sock:
        status = None
        try:
            while time.monotonic() - started < BODY_TIMEOUT_S + 5:
                sock.sendall(b"x")
                sock.settimeout(0.5)
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    continue
                status = int(data.split(b" ", 2)[1]) if data else None
                break
        except ConnectionError:
            pass
    assert status in (408, None) and time.monotonic() - started < BODY_TIMEOUT_S + 5
    assert responsive(served.url)


def test_a_small_body_still_reaches_django(served):
    """The admin's login form is read and answered by Django (its CSRF check refuses a forged one)."""
    body = b"username=a&password=b"
    with _request(
        served,
        "/admin/login/",
        {"content-length": str(len(body)), "content-type": "application/x-www-form-urlencoded"},
    ) as sock:
        sock.sendall(body)
        assert _status(sock) == 403
