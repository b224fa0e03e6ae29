"""Many fake provider accounts in one process, each enforcing its own rate limits: `make bench-pool`'s
upstreams (bench/pool/), and the fake its tests drive with the official SDKs.

Every account lives under its own path prefix, `http://127.0.0.1:PORT/<name>/v1` (an assignment's
`base_url`), and behaves as its own account: its own limits, prompt cache and outages.

- Shapes: an `openai` account serves `POST /chat/completions` and `POST /responses`; an `anthropic`
  account serves `POST /messages`. Plain JSON answers only (a `stream: true` request is a 400).
- Limits: requests and tokens per minute, each a token bucket refilled continuously over a minute
  (`Bucket`). An OpenAI request costs its input tokens plus its `max_tokens`/`max_output_tokens` (as
  OpenAI counts a request against TPM before it runs); an Anthropic request costs its uncached input
  tokens on the input-tokens limit (cache reads do not count, as Anthropic's ITPM) and its output on
  the output-tokens limit (a fifth of `tpm`). Every answer, 429s included, carries the real headers:
  OpenAI `x-ratelimit-limit|remaining|reset-requests|tokens` (resets as Go durations, `1s`, `6m0s`,
  `250ms`: time until the bucket is full again), Anthropic `anthropic-ratelimit-requests|tokens|
  input-tokens|output-tokens-limit|remaining|reset` (resets as RFC 3339 instants; `tokens` is the most
  restrictive of input and output) and `request-id`. Over a limit: 429 with `retry-after` (seconds
  until the request would fit) and the provider's body (OpenAI `rate_limit_exceeded`, type `requests`
  or `tokens`; Anthropic `rate_limit_error`).
- Prompt cache (`PrefixCache`): each account remembers, for `cache_ttl_s` (300 s, as the providers'
  caches), the digests of every message prefix it served (system prompt first, then message by
  message). A request whose longest remembered prefix holds at least 1024 tokens reports it as cached:
  `prompt_tokens_details.cached_tokens` (Chat), `input_tokens_details.cached_tokens` (Responses),
  `cache_read_input_tokens` (Messages, whose `input_tokens` then counts only the rest, and the part
  before the last message as `cache_creation_input_tokens`). Caching is automatic on both shapes.
  Tokens are counted as characters / 4 of each message's JSON.
- Outages (`Outage`), in seconds after the phase start (`POST /_pool/reset`): `unavailable` (503
  OpenAI `server_error`, 529 Anthropic `overloaded_error`), `unauthorized` (401 `invalid_api_key` /
  `authentication_error`) or `hang` (the request is read and never answered).
- Records: every request as (seconds since the phase start, account, conversation, turn, status,
  input tokens, cached tokens, headroom: the smallest share of a limit left that its headers reported,
  None for an answer without them): `GET /_pool/events`. `POST /_pool/reset` answers the Unix time of
  the phase start (`wall`), so a reader can put other clocks' instants on the phase's. A conversation
  is named by `[conv:ID]` at the start of its first message, its turn is its count of user messages.
- A request without `Authorization` or `x-api-key` gets 401 (a gateway that forgets the credential).

Usage: python -m devkit.pool_upstream --port 19200 --accounts accounts.json (a list of `AccountSpec`
fields; `outages` as [start_s, end_s or null, kind]).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import hashlib
import itertools
import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

Shape = Literal["openai", "anthropic"]
OutageKind = Literal["unavailable", "unauthorized", "hang"]
CACHE_TTL_S = 300.0
MIN_CACHED_TOKENS = 1024  # a shorter prefix is never reported cached (OpenAI's and Anthropic's minimum)
ANSWER = "Done: the change is applied and the tests pass. " * 5  # 60 tokens of answer
CONVERSATION = re.compile(r"\[conv:([\w-]+)\]")


def tokens_of(item: object) -> int:
    return len(json.dumps(item, separators=(",", ":"))) // 4


@dataclass(frozen=True)
class Outage:
    start_s: float
    end_s: float | None  # None: until the end of the run
    kind: OutageKind

    def covers(self, t: float) -> bool:
        return self.start_s <= t and (self.end_s is None or t < self.end_s)


@dataclass(frozen=True)
class AccountSpec:
    name: str
    shape: Shape
    rpm: int
    tpm: int
    outages: tuple[Outage, ...] = ()

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> AccountSpec:
        outages = tuple(
            Outage(float(s), None if e is None else float(e), k) for s, e, k in raw.get("outages", ())
        )
        return cls(raw["name"], raw["shape"], int(raw["rpm"]), int(raw["tpm"]), outages)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": self.shape,
            "rpm": self.rpm,
            "tpm": self.tpm,
            "outages": [[o.start_s, o.end_s, o.kind] for o in self.outages],
        }

    def outage(self, t: float) -> OutageKind | None:
        return next((o.kind for o in self.outages if o.covers(t)), None)


class Bucket:
    """`limit` per minute, refilled continuously; starts full."""

    def __init__(self, limit: int, now: float) -> None:
        self.limit = limit
        self.level = float(limit)
        self.at = now

    def _refill(self, now: float) -> None:
        self.level = min(self.limit, self.level + (now - self.at) * self.limit / 60)
        self.at = max(self.at, now)

    def remaining(self, now: float) -> int:
        self._refill(now)
        return max(int(self.level), 0)

    def take(self, amount: int, now: float) -> bool:
        """Take `amount` if it is there; False (nothing taken) when not."""
        self._refill(now)
        if self.level < amount:
            return False
        self.level -= amount
        return True

    def spend(self, amount: int, now: float) -> None:
        """Take `amount` whatever is left (output counted after the answer)."""
        self._refill(now)
        self.level -= amount

    def wait_s(self, amount: int, now: float) -> float:
        """Seconds until `amount` is there (an amount above the limit: until full)."""
        self._refill(now)
        return max(min(amount, self.limit) - self.level, 0) * 60 / self.limit

    def full_in_s(self, now: float) -> float:
        return self.wait_s(self.limit, now)


def go_duration(seconds: float) -> str:
    """OpenAI's reset format: `250ms`, `1s`, `12.5s`, `6m0s`."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, rest = divmod(round(seconds, 3), 60)
    secs = f"{rest:.3f}".rstrip("0").rstrip(".")
    return f"{int(minutes)}m{secs}s" if minutes else f"{secs}s"


