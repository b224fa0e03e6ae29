"""`devkit/fast_upstream.py` with long, paced streams, for `make bench-scale`'s stream curve.

A streaming `POST /v1/chat/completions` is answered with `max_tokens` content events, one every
`--interval-ms`, then a finish chunk, a usage chunk and `data: [DONE]`. Each event's content is
`time.monotonic_ns()` taken just before it is written (one clock for every process on this machine),
so a client can tell how long each event took to reach it, directly or through the gateway. One timer
drives every stream: the streams are spread over SLOTS phases of the interval, so a thousand streams
are a few wakeups each interval rather than a thousand, and they do not all write at the same instant.
Everything else (non-streaming chat, models, the Responses websocket, `/_bench/stats`) is
fast_upstream's own.

Usage: python -m bench.scale.stream_upstream --port 19201 --models m1,m2 --interval-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import sys
import time

from devkit.fast_upstream import HttpProtocol, Upstream, _chunk, _json

SLOTS = 10
HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


class Stream:
    """One paced stream: its remaining events and how to write them."""

    def __init__(self, transport: asyncio.Transport, model: str, events: int) -> None:
        self.transport = transport
        self.left = events
        base = {"id": "chatcmpl-scale", "object": "chat.completion.chunk", "created": 0, "model": model}
        event = {**base, "choices": [{"index": 0, "delta": {"content": "@"}, "finish_reason": None}]}
        self.before, self.after = (b"data: " + _json(event) + b"\n\n").split(b"@")
        finish = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        usage = {**base, "choices": [], "usage": {"prompt_tokens": 24, "completion_tokens": events}}
        self.tail = (
            b"".join(_chunk(b"data: " + _json(e) + b"\n\n") for e in (finish, usage))
            + _chunk(b"data: [DONE]\n\n")
            + b"0\r\n\r\n"
        )

    def send(self) -> bool:
        """Write the next event (and the end after the last); False once the stream is over."""
        if self.transport.is_closing():
            return False
        self.transport.write(_chunk(b"%s%d%s" % (self.before, time.monotonic_ns(), self.after)))
        self.left -= 1
        if self.left > 0:
            return True
        self.transport.write(self.tail)
        return False


class Pacer:
    """Writes one event of every stream each interval, the streams spread over SLOTS phases of it."""

    def __init__(self, interval_s: float) -> None:
        self.slots: list[list[Stream]] = [[] for _ in range(SLOTS)]
        self.step_s = interval_s / SLOTS
        self.added = 0
        self.ticks = 0
        self.started = 0.0

    def add(self, stream: Stream) -> None:
        self.slots[self.added % SLOTS].append(stream)
        self.added += 1

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.started = loop.time()
        loop.call_at(self.started + self.step_s, self.tick)

    def tick(self) -> None:
        slot = self.ticks % SLOTS
        self.slots[slot] = [s for s in self.slots[slot] if s.send()]
        self.ticks += 1
        loop = asyncio.get_running_loop()
        loop.call_at(self.started + (self.ticks + 1) * self.step_s, self.tick)


class PacedProtocol(HttpProtocol):
    def __init__(self, upstream: Upstream, pacer: Pacer) -> None:
        super().__init__(upstream)
        self.pacer = pacer

    def on_message_complete(self) -> None:
        if self.url == b"/v1/chat/completions" and not self.parser.should_upgrade():
            try:
                req = json.loads(b"".join(self.body))
            except ValueError:
                req = None
            if isinstance(req, dict) and req.get("stream") is True and self.transport is not None:
                self.upstream.requests += 1
                self.transport.write(HEAD)
                events = req.get("max_tokens")
                self.pacer.add(Stream(self.transport, str(req.get("model")), max(int(events or 1), 1)))
                return
        super().on_message_complete()


async def serve(args: argparse.Namespace) -> None:
    upstream = Upstream("scale", args.models.split(","), set(), 0)
    pacer = Pacer(args.interval_ms / 1000)
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    server = await loop.create_server(lambda: PacedProtocol(upstream, pacer), sock=sock, backlog=4096)
    pacer.start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"stream_upstream on http://{args.host}:{args.port}/v1", flush=True)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--models", default="gpt-5")
    p.add_argument("--interval-ms", type=float, default=20.0)
    args = p.parse_args(argv)
    import uvloop

    uvloop.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
