"""A fast OpenAI-compatible fake upstream for the benchmark (not the test fake).

Raw asyncio protocol + httptools, on uvloop when it is installed, so that the upstream costs a few
tens of microseconds per request and the benchmark measures the proxy in front of it, not this.

Routes:
- `POST /v1/chat/completions`: a fixed chat completion; with `"stream": true`, server-sent events
  (a role chunk, three content chunks, a finish chunk, a usage chunk when
  `stream_options.include_usage` is set, then `data: [DONE]`), each event written separately.
- `GET /v1/models`: the OpenAI list format.
- `POST /_bench/config` with `{"delay_ms": N}`: change the delay at run time, so the benchmark can
  switch to the "50 ms upstream" case without restarting the upstream (the proxy's pooled
  connections stay up).
- `GET /_bench/stats`: connections accepted and requests served so far (connection reuse check).

`--reject MODEL` (repeatable) answers that model with 404
`{"error": {"type": "invalid_request_error", "code": "model_not_found", "param": "model", ...}}`.
`--delay-ms` waits before the response headers (before the first event of a stream).
A request without `Authorization` or `x-api-key` gets 401, so a proxy that forgets the upstream
credential is noticed.

Usage: python bench/fast_upstream.py --port 19101 [--reject gpt-x] [--delay-ms 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import sys
import time

import httptools

CREATED = int(time.time())
REASONS = {
    200: b"OK",
    400: b"Bad Request",
    401: b"Unauthorized",
    404: b"Not Found",
    405: b"Method Not Allowed",
}
CONTENT_CHUNKS = ("Hello", " from the", " bench upstream.")


def _json(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _response(
    status: int, body: bytes, content_type: bytes = b"application/json", keep_alive: bool = True
) -> bytes:
    head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n" % (
        status,
        REASONS.get(status, b"Error"),
        content_type,
        len(body),
    )
    if not keep_alive:
        head += b"connection: close\r\n"
    return head + b"\r\n" + body


def _error(status: int, err_type: str, code: str | None, param: str | None, message: str) -> bytes:
    return _json({"error": {"type": err_type, "code": code, "param": param, "message": message}})


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Upstream:
    """What to answer; shared by every connection of the process."""

    def __init__(self, name: str, models: list[str], reject: set[str], delay_ms: float) -> None:
        self.name = name
        self.models = models
        self.reject = reject
        self.delay_s = delay_ms / 1000
        self.connections = 0  # accepted so far: a proxy that does not reuse connections shows here
        self.requests = 0
        self._cache: dict[tuple[str, bool, bool], list[bytes]] = {}

    def models_body(self) -> bytes:
        data = [
            {"id": m, "object": "model", "created": CREATED, "owned_by": self.name}
            for m in self.models
            if m not in self.reject
        ]
        return _json({"object": "list", "data": data})

    def chat(self, model: str, stream: bool, include_usage: bool) -> list[bytes]:
        """The response as a list of writes (one for JSON, one per event for SSE); cached per shape."""
        key = (model, stream, include_usage)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        rid = f"chatcmpl-{self.name}"
        usage = {"prompt_tokens": 24, "completion_tokens": 6, "total_tokens": 30}
        if not stream:
            body = _json(
                {
                    "id": rid,
                    "object": "chat.completion",
                    "created": CREATED,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "".join(CONTENT_CHUNKS)},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": usage,
                }
            )
            writes = [_response(200, body)]
        else:
            base = {"id": rid, "object": "chat.completion.chunk", "created": CREATED, "model": model}
            deltas: list[dict] = [{"role": "assistant", "content": ""}] + [
                {"content": c} for c in CONTENT_CHUNKS
            ]
            events = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
            events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            if include_usage:
                events.append({**base, "choices": [], "usage": usage})
            blocks = [b"data: " + _json(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]
            head = (
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            writes = [head + _chunk(blocks[0])] + [_chunk(b) for b in blocks[1:-1]]
            writes.append(_chunk(blocks[-1]) + b"0\r\n\r\n")
        self._cache[key] = writes
        return writes

    def handle(self, method: bytes, path: bytes, headers: dict[bytes, bytes], body: bytes) -> list[bytes]:
        path = path.split(b"?", 1)[0]
        if path == b"/_bench/stats" and method == b"GET":
            return [_response(200, _json({"connections": self.connections, "requests": self.requests}))]
        self.requests += 1
        if path == b"/_bench/config" and method == b"POST":
            try:
                self.delay_s = float(json.loads(body)["delay_ms"]) / 1000
            except (ValueError, KeyError, TypeError):
                return [_response(400, _error(400, "invalid_request_error", None, None, "need delay_ms"))]
            return [_response(200, _json({"delay_ms": self.delay_s * 1000}))]
        if b"authorization" not in headers and b"x-api-key" not in headers:
            return [_response(401, _error(401, "invalid_request_error", "invalid_api_key", None, "no key"))]
        if path == b"/v1/models":
            if method != b"GET":
                return [_response(405, _error(405, "invalid_request_error", None, None, "use GET"))]
            return [_response(200, self.models_body())]
        if path != b"/v1/chat/completions":
            return [_response(404, _error(404, "invalid_request_error", None, None, "unknown route"))]
        if method != b"POST":
            return [_response(405, _error(405, "invalid_request_error", None, None, "use POST"))]
        try:
            req = json.loads(body)
            model = req["model"]
            if not isinstance(model, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return [_response(400, _error(400, "invalid_request_error", None, "model", "bad request body"))]
        if model in self.reject or model not in self.models:
            msg = f"The model `{model}` does not exist or you do not have access to it."
            return [_response(404, _error(404, "invalid_request_error", "model_not_found", "model", msg))]
        stream = req.get("stream") is True
        opts = req.get("stream_options")
        include_usage = stream and isinstance(opts, dict) and opts.get("include_usage") is True
        return self.chat(model, stream, include_usage)


class HttpProtocol(asyncio.Protocol):
    """HTTP/1.1 with keep-alive; responses go out in request order (pipelining-safe)."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.tail: asyncio.Future | None = None  # the last queued delayed response

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.upstream.connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        if self.tail is not None:
            self.tail.cancel()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.write(_response(400, b"{}", keep_alive=False))
                self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = {}
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        keep_alive = self.parser.should_keep_alive()
        writes = self.upstream.handle(self.parser.get_method(), self.url, self.headers, b"".join(self.body))
        is_bench_control = self.url.startswith(b"/_bench/")
        delay = 0.0 if is_bench_control else self.upstream.delay_s
        if delay <= 0 and (self.tail is None or self.tail.done()):
            self._send(writes, keep_alive)
        else:
            self.tail = asyncio.ensure_future(self._send_later(self.tail, delay, writes, keep_alive))

    async def _send_later(
        self, previous: asyncio.Future | None, delay: float, writes: list[bytes], keep_alive: bool
    ) -> None:
        if previous is not None and not previous.done():
            await asyncio.shield(previous)
        if delay > 0:
            await asyncio.sleep(delay)
        self._send(writes, keep_alive)

    def _send(self, writes: list[bytes], keep_alive: bool) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        for w in writes:  # one write per SSE event: a proxy sees separate events, as from a real provider
            transport.write(w)
        if not keep_alive:
            transport.close()


async def serve(args: argparse.Namespace) -> None:
    upstream = Upstream(args.name, args.models.split(","), set(args.reject), args.delay_ms)
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    server = await loop.create_server(lambda: HttpProtocol(upstream), sock=sock, backlog=1024)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"fast_upstream {args.name} on http://{args.host}:{args.port}/v1", flush=True)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--name", default="fast")
    p.add_argument("--models", default="gpt-5,gpt-x", help="comma list of served model ids")
    p.add_argument("--reject", action="append", default=[], help="answer this model with 404 model_not_found")
    p.add_argument("--delay-ms", type=float, default=0.0, help="wait before answering")
    args = p.parse_args(argv)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # plain asyncio still works, only slower
        runner = asyncio.run
    runner(serve(args))


if __name__ == "__main__":
    sys.exit(main())
