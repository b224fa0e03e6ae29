"""A loopback HTTP proxy that lets nothing through: point a program's HTTP_PROXY/HTTPS_PROXY/ALL_PROXY at
it (with NO_PROXY=127.0.0.1,localhost) and every connection it tries outside loopback (a `CONNECT host:443`
for HTTPS, an absolute URL for plain HTTP) is refused with 403 and recorded in `attempts` as the request
line, never forwarded. tests/agents/ runs the real agent CLIs under it and asserts it recorded nothing.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Self

from devkit.harness import HOST


class EgressTrap:
    def __init__(self) -> None:
        self.attempts: list[str] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 10)
            if line:
                with self._lock:
                    self.attempts.append(line.decode("latin-1").strip())
            writer.write(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            await writer.drain()
        except (OSError, TimeoutError):
            pass
        finally:
            writer.close()

    def start(self) -> Self:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="egress-trap", daemon=True)
        self._thread.start()

        async def listen() -> None:
            self._server = await asyncio.start_server(self._refuse, HOST, 0)
            self.port = self._server.sockets[0].getsockname()[1]

        asyncio.run_coroutine_threadsafe(listen(), self._loop).result(10)
        return self

    def stop(self) -> None:
        if self._loop is None or self._server is None:
            return
        self._server.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join()
        self._loop.close()
        self._loop = None

    def environment(self) -> dict[str, str]:
        """The proxy variables (both spellings) that send a program's outside connections here."""
        names = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
        proxies = {name: self.url for name in names} | {name.lower(): self.url for name in names}
        loopback = f"{HOST},localhost"
        return proxies | {"NO_PROXY": loopback, "no_proxy": loopback}

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
