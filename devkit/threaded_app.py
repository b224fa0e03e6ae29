"""An aiohttp application served on 127.0.0.1 (a free port) by an event loop of its own in a daemon thread,
so a synchronous test can start a fake, call it over a real socket, and stop it. A subclass says what it
serves (`application`); `start` returns once the socket listens, `stop` once it is closed."""

from __future__ import annotations

import asyncio
import threading
from typing import Self

from aiohttp import web


@web.middleware
async def gzip_when_offered(request: web.Request, handler) -> web.StreamResponse:
    """A plain answer gzip-compressed when the request offers it, as providers' front ends do."""
    response = await handler(request)
    if "gzip" in request.headers.get("accept-encoding", "") and isinstance(response, web.Response):
        response.enable_compression(web.ContentCoding.gzip)
    return response


class ThreadedApp:
    thread_name = "fake-upstream"

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    def application(self) -> web.Application:
        """The routes this fake serves."""
        raise NotImplementedError

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> Self:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=self.thread_name, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    def stop(self) -> None:
        if self._loop is None or self._runner is None:
            return
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join()
        self._loop.close()
        self._loop = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def _listen(self) -> None:
        self._runner = web.AppRunner(self.application(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
