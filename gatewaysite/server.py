"""`python -m gatewaysite.server [uvicorn options]`: the gateway served by uvicorn as production runs
it (`make run` uses it), with what uvicorn does not do by itself (SPEC §11):

- a deadline for a request's headers: uvicorn drops an idle keep-alive connection, but a client that
  drips its headers a byte at a time is never dropped (any byte cancels the keep-alive timer). Here
  the headers of each request must be complete within `GATEWAY_CLIENT_TIMEOUT_S` of the connection
  or of the request's first byte, or the connection is closed. The body's own timeouts are the
  application's (`proxy.edge.read_body`).
- websocket messages refused by the server as soon as their header announces more than
  `GATEWAY_MAX_BODY_BYTES` (`--ws-max-size`, close code 1009), before their payload is read.

- a response's head and body reach the socket as one write (`CoalescedTransport`): uvicorn writes a
  response's status line and headers, then its body, each straight to the socket, so every answer
  cost two system calls and two TCP segments, and the client woke up twice. Measured (2026-12-04,
  bench/profile.md, 30 interleaved pairs): 0.03 ms less CPU a request at c=1, 0.05 ms at c=16.
- uvicorn's own access line off (`--no-access-log`; `--access-log` turns it back on): the gateway logs
  one structured line per request itself (SPEC §10: request id, route, outcome, status, attempts and
  its duration), and a second, unstructured line for each request cost about 3 % of the gateway's CPU.
- with more than one worker (`--workers N` or `WEB_CONCURRENCY`), a fresh directory for
  prometheus-client's multiprocess mode (`PROMETHEUS_MULTIPROC_DIR`, created, or emptied when the
  operator names one), so that `/metrics` sums every worker (proxy/metrics.py).

Any uvicorn option may follow (`--port`, `--workers`, ...). The equivalent plain uvicorn command is
`uvicorn gatewaysite.asgi:application --http gatewaysite.server:HttpToolsProtocol --ws-max-size N
--no-access-log`.

This steps around uvicorn's protocol class (its callbacks `connection_made`, `on_message_begin`,
`on_headers_complete`, `connection_lost`): tests/proxy/test_edge_processes.py drips headers at a
real server started by this module, so an uvicorn upgrade that changes them fails there.
"""

import asyncio
import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as UvicornHttpToolsProtocol

APP = "gatewaysite.asgi:application"


def _client_timeout_s() -> float:
    from django.conf import settings

    return settings.GATEWAY_CLIENT_TIMEOUT_S


class CoalescedTransport(asyncio.Transport):
    """A connection's transport that holds a write until the next one, or until the event loop's step
    ends, whichever comes first: the two writes uvicorn makes for a response (its head, then its body)
    reach the socket as one, as soon as the body is written; a head whose body is still to come (a
    stream's first event) goes out at the end of the step. Nothing is held longer or reordered.
    Closing sends what is held first; aborting drops it, as it drops what the socket has not sent; once
    the connection is closing, what is held is dropped too. The websocket protocol a connection is
    upgraded to writes through it as well."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport, self._loop = transport, loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._held is None:
            self._held = bytes(data)
            self._loop.call_soon(self._send)
        else:
            held, self._held = self._held, None
            self._transport.write(held + data)

    def writelines(self, list_of_data) -> None:  # type: ignore[no-untyped-def]
        for data in list_of_data:
            self.write(data)

    def _send(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self._send()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def write_eof(self) -> None:
        self._send()
        self._transport.write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default=None):  # type: ignore[no-untyped-def]
        return self._transport.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")


class HttpToolsProtocol(UvicornHttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline for each request's headers, writing through a
    `CoalescedTransport`."""

    header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescedTransport(transport, self.loop))
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self.header_deadline is None:
            self.header_deadline = self.loop.call_later(_client_timeout_s(), self._headers_too_slow)

    def _disarm(self) -> None:
        if self.header_deadline is not None:
            self.header_deadline.cancel()
            self.header_deadline = None

    def _headers_too_slow(self) -> None:
        self.header_deadline = None
        if not self.transport.is_closing():
            self.transport.close()


def command(args: list[str]) -> list[str]:
    """The uvicorn command line for the gateway, `args` last (they win)."""
    from django.conf import settings

    return [
        APP,
        "--http",
        "gatewaysite.server:HttpToolsProtocol",
        "--ws-max-size",
        str(settings.GATEWAY_MAX_BODY_BYTES),
        "--no-access-log",
        *args,
    ]


def workers(args: list[str]) -> int:
    """The number of worker processes uvicorn will start for these arguments (its own rules: the
    last `--workers` wins, else `WEB_CONCURRENCY`, else one)."""
    count = os.environ.get("WEB_CONCURRENCY", "1")
    for i, arg in enumerate(args):
        if arg == "--workers" and i + 1 < len(args):
            count = args[i + 1]
        elif arg.startswith("--workers="):
            count = arg.removeprefix("--workers=")
    try:
        return int(count)
    except ValueError:
        return 1  # uvicorn refuses it itself, with its own message


def prepare_metrics_dir(args: list[str]) -> None:
    """Workers share their counters through files (before any of them imports prometheus-client);
    files from an earlier run would be counted again, so the directory starts empty."""
    named = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if named:
        directory = Path(named)
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.db"):
            stale.unlink()
    elif workers(args) > 1:
        directory = Path(tempfile.mkdtemp(prefix="gateway-metrics-"))
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gatewaysite.settings")
    prepare_metrics_dir(sys.argv[1:])
    import uvicorn

    uvicorn.main.main(args=command(sys.argv[1:]), prog_name="gatewaysite.server")


if __name__ == "__main__":
    main()
