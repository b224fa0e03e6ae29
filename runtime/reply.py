"""An HTTP answer sent straight on ASGI, for the hot routes that need nothing of Django's request and
response objects (the proxied API routes: gatewaysite.asgi, proxy.views).

Django's handler (runtime.handler) builds a request object with its META, resolves the URL, converts
the view's HttpResponse and runs the view in a task of its own beside a second one that waits for a
disconnect. On the proxied routes that was about a tenth of the event loop's time. Here the answer is
computed in the server's own task, and, once it takes longer than a few milliseconds, one task waits for
the client to leave: if it does before the answer is complete, the answer is cancelled (an upstream call
in flight, a stream being relayed), as Django's handler does it.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from email.header import Header

Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


@dataclass(slots=True)
class Reply:
    """A status, headers (lowercase names) and either a whole body or its chunks as they come."""

    status: int
    body: bytes = b""
    chunks: AsyncIterator[bytes] | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)

    def __setitem__(self, name: str, value: str) -> None:
        """Set a header (replacing any of that name), as on Django's HttpResponse."""
        name = name.lower()
        self.headers = [(n, v) for n, v in self.headers if n != name]
        self.headers.append((name, value))


def header_value(value: str) -> bytes:
    """A header value as bytes: latin-1 when it can be, else MIME-encoded as Django encodes it. A line
    break can never reach the wire (it would split the header)."""
    if "\n" in value or "\r" in value:
        raise ValueError("a header value holds a line break")
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return Header(value, "utf-8", maxlinelen=1 << 30).encode().encode("ascii")


async def send_reply(reply: Reply, send: Send) -> None:
    headers = [(name.encode("latin-1"), header_value(value)) for name, value in reply.headers]
    if reply.chunks is None:
        headers.append((b"content-length", str(len(reply.body)).encode("ascii")))
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": reply.body})
        return
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    async with contextlib.aclosing(reply.chunks) as chunks:  # closed at once if the client leaves
        async for chunk in chunks:
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body"})


async def _disconnect(receive: Receive) -> None:
    """Returns when the client has gone (the request body was read whole before)."""
    while (await receive())["type"] != "http.disconnect":
        pass


# How long an answer is computed before a task starts watching for the client to leave. Most answers
# are sent sooner and never pay for that task (its creation, its first run, its cancellation: about 1 %
# of a request's instructions, bench/profile.md); a client that left meanwhile is found when it starts.
WATCH_AFTER_S = 0.005


async def respond(
    receive: Receive, send: Send, answer: Callable[[], Awaitable[Reply]], *, watch_disconnect: bool = True
) -> None:
    """Compute `answer()` and send it. With `watch_disconnect`, a client that leaves before the answer
    is sent whole cancels it (only when the body was read whole: else its next message would be body,
    not a disconnect), from WATCH_AFTER_S on."""
    if not watch_disconnect:
        await send_reply(await answer(), send)
        return
    loop = asyncio.get_running_loop()
    serving = asyncio.current_task()
    assert serving is not None
    answered = False
    watcher: asyncio.Task | None = None

    def on_disconnect(watcher: asyncio.Task) -> None:
        # After the last message the server reports a disconnect too: by then nothing is cancelled.
        if not answered and not watcher.cancelled() and watcher.exception() is None:
            serving.cancel()

    def watch() -> None:
        nonlocal watcher
        watcher = loop.create_task(_disconnect(receive))
        watcher.add_done_callback(on_disconnect)

    timer = loop.call_later(WATCH_AFTER_S, watch)
    try:
        await send_reply(await answer(), send)
    except asyncio.CancelledError:
        if watcher is None or not (watcher.done() and not watcher.cancelled()):
            raise  # cancelled by the server, not by the client leaving
        serving.uncancel()  # the client left: there is no one to answer
    finally:
        answered = True
        timer.cancel()
        if watcher is not None:
            watcher.cancel()
