"""The soak's load: the upstreams it runs against and the mix it sends, one client request checked as
it is answered (`Outcome`: well-formed, typed, no provider message, one upstream's text, one
terminal event), `Load` driving HTTP, SSE and websocket requests at a concurrency, and the gateway
process watched while it runs (`monitor`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from devkit import chaos_upstream
from devkit.procfs import inventory
from devkit.sse_reader import read_sse

ROOT = Path(__file__).resolve().parent.parent
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
