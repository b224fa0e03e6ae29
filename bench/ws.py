"""The websocket phase of `make bench` (SPEC §6.3, §12; issue #5): the memory an idle client websocket
holds in the gateway, and the latency the relay adds to each event, for every gateway server this run
started, against the fast upstream's own websocket (devkit/fast_upstream.py) in the same run.

Memory. A client websocket is idle the way a real one is between turns: it has sent one
`response.create` and read the whole response, so the gateway holds it and the live upstream
connection it is pinned to (SPEC §6.3). For each server: a few warm-up connections go through the
whole path and are closed again; then the gateway process's VmRSS and open file descriptors and the
upstreams' open websocket count are read, `idle` connections are opened (OPEN_CONCURRENCY at a time)
and left idle, the server is left to settle, and the same readings are taken again. Per connection =
RSS growth / connections. It is done for two kinds of client, one after the other with the first
kind's connections still open (so the second kind cannot reuse memory the first one freed): one that
offers permessage-deflate, as the `websockets` library and browsers do by default, and one that offers
no compression, which is what every client gets from a server started with compression off. Then all
are closed, and the upstreams' open websocket count and the gateway's descriptor count must return to
where they were.

Latency. One client connection per target (direct, then each gateway), kept open for the whole phase
as a client keeps its live connection. Every response has DELTAS `response.output_text.delta` events.
The upstream stamps each event with `time.monotonic_ns()` just before writing it, and the client takes
the same clock as soon as the event is read, so receive - send is the event's whole trip (one clock:
everything runs on this machine). Directly that is the upstream's write and the client's read; through
the gateway it is that plus the relay, so the latency the gateway adds to an event is gateway minus
direct, at p50 and at p99. Two upstream pacings: `paced`, PACE_MS before each delta, as a model streams
tokens (each event is relayed on its own: what an interactive client feels), and `burst`, every event
back to back (later events wait behind earlier ones in each hop: the relay's throughput per event).
Targets take turns inside each repetition so that drift on a shared machine hits them alike.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

IDLE_CONNECTIONS = 500  # the target is stated for this many
QUICK_IDLE_CONNECTIONS = 100
WARMUP_CONNECTIONS = 10
OPEN_CONCURRENCY = 25  # below daphne's listen backlog (50)
DELTAS = 20
PACE_MS = 2.0
RESPONSES_PER_REP = 50
QUICK_RESPONSES_PER_REP = 20
WARMUP_RESPONSES = 10
RESPONSE_TIMEOUT_S = 30
SETTLE_S = 1.0  # after the server's CPU use has fallen: let timers and the ledger writer finish
# Each kind of client is kept open while the next is measured, and each idle websocket costs the
# gateway two descriptors (client side and upstream side).
FDS_PER_CONNECTION_IN_GATEWAY = 2
FD_MARGIN = 200

# (websockets `compression` argument, what the report calls that client)
CLIENT_KINDS: tuple[tuple[str | None, str], ...] = (
    ("deflate", "offers permessage-deflate"),
    (None, "offers no compression"),
)
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})
CREATE_FRAME = json.dumps(
    {"type": "response.create", "model": "gpt-5", "input": "Say hello in twenty words."}
)
DEFAULT_UPSTREAM = {"ws_deltas": 3, "ws_interval_ms": 0}  # fast_upstream's own defaults, restored after


@dataclass
class Server:
    name: str  # as in results.json
    label: str
    url: str  # ws://host:port/v1/responses
    key: str
    pid: int | None  # the process to read memory from (None: direct, or a gateway this run did not start)


@dataclass
class Hooks:
    """What the driver lends this phase: the upstreams' control port and the server process probes."""

    upstream_stats: Callable[[], dict[str, int] | None]  # summed over the upstreams
    configure_upstreams: Callable[[dict[str, float]], None]
    quiesce: Callable[[int], None]  # wait until this process is idle
    cpu_seconds: Callable[[int], float | None]


def ws_url(base_url: str) -> str:
    """`http://host:port/v1` -> `ws://host:port/v1/responses`."""
    return "ws" + base_url.removeprefix("http") + "/responses"