class PrefixCache:
    """Digests of the message prefixes an account served, each kept `ttl_s` after its last use."""

    def __init__(self, ttl_s: float = CACHE_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._expiry: dict[str, float] = {}

    @staticmethod
    def prefixes(items: Iterable[object]) -> list[tuple[str, int]]:
        """(digest, tokens) of each prefix of `items`: the first item, the first two, ..."""
        digest = hashlib.sha256()
        total, found = 0, []
        for item in items:
            digest.update(json.dumps(item, sort_keys=True, separators=(",", ":")).encode())
            total += tokens_of(item)
            found.append((digest.copy().hexdigest(), total))
        return found

    def cached(self, prefixes: list[tuple[str, int]], now: float) -> int:
        """Tokens of the longest remembered prefix (0 under MIN_CACHED_TOKENS)."""
        hits = [tokens for key, tokens in prefixes if self._expiry.get(key, 0.0) > now]
        return max(hits, default=0) if max(hits, default=0) >= MIN_CACHED_TOKENS else 0

    def remember(self, prefixes: list[tuple[str, int]], now: float) -> None:
        if len(self._expiry) > 200_000:
            self._expiry = {key: at for key, at in self._expiry.items() if at > now}
        for key, _ in prefixes:
            self._expiry[key] = now + self.ttl_s


@dataclass(frozen=True)
class Usage:
    input_tokens: int  # every input token, cached ones included
    cached_tokens: int
    written_tokens: int  # Anthropic: the prefix before the last message, written to the cache
    output_tokens: int


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any] | None  # None: never answer (hang)
    headers: dict[str, str]
    usage: Usage | None = None


