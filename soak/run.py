"""`make soak`: a bounded, self-stopping soak of the gateway on loopback, then the invariants.

What runs (everything on 127.0.0.1, everything stopped at the end):
- four chaotic upstreams in one process (devkit/chaos_upstream.py): each request is served, rejected
  with model_not_found, rate limited (429), failed with 503, hung past the client's deadline, dropped,
  or (on streams) cut or failed before or after visible output, or (websockets) closed;
- the gateway as production runs it (devkit/gateway.py): `uvicorn gatewaysite.asgi:application`,
  DJANGO_DEBUG=false, a generated secret, a fresh SQLite file (or a fresh PostgreSQL database on the
  server of DATABASE_URL when it is PostgreSQL), `manage.py migrate` and `load_gateway_config` of a
  generated YAML: one pool with the four assignments, one key;
- the load: `--requests` client requests at `--concurrency`, mixed over plain HTTP and SSE (Chat
  Completions and Responses) and, when the gateway has a websocket route at /v1/responses, Responses
  websocket mode; plus a few malformed requests and unknown models. Every request carries
  `x-gateway-deadline-ms`, so hung upstreams end at the deadline.

Then the gateway gets SIGTERM and must exit on its own (its ledger writer flushes at exit), and the
harness reads the ledger from the database. It asserts:
- every request got exactly one well-formed answer or typed error within deadline + margin; no 500;
  error bodies in the SPEC §4 shape; no provider message relayed; a stream's visible text comes from
  one upstream only (no handoff after visible output) and ends with exactly one terminal event;
- every request has exactly one RequestRecord (matched by `x-gateway-request-id`; websocket frames
  by count), with the status the client saw; its attempts are consistent: ordinals 1..n, at most one
  `succeeded`, handoffs only from attempts whose dispatch was rejected or never sent, and
  `retry_count` == number of `retryable_failed` attempts;
- circuit rows obey the state machine: state closed/open/half_open, open rows have open_until,
  probes_in_flight <= half_open_probes unless the lease expired, and no probe slot held at exit;
- no socket, descriptor or thread leak: the gateway's sockets back to baseline once the clients and
  the upstreams are gone; RSS flat after warm-up (growth below `--max-rss-growth`);
- SIGTERM drains the ledger: the process exits 0 within the grace period and no record is missing.

Prints a summary table; `--json PATH` writes the full report; a run of 20,000+ requests writes its
figures to bench/soak.md (included in bench/results.md). Exit status 0 only if every check holds.

Usage: python soak/main.py [--requests 20000] [--concurrency 64] [--seed 1] [--json report.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from devkit import chaos_upstream  # noqa: E402
from devkit.databases import Database, LedgerStall  # noqa: E402
from devkit.gateway import GatewayProcess  # noqa: E402
from devkit.harness import PYTHON, spawn, stop  # noqa: E402
from devkit.procfs import Inventory, inventory  # noqa: E402
from devkit.sse_reader import read_sse  # noqa: E402

UPSTREAM_NAMES = ("a", "b", "c", "d")
UPSTREAM_KEY_ENV = "GATEWAY_UPSTREAM_SOAK_KEY"
MODEL = "gpt-5"
UNKNOWN_MODEL = "gpt-unknown-soak-9"
CIRCUIT = {
    "failure_threshold": 3,
    "cooldown_seconds": 1,
    "max_cooldown_seconds": 4,
    "half_open_probes": 1,
    "probe_lease_seconds": 10,
    "demotion_seconds": 2,
}
RETRY = {"max_attempts": 4, "backoff_base_ms": 10, "default_deadline_ms": 120000}
# Request kinds and their shares (websocket only when the gateway has the route).
MIX = {
    "chat_http": 22,
    "responses_http": 22,
    "chat_sse": 22,
    "responses_sse": 22,
    "websocket": 8,
    "bad_json": 2,
    "unknown_model": 2,
}
TRANSPORT = {
    "chat_http": "http",
    "responses_http": "http",
    "chat_sse": "sse",
    "responses_sse": "sse",
    "websocket": "websocket",
    "bad_json": "http",
    "unknown_model": "http",
}
PATHS = {
    "chat_http": "/v1/chat/completions",
    "chat_sse": "/v1/chat/completions",
    "responses_http": "/v1/responses",
    "responses_sse": "/v1/responses",
    "bad_json": "/v1/chat/completions",
    "unknown_model": "/v1/chat/completions",
}
EXPECTED_TYPED = {"bad_json": (400, "invalid_request"), "unknown_model": (404, "model_not_found")}
RESPONSES_TERMINALS = {"response.completed", "response.incomplete", "response.failed", "error"}
# The gateway's typed statuses (SPEC §4) and what a sanitized upstream failure may carry.
ALLOWED_STATUSES = {200, 400, 401, 403, 404, 409, 413, 429, 502, 503, 504}
TEXTS = {t: n for n in UPSTREAM_NAMES for t in chaos_upstream.texts_of(n)}
RAW_MESSAGES = chaos_upstream.raw_provider_messages()


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- one client request ------------------------------------------------------------------------


@dataclass
class Outcome:
    index: int
    kind: str
    transport: str
    phase: str = "load"  # load | drain (the burst around SIGTERM)
    status: int | None = None  # HTTP status (websocket: None)
    code: str = ""  # "ok", the typed error code, or what went wrong on the client side
    request_id: str | None = None
    attempts_header: int | None = None
    latency_s: float = 0.0
    done_at: float = 0.0
    problems: list[str] = field(default_factory=list)
    # Multi-node runs: which node (and which start of it) served the request, when it was sent, the
    # id the upstreams log it by, which key sent it, and whether the node was killed under it.
    node: int = -1
    incarnation: int = 0
    started_at: float = 0.0
    sid: str = ""
    key: str = "main"
    killed: bool = False


def _error_problems(body: object, where: str) -> list[str]:
    """SPEC §4 OpenAI error shape: {"error": {"message", "type", "code", "param"}}."""
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], dict):
        return [f"{where}: error body is not {{'error': {{...}}}}: {str(body)[:160]}"]
    error = body["error"]
    problems = []
    if set(error) != {"message", "type", "code", "param"}:
        problems.append(f"{where}: error keys {sorted(error)}")
    if not (isinstance(error.get("message"), str) and error["message"]):
        problems.append(f"{where}: error.message missing")
    if not (isinstance(error.get("type"), str) and error["type"]):
        problems.append(f"{where}: error.type missing")
    for name in ("code", "param"):
        if error.get(name) is not None and not isinstance(error[name], str):
            problems.append(f"{where}: error.{name} is {type(error[name]).__name__}")
    return problems


def _raw_leak(text: str) -> str | None:
    return next((m for m in RAW_MESSAGES if m in text), None)


def _one_upstream_text(text: str, complete: bool, where: str) -> list[str]:
    """The visible text must be one upstream's text (complete) or a prefix of it (cut short)."""
    if complete:
        return [] if text in TEXTS else [f"{where}: answer text {text[:80]!r} is no single upstream's"]
    if text and not any(t.startswith(text) for t in TEXTS):
        return [f"{where}: visible text {text[:80]!r} mixes upstreams (handoff after visible output?)"]
    return []