def raise_fd_limit() -> tuple[int, int]:
    """Soft RLIMIT_NOFILE up to the hard limit; the servers this driver starts inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        soft = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        except (ValueError, OSError):
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft, hard


def _proc_status_kib(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def fd_soft_limit(pid: int) -> int | None:
    """The process's own soft limit on open files (/proc/PID/limits)."""
    try:
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                value = line.split()[3]
                return None if value == "unlimited" else int(value)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _percentile(sorted_values: list[float], p: float) -> float:
    """Nearest rank, as bench/run.py's `percentile`."""
    if not sorted_values:
        return math.nan
    return sorted_values[max(1, math.ceil(p / 100 * len(sorted_values))) - 1]


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]


# --- one client ----------------------------------------------------------------------------------


async def _connect(server: Server, compression: str | None) -> ClientConnection:
    return await connect(
        server.url,
        additional_headers={"Authorization": f"Bearer {server.key}"},
        compression=compression,
        proxy=None,  # loopback only, whatever the environment says
        open_timeout=RESPONSE_TIMEOUT_S,
    )


def _negotiated(ws: ClientConnection) -> str:
    extensions = ws.response.headers.get("Sec-WebSocket-Extensions") if ws.response else None
    return extensions.split(";", 1)[0].strip() if extensions else "none"


async def _respond(ws: ClientConnection) -> tuple[int, list[tuple[int, dict[str, Any]]]]:
    """Send one `response.create` and read its events through the terminal one: (the time it was sent,
    [(the time each event was read, the event)])."""
    events: list[tuple[int, dict[str, Any]]] = []
    sent = time.monotonic_ns()
    await ws.send(CREATE_FRAME)
    async with asyncio.timeout(RESPONSE_TIMEOUT_S):
        while True:
            frame = await ws.recv()
            received = time.monotonic_ns()  # before anything else is done with the frame
            event = json.loads(frame)
            events.append((received, event))
            if event.get("type") in TERMINAL:
                return sent, events


async def _open_idle(server: Server, count: int, compression: str | None) -> tuple[list, list[str], dict]:
    """`count` connections, each through one whole response: (open connections, errors, negotiated
    extension -> connections)."""
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)

    async def one() -> ClientConnection:
        async with gate:
            ws = await _connect(server, compression)
            try:
                _, events = await _respond(ws)
                last = events[-1][1]
                if last.get("type") != "response.completed":
                    raise RuntimeError(f"the response ended with {json.dumps(last)[:160]}")
            except BaseException:
                ws.transport.abort()
                raise
            return ws

    results = await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
    conns = [r for r in results if isinstance(r, ClientConnection)]
    errors = [_why(r) for r in results if isinstance(r, BaseException)]
    negotiated: dict[str, int] = {}
    for ws in conns:
        name = _negotiated(ws)
        negotiated[name] = negotiated.get(name, 0) + 1
    return conns, errors, negotiated


async def _close_all(conns: list[ClientConnection]) -> None:
    gate = asyncio.Semaphore(OPEN_CONCURRENCY * 4)

    async def one(ws: ClientConnection) -> None:
        async with gate:
            await ws.close()

    await asyncio.gather(*(one(ws) for ws in conns), return_exceptions=True)


# --- memory --------------------------------------------------------------------------------------


async def _readings(server: Server, hooks: Hooks) -> dict[str, Any]:
    assert server.pid is not None
    await asyncio.to_thread(hooks.quiesce, server.pid)
    await asyncio.sleep(SETTLE_S)
    stats = await asyncio.to_thread(hooks.upstream_stats) or {}
    return {
        "rss_kib": _proc_status_kib(server.pid, "VmRSS"),
        "fds": open_fds(server.pid),
        "upstream_ws_open": stats.get("ws_open"),
        "upstream_ws_accepted": stats.get("ws_connections"),
    }


def _minus(a: dict[str, Any], b: dict[str, Any], key: str) -> int | None:
    return None if a.get(key) is None or b.get(key) is None else a[key] - b[key]


