"""The stream curve's client: N concurrent SSE streams of `events` events each (bench/scale/stream_upstream.py
paces them), over raw asyncio connections with httptools, so that a thousand streams at 50 events a
second cost this client a fraction of a CPU.

Each content event carries the upstream's `time.monotonic_ns()` at its write; the client takes the same
clock when the event is parsed out of what it read: receive - send is the event's whole trip (direct:
the upstream's write and this read; through the gateway: that plus the relay). Per stream it keeps the
events seen, the longest gap between two of them, and whether `[DONE]` came; over all streams, every
event's latency within the measured window (`window`: monotonic seconds).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from array import array
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httptools

STAMP = re.compile(rb'"content":"(\d+)"')
DONE = b"data: [DONE]"
OPEN_CONCURRENCY = 100  # connections being opened at once


@dataclass
class StreamStats:
    status: int = 0
    events: int = 0
    done: bool = False
    error: str = ""
    first: float = 0.0  # monotonic seconds of the first event
    last: float = 0.0
    max_gap_s: float = 0.0


@dataclass
class Shared:
    window: tuple[float, float]  # events received within it count
    latencies_us: array = field(default_factory=lambda: array("q"))
    in_window: int = 0


class StreamClient(asyncio.Protocol):
    def __init__(self, request: bytes, stats: StreamStats, shared: Shared, ended: asyncio.Future) -> None:
        self.request = request
        self.stats = stats
        self.shared = shared
        self.ended = ended
        self.parser = httptools.HttpResponseParser(self)
        self.carry = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._end(f"bad HTTP: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self._end("" if self.stats.done else f"connection lost after {self.stats.events} events")

    def on_status(self, _status: bytes) -> None:
        self.stats.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        now_ns = time.monotonic_ns()
        now = now_ns / 1e9
        text = self.carry + body
        cut = text.rfind(b"\n\n")
        if cut < 0:
            self.carry = text
            return
        self.carry = text[cut + 2 :]
        complete = text[: cut + 2]
        stats, shared = self.stats, self.shared
        stamps = STAMP.findall(complete)
        if stamps:
            if stats.events:
                stats.max_gap_s = max(stats.max_gap_s, now - stats.last)
            else:
                stats.first = now
            stats.last = now
            stats.events += len(stamps)
            if shared.window[0] <= now <= shared.window[1]:
                shared.in_window += len(stamps)
                shared.latencies_us.extend((now_ns - int(s)) // 1000 for s in stamps)
        if DONE in complete:
            stats.done = True

    def on_message_complete(self) -> None:
        if self.stats.status != 200:
            self._end(f"HTTP {self.stats.status}")
        elif self.transport is not None:
            self.transport.close()

    def _end(self, error: str) -> None:
        if error and not self.stats.error:
            self.stats.error = error
        if not self.ended.done():
            self.ended.set_result(None)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


def request_bytes(url: str, key: str, model: str, events: int) -> bytes:
    parts = urlsplit(url)
    body = json.dumps(
        {
            "model": model,
            "stream": True,
            "max_tokens": events,
            "messages": [{"role": "user", "content": "Count slowly."}],
        }
    ).encode()
    head = (
        f"POST {parts.path}/chat/completions HTTP/1.1\r\nhost: {parts.netloc}\r\n"
        f"authorization: Bearer {key}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def run_streams(
    url: str,
    key: str,
    model: str,
    count: int,
    events: int,
    window: tuple[float, float],
    give_up_s: float = 600,
) -> tuple[list[StreamStats], Shared]:
    """`count` streams of `events` events to `url` (ending in /v1), opened OPEN_CONCURRENCY at a time;
    returns when every one has ended, or after `give_up_s` with the rest cut. `window`: seconds from
    the call."""
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    shared = Shared((started + window[0], started + window[1]))
    parts = urlsplit(url)
    request = request_bytes(url, key, model, events)
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)
    stats = [StreamStats() for _ in range(count)]
    endings: list[asyncio.Future] = []

    async def one(s: StreamStats) -> None:
        ended = loop.create_future()
        endings.append(ended)
        async with gate:
            try:
                await loop.create_connection(
                    lambda: StreamClient(request, s, shared, ended), parts.hostname, parts.port
                )
            except OSError as exc:
                s.error = f"connect: {exc}"
                ended.set_result(None)

    await asyncio.gather(*(one(s) for s in stats))
    left = give_up_s - (time.monotonic() - started)
    try:
        await asyncio.wait_for(asyncio.gather(*endings), max(left, 0.1))
    except TimeoutError:
        for s in stats:
            if not s.done and not s.error:
                s.error = f"not finished within {give_up_s:.0f} s"
    return stats, shared


def summary(stats: list[StreamStats], shared: Shared, events: int, stall_s: float) -> dict[str, Any]:
    """Every stream complete? The streams refused (no event: an error status, or no connection), cut
    (started, then fewer events than asked, no [DONE] or an error) and stalled (a gap over `stall_s`),
    and the latency of the window's events."""
    lat = sorted(shared.latencies_us)

    def pct(p: float) -> float | None:
        return lat[min(len(lat) - 1, int(p / 100 * len(lat)))] / 1000 if lat else None

    refused = [s for s in stats if not s.events]
    cut = [s for s in stats if s.events and (s.error or not s.done or s.events != events)]
    return {
        "streams": len(stats),
        "events_each": events,
        "events_seen": sum(s.events for s in stats),
        "events_in_window": shared.in_window,
        "refused": len(refused),
        "refused_examples": sorted({s.error or f"HTTP {s.status}" for s in refused})[:3],
        "cut": len(cut),
        "cut_examples": sorted({s.error or f"{s.events} events, done={s.done}" for s in cut})[:3],
        "stalled": sum(1 for s in stats if s.max_gap_s > stall_s),
        "max_gap_s": max((s.max_gap_s for s in stats), default=0.0),
        "latency_p50_ms": pct(50),
        "latency_p99_ms": pct(99),
        "latency_samples": len(lat),
    }