def check_chat_stream(events: list[tuple[str | None, Any]]) -> tuple[str, list[str]]:
    problems: list[str] = []
    terminals = [
        i for i, (_, d) in enumerate(events) if d == "[DONE]" or (isinstance(d, dict) and "error" in d)
    ]
    text = "".join(
        (c.get("delta") or {}).get("content") or ""
        for _, d in events
        if isinstance(d, dict)
        for c in d.get("choices") or []
        if isinstance(c, dict)
    )
    if len(terminals) != 1 or terminals[0] != len(events) - 1:
        problems.append(f"sse chat: {len(terminals)} terminal events, at {terminals[-3:]} of {len(events)}")
        return "no_terminal", problems
    last = events[-1][1]
    if last == "[DONE]":
        return "ok", _one_upstream_text(text, True, "sse chat")
    problems += _error_problems(last, "sse chat error event")
    problems += _one_upstream_text(text, False, "sse chat")
    error = last.get("error") if isinstance(last, dict) else None
    code = (error.get("code") or error.get("type") or "error") if isinstance(error, dict) else "error"
    return code, problems


def check_responses_events(events: list[tuple[str | None, Any]], where: str) -> tuple[str, list[str]]:
    problems: list[str] = []
    types = [(name or (d.get("type") if isinstance(d, dict) else None)) for name, d in events]
    terminals = [i for i, t in enumerate(types) if t in RESPONSES_TERMINALS]
    text = "".join(
        d.get("delta") or ""
        for t, (_, d) in zip(types, events, strict=True)
        if t == "response.output_text.delta" and isinstance(d, dict)
    )
    if types.count("response.created") > 1:
        problems.append(f"{where}: response.created sent {types.count('response.created')} times")
    if len(terminals) != 1 or terminals[0] != len(events) - 1:
        problems.append(f"{where}: {len(terminals)} terminal events, last of {len(events)} is {types[-1:]}")
        return "no_terminal", problems
    final_type, final = types[-1], events[-1][1]
    if final_type == "response.completed":
        return "ok", _one_upstream_text(text, True, where)
    problems += _one_upstream_text(text, False, where)
    if final_type == "error":
        error = final.get("error") if isinstance(final, dict) else None
        if not isinstance(error, dict) or not isinstance(error.get("message"), str):
            problems.append(f"{where}: error event without an error object: {str(final)[:160]}")
            return "error", problems
        return str(error.get("code") or error.get("type") or "error"), problems
    return final_type, problems


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class Load:
    def __init__(
        self, args: argparse.Namespace, base_url: str, key: str, websocket: bool, phase: str = "load"
    ) -> None:
        self.args = args
        self.phase = phase
        self.closed = False  # no new request once set (SIGTERM was sent)
        self.base_url = base_url
        self.ws_url = base_url.replace("http://", "ws://") + "/v1/responses"
        self.headers = {
            "authorization": f"Bearer {key}",
            "content-type": "application/json",
            "x-gateway-deadline-ms": str(args.deadline_ms),
        }
        self.limit_s = args.deadline_ms / 1000 + args.margin_s
        self.websocket = websocket
        self.outcomes: list[Outcome] = []
        rng = random.Random(args.seed)  # noqa: S311 - a reproducible mix, not secrets
        mix = {k: w for k, w in MIX.items() if websocket or k != "websocket"}
        self.plan = rng.choices(list(mix), list(mix.values()), k=args.requests)
        self.rng = rng
        self.next = 0
        self.started = 0.0
        self.stop_at = 0.0

    @staticmethod
    def body(kind: str, stream: bool, sid: str = "") -> dict:
        # `sid=...` in the prompt: the upstreams log each request they receive by it.
        prompt = f"soak: say hello sid={sid}" if sid else "soak: say hello"
        if kind.startswith("responses") or kind == "websocket":
            body: dict = {"model": MODEL, "input": prompt}
        else:
            body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}
            if stream:
                body["stream_options"] = {"include_usage": True}
        if kind == "unknown_model":
            body["model"] = UNKNOWN_MODEL
        if stream:
            body["stream"] = True
        return body

    async def run(self) -> list[Outcome]:
        connector = aiohttp.TCPConnector(limit=self.args.concurrency, force_close=False)
        self.started = time.monotonic()
        self.stop_at = self.started + self.args.time_limit
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
            workers = [asyncio.create_task(self.worker(session)) for _ in range(self.args.concurrency)]
            await asyncio.gather(*workers)
        return self.outcomes

    def take(self) -> int | None:
        if self.closed or self.next >= len(self.plan) or time.monotonic() > self.stop_at:
            return None
        self.next += 1
        return self.next - 1

    def pick(self, session: aiohttp.ClientSession) -> tuple[aiohttp.ClientSession, str, int, int]:
        """Where the next request goes: (session, base URL, node, incarnation). One gateway here;
        the multi-node soak spreads requests over its nodes."""
        return session, self.base_url, -1, 0

    def key_for(self, index: int) -> tuple[str, dict[str, str]]:
        """The key that sends request `index`: (its name, its headers)."""
        return "main", self.headers

    def new_outcome(self, index: int, kind: str, node: int, incarnation: int, **fields: Any) -> Outcome:
        key, _ = self.key_for(index)
        o = Outcome(index, kind, TRANSPORT[kind], self.phase, node=node, incarnation=incarnation, **fields)
        o.key, o.sid, o.started_at = key, f"{self.phase}-{index}", time.monotonic()
        return o

    async def worker(self, session: aiohttp.ClientSession) -> None:
        while (index := self.take()) is not None:
            kind = self.plan[index]
            target, base_url, node, incarnation = self.pick(session)
            if kind == "websocket":
                await self.websocket_session(target, index, base_url, node, incarnation)
            else:
                outcome = self.new_outcome(index, kind, node, incarnation)
                t0 = time.monotonic()
                try:
                    await asyncio.wait_for(self.http(target, outcome, base_url), self.limit_s)
                except TimeoutError:
                    outcome.code = "client_timeout"
                    outcome.problems.append(f"no complete answer within {self.limit_s:.1f} s")
                except aiohttp.ClientError as exc:
                    outcome.code = "client_transport_error"
                    if not (self.closed and outcome.status is None):  # refused after SIGTERM: expected
                        outcome.problems.append(f"transport error: {type(exc).__name__}: {exc}"[:200])
                outcome.latency_s = time.monotonic() - t0
                outcome.done_at = time.monotonic()
                self.outcomes.append(outcome)

    async def http(self, session: aiohttp.ClientSession, o: Outcome, base_url: str) -> None:
        stream = o.transport == "sse"
        data = b'{"model": "gpt-5", "messages": [' if o.kind == "bad_json" else None
        body = None if data is not None else self.body(o.kind, stream, o.sid)
        _, headers = self.key_for(o.index)
        async with session.post(base_url + PATHS[o.kind], json=body, data=data, headers=headers) as resp:
            o.status = resp.status
            o.request_id = resp.headers.get("x-gateway-request-id")
            o.attempts_header = _int_or_none(resp.headers.get("x-gateway-attempts"))
            chunks = []
            try:
                async for chunk in resp.content.iter_any():
                    chunks.append(chunk)
            except aiohttp.ClientPayloadError as exc:
                o.problems.append(f"response body ended abnormally: {type(exc).__name__}")
            raw = b"".join(chunks)
            ctype = resp.headers.get("content-type", "")
        if not o.request_id:
            o.problems.append("no x-gateway-request-id header")
        text = raw.decode("utf-8", "replace")
        if (leak := _raw_leak(text)) is not None:
            o.problems.append(f"provider message relayed: {leak!r}")
        if o.status not in ALLOWED_STATUSES:
            o.problems.append(f"status {o.status}: {text[:160]!r}")
        if o.status == 200 and ctype.startswith("text/event-stream"):
            events = read_sse(text)
            if o.kind.startswith("chat"):
                o.code, problems = check_chat_stream(events)
            else:
                o.code, problems = check_responses_events(events, "sse responses")
            o.problems += problems
            if not stream:
                o.problems.append("a stream answered a non-streaming request")
            return
        try:
            parsed = json.loads(raw)
        except ValueError:
            o.code = "malformed"
            o.problems.append(f"status {o.status} body is not JSON: {text[:160]!r}")
            return
        if o.status == 200:
            o.code = "ok"
            o.problems += _one_upstream_text(_json_text(o.kind, parsed), True, f"{o.kind} 200")
        else:
            o.problems += _error_problems(parsed, f"{o.kind} {o.status}")
            error = parsed.get("error") if isinstance(parsed, dict) else None
            o.code = str(error.get("code") or error.get("type")) if isinstance(error, dict) else "malformed"
        expected = EXPECTED_TYPED.get(o.kind)
        if expected is not None and (o.status, o.code) != expected:
            o.problems.append(f"{o.kind}: expected {expected}, got {(o.status, o.code)}")

    async def websocket_session(
        self, session: aiohttp.ClientSession, index: int, base_url: str, node: int = -1, incarnation: int = 0
    ) -> None:
        """One websocket connection carrying this frame and, while the plan has websocket requests
        next in line, up to two more (each response.create is one request)."""
        frames = [index]
        while len(frames) < 3 and self.next < len(self.plan) and self.plan[self.next] == "websocket":
            frames.append(self.next)
            self.next += 1
        headers = {k: v for k, v in self.key_for(index)[1].items() if k != "content-type"}
        ws_url = base_url.replace("http://", "ws://") + "/v1/responses"
        t0 = time.monotonic()
        try:
            ws = await asyncio.wait_for(session.ws_connect(ws_url, headers=headers), self.limit_s)
        except (TimeoutError, aiohttp.ClientError) as exc:
            for i in frames:
                o = self.new_outcome(i, "websocket", node, incarnation, code="ws_connect_failed")
                o.problems.append(f"websocket handshake failed: {type(exc).__name__}: {exc}"[:200])
                o.latency_s, o.done_at = time.monotonic() - t0, time.monotonic()
                self.outcomes.append(o)
            return
        try:
            for n, i in enumerate(frames):
                o = self.new_outcome(i, "websocket", node, incarnation)
                if ws.closed:
                    o.code = "not_sent"  # the gateway closed the connection: this frame was never sent
                else:
                    await self.websocket_frame(ws, o)
                o.done_at = time.monotonic()
                self.outcomes.append(o)
                if o.code == "not_sent":
                    for rest in frames[n + 1 :]:
                        self.outcomes.append(
                            self.new_outcome(rest, "websocket", node, incarnation, code="not_sent")
                        )
                    break
        finally:
            await ws.close()

    async def websocket_frame(self, ws: aiohttp.ClientWebSocketResponse, o: Outcome) -> None:
        t0 = time.monotonic()
        try:
            await ws.send_str(json.dumps({"type": "response.create", **self.body("websocket", False, o.sid)}))
        except aiohttp.ClientConnectionResetError:
            o.code = "not_sent"  # the gateway was closing the connection (a drain): the frame never left
            return
        events: list[tuple[str | None, Any]] = []
        try:
            async with asyncio.timeout(self.limit_s):
                while True:
                    message = await ws.receive()
                    if message.type != aiohttp.WSMsgType.TEXT:
                        break
                    if (leak := _raw_leak(message.data)) is not None:
                        o.problems.append(f"provider message relayed: {leak!r}")
                    try:
                        data = json.loads(message.data)
                    except ValueError:
                        o.problems.append(f"non-JSON websocket frame: {message.data[:120]!r}")
                        continue
                    events.append((None, data))
                    if isinstance(data, dict) and data.get("type") in RESPONSES_TERMINALS:
                        break
        except TimeoutError:
            o.code = "client_timeout"
            o.problems.append(f"no terminal event or close within {self.limit_s:.1f} s")
        o.latency_s = time.monotonic() - t0
        if o.code:
            return
        if events and isinstance(events[-1][1], dict) and events[-1][1].get("type") in RESPONSES_TERMINALS:
            o.code, problems = check_responses_events(events, "websocket")
            o.problems += problems
        else:
            # Closed by the gateway (SPEC §6.3: closing either side closes the other).
            o.code = f"closed_{ws.close_code}"
            if ws.close_code in (None, 1006):
                o.problems.append(f"websocket dropped without a close frame (code {ws.close_code})")