async def measure_memory(
    server: Server, count: int, hooks: Hooks, clients: tuple[tuple[str | None, str], ...] = CLIENT_KINDS
) -> dict[str, Any]:
    assert server.pid is not None
    warm, errors, _ = await _open_idle(server, WARMUP_CONNECTIONS, "deflate")
    await _close_all(warm)
    if errors:
        return {"error": f"warm-up connections failed: {errors[0]}"}
    start = await _readings(server, hooks)
    held: list[ClientConnection] = []
    kinds: list[dict[str, Any]] = []
    try:
        for compression, label in clients:
            before = await _readings(server, hooks)
            opened = time.monotonic()
            conns, errors, negotiated = await _open_idle(server, count, compression)
            open_s = time.monotonic() - opened
            held += conns
            idle = await _readings(server, hooks)
            grown = _minus(idle, before, "rss_kib")
            kinds.append(
                {
                    "client": label,
                    "compression_offered": compression or "none",
                    "negotiated": negotiated,
                    "asked": count,
                    "open": len(conns),
                    "errors": len(errors),
                    "first_errors": sorted(set(errors))[:3],
                    "open_seconds": open_s,
                    "before": before,
                    "idle": idle,
                    "rss_added_kib": grown,
                    "per_connection_kib": grown / len(conns) if conns and grown is not None else None,
                    "fds_added": _minus(idle, before, "fds"),
                    "upstream_ws_open_added": _minus(idle, before, "upstream_ws_open"),
                    "upstream_ws_accepted_added": _minus(idle, before, "upstream_ws_accepted"),
                }
            )
    finally:
        await _close_all(held)
    # The gateway closes each upstream connection when its client goes (SPEC §6.3): wait for that.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        stats = await asyncio.to_thread(hooks.upstream_stats) or {}
        if stats.get("ws_open") == start["upstream_ws_open"]:
            break
        await asyncio.sleep(0.2)
    closed = await _readings(server, hooks)
    return {
        "start": start,
        "kinds": kinds,
        "closed_all": len(held),
        "after_close": closed,
        "upstream_ws_open_back": closed["upstream_ws_open"] == start["upstream_ws_open"],
        "fds_left": _minus(closed, start, "fds"),
    }


# --- latency -------------------------------------------------------------------------------------


def _summary(values_ns: list[int]) -> dict[str, float]:
    us = sorted(v / 1000 for v in values_ns)
    return {
        "count": len(us),
        "p50_us": _percentile(us, 50),
        "p90_us": _percentile(us, 90),
        "p99_us": _percentile(us, 99),
        "mean_us": sum(us) / len(us) if us else math.nan,
    }


@dataclass
class _Samples:
    deltas: list[int]
    terminal: list[int]
    round_trip: list[int]
    rep_p50_us: list[float]
    cpu_s: float = 0.0
    cpu_responses: int = 0
    errors: int = 0
    first_error: str = ""
    negotiated: str = ""


async def _responses(ws: ClientConnection, count: int, samples: _Samples | None) -> None:
    for _ in range(count):
        sent, events = await _respond(ws)
        if samples is None:
            continue
        last_received, last = events[-1]
        if last.get("type") != "response.completed":
            raise RuntimeError(f"the response ended with {json.dumps(last)[:160]}")
        for received, event in events:
            if event.get("type") == "response.output_text.delta":
                samples.deltas.append(received - event["bench_sent_ns"])
        samples.terminal.append(last_received - last["bench_sent_ns"])
        samples.round_trip.append(last_received - sent)


