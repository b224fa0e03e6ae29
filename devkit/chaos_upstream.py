"""Chaotic fake upstreams for the soak run: several OpenAI-compatible providers in one process, each
answering every request with a behaviour drawn at random.

They are the test suite's FakeUpstream (devkit/upstream.py: the same wire shapes for Chat
Completions, Responses, SSE and Responses websocket mode), with two changes:
- the behaviour of each request is drawn from per-transport weights with a seeded RNG, instead of
  a per-model script (scripts are sequences; under concurrency a sequence is not a distribution);
- requests are counted, not recorded (a soak sends tens of thousands).
Each upstream serves the text "hello from <name>, the soak upstream", so a stream that mixes two
upstreams' words (a handoff after visible output) is not a prefix of any one upstream's text.

Behaviours: serve; slow (served late, as providers often are: a plain answer after 0.4 s, stream
events 50 ms apart); model_not_found (404); rate_limited (429); unavailable (503); hang (longer than
the client's deadline); drop (the connection closes mid-response); on SSE also fail_before_visible,
cut_before_visible, cut_after_visible, fail_after_visible; on websockets also close_websocket.

The arrival log (`--arrivals-file`): one JSON line per request an upstream received, as the upstream
saw it: {"u": upstream, "t": transport (http|sse|websocket), "sid": the soak client's id for the
request (the client writes `sid=<id>` into the prompt, which the gateway forwards as is), "k": the
behaviour drawn, "a": arrival and "e": end (time.time(); the end is when the answer was written or
the gateway closed the connection, whichever came first: a hanging answer notices a disconnect
within 50 ms)}. The multi-node soak counts replays and concurrent half-open probes from it.

Usage: python -m devkit.chaos_upstream --names a,b,c,d --ready-file F [--ports P1,P2,P3,P4]
       [--stats-file F] [--arrivals-file F] [--seed N] [--hang-s 8].
Writes {"ports": {name: port}} to the ready file once every upstream listens; stops on SIGTERM/SIGINT
and then writes the per-upstream tallies to the stats file and the arrivals to the arrivals file.
"""

from __future__ import annotations

import argparse
import contextvars
import json
import random
import re
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from devkit import behaviours
from devkit.upstream import FakeUpstream

MODEL = "gpt-5"

# Per transport: behaviour -> weight. Failures are frequent on purpose (about 40 % of attempts), so
# that handoffs, exhausted plans and circuits opening and closing all happen many times in a run.
WEIGHTS: dict[str, dict[str, float]] = {
    "http": {
        "serve": 50,
        "slow": 10,
        "model_not_found": 10,
        "rate_limited": 10,
        "unavailable": 12,
        "hang": 2,
        "drop": 2,
    },
    "sse": {
        "serve": 47,
        "slow": 8,
        "model_not_found": 6,
        "rate_limited": 6,
        "unavailable": 8,
        "hang": 2,
        "fail_before_visible": 6,
        "cut_before_visible": 5,
        "cut_after_visible": 5,
        "fail_after_visible": 5,
    },
    "websocket": {
        "serve": 47,
        "slow": 8,
        "model_not_found": 7,
        "rate_limited": 7,
        "unavailable": 7,
        "hang": 2,
        "fail_before_visible": 5,
        "cut_after_visible": 5,
        "fail_after_visible": 5,
        "close_websocket": 7,
    },
}


SID = re.compile(r"sid=([A-Za-z0-9_.-]+)")
# The request being answered, in its handler's task: {"request", "entry": its arrival log entry}.
_CALL: contextvars.ContextVar[dict | None] = contextvars.ContextVar("soak_call", default=None)


# How late a slow answer is (plain: once; streams: before each event, about ten of them).
SLOW_S = {"http": 0.4, "sse": 0.05, "websocket": 0.05}


def text_of(name: str) -> str:
    return f"hello from {name}, the soak upstream"


def texts_of(name: str) -> tuple[str, ...]:
    """What the upstream may stream: its served text, and the fake's default text, which a failure
    after visible output starts to stream ("hello", then the failure)."""
    return (text_of(name), f"hello from {name}")


def raw_provider_messages() -> tuple[str, ...]:
    """What these upstreams put in their error messages: none of it may reach a client (SPEC §4)."""
    rejects = (behaviours.model_not_found(), behaviours.rate_limited(), behaviours.unavailable())
    return (*(r.error.message for r in rejects), behaviours.MID_STREAM_FAILURE.message)