def _json_text(kind: str, body: object) -> str:
    try:
        if kind.startswith("chat"):
            return body["choices"][0]["message"]["content"]  # type: ignore[index]
        return body["output"][0]["content"][0]["text"]  # type: ignore[index]
    except (KeyError, IndexError, TypeError):
        return f"<no text in {str(body)[:80]}>"


# --- monitoring the gateway process ------------------------------------------------------------


@dataclass
class Sample:
    t: float
    progress: float
    rss_kb: int
    threads: int


async def monitor(pid: int, load: Load, samples: list[Sample], stop_event: asyncio.Event) -> None:
    last_log = time.monotonic()
    while not stop_event.is_set():
        inv = inventory(pid)
        progress = len(load.outcomes) / max(len(load.plan), 1)
        samples.append(Sample(time.monotonic() - load.started, progress, inv.rss_kb, inv.threads))
        if time.monotonic() - last_log >= 10:
            last_log = time.monotonic()
            log(
                f"{len(load.outcomes)}/{len(load.plan)} done, RSS {inv.rss_kb / 1024:.0f} MiB, "
                f"{inv.threads} threads, {inv.sockets} sockets"
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop_event.wait(), 0.5)


# --- checks ------------------------------------------------------------------------------------


@dataclass
class Check:
    id: str  # stable: tests/reliability/test_soak_short.py names its cases by these
    name: str
    ok: bool
    detail: str
    examples: list[str] = field(default_factory=list)