async def measure_latency(
    servers: list[Server], hooks: Hooks, *, reps: int, responses: int, interval_ms: float
) -> dict[str, Any]:
    await asyncio.to_thread(hooks.configure_upstreams, {"ws_deltas": DELTAS, "ws_interval_ms": interval_ms})
    conns: dict[str, ClientConnection | None] = {}
    samples = {s.name: _Samples([], [], [], []) for s in servers}
    for s in servers:
        try:
            ws = await _connect(s, "deflate")  # the client library's default
            samples[s.name].negotiated = _negotiated(ws)
            await _responses(ws, WARMUP_RESPONSES, None)
            conns[s.name] = ws
        except Exception as exc:  # reported, not raised: the other targets are still measured
            conns[s.name] = None
            samples[s.name].errors += 1
            samples[s.name].first_error = _why(exc)
        if s.pid is not None:
            await asyncio.to_thread(hooks.quiesce, s.pid)
    for _ in range(reps):
        for s in servers:
            ws = conns[s.name]
            if ws is None:
                continue
            got = samples[s.name]
            first = len(got.deltas)
            cpu_before = hooks.cpu_seconds(s.pid) if s.pid is not None else None
            try:
                await _responses(ws, responses, got)
            except Exception as exc:
                got.errors += 1
                got.first_error = got.first_error or _why(exc)
                ws.transport.abort()
                conns[s.name] = None
                continue
            cpu_after = hooks.cpu_seconds(s.pid) if s.pid is not None else None
            if cpu_before is not None and cpu_after is not None:
                got.cpu_s += cpu_after - cpu_before
                got.cpu_responses += responses
            got.rep_p50_us.append(_percentile(sorted(v / 1000 for v in got.deltas[first:]), 50))
            if s.pid is not None:
                await asyncio.to_thread(hooks.quiesce, s.pid)
    await _close_all([ws for ws in conns.values() if ws is not None])
    out: dict[str, Any] = {}
    for s in servers:
        got = samples[s.name]
        if not got.deltas:
            out[s.name] = {"error": got.first_error or "no event measured"}
            continue
        out[s.name] = {
            "events": _summary(got.deltas),
            "terminal": _summary(got.terminal),
            "round_trip": _summary(got.round_trip),
            "rep_p50_us": got.rep_p50_us,
            "responses": len(got.round_trip),
            "cpu_ms_per_response": got.cpu_s * 1000 / got.cpu_responses if got.cpu_responses else None,
            "negotiated": got.negotiated,
            "errors": got.errors,
            "first_error": got.first_error,
        }
    return out


# --- the phase -----------------------------------------------------------------------------------


async def _phase(
    direct: Server, gateways: list[Server], hooks: Hooks, *, idle: int, reps: int, responses: int
) -> dict[str, Any]:
    memory: dict[str, Any] = {}
    for g in gateways:
        if g.pid is None:
            memory[g.name] = {"error": "a gateway this run did not start: no process to read memory from"}
            continue
        limit = min(v for v in (fd_soft_limit(g.pid), resource.getrlimit(resource.RLIMIT_NOFILE)[0]) if v)
        need = len(CLIENT_KINDS) * idle * FDS_PER_CONNECTION_IN_GATEWAY + FD_MARGIN
        if limit < need:
            memory[g.name] = {"error": f"open-file limit {limit} is below the {need} this needs"}
            continue
        try:
            memory[g.name] = await measure_memory(g, idle, hooks)
        except Exception as exc:
            memory[g.name] = {"error": _why(exc)}
    latency: dict[str, Any] = {}
    try:
        for mode, interval in (("paced", PACE_MS), ("burst", 0.0)):
            latency[mode] = await measure_latency(
                [direct, *gateways], hooks, reps=reps, responses=responses, interval_ms=interval
            )
    finally:
        await asyncio.to_thread(hooks.configure_upstreams, DEFAULT_UPSTREAM)
    return {"memory": memory, "latency": latency}


def run_phase(
    direct: Server, gateways: list[Server], hooks: Hooks, *, quick: bool, reps: int
) -> dict[str, Any]:
    """Measure; a dict for results.json (`bench/run.py` builds the report from it)."""
    idle = QUICK_IDLE_CONNECTIONS if quick else IDLE_CONNECTIONS
    responses = QUICK_RESPONSES_PER_REP if quick else RESPONSES_PER_REP
    coro = _phase(direct, gateways, hooks, idle=idle, reps=reps, responses=responses)
    try:
        import uvloop

        result = uvloop.run(coro)
    except ImportError:
        result = asyncio.run(coro)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {
        **result,
        "quick": quick,
        "idle_connections": idle,
        "target_idle_connections": IDLE_CONNECTIONS,
        "deltas": DELTAS,
        "pace_ms": PACE_MS,
        "reps": reps,
        "responses_per_rep": responses,
        "fd_limit": [soft, hard],
        "servers": {s.name: s.label for s in (direct, *gateways)},
    }