class ChaosUpstream(FakeUpstream):
    def __init__(self, name: str, *, seed: int, hang_s: float, port: int = 0) -> None:
        super().__init__(name, models=(MODEL,), port=port)
        self.hang_s = hang_s
        self._rng = random.Random(f"{seed}:{name}")  # noqa: S311 - reproducible chaos, not secrets
        self._chaos_lock = threading.Lock()
        self._transport = "http"
        self.tally: Counter[str] = Counter()
        self.arrivals: list[dict] = []

    # The fake calls _record and then _behaviour_for for the same request, with no await between
    # them (one event loop thread): the transport noted here is the one of that request.
    def _record(self, request, model, body, transport) -> None:  # type: ignore[override]
        self._transport = transport
        found = SID.search(json.dumps(body)) if body is not None else None
        call = {"u": self.name, "t": transport, "sid": found.group(1) if found else None, "k": None}
        call["a"] = time.time()
        _CALL.set({"request": request, "entry": call})
        with self._chaos_lock:
            self.tally[f"{transport}:requests"] += 1
            self.arrivals.append(call)

    def _behaviour_for(self, model: str) -> behaviours.Behaviour:
        if model != MODEL:
            return behaviours.model_not_found()
        weights = WEIGHTS[self._transport]
        with self._chaos_lock:
            kind = self._rng.choices(list(weights), list(weights.values()))[0]
            self.tally[f"{self._transport}:{kind}"] += 1
        call = _CALL.get()
        if call is not None:
            call["entry"]["k"] = kind
        return self._make(kind)

    # The end of each answer, as the upstream sees it (the outermost of these sets it last).
    async def _respond_json(self, request, *args):  # type: ignore[override]
        try:
            return await super()._respond_json(request, *args)
        finally:
            _ended()

    async def _respond_stream(self, request, *args):  # type: ignore[override]
        try:
            return await super()._respond_stream(request, *args)
        finally:
            _ended()

    async def _answer_frame(self, request, ws, frame):  # type: ignore[override]
        try:
            return await super()._answer_frame(request, ws, frame)
        finally:
            _ended()

    async def _pause(self, seconds: float) -> bool:
        """The fake's pause, ended early when the gateway closes the connection (it gave up on the
        answer): a hanging upstream's log then shows when the gateway stopped waiting for it."""
        call = _CALL.get()
        request = call["request"] if call is not None else None
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if await super()._pause(min(left, 0.05)):
                return True
            if request is not None and (request.transport is None or request.transport.is_closing()):
                return False
        return False

    def _make(self, kind: str) -> behaviours.Behaviour:
        match kind:
            case "serve":
                return behaviours.serve(text_of(self.name))
            case "slow":  # a provider taking its time: the whole answer, or each stream event, late
                return behaviours.slow_stream(SLOW_S[self._transport], text_of(self.name))
            case "model_not_found":
                return behaviours.model_not_found()
            case "rate_limited":
                return behaviours.rate_limited()
            case "unavailable":
                return behaviours.unavailable(503)
            case "hang":
                return behaviours.hang(self.hang_s)
            case "drop" | "close_websocket":
                return behaviours.close_websocket()  # on HTTP: the connection drops mid-response
            case "fail_before_visible":
                return behaviours.fail_before_visible()
            case "cut_before_visible":
                return behaviours.cut_stream(after_visible=False)
            case "cut_after_visible":
                return behaviours.cut_stream(after_visible=True)
            case "fail_after_visible":
                return behaviours.fail_after_visible()
        raise ValueError(kind)


def _ended() -> None:
    call = _CALL.get()
    if call is not None:
        call["entry"]["e"] = time.time()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--names", default="a,b,c,d")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--hang-s", type=float, default=8.0)
    p.add_argument("--ports", default="", help="comma list, one per name (default: free ports)")
    p.add_argument("--ready-file", type=Path, required=True)
    p.add_argument("--stats-file", type=Path)
    p.add_argument("--arrivals-file", type=Path)
    args = p.parse_args(argv)

    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    names = args.names.split(",")
    ports = [int(p) for p in args.ports.split(",")] if args.ports else [0] * len(names)
    upstreams = [
        ChaosUpstream(n, seed=args.seed, hang_s=args.hang_s, port=port)
        for n, port in zip(names, ports, strict=True)
    ]
    try:
        for u in upstreams:
            u.start()
        tmp = args.ready_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"ports": {u.name: u.port for u in upstreams}}))
        tmp.replace(args.ready_file)  # atomically: the harness never reads half a file
        while not stopping.wait(0.5):
            pass
    finally:
        for u in upstreams:
            u.stop()
    if args.stats_file:
        args.stats_file.write_text(json.dumps({u.name: dict(u.tally) for u in upstreams}, indent=1))
    if args.arrivals_file:
        with open(args.arrivals_file, "w") as out:
            for u in upstreams:
                for call in u.arrivals:
                    out.write(json.dumps(call) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