class Account:
    """One account's limits, cache and outages; pure (time comes in as `now`, seconds on the run's
    clock, and `wall`, the Unix time of that instant, for Anthropic's reset instants)."""

    def __init__(self, spec: AccountSpec, now: float) -> None:
        self.spec = spec
        self.requests = Bucket(spec.rpm, now)
        self.tokens = Bucket(spec.tpm, now)  # OpenAI: tokens; Anthropic: input tokens
        self.output = Bucket(max(spec.tpm // 5, 1), now)  # Anthropic only
        self.cache = PrefixCache()
        self._ids = itertools.count(1)

    def buckets(self) -> tuple[Bucket, ...]:
        """The limits its headers report."""
        if self.spec.shape == "openai":
            return self.requests, self.tokens
        return self.requests, self.tokens, self.output

    def headroom(self, now: float) -> float:
        """The smallest share of a limit left, as its headers say it."""
        return min(bucket.remaining(now) / bucket.limit for bucket in self.buckets())

    def headers(self, now: float, wall: float) -> dict[str, str]:
        if self.spec.shape == "openai":
            return {
                "x-ratelimit-limit-requests": str(self.requests.limit),
                "x-ratelimit-limit-tokens": str(self.tokens.limit),
                "x-ratelimit-remaining-requests": str(self.requests.remaining(now)),
                "x-ratelimit-remaining-tokens": str(self.tokens.remaining(now)),
                "x-ratelimit-reset-requests": go_duration(self.requests.full_in_s(now)),
                "x-ratelimit-reset-tokens": go_duration(self.tokens.full_in_s(now)),
            }
        tightest = min((self.tokens, self.output), key=lambda b: b.remaining(now) / b.limit)
        headers = {}
        for name, bucket in (
            ("requests", self.requests),
            ("tokens", tightest),
            ("input-tokens", self.tokens),
            ("output-tokens", self.output),
        ):
            reset = dt.datetime.fromtimestamp(math.ceil(wall + bucket.full_in_s(now)), dt.UTC)
            headers[f"anthropic-ratelimit-{name}-limit"] = str(bucket.limit)
            headers[f"anthropic-ratelimit-{name}-remaining"] = str(bucket.remaining(now))
            headers[f"anthropic-ratelimit-{name}-reset"] = reset.strftime("%Y-%m-%dT%H:%M:%SZ")
        return headers

    def answer(self, route: str, body: dict[str, Any], t: float, now: float, wall: float) -> Answer:
        """What this account answers to `body` on `route` (`chat`, `responses`, `messages`) at `t`
        seconds after the phase start."""
        outage = self.spec.outage(t)
        if outage == "hang":
            return Answer(0, None, {})
        request_id = f"req_{self.spec.name}_{next(self._ids)}"
        id_header = {"x-request-id" if self.spec.shape == "openai" else "request-id": request_id}
        if outage is not None:
            status, error = OUTAGE_ERRORS[self.spec.shape, outage]
            return Answer(status, envelope(self.spec.shape, error), id_header)
        if body.get("stream"):
            error = ("invalid_request_error", "this fake answers plain JSON only", None)
            return Answer(400, envelope(self.spec.shape, error), id_header)
        items = prompt_items(route, body)
        prefixes = self.cache.prefixes(items)
        input_tokens = prefixes[-1][1] if prefixes else 0
        cached = self.cache.cached(prefixes, now)
        max_output = int(body.get("max_tokens") or body.get("max_output_tokens") or 4096)
        over = self._over_limit(input_tokens, cached, max_output, now)
        if over is not None:
            bucket, needed = over
            retry = max(math.ceil(bucket.wait_s(needed, now)), 1)
            headers = {**id_header, **self.headers(now, wall), "retry-after": str(retry)}
            return Answer(429, self._rate_limit_body(bucket, needed, retry), headers)
        self.cache.remember(prefixes, now)
        written = max((prefixes[-2][1] if len(prefixes) > 1 else 0) - cached, 0)
        usage = Usage(input_tokens, cached, written, tokens_of(ANSWER))
        if self.spec.shape == "anthropic":
            self.output.spend(usage.output_tokens, now)
        payload = ANSWERS[route](request_id, str(body.get("model", "")), usage)
        return Answer(200, payload, {**id_header, **self.headers(now, wall)}, usage)

    def _over_limit(
        self, input_tokens: int, cached: int, max_output: int, now: float
    ) -> tuple[Bucket, int] | None:
        """The bucket this request does not fit in and what it needs, else None (and its cost taken).
        OpenAI counts the whole prompt and `max_tokens`; Anthropic's input limit the uncached input,
        its output limit the answer (spent after it)."""
        openai = self.spec.shape == "openai"
        needs = [
            (self.requests, 1),
            (self.tokens, input_tokens + max_output if openai else input_tokens - cached),
        ]
        if not openai:
            needs.append((self.output, 1))
        for bucket, amount in needs:
            if bucket.remaining(now) < amount:
                return bucket, amount
        for bucket, amount in needs[:2]:
            bucket.take(amount, now)
        return None

    def _rate_limit_body(self, bucket: Bucket, needed: int, retry_s: int) -> dict[str, Any]:
        if self.spec.shape == "openai":
            kind, unit = ("requests", "RPM") if bucket is self.requests else ("tokens", "TPM")
            used = bucket.limit - bucket.remaining(bucket.at)
            message = (
                f"Rate limit reached for {self.spec.name} in organization org-pool on {kind} per min "
                f"({unit}): Limit {bucket.limit}, Used {used}, Requested {needed}. "
                f"Please try again in {retry_s}s."
            )
            return {"error": {"message": message, "type": kind, "param": None, "code": "rate_limit_exceeded"}}
        what = {id(self.requests): "requests", id(self.tokens): "input tokens"}.get(
            id(bucket), "output tokens"
        )
        message = (
            f"This request would exceed the rate limit for your organization of {bucket.limit} {what} "
            "per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits."
        )
        return {"type": "error", "error": {"type": "rate_limit_error", "message": message}}


def envelope(shape: Shape, error: tuple[str, str, str | None]) -> dict[str, Any]:
    kind, message, code = error
    if shape == "openai":
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return {"type": "error", "error": {"type": kind, "message": message}}


OUTAGE_ERRORS: dict[tuple[Shape, OutageKind], tuple[int, tuple[str, str, str | None]]] = {
    ("openai", "unavailable"): (503, ("server_error", "The server is overloaded or not ready yet.", None)),
    ("anthropic", "unavailable"): (529, ("overloaded_error", "Overloaded", None)),
    ("openai", "unauthorized"): (
        401,
        ("invalid_request_error", "Incorrect API key provided: sk-pool****. ", "invalid_api_key"),
    ),
    ("anthropic", "unauthorized"): (401, ("authentication_error", "invalid x-api-key", None)),
}


def prompt_items(route: str, body: dict[str, Any]) -> list[object]:
    """The prompt as the provider caches it: the system prompt first, then each message."""
    if route == "chat":
        return list(body.get("messages") or [])
    if route == "responses":
        given = body.get("input") or []
        messages = [{"role": "user", "content": given}] if isinstance(given, str) else list(given)
        return ([{"instructions": body["instructions"]}] if body.get("instructions") else []) + messages
    return ([{"system": body["system"]}] if body.get("system") else []) + list(body.get("messages") or [])


def conversation_of(items: list[object]) -> tuple[str, int]:
    """(conversation id from `[conv:ID]` in the first message, else "", count of user messages)."""
    found = CONVERSATION.search(json.dumps(items[0])[:400]) if items else None
    turns = sum(1 for i in items if isinstance(i, dict) and i.get("role") == "user")
    return (found.group(1) if found else ""), turns


def _chat(request_id: str, model: str, usage: Usage) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": ANSWER, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.output_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
        },
        "system_fingerprint": None,
    }


