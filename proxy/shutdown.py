"""Ending open streams cleanly when the server is told to stop (SIGTERM / SIGINT).

A server's graceful shutdown waits for in-flight responses, then cuts what is left mid-stream,
which a client sees as a truncated response. On the stop signal the gateway starts its own,
shorter grace (`GATEWAY_SHUTDOWN_GRACE_S`, set below the server's); streams still open when it runs
out end with a typed terminal event (`gateway_shutting_down`) and their ledger rows, before the
server's grace expires. Installed from the ASGI lifespan (uvicorn); the previous handlers still run.
"""

import asyncio
import signal
from collections.abc import Awaitable, Callable

from django.conf import settings

Interrupt = Callable[[], Awaitable[None]]

_open: set[Interrupt] = set()


def register(interrupt: Interrupt) -> Callable[[], None]:
    """Track an open stream; `interrupt` makes its pending upstream read fail. Returns the release."""
    _open.add(interrupt)
    return lambda: _open.discard(interrupt)


async def _interrupt_after_grace() -> None:
    await asyncio.sleep(settings.GATEWAY_SHUTDOWN_GRACE_S)
    await asyncio.gather(*(interrupt() for interrupt in list(_open)), return_exceptions=True)


def install() -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)

        def on_signal(signum, frame, previous=previous) -> None:
            loop.call_soon_threadsafe(lambda: loop.create_task(_interrupt_after_grace()))
            if callable(previous):
                previous(signum, frame)

        signal.signal(sig, on_signal)