CHECK_IDS = (
    "all_ran",
    "deadline",
    "no_500",
    "well_formed",
    "sanitized",
    "one_upstream",
    "drain_answers",
    "exit",
    "client_sockets",
    "sockets",
    "threads",
    "memory",
    "records",
    "ledger_matches_client",
    "attempts",
    "circuits",
    "probes",
    "log",
)


def _examples(items: list[str], n: int = 5) -> list[str]:
    return items[:n]


def client_checks(outcomes: list[Outcome], planned: int) -> list[Check]:
    by_problem: dict[str, list[str]] = defaultdict(list)
    for o in outcomes:
        for p in o.problems:
            category = (
                "deadline"
                if "within" in p
                else "status"
                if p.startswith("status")
                else "leak"
                if "provider message" in p
                else "handoff"
                if "upstream" in p and "text" in p
                else "shape"
            )
            by_problem[category].append(f"#{o.index} {o.kind} rid={o.request_id}: {p}")
    five_hundreds = [o for o in outcomes if o.status and o.status >= 500 and o.status not in (502, 503, 504)]
    checks = [
        Check(
            "all_ran",
            "all planned requests ran",
            len(outcomes) == planned,
            f"{len(outcomes)} of {planned} (a shortfall means the time limit stopped the load)",
        ),
        Check(
            "deadline",
            "every request answered within deadline + margin",
            not by_problem["deadline"],
            f"{len(by_problem['deadline'])} late or unanswered",
            _examples(by_problem["deadline"]),
        ),
        Check(
            "no_500",
            "no 500 (or other untyped 5xx) from the gateway",
            not five_hundreds and not by_problem["status"],
            f"{len(five_hundreds)} untyped 5xx, {len(by_problem['status'])} unexpected statuses",
            _examples(by_problem["status"]),
        ),
        Check(
            "well_formed",
            "answers and errors well-formed (SPEC §4 shape, one terminal event per stream)",
            not by_problem["shape"],
            f"{len(by_problem['shape'])} malformed",
            _examples(by_problem["shape"]),
        ),
        Check(
            "sanitized",
            "no provider message relayed",
            not by_problem["leak"],
            f"{len(by_problem['leak'])} leaks",
            _examples(by_problem["leak"]),
        ),
        Check(
            "one_upstream",
            "visible output from one upstream only (no handoff after visible output)",
            not by_problem["handoff"],
            f"{len(by_problem['handoff'])} mixed",
            _examples(by_problem["handoff"]),
        ),
    ]
    return checks


