"""A fast OpenAI-compatible fake upstream for the benchmark (not the test fake).

Raw asyncio protocol + httptools, on uvloop when it is installed, so that the upstream costs a few
tens of microseconds per request and the benchmark measures the proxy in front of it, not this.

Routes:
- `POST /v1/chat/completions`: a fixed chat completion; with `"stream": true`, server-sent events
  (a role chunk, three content chunks, a finish chunk, a usage chunk when
  `stream_options.include_usage` is set, then `data: [DONE]`), each event written separately.
- `GET /v1/models`: the OpenAI list format.
- `GET /v1/responses` with a websocket upgrade: the Responses websocket mode (SPEC §6.3). Each
  `{"type": "response.create", "model": ...}` text frame is answered, in order, with the events of
  one response: `response.created`, `response.in_progress`, `response.output_item.added`,
  `response.content_part.added`, `ws_deltas` x `response.output_text.delta`,
  `response.output_text.done`, `response.content_part.done`, `response.output_item.done`,
  `response.completed`, one frame and one write each. With `ws_interval_ms` > 0 the upstream waits
  that long before each delta, as a model streaming tokens does; otherwise they go back to back.
  Every event carries `bench_sent_ns`, `time.monotonic_ns()` taken just before its frame is written
  (one clock for every process on this machine), so a client can tell how long the event took to
  reach it, directly or through a proxy. The connection stays open after a response, like a real
  provider's; pings and the closing handshake are answered by the `websockets` protocol (sans-I/O,
  no compression offered or accepted).
- `POST /_bench/config` with any of `{"delay_ms": N, "ws_deltas": N, "ws_interval_ms": N}`: change
  them at run time, so the benchmark can switch to the "50 ms upstream" case without restarting the
  upstream (the proxy's pooled connections stay up).
- `GET /_bench/stats`: connections accepted and requests served so far (connection reuse check), and
  websocket connections accepted so far and open now (`ws_connections`, `ws_open`: each idle client
  websocket of a proxy should hold exactly one).

`--reject MODEL` (repeatable) answers that model with 404
`{"error": {"type": "invalid_request_error", "code": "model_not_found", "param": "model", ...}}`.
`--delay-ms` waits before the response headers (before the first event of a stream; not used on
websockets). A request or websocket handshake without `Authorization` or `x-api-key` gets 401, so a
proxy that forgets the upstream credential is noticed.

Usage: python -m devkit.fast_upstream --port 19101 [--reject gpt-x] [--delay-ms 50]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import socket
import sys
import time
from collections import deque

import httptools
from websockets.frames import Opcode
from websockets.http11 import Request
from websockets.server import ServerProtocol

CREATED = int(time.time())
REASONS = {
    200: b"OK",
    400: b"Bad Request",
    401: b"Unauthorized",
    404: b"Not Found",
    405: b"Method Not Allowed",
}
CONTENT_CHUNKS = ("Hello", " from the", " bench upstream.")
WS_PATH = "/v1/responses"
WS_MAX_FRAME_BYTES = 1 << 20


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
        self.ws_deltas = len(CONTENT_CHUNKS)
        self.ws_interval_s = 0.0
        self.ws_connections = 0  # websocket connections accepted so far
        self.ws_open = 0  # and open now
        self._response_ids = itertools.count(1)
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

    def configure(self, body: bytes) -> bytes:
        known = {"delay_ms", "ws_deltas", "ws_interval_ms"}
        try:
            req = json.loads(body)
            if not isinstance(req, dict) or not req or not set(req) <= known:
                raise ValueError
            delay_s = float(req.get("delay_ms", self.delay_s * 1000)) / 1000
            deltas = int(req.get("ws_deltas", self.ws_deltas))
            interval_s = float(req.get("ws_interval_ms", self.ws_interval_s * 1000)) / 1000
            if delay_s < 0 or deltas < 1 or interval_s < 0:
                raise ValueError
        except (ValueError, TypeError):
            msg = f"need a JSON object with some of {sorted(known)}"
            return _response(400, _error(400, "invalid_request_error", None, None, msg))
        self.delay_s, self.ws_deltas, self.ws_interval_s = delay_s, deltas, interval_s
        current = {"delay_ms": delay_s * 1000, "ws_deltas": deltas, "ws_interval_ms": interval_s * 1000}
        return _response(200, _json(current))

    def ws_events(self, model: str) -> tuple[list[bytes], list[bytes], list[bytes]]:
        """One response in the Responses websocket mode, as (lead, deltas, tail) lists of event
        prefixes; each is completed with its send time (`ws_frame`)."""
        rid = f"resp_{self.name}_{next(self._response_ids)}"
        mid = f"msg_{self.name}_{rid}"
        words = [f" word{i}" for i in range(self.ws_deltas)]
        text = "".join(words)
        usage = {"input_tokens": 24, "output_tokens": len(words), "total_tokens": 24 + len(words)}

        def response(status: str, output: list, with_usage: bool = False) -> dict:
            return {
                "id": rid,
                "object": "response",
                "created_at": CREATED,
                "status": status,
                "model": model,
                "output": output,
                "usage": usage if with_usage else None,
            }

        def message(status: str, content: list) -> dict:
            return {"id": mid, "type": "message", "status": status, "role": "assistant", "content": content}

        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        empty = {**part, "text": ""}
        at = {"item_id": mid, "output_index": 0, "content_index": 0}
        seq = itertools.count()

        def event(kind: str, **fields: object) -> bytes:
            body = _json({"type": kind, "sequence_number": next(seq), **fields})
            return body[:-1] + b',"bench_sent_ns":'

        lead = [
            event("response.created", response=response("in_progress", [])),
            event("response.in_progress", response=response("in_progress", [])),
            event("response.output_item.added", output_index=0, item=message("in_progress", [])),
            event("response.content_part.added", **at, part=empty),
        ]
        deltas = [event("response.output_text.delta", **at, delta=w, logprobs=[]) for w in words]
        done = message("completed", [part])
        tail = [
            event("response.output_text.done", **at, text=text, logprobs=[]),
            event("response.content_part.done", **at, part=part),
            event("response.output_item.done", output_index=0, item=done),
            event("response.completed", response=response("completed", [done], with_usage=True)),
        ]
        return lead, deltas, tail

    def handle(self, method: bytes, path: bytes, headers: dict[bytes, bytes], body: bytes) -> list[bytes]:
        path = path.split(b"?", 1)[0]
        if path == b"/_bench/stats" and method == b"GET":
            stats = {
                "connections": self.connections,
                "requests": self.requests,
                "ws_connections": self.ws_connections,
                "ws_open": self.ws_open,
            }
            return [_response(200, _json(stats))]
        self.requests += 1
        if path == b"/_bench/config" and method == b"POST":
            return [self.configure(body)]
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
        except httptools.HttpParserUpgrade as upgrade:
            self._upgrade(data[upgrade.args[0] :])
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.write(_response(400, b"{}", keep_alive=False))
                self.transport.close()

    def _upgrade(self, rest: bytes) -> None:
        """Hand the connection to the websocket protocol, replaying the handshake it has to see."""
        transport = self.transport
        if transport is None:
            return
        head = [b"GET ", self.url, b" HTTP/1.1\r\n"]
        for name, value in self.headers.items():
            head += [name, b": ", value, b"\r\n"]
        head.append(b"\r\n")
        ws = WebsocketProtocol(self.upstream, transport)
        self.transport = None
        transport.set_protocol(ws)
        ws.data_received(b"".join(head) + rest)

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
        if self.parser.should_upgrade():
            return  # a websocket handshake: `data_received` hands the connection over
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


class WebsocketProtocol(asyncio.Protocol):
    """An upgraded connection: the Responses websocket mode, one response at a time, in order."""

    def __init__(self, upstream: Upstream, transport: asyncio.Transport) -> None:
        self.upstream = upstream
        self.transport: asyncio.Transport | None = transport
        self.conn = ServerProtocol(max_size=WS_MAX_FRAME_BYTES)  # no extensions: no compression
        self.frames: deque[bytes] = deque()
        self.worker: asyncio.Task | None = None
        self.counted = False

    def data_received(self, data: bytes) -> None:
        self.conn.receive_data(data)
        for event in self.conn.events_received():
            if isinstance(event, Request):
                self._handshake(event)
            elif event.opcode is Opcode.TEXT:  # pings and closes are answered by the protocol itself
                self.frames.append(event.data)
                if self.worker is None:
                    self.worker = asyncio.ensure_future(self._answer())
        self._flush()

    def eof_received(self) -> bool | None:
        self.conn.receive_eof()
        self._flush()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.counted:
            self.upstream.ws_open -= 1
            self.counted = False
        if self.worker is not None:
            self.worker.cancel()
        self.transport = None

    def _handshake(self, request: Request) -> None:
        if request.path.split("?", 1)[0] != WS_PATH:
            response = self.conn.reject(404, "unknown route\n")
        elif "authorization" not in request.headers and "x-api-key" not in request.headers:
            response = self.conn.reject(401, "no key\n")
        else:
            response = self.conn.accept(request)
        self.conn.send_response(response)
        if response.status_code == 101:
            self.upstream.ws_connections += 1
            self.upstream.ws_open += 1
            self.counted = True

    def _flush(self) -> None:
        transport = self.transport
        if transport is None:
            return
        for data in self.conn.data_to_send():
            if data:
                transport.write(data)
            else:  # the protocol's end of stream: its closing handshake is done
                transport.close()
                return

    def _send(self, prefix: bytes) -> bool:
        """Write one event, stamped now; False once the connection is gone."""
        if self.transport is None or self.transport.is_closing():
            return False
        self.conn.send_text(b"%s%d}" % (prefix, time.monotonic_ns()))
        self._flush()
        return True

    async def _answer(self) -> None:
        upstream = self.upstream
        try:
            while self.frames:
                frame = self.frames.popleft()
                upstream.requests += 1
                try:
                    req = json.loads(frame)
                    model = req["model"]
                    if req.get("type") != "response.create" or not isinstance(model, str):
                        raise TypeError
                except (ValueError, KeyError, TypeError):
                    self._error(400, None, "model", "bad response.create frame")
                    continue
                if model in upstream.reject or model not in upstream.models:
                    msg = f"The model `{model}` does not exist or you do not have access to it."
                    self._error(404, "model_not_found", "model", msg)
                    continue
                lead, deltas, tail = upstream.ws_events(model)
                interval = upstream.ws_interval_s
                for prefix in lead:
                    self._send(prefix)
                for prefix in deltas:
                    if interval > 0:
                        await asyncio.sleep(interval)
                    self._send(prefix)
                for prefix in tail:
                    if not self._send(prefix):
                        return
        finally:
            self.worker = None

    def _error(self, status: int, code: str | None, param: str | None, message: str) -> None:
        error = {"type": "invalid_request_error", "code": code, "param": param, "message": message}
        self._send(_json({"type": "error", "status": status, "error": error})[:-1] + b',"bench_sent_ns":')


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
