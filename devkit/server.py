"""The machinery of a fake upstream: an aiohttp server on a real loopback socket, scripted per model and
recording every request; the provider's routes are its subclass's (devkit.upstream.FakeUpstream).

It runs on 127.0.0.1 in its own thread and event loop, so sync tests and async tests (which own their
loop) can both drive it. `start()` returns once the port listens; `stop()` wakes hanging handlers,
closes every connection (websockets included) and joins the thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from dataclasses import dataclass, field
from typing import Literal, Self

from aiohttp import WSCloseCode, hdrs, web
from aiohttp.web import ContentCoding

from devkit.behaviours import ApiError, Behaviour, JsonObject, error_envelope, model_not_found, serve

Transport = Literal["http", "sse", "websocket"]


@dataclass(frozen=True)
class Hit:
    """One request as the fake received it (one `response.create` frame on a websocket)."""

    path: str
    method: str
    model: str | None
    headers: dict[str, str]  # lowercased names
    body: JsonObject | None  # None: no body, or not a JSON object
    transport: Transport


@dataclass
class _Running:
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    runner: web.AppRunner
    port: int
    stopping: asyncio.Event
    websockets: set[web.WebSocketResponse] = field(default_factory=set)


class FakeServer:
    """A scriptable fake server on 127.0.0.1; a subclass adds its provider's routes (`_add_routes`)."""

    def __init__(
        self,
        name: str = "fake",
        models: tuple[str, ...] | list[str] = ("gpt-5",),
        *,
        require_key: str | None = None,
        port: int = 0,
        compression: Literal["gzip", "deflate", "identity"] = "gzip",
    ) -> None:
        """`require_key`: answer 401 unless `Authorization: Bearer KEY` or `x-api-key: KEY` is sent.
        `port`: 0 picks a free port. `compression`: the coding preferred when the request offers it."""
        self.name = name
        self.compression = compression
        self._answer_digests: list[str] = []
        self.models = tuple(models)
        self.require_key = require_key
        # What GET /v1/models does; None lists `models`.
        self.models_behaviour: Behaviour | None = None
        self._requested_port = port
        self._lock = threading.Lock()  # hits and scripts are shared by the test thread and the server
        self._scripts: dict[str, list[Behaviour]] = {}
        self._hits: list[Hit] = []
        self._ws_connections = 0
        self._running: _Running | None = None

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> Self:
        """Listen on 127.0.0.1; returns once connections are accepted."""
        if self._running is not None:
            raise RuntimeError(f"fake upstream {self.name} is already running")
        loop = asyncio.new_event_loop()
        thread = threading.Thread(
            target=self._run_loop, args=(loop,), name=f"fake-upstream-{self.name}", daemon=True
        )
        thread.start()
        try:
            self._running = asyncio.run_coroutine_threadsafe(self._listen(loop, thread), loop).result(10)
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            raise
        return self

    def stop(self) -> None:
        """Close every connection (hanging and slow handlers end at once) and join the thread."""
        running = self._running
        if running is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(running), running.loop).result(10)
        running.loop.call_soon_threadsafe(running.loop.stop)
        running.thread.join()
        # Cleared last: handlers still finishing during the shutdown look their state up here.
        self._running = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @staticmethod
    def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        loop.run_forever()
        loop.close()

    def _add_routes(self, app: web.Application) -> None:
        """The provider's paths: each fake (devkit.upstream, devkit.azure...) declares its own."""
        raise NotImplementedError

    async def _listen(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> _Running:
        app = web.Application(client_max_size=64 * 1024 * 1024)  # above the gateway's own body limit
        self._add_routes(app)
        # Handlers end promptly on `stopping`; the timeout only bounds a handler stuck elsewhere.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", self._requested_port).start()
        except BaseException:
            await runner.cleanup()
            raise
        return _Running(loop, thread, runner, port=runner.addresses[0][1], stopping=asyncio.Event())

    @staticmethod
    async def _shutdown(running: _Running) -> None:
        running.stopping.set()
        # aiohttp does not close server websockets itself: their handlers would outlive the runner.
        for ws in list(running.websockets):
            await ws.close(code=WSCloseCode.GOING_AWAY)
        await running.runner.cleanup()

    # -- addresses ------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._require_running().port

    @property
    def base_url(self) -> str:
        """The API root an assignment's `base_url` names: `http://127.0.0.1:PORT/v1`."""
        return f"http://127.0.0.1:{self.port}/v1"

    def _require_running(self) -> _Running:
        if self._running is None:
            raise RuntimeError(f"fake upstream {self.name} is not running")
        return self._running

    # -- scripting and recording ----------------------------------------------------------------------

    def script(self, model: str, first: Behaviour, *then: Behaviour) -> None:
        """Answer the next requests for `model` with these behaviours in order; the last one repeats.

        Replaces any earlier script for `model`; a scripted model need not be in `models`."""
        with self._lock:
            self._scripts[model] = [first, *then]

    @property
    def hits(self) -> list[Hit]:
        with self._lock:
            return list(self._hits)

    def hit_count(self, model: str | None = None, path: str | None = None) -> int:
        """Requests received, optionally only those for `model` and/or to `path` (e.g. "/v1/responses")."""
        return sum(
            1
            for hit in self.hits
            if (model is None or hit.model == model) and (path is None or hit.path == path)
        )

    @property
    def ws_connections(self) -> int:
        """Websocket connections accepted so far."""
        with self._lock:
            return self._ws_connections

    @property
    def ws_open(self) -> int:
        """Websocket connections open right now (a closed or dropped one leaves at once)."""
        running = self._running
        return len(running.websockets) if running is not None else 0

    @property
    def answer_digests(self) -> list[str]:
        """SHA-256 (hex) of each plain body answered, as sent before any compression."""
        with self._lock:
            return list(self._answer_digests)

    def _coding(self, request: web.BaseRequest) -> ContentCoding | None:
        """The content coding to answer with: the preferred one if offered, else the other offered."""
        offered = request.headers.get(hdrs.ACCEPT_ENCODING, "").lower()
        if self.compression == "identity":
            return None
        other = "deflate" if self.compression == "gzip" else "gzip"
        for name in (self.compression, other):
            if name in offered:
                return ContentCoding(name)
        return None

    def _finish(self, request: web.BaseRequest, response: web.StreamResponse) -> web.StreamResponse:
        """Compress a plain answer the way an ordinary server does when the client offered it."""
        if isinstance(response, web.Response) and response.body is not None and not response.prepared:
            body = response.body
            if isinstance(body, bytes):
                with self._lock:
                    self._answer_digests.append(hashlib.sha256(body).hexdigest())
            coding = self._coding(request)
            if coding is not None:
                response.enable_compression(force=coding)
        return response

    def reset(self) -> None:
        """Forget hits, websocket connections, scripts and `models_behaviour`."""
        with self._lock:
            self._hits.clear()
            self._scripts.clear()
            self._ws_connections = 0
            self.models_behaviour = None

    def _record(
        self, request: web.Request, model: str | None, body: JsonObject | None, transport: Transport
    ) -> None:
        headers = {name.lower(): value for name, value in request.headers.items()}
        with self._lock:
            self._hits.append(Hit(request.path, request.method, model, headers, body, transport))

    def _behaviour_for(self, model: str) -> Behaviour:
        with self._lock:
            script = self._scripts.get(model)
            if script:
                return script.pop(0) if len(script) > 1 else script[0]
        return serve() if model in self.models else model_not_found()

    def _authorized(self, request: web.Request) -> bool:
        bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
        return self.require_key is None or self.require_key in (bearer, request.headers.get("x-api-key"))

    async def _pause(self, seconds: float) -> bool:
        """Sleep `seconds`; True if the fake is stopping meanwhile (the caller then drops the connection)."""
        try:
            await asyncio.wait_for(self._require_running().stopping.wait(), seconds)
        except TimeoutError:
            return False
        return True


def openai_failure(status: int, err: ApiError) -> web.Response:
    return web.json_response(error_envelope(status, err, anthropic=False), status=status)


def drop(request: web.BaseRequest) -> web.StreamResponse:
    """Close the TCP connection without finishing the response.

    `close()` (not `abort()`) so what was already written still reaches the client. The response
    returned is never sent: aiohttp's write to the closed transport fails with a ConnectionError,
    which it treats as a client disconnect, silently.
    """
    if request.transport is not None:
        request.transport.close()
    return web.Response()