def ledger_checks(database: Database, outcomes: list[Outcome]) -> tuple[list[Check], dict]:
    """Reads the ledger and the circuits straight from the database (the gateway has exited)."""
    os.environ["DATABASE_URL"] = database.url
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
    os.environ["DJANGO_DEBUG"] = "false"
    os.environ["DATABASE_CONN_MAX_AGE"] = "0"
    os.environ["DJANGO_SETTINGS_MODULE"] = "gatewaysite.settings"
    import django

    django.setup()
    from django.db import connections

    from pools.models import GatewaySettings
    from proxy.models import Attempt, RequestRecord
    from routing.models import Circuit

    try:
        records = list(
            RequestRecord.objects.values(
                "id", "request_id", "transport", "status_code", "outcome", "retry_count", "finished_at"
            )
        )
        attempts: dict[int, list[dict]] = defaultdict(list)
        for a in Attempt.objects.order_by("request_id", "ordinal").values(
            "request_id", "ordinal", "status", "dispatch_state", "failure_class"
        ):
            attempts[a["request_id"]].append(a)
        circuits = list(Circuit.objects.values())
        settings = GatewaySettings.objects.filter(pk=1).values().first() or {}
    finally:
        connections.close_all()
    now = datetime.now(UTC)

    by_rid = {r["request_id"]: r for r in records}
    missing, mismatched = [], []
    for o in outcomes:
        if o.transport == "websocket" or o.request_id is None or o.killed:
            continue
        record = by_rid.get(o.request_id)
        if record is None:
            missing.append(f"#{o.index} {o.kind} {o.status} rid={o.request_id}")
            continue
        dispatched = sum(1 for a in attempts[record["id"]] if a["status"] != "ineligible")
        if record["status_code"] != o.status:
            mismatched.append(f"rid={o.request_id}: client saw {o.status}, ledger {record['status_code']}")
        if o.attempts_header is not None and o.attempts_header != dispatched:
            mismatched.append(
                f"rid={o.request_id}: x-gateway-attempts {o.attempts_header}, ledger {dispatched} dispatched"
            )
    # Requests the gateway answered have a known id; one the client gave up on (or that was refused
    # around SIGTERM, or whose node was killed under it) may or may not have reached the ledger: the
    # record count must lie in between.
    answered = sum(1 for o in outcomes if o.transport != "websocket" and o.request_id and not o.killed)
    unknown = sum(1 for o in outcomes if o.transport != "websocket" and (not o.request_id or o.killed))
    stored_http = sum(1 for r in records if r["transport"] in ("http", "sse"))
    # Websocket frames likewise: one answered by an event surely reached the gateway; one that met
    # only a close (the gateway stopping under SIGTERM) may or may not have been delivered to it.
    sent = [
        o for o in outcomes if o.transport == "websocket" and o.code not in ("not_sent", "ws_connect_failed")
    ]
    frames = len(sent)
    closed_only = sum(1 for o in sent if o.code.startswith("closed_") or o.killed)
    stored_ws = sum(1 for r in records if r["transport"] == "websocket")
    count_ok = answered <= stored_http <= answered + unknown and frames - closed_only <= stored_ws <= frames
    inconsistent = []
    for r in records:
        rows = attempts.get(r["id"], [])
        why = _attempt_problems(r, rows)
        if why:
            trail = " ".join(f"{a['ordinal']}:{a['status']}/{a['dispatch_state']}" for a in rows)
            inconsistent.append(f"rid={r['request_id']} outcome={r['outcome']}: {why} [{trail}]")

    circuit_bad, probe_held = [], []
    limit = settings.get("half_open_probes", 1)
    for c in circuits:
        label = f"circuit a{c['assignment_id']}/{c['model']}/{c['route_class']} {c['state']}"
        if c["state"] not in ("closed", "open", "half_open"):
            circuit_bad.append(f"{label}: unknown state")
        if c["state"] == "open" and c["open_until"] is None:
            circuit_bad.append(f"{label}: open without open_until")
        lease_expired = c["probe_lease_expires_at"] is not None and c["probe_lease_expires_at"] <= now
        if c["probes_in_flight"] > limit and not lease_expired:
            circuit_bad.append(f"{label}: {c['probes_in_flight']} probes in flight > {limit}")
        if c["probes_in_flight"] > 0:
            probe_held.append(f"{label}: {c['probes_in_flight']} probe(s) still held at exit")

    checks = [
        Check(
            "records",
            "every request has exactly one RequestRecord (SIGTERM drained the ledger)",
            not missing and count_ok,
            f"{len(missing)} missing by request id; HTTP/SSE: {stored_http} records for {answered} answered "
            f"(+{unknown} unanswered) requests; websocket: {stored_ws} records for {frames} frames "
            f"({closed_only} answered only by a close)",
            _examples(missing),
        ),
        Check(
            "ledger_matches_client",
            "ledger agrees with what the client saw (status, x-gateway-attempts)",
            not mismatched,
            f"{len(mismatched)} disagreements",
            _examples(mismatched),
        ),
        Check(
            "attempts",
            "attempts consistent (ordinals, <= 1 succeeded, handoffs pre-visible, retry_count)",
            not inconsistent,
            f"{len(inconsistent)} inconsistent of {len(records)} records",
            _examples(inconsistent),
        ),
        Check(
            "circuits",
            "circuit rows obey the state machine",
            not circuit_bad,
            f"{len(circuits)} circuit rows, states {dict(Counter(c['state'] for c in circuits))}",
            _examples(circuit_bad),
        ),
        Check(
            "probes",
            "no probe slot held once no request is in flight",
            not probe_held,
            f"{len(probe_held)} circuits with a held probe",
            _examples(probe_held),
        ),
    ]
    summary = {
        "records": len(records),
        "attempts": sum(len(v) for v in attempts.values()),
        "handoffs": sum(r["retry_count"] for r in records),
        "requests_with_handoff": sum(1 for r in records if r["retry_count"]),
        "ledger_outcomes": dict(Counter(f"{r['status_code']} {r['outcome']}" for r in records).most_common()),
        "attempt_statuses": dict(Counter(a["status"] for rows in attempts.values() for a in rows)),
        "circuits": dict(Counter(c["state"] for c in circuits)),
    }
    return checks, summary


def _attempt_problems(record: dict, rows: list[dict]) -> str:
    if record["finished_at"] is None or record["status_code"] is None or not record["outcome"]:
        return "record not finished (finished_at/status/outcome empty)"
    if [a["ordinal"] for a in rows] != list(range(1, len(rows) + 1)):
        return f"ordinals {[a['ordinal'] for a in rows]}"
    statuses = [a["status"] for a in rows]
    if statuses.count("succeeded") > 1:
        return f"{statuses.count('succeeded')} succeeded attempts"
    if record["retry_count"] != statuses.count("retryable_failed"):
        return f"retry_count {record['retry_count']} != {statuses.count('retryable_failed')} retryable_failed"
    dispatched = [a for a in rows if a["status"] != "ineligible"]
    for n, a in enumerate(dispatched):
        last = n == len(dispatched) - 1
        if not last and a["status"] != "retryable_failed":
            return f"attempt {a['ordinal']} {a['status']} is followed by another dispatch"
        if a["status"] == "retryable_failed":
            if last:
                return f"attempt {a['ordinal']} retryable_failed but no handoff followed"
            if a["dispatch_state"] not in ("not_sent", "rejected"):
                return f"handoff after attempt {a['ordinal']} whose dispatch was {a['dispatch_state']}"
        if a["status"] == "succeeded" and a["dispatch_state"] != "completed":
            return f"succeeded attempt {a['ordinal']} with dispatch {a['dispatch_state']}"
    if record["outcome"] == "ok" and statuses.count("succeeded") != 1:
        return "outcome ok without a succeeded attempt"
    return ""