def _responses(request_id: str, model: str, usage: Usage) -> dict[str, Any]:
    text = {"type": "output_text", "text": ANSWER, "annotations": []}
    message = {"type": "message", "id": f"msg_{request_id}", "status": "completed", "role": "assistant"}
    return {
        "id": f"resp_{request_id}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": model,
        "output": [{**message, "content": [text]}],
        "usage": {
            "input_tokens": usage.input_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.input_tokens + usage.output_tokens,
        },
    }


def _messages(request_id: str, model: str, usage: Usage) -> dict[str, Any]:
    return {
        "id": f"msg_{request_id}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": ANSWER}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage.input_tokens - usage.cached_tokens - usage.written_tokens,
            "cache_creation_input_tokens": usage.written_tokens,
            "cache_read_input_tokens": usage.cached_tokens,
            "output_tokens": usage.output_tokens,
        },
    }


ANSWERS: dict[str, Callable[[str, str, Usage], dict[str, Any]]] = {
    "chat": _chat,
    "responses": _responses,
    "messages": _messages,
}
ROUTES: dict[tuple[Shape, str], str] = {
    ("openai", "chat/completions"): "chat",
    ("openai", "responses"): "responses",
    ("anthropic", "messages"): "messages",
}


@dataclass
class Pool:
    """Every account of the process and the phase's records; `clock` is the run's (monotonic) clock."""

    specs: list[AccountSpec]
    clock: Callable[[], float] = time.monotonic
    t0: float = 0.0
    wall0: float = 0.0  # the Unix time at t0
    accounts: dict[str, Account] = field(default_factory=dict)
    events: list[tuple[float, str, str, int, int, int, int, float | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """A new phase: limits full, caches empty, records cleared, outage schedules from now."""
        self.t0, self.wall0 = self.clock(), time.time()
        self.accounts = {s.name: Account(s, self.t0) for s in self.specs}
        self.events = []

    def answer(self, name: str, path: str, body: dict[str, Any]) -> Answer:
        account = self.accounts[name]
        route = ROUTES.get((account.spec.shape, path))
        if route is None:
            return Answer(
                404, envelope(account.spec.shape, ("not_found_error", f"no route {path}", None)), {}
            )
        now = self.clock()
        t = now - self.t0
        answer = account.answer(route, body, t, now, time.time())
        conversation, turn = conversation_of(prompt_items(route, body))
        usage = answer.usage or Usage(0, 0, 0, 0)
        headroom = round(account.headroom(now), 4) if answer.status in (200, 429) else None
        self.events.append(
            (
                round(t, 3),
                name,
                conversation,
                turn,
                answer.status,
                usage.input_tokens,
                usage.cached_tokens,
                headroom,
            )
        )
        return answer


def make_app(pool: Pool) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        name, path = request.match_info["account"], request.match_info["path"]
        if name not in pool.accounts:
            return web.json_response(
                envelope("openai", ("invalid_request_error", "no such account", None)), status=404
            )
        shape = pool.accounts[name].spec.shape
        if not (request.headers.get("authorization") or request.headers.get("x-api-key")):
            return web.json_response(envelope(shape, OUTAGE_ERRORS[shape, "unauthorized"][1]), status=401)
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            error = ("invalid_request_error", "the body must be a JSON object", None)
            return web.json_response(envelope(shape, error), status=400)
        answer = pool.answer(name, path, body)
        if answer.body is None:
            await asyncio.Event().wait()  # hang: until the client gives up (the handler is cancelled)
        return web.json_response(answer.body, status=answer.status, headers=answer.headers)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})

    async def reset(request: web.Request) -> web.Response:
        pool.reset()
        return web.json_response({"accounts": len(pool.accounts), "wall": pool.wall0})

    async def events(request: web.Request) -> web.Response:
        return web.json_response({"accounts": [s.to_json() for s in pool.specs], "events": pool.events})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/_pool/reset", reset)
    app.router.add_get("/_pool/events", events)
    app.router.add_get("/{account}/v1/models", models)
    app.router.add_post("/{account}/v1/{path:.+}", handle)
    return app


class PoolServer:
    """The pool on 127.0.0.1 in a thread of its own (tests): `start()` returns its port."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    def start(self) -> int:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self.port

    async def _listen(self) -> None:
        self._runner = web.AppRunner(make_app(self.pool), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description="many rate-limited fake accounts on one port")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--accounts", required=True, help="JSON file: a list of AccountSpec fields")
    args = parser.parse_args()
    with open(args.accounts) as f:
        specs = [AccountSpec.from_json(raw) for raw in json.load(f)]
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(make_app(Pool(specs)), host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
