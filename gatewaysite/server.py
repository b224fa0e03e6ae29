"""`python -m gatewaysite.server [uvicorn options]`: the gateway served by uvicorn as production runs
it (`make run` uses it), with what uvicorn does not do by itself (SPEC §11):

- a deadline for a request's headers: uvicorn drops an idle keep-alive connection, but a client that
  drips its headers a byte at a time is never dropped (any byte cancels the keep-alive timer). Here
  the headers of each request must be complete within `GATEWAY_CLIENT_TIMEOUT_S` of the connection
  or of the request's first byte, or the connection is closed. The body's own timeouts are the
  application's (`proxy.edge.read_body`).
- websocket messages refused by the server as soon as their header announces more than
  `GATEWAY_MAX_BODY_BYTES` (`--ws-max-size`, close code 1009), before their payload is read.
- flow control for websocket control frames (`WebSocketProtocol`): uvicorn's default implementation
  (`websockets-sansio`), like `wsproto`, writes the pong of every ping into the connection's write
  buffer and reads on, so a client that floods pings and never reads its pongs grew a worker by
  390 MiB in 15 s, before its key was even checked (issue 45). Here, once the write buffer is past its
  high-water mark, a ping stops the reading until the client has taken its pongs. The third choice,
  `--ws websockets` (the library's legacy asyncio implementation), waits for its pongs to drain too,
  but lets a stream run on to a client that stopped reading its messages
  (tests/proxy/test_servers.py), so it is not used.

- uvicorn's own access line off (`--no-access-log`; `--access-log` turns it back on): the gateway logs
  one structured line per request itself (SPEC §10: request id, route, outcome, status, attempts and
  its duration), and a second, unstructured line for each request cost about 3 % of the gateway's CPU.
- no `server: uvicorn` header (`--no-server-header`; `--server-header` brings it back): an answer need
  not name the software behind it to whoever probes for a known weakness, and uvicorn checks every
  header of every answer against two regular expressions.
- uvicorn's own lines (startup, shutdown, its errors) one JSON object each, as the gateway's, when
  `GATEWAY_LOG_FORMAT` is `json` (`--log-config gatewaysite/uvicorn_log.json`, gatewaysite.logformat).
- with more than one worker (`--workers N` or `WEB_CONCURRENCY`), a fresh directory for
  prometheus-client's multiprocess mode (`PROMETHEUS_MULTIPROC_DIR`, created, or emptied when the
  operator names one), so that `/metrics` sums every worker (proxy/ledger/metrics.py).

Any uvicorn option may follow (`--port`, `--workers`, ...). The equivalent plain uvicorn command is
`uvicorn gatewaysite.asgi:application --http gatewaysite.server:HttpToolsProtocol
--ws gatewaysite.server:WebSocketProtocol --ws-max-size N --no-access-log --no-server-header
--log-config gatewaysite/uvicorn_log.json` (the last with `GATEWAY_LOG_FORMAT=json`).

This steps around uvicorn's protocol classes (their callbacks `connection_made`, `on_message_begin`,
`on_headers_complete`, `connection_lost`; `handle_ping`, `resume_writing`, `read_paused`):
tests/proxy/test_edge_processes.py drips headers and tests/security/test_attack_websocket.py floods
pings at a real server started by this module, so an uvicorn upgrade that changes them fails there.
"""

import asyncio
import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as UvicornHttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

APP = "gatewaysite.asgi:application"
UVICORN_JSON_LOG = Path(__file__).with_name("uvicorn_log.json")  # GATEWAY_LOG_FORMAT=json


def _client_timeout_s() -> float:
    from django.conf import settings

    return settings.GATEWAY_CLIENT_TIMEOUT_S


class HttpToolsProtocol(UvicornHttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline for each request's headers."""

    header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
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


class WebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O websockets protocol with flow control for the pongs it answers pings with."""

    pongs_waiting = False  # reading stopped until the client takes its pongs

    def handle_ping(self) -> None:
        super().handle_ping()
        if not self.writable.is_set():  # the write buffer is past its high-water mark
            self.pongs_waiting = True
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.pongs_waiting:
            self.pongs_waiting = False
            if not self.read_paused:  # else the application's next receive resumes the reading
                self.transport.resume_reading()


def command(args: list[str]) -> list[str]:
    """The uvicorn command line for the gateway, `args` last (they win)."""
    from django.conf import settings

    # uvicorn configures its loggers before the application (and Django's LOGGING) is loaded.
    log_config = ["--log-config", str(UVICORN_JSON_LOG)] if settings.GATEWAY_LOG_FORMAT == "json" else []
    return [
        APP,
        "--http",
        "gatewaysite.server:HttpToolsProtocol",
        "--ws",
        "gatewaysite.server:WebSocketProtocol",
        "--ws-max-size",
        str(settings.GATEWAY_MAX_BODY_BYTES),
        "--no-access-log",
        "--no-server-header",
        *log_config,
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