def process_checks(
    baseline: Inventory,
    drained: Inventory,
    after: Inventory,
    samples: list[Sample],
    args: argparse.Namespace,
    db_port: int | None,
) -> tuple[list[Check], dict]:
    warm = [s for s in samples if s.progress >= args.warmup]
    tail = [s for s in samples if s.progress >= 0.9]
    rss_warm = warm[0].rss_kb if warm else 0
    rss_end = max((s.rss_kb for s in tail), default=0)
    growth = (rss_end / rss_warm - 1) if rss_warm else math.nan
    threads_warm = max((s.threads for s in samples if s.progress <= args.warmup + 0.05), default=0)
    leftover_tcp = after.tcp_excluding(db_port)
    downstream = [s for s in drained.tcp if s.local_port == args.gateway_port and s.state != "LISTEN"]
    checks = [
        Check(
            "client_sockets",
            "client connections closed on the gateway side",
            not downstream,
            f"{len(downstream)} sockets still open to clients 1 s after the clients closed",
            _examples([f"{s}" for s in downstream]),
        ),
        Check(
            "sockets",
            "gateway sockets back to baseline once clients and upstreams are gone",
            after.non_db_sockets(db_port) <= baseline.non_db_sockets(db_port) and not leftover_tcp,
            f"non-database sockets: baseline {baseline.non_db_sockets(db_port)}, after "
            f"{after.non_db_sockets(db_port)} (TCP left: {len(leftover_tcp)}); fds {baseline.fds} -> "
            f"{after.fds}",
            _examples([f"{s}" for s in leftover_tcp]),
        ),
        Check(
            "threads",
            "no thread leak",
            after.threads <= threads_warm + 4,
            f"threads: baseline {baseline.threads}, after warm-up {threads_warm}, end {after.threads}",
        ),
        Check(
            "memory",
            f"memory flat after warm-up (RSS growth < {args.max_rss_growth:.0%})",
            bool(rss_warm) and growth < args.max_rss_growth,
            f"RSS {baseline.rss_kb / 1024:.0f} MiB at start, {rss_warm / 1024:.0f} MiB after warm-up, "
            f"{rss_end / 1024:.0f} MiB at the end ({growth:+.1%})",
        ),
    ]
    return checks, {
        "rss_mib": {"start": baseline.rss_kb / 1024, "warm": rss_warm / 1024, "end": rss_end / 1024},
        "rss_growth": growth,
        "threads": {"start": baseline.threads, "warm": threads_warm, "end": after.threads},
        "sockets": {"start": baseline.sockets, "drained": drained.sockets, "end": after.sockets},
        "fds": {"start": baseline.fds, "end": after.fds},
    }


# --- report ------------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1]


def summary_table(report: dict) -> str:
    lines = []
    run = report["run"]
    lines.append(
        f"soak: {run['requests_done']} requests ({run['by_transport']}) at concurrency "
        f"{run['concurrency']} in {run['load_seconds']:.1f} s "
        f"({run['requests_done'] / max(run['load_seconds'], 1e-9):.0f} req/s); "
        f"database {run['database']}; {run['websocket']}"
    )
    lines.append("")
    lines.append(f"{'outcome (status, code, transport)':<58}{'count':>8}")
    for key, count in report["outcomes"].items():
        lines.append(f"{key:<58}{count:>8}")
    ledger = report.get("ledger", {})
    lines.append("")
    lines.append(
        f"handoffs: {ledger.get('handoffs', '?')} in {ledger.get('requests_with_handoff', '?')} requests; "
        f"attempts {ledger.get('attempt_statuses', {})}; circuits at exit {ledger.get('circuits', {})}"
    )
    lines.append("")
    lines.append(f"{'latency (ms)':<16}{'n':>8}{'p50':>10}{'p99':>10}{'max':>10}")
    for transport, row in report["latency_ms"].items():
        lines.append(f"{transport:<16}{row['n']:>8}{row['p50']:>10.1f}{row['p99']:>10.1f}{row['max']:>10.1f}")
    proc = report.get("process", {})
    if proc:
        lines.append("")
        rss = proc["rss_mib"]
        lines.append(
            f"gateway RSS {rss['start']:.0f} -> {rss['warm']:.0f} (warm) -> {rss['end']:.0f} MiB; "
            f"threads {proc['threads']}; sockets {proc['sockets']}; fds {proc['fds']}; "
            f"SIGTERM exit {report['run']['exit_code']} in {report['run']['exit_seconds']:.1f} s"
        )
    lines.append("")
    for c in report["checks"]:
        lines.append(f"[{'PASS' if c['ok'] else 'FAIL'}] {c['id']}: {c['name']}: {c['detail']}")
        for e in c["examples"]:
            lines.append(f"         e.g. {e}")
    failed = sum(1 for c in report["checks"] if not c["ok"])
    lines.append("")
    lines.append("soak: all checks passed" if not failed else f"soak: {failed} check(s) FAILED")
    return "\n".join(lines)


# --- the run -----------------------------------------------------------------------------------


def websocket_route_present() -> bool:
    consumers, routing = ROOT / "proxy" / "consumers.py", ROOT / "proxy" / "routing.py"
    return consumers.exists() and "v1/responses" in routing.read_text()


async def websocket_handshake_ok(url: str, key: str) -> bool:
    try:
        async with aiohttp.ClientSession() as session:
            auth = {"authorization": f"Bearer {key}"}
            ws = await asyncio.wait_for(session.ws_connect(url, headers=auth), 5)
            await ws.close()
            return True
    except (aiohttp.ClientError, TimeoutError):
        return False


def start_upstreams(
    workdir: Path, args: argparse.Namespace, phase: str, ports: dict[str, int] | None = None
) -> tuple[subprocess.Popen, dict[str, int]]:
    ready = workdir / f"upstreams-{phase}.json"
    ready.unlink(missing_ok=True)
    cmd = [
        PYTHON,
        "-m",
        "devkit.chaos_upstream",
        "--names",
        ",".join(UPSTREAM_NAMES),
        "--seed",
        str(args.seed if phase == "load" else args.seed + 1),
        "--hang-s",
        str(args.hang_s),
        "--ready-file",
        str(ready),
        "--stats-file",
        str(workdir / f"upstream_stats-{phase}.json"),
    ]
    if ports:
        cmd += ["--ports", ",".join(str(ports[n]) for n in UPSTREAM_NAMES)]
    log_path = workdir / f"upstreams-{phase}.log"
    proc = spawn(cmd, dict(os.environ), log_path)
    deadline = time.monotonic() + 30
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(f"chaos upstreams did not start: {log_path.read_text()[-800:]}")
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())["ports"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--deadline-ms", type=int, default=3000, help="x-gateway-deadline-ms on every request")
    p.add_argument("--margin-s", type=float, default=2.5, help="allowed past the deadline")
    p.add_argument("--hang-s", type=float, default=8.0, help="how long a hanging upstream hangs")
    p.add_argument("--warmup", type=float, default=0.2, help="share of requests before memory is baselined")
    p.add_argument("--max-rss-growth", type=float, default=0.2)
    p.add_argument("--time-limit", type=float, help="seconds of load at most (480; with --nodes > 1: 1200)")
    p.add_argument("--exit-timeout", type=float, default=60, help="seconds the gateway gets to exit")
    p.add_argument("--drain-after", type=float, default=1.0, help="seconds into the drain burst for SIGTERM")
    p.add_argument(
        "--drain-db-stall",
        type=float,
        default=8.0,
        help="PostgreSQL: at most this many seconds the ledger table stays locked from SIGTERM to the exit",
    )
    p.add_argument("--no-websocket", action="store_true", help="HTTP and SSE only")
    p.add_argument(
        "--no-bench-record",
        action="store_true",
        help=f"do not write {BENCH_SOAK_MD.name} (a run of {FULL_RUN_REQUESTS}+ requests writes it)",
    )
    p.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="gateway nodes (more than one: the multi-node soak with node and database faults)",
    )
    p.add_argument(
        "--database",
        choices=("default", "postgres"),
        default="default",
        help="postgres: a PostgreSQL server of the soak's own (multi-node mode); default: SQLite, or "
        "a fresh database on the server of DATABASE_URL",
    )
    p.add_argument("--workers", type=int, default=2, help="multi-node: uvicorn workers per node")
    p.add_argument("--db-stall-s", type=float, default=5.0, help="multi-node: how long PostgreSQL is stopped")
    p.add_argument(
        "--budget-share",
        type=float,
        default=0.1,
        help="multi-node: share of requests sent with a budgeted key",
    )
    p.add_argument("--workdir", type=Path, help="default: soak/out/<timestamp>")
    p.add_argument("--json", type=Path, help="write the full report here")
    return p.parse_args(argv)


def main(args: argparse.Namespace) -> int:
    """The single-node run; soak/main.py chooses between it and soak/multinode.py."""
    started = time.monotonic()
    workdir = args.workdir or ROOT / "soak" / "out" / time.strftime("%Y%m%d-%H%M%S")
    workdir.mkdir(parents=True, exist_ok=True)
    key = f"sk-gw-soak-{secrets.token_hex(16)}"
    database = Database.create(workdir)
    log(f"workdir {workdir}; database {database.vendor} {database.name}")
    upstreams, ports = start_upstreams(workdir, args, "load")
    gateway = GatewayProcess(
        database, workdir, env_extra={UPSTREAM_KEY_ENV: f"sk-soak-upstream-{secrets.token_hex(8)}"}
    )
    try:
        gateway.prepare(chaos_config(ports, key))
        gateway.start()
        args.gateway_port = gateway.port
        log(f"gateway pid {gateway.pid} on {gateway.url}; upstreams {ports}")
        websocket, ws_note = websocket_mode(args, gateway.url, key)
        log(ws_note)
        baseline = inventory(gateway.pid)

        # 1. The load, with the gateway process watched.
        load = Load(args, gateway.url, key, websocket)
        samples: list[Sample] = []

        async def drive() -> list[Outcome]:
            stop_event = asyncio.Event()
            watcher = asyncio.create_task(monitor(gateway.pid, load, samples, stop_event))
            try:
                return await load.run()
            finally:
                stop_event.set()
                await watcher

        log(f"load: {args.requests} requests at concurrency {args.concurrency} ...")
        outcomes = asyncio.run(drive())
        load_seconds = time.monotonic() - load.started
        log(f"load done in {load_seconds:.1f} s")

        # 2. Leaks: the clients are gone (their session closed); then the upstreams too.
        time.sleep(1.0)
        drained = inventory(gateway.pid)
        stop(upstreams)
        time.sleep(1.5)
        after = inventory(gateway.pid)

        # 3. SIGTERM in the middle of a burst: in-flight requests finish, the process exits on its
        #    own, and its last ledger records (submitted during the graceful shutdown) are saved.
        upstreams, _ = start_upstreams(workdir, args, "drain", ports)
        log("drain: a burst of requests, SIGTERM to the gateway 1 s into it ...")
        drain_outcomes, exit_code, exit_seconds = asyncio.run(drain(args, gateway, database, key))
        log(f"gateway exited with {exit_code} {exit_seconds:.1f} s after SIGTERM")
        stop(upstreams)

        everything = outcomes + drain_outcomes
        checks = client_checks(outcomes, len(load.plan))
        checks += drain_checks(drain_outcomes, exit_code, exit_seconds, args)
        p_checks, p_summary = process_checks(baseline, drained, after, samples, args, database.port)
        checks += p_checks
        l_checks, l_summary = ledger_checks(database, everything)
        checks += l_checks
        log_text = gateway.log_path.read_text(errors="replace")
        tracebacks = len(re.findall(r"^Traceback|Exception in ASGI application", log_text, re.M))
        checks.append(
            Check(
                "log",
                "no unhandled exception in the gateway log",
                not tracebacks,
                f"{tracebacks} tracebacks in {gateway.log_path}",
                _examples(sorted(set(re.findall(r"^\w*(?:Error|Exception)\b.*$", log_text, re.M)))),
            )
        )
        report = {
            "run": {
                "requests_planned": len(load.plan),
                "requests_done": len(outcomes),
                "drain_requests": len(drain_outcomes),
                "by_transport": dict(Counter(o.transport for o in outcomes)),
                "concurrency": args.concurrency,
                "load_seconds": load_seconds,
                "database": database.vendor,
                "websocket": ws_note,
                "deadline_ms": args.deadline_ms,
                "seed": args.seed,
                "exit_code": exit_code,
                "exit_seconds": exit_seconds,
                "workdir": str(workdir),
            },
            "outcomes": dict(
                Counter(f"{o.status or '-'} {o.code} ({o.transport})" for o in outcomes).most_common()
            ),
            "latency_ms": latency_table(outcomes),
            "ledger": l_summary,
            "process": p_summary,
            "upstreams": {
                phase: _read_json(workdir / f"upstream_stats-{phase}.json") for phase in ("load", "drain")
            },
            "checks": [asdict(c) for c in checks],
        }
        report["run"]["total_seconds"] = time.monotonic() - started
    except BaseException:
        gateway.kill()
        stop(upstreams)
        raise
    finally:
        with contextlib.suppress(Exception):
            database.drop()
    text = summary_table(report)
    print(text, flush=True)
    (workdir / "summary.txt").write_text(text + "\n")
    if args.requests >= FULL_RUN_REQUESTS and not args.no_bench_record:
        # The multi-node section (soak/multinode.py) stays as its last run wrote it.
        current = BENCH_SOAK_MD.read_text() if BENCH_SOAK_MD.exists() else ""
        rest = current[current.find(MULTINODE_SECTION) :] if MULTINODE_SECTION in current else ""
        BENCH_SOAK_MD.write_text(bench_section(report) + ("\n" + rest if rest else ""))
        log(f"figures for bench/results.md: {BENCH_SOAK_MD}")
    report_path = args.json or workdir / "report.json"
    report_path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    log(f"report: {report_path}; total {time.monotonic() - started:.0f} s")
    return 0 if all(c["ok"] for c in report["checks"]) else 1


def websocket_mode(args: argparse.Namespace, url: str, key: str) -> tuple[bool, str]:
    if args.no_websocket:
        return False, "websocket: off (--no-websocket)"
    if not websocket_route_present():
        return False, "websocket: not exercised (no proxy/consumers.py with a /v1/responses route)"
    if not asyncio.run(websocket_handshake_ok(url.replace("http://", "ws://") + "/v1/responses", key)):
        return False, "websocket: not exercised (the /v1/responses websocket handshake was refused)"
    return True, "websocket: exercised"


async def drain(
    args: argparse.Namespace, gateway: GatewayProcess, database: Database, key: str
) -> tuple[list[Outcome], int | None, float]:
    """Requests at full concurrency; SIGTERM `--drain-after` seconds in; no new request after it.

    On PostgreSQL, from just before the SIGTERM until the process exits (at most `--drain-db-stall`
    seconds), another connection locks the ledger table against INSERTs: the records of the requests
    that finish during the graceful shutdown are then still queued in the writer when the server
    stops, and only a flush at exit saves them. (On SQLite a lock would stall the request path's own
    writes too, so there the drain relies on timing alone.)"""
    burst = argparse.Namespace(**{**vars(args), "requests": args.concurrency * 50, "seed": args.seed + 1})
    load = Load(burst, gateway.url, key, websocket=False, phase="drain")
    sigterm_at = 0.0

    async def trigger() -> None:
        nonlocal sigterm_at
        await asyncio.sleep(args.drain_after)
        stall = LedgerStall(database)
        if args.drain_db_stall > 0 and database.vendor == "postgresql":
            await asyncio.to_thread(stall.acquire)
        load.closed = True
        sigterm_at = time.monotonic()
        assert gateway.proc is not None
        gateway.proc.send_signal(signal.SIGTERM)
        while gateway.proc.poll() is None and time.monotonic() < sigterm_at + args.drain_db_stall:
            await asyncio.sleep(0.05)
        await asyncio.to_thread(stall.release)

    task = asyncio.create_task(trigger())
    outcomes = await load.run()
    await task
    code = await asyncio.to_thread(gateway.wait, args.exit_timeout - (time.monotonic() - sigterm_at))
    return outcomes, code, time.monotonic() - sigterm_at


def drain_checks(
    outcomes: list[Outcome], exit_code: int | None, exit_seconds: float, args: argparse.Namespace
) -> list[Check]:
    answered = [o for o in outcomes if o.status is not None]
    broken = [f"#{o.index} {o.kind} rid={o.request_id}: {p}" for o in answered for p in o.problems]
    refused = sum(1 for o in outcomes if o.status is None)
    return [
        Check(
            "drain_answers",
            "requests in flight at SIGTERM finish with a well-formed answer",
            bool(answered) and not broken,
            f"{len(answered)} answered during the drain ({refused} refused after SIGTERM, as expected)",
            _examples(broken),
        ),
        # uvicorn re-raises SIGTERM after its graceful shutdown, so "exited on its own" is -15 or 0.
        Check(
            "exit",
            "gateway exits on its own after SIGTERM within the grace period",
            exit_code in (0, -signal.SIGTERM),
            f"exit {exit_code} {exit_seconds:.1f} s after SIGTERM (limit {args.exit_timeout:.0f} s)",
        ),
    ]


FULL_RUN_REQUESTS = 20000  # what the issue asks of `make soak`; shorter runs leave the figures alone
BENCH_SOAK_MD = ROOT / "bench" / "soak.md"  # included in bench/results.md by bench/run.py
MULTINODE_SECTION = "## Soak across nodes"  # the heading soak/multinode.py writes its section under


def bench_section(report: dict) -> str:
    """The soak's figures for bench/results.md: throughput and latency under the fault mix."""
    run, ledger = report["run"], report.get("ledger", {})
    checks = report["checks"]
    passed = sum(1 for c in checks if c["ok"])
    rate = run["requests_done"] / max(run["load_seconds"], 1e-9)
    lines = [
        "## Soak under faults (`make soak`)",
        "",
        f"Last full run: {time.strftime('%Y-%m-%d', time.gmtime())}, written by `soak/run.py` "
        "(soak/README.md says what runs and what is checked); `make bench` does not rerun it.",
        f"{run['requests_done']} requests ({run['by_transport']}) at concurrency {run['concurrency']} "
        "against four upstreams that reject, rate-limit, fail with 503, hang, cut streams before and "
        f"after output and close websockets; database {run['database']}; {run['websocket']}.",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| throughput under the fault mix | {rate:.0f} req/s ({run['load_seconds']:.1f} s of load) |",
        f"| handoffs | {ledger.get('handoffs', '?')} in {ledger.get('requests_with_handoff', '?')} "
        "requests |",
    ]
    for transport, row in report["latency_ms"].items():
        lines.append(
            f"| latency {transport} (n={row['n']}) | p50 {row['p50']:.1f} ms, p99 {row['p99']:.1f} ms, "
            f"max {row['max']:.1f} ms |"
        )
    lines.append(f"| invariant checks | {passed} of {len(checks)} passed |")
    lines += [
        "",
        f"Every request carries `x-gateway-deadline-ms: {run['deadline_ms']}` and some "
        "upstreams hang past it, so the p99 latencies are those requests' typed answers at the "
        "deadline, not slow successes.",
    ]
    lines += ["", "| outcome (status, code, transport) | count |", "| --- | --- |"]
    lines += [f"| {key} | {count} |" for key, count in report["outcomes"].items()]
    return "\n".join(lines) + "\n"


def latency_table(outcomes: list[Outcome]) -> dict[str, dict[str, float]]:
    latency: dict[str, dict[str, float]] = {}
    for transport in ("http", "sse", "websocket"):
        values = [o.latency_s * 1000 for o in outcomes if o.transport == transport and o.code != "not_sent"]
        if values:
            latency[transport] = {
                "n": len(values),
                "p50": percentile(values, 50),
                "p99": percentile(values, 99),
                "max": max(values),
            }
    return latency


def chaos_config(ports: dict[str, int], key: str) -> dict:
    from devkit.gateway import gateway_config

    urls = {name: f"http://127.0.0.1:{port}/v1" for name, port in ports.items()}
    return gateway_config(urls, key=key, key_env=UPSTREAM_KEY_ENV, circuit=CIRCUIT, retry=RETRY)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


if __name__ == "__main__":
    sys.exit("soak: the entry point is soak/main.py (make soak)")
