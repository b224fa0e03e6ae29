"""A fake OpenAI and Anthropic provider on a real loopback socket, for end-to-end tests of the gateway.

Contract:
- `FakeUpstream` speaks the wire formats the gateway relays (devkit.wire): OpenAI Chat Completions and
  Responses (JSON, SSE, and Responses websocket mode at `/v1/responses`), `/v1/responses/compact`,
  `/v1/models`, `/v1/embeddings`, OpenAI's Files API (devkit.files_api), and Anthropic `/v1/messages`
  (JSON, SSE) and `/v1/messages/count_tokens`. `"stream": true` in the body selects SSE. OpenAI routes
  answer errors in the OpenAI envelope, Anthropic routes in the Anthropic one.
- It is a devkit.server.FakeServer: a thread of its own, `start()`/`stop()`, and behaviour scripted per
  model (devkit.behaviours): `script(model, b1, b2, ...)` gives b1 to the first request for that model,
  b2 to the second, and repeats the last one. A model in `models` that is not scripted is served; any
  other model gets the provider's real "model not found" error.
- Every request (every `response.create` frame on a websocket) is recorded in `hits` before the key
  check and the behaviour apply, so tests can see what the gateway sent even when it was rejected.
- Like ordinary servers, it compresses what it answers over HTTP (JSON, errors and SSE, each event
  flushed) whenever the request's `Accept-Encoding` offers gzip or deflate (`compression` picks which
  it prefers, or "identity" to never compress). `answer_digests` are the SHA-256 of the plain bodies
  it answered, before compression.
- `answer_headers` (empty unless a test sets it) are added to every answer: JSON, errors, SSE and the
  websocket handshake, as a provider sends its rate-limit headers (`x-ratelimit-*`,
  `anthropic-ratelimit-*`) with each.
- Like OpenAI, it stores the Responses it served: a `previous_response_id` it never created gets
  400 `previous_response_not_found` (another account's response is unknown to this one).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, cast

from aiohttp import WSMsgType, web
from aiohttp.web import ContentCoding

from devkit import tool_steps
from devkit.behaviours import (
    BAD_KEY,
    MID_STREAM_FAILURE,
    MODEL_NOT_FOUND,
    ApiError,
    Behaviour,
    CloseWebsocket,
    Drip,
    FailAfterVisible,
    FailBeforeVisible,
    Hang,
    JsonObject,
    RawError,
    Refusal,
    Reject,
    Serve,
    error_envelope,
    no_such_file,
    openai_error,
    serve,
)
from devkit.files_api import FilesApi
from devkit.server import drop, openai_failure
from devkit.wire import (
    Api,
    Call,
    Chat,
    Compact,
    CountTokens,
    Embeddings,
    Messages,
    ModelList,
    Responses,
    StreamingApi,
    reply_for,
    sse_bytes,
    stream_plan,
)

_BAD_JSON = ApiError("invalid_request_error", "We could not parse the JSON body of your request.")
_MISSING_MODEL = ApiError("invalid_request_error", "You must provide a model parameter.", None, "model")
_NOT_A_WEBSOCKET = ApiError("invalid_request_error", "Expected a websocket upgrade.")
_BAD_FRAME = ApiError("invalid_request_error", "Expected a response.create JSON text frame.", None, "type")


def _previous_not_found(previous: str) -> ApiError:
    return ApiError(
        "invalid_request_error",
        f"Previous response with id '{previous}' not found.",
        "previous_response_not_found",
        "previous_response_id",
    )


@dataclass(frozen=True)
class _Route:
    make: type[Api]
    anthropic: bool = False  # errors in the Anthropic envelope
    streams: bool = False


_ROUTES = {
    "/v1/chat/completions": _Route(Chat, streams=True),
    "/v1/responses": _Route(Responses, streams=True),
    "/v1/responses/compact": _Route(Compact),
    "/v1/messages": _Route(Messages, anthropic=True, streams=True),
    "/v1/messages/count_tokens": _Route(CountTokens, anthropic=True),
    "/v1/embeddings": _Route(Embeddings),
}


_TOOL_STEPS: dict[type[Api], tool_steps.Decide] = {
    Chat: tool_steps.chat,
    Responses: tool_steps.responses,
    Messages: tool_steps.messages,
}


def _parse_object(raw: bytes | str) -> JsonObject | None:
    try:
        parsed = json.loads(raw)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _model_of(body: JsonObject | None) -> str | None:
    model = body.get("model") if body is not None else None
    return model if isinstance(model, str) else None


def _delay_of(behaviour: Behaviour) -> float:
    return behaviour.delay_s if isinstance(behaviour, Serve) else 0.0


_Fail = Callable[[int, ApiError], web.StreamResponse]


class FakeUpstream(FilesApi):
    """A scriptable fake provider listening on 127.0.0.1 (see the module docstring for the contract)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._responses: set[str] = set()  # the Responses it served (and so stores), by id
        self.answer_headers: dict[str, str] = {}
        self.tool_steps = 0  # tool steps a turn takes on Chat, Responses and Messages (devkit.tool_steps)

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/responses"

    def _add_routes(self, app: web.Application) -> None:
        """The provider's paths; a fake of another provider (devkit.azure, devkit.bedrock...) overrides."""
        for path, route in _ROUTES.items():
            app.router.add_post(path, self._http_handler(route))
        app.router.add_get("/v1/responses", self._handle_websocket)
        app.router.add_get("/v1/models", self._handle_models)
        self._add_file_routes(app)

    def _unknown_previous(self, body: JsonObject) -> str | None:
        """The body's `previous_response_id` when this account never created it."""
        previous = body.get("previous_response_id")
        if not isinstance(previous, str):
            return None
        with self._lock:
            return None if previous in self._responses else previous

    def _stores(self, api: object, behaviour: Behaviour) -> None:
        if isinstance(api, Responses) and isinstance(behaviour, Serve | Refusal | FailAfterVisible):
            with self._lock:
                self._responses.add(api.id)

    # -- HTTP -----------------------------------------------------------------------------------------

    def _http_handler(
        self, route: _Route, model_in_path: Callable[[web.Request], str] | None = None
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """`model_in_path`: the model named by the URL rather than the body (an Azure deployment)."""

        def fail(status: int, err: ApiError) -> web.Response:
            return web.json_response(error_envelope(status, err, anthropic=route.anthropic), status=status)

        async def handle(request: web.Request) -> web.StreamResponse:
            body = _parse_object(await request.read())
            model = model_in_path(request) if model_in_path is not None else _model_of(body)
            stream = route.streams and body is not None and body.get("stream") is True
            self._record(request, model, body, "sse" if stream else "http")
            if not self._authorized(request):
                return fail(401, BAD_KEY)
            if body is None:
                return fail(400, _BAD_JSON)
            if model is None:
                return fail(400, _MISSING_MODEL)
            unknown = self._unknown_previous(body) if route.make is Responses else None
            if unknown is not None:
                return fail(400, _previous_not_found(unknown))
            missing = self._missing_file(body)
            if missing is not None:
                return fail(404, no_such_file(missing))
            behaviour = self._behaviour_for(model)
            behaviour, calls = self._tool_step(_TOOL_STEPS.get(route.make), body, behaviour)
            api = route.make(Call(model, body, calls))
            self._stores(api, behaviour)
            if stream:
                return await self._respond_stream(request, cast(StreamingApi, api), behaviour, fail)
            return await self._respond_json(request, api, behaviour, fail)

        async def compressed(request: web.Request) -> web.StreamResponse:
            response = await handle(request)
            if not response.prepared:  # a stream's went with its head
                response.headers.update(self.answer_headers)
            return self._finish(request, response)

        return compressed

    def _tool_step(
        self, decide: tool_steps.Decide | None, body: JsonObject, behaviour: Behaviour
    ) -> tuple[Behaviour, tuple[tuple[str, JsonObject], ...]]:
        """The behaviour and the tool calls of this answer when the fake takes tool steps (`decide`: the
        wire's rule, devkit.tool_steps; None: its API takes no tools here)."""
        step = decide(body, self.tool_steps) if decide is not None and isinstance(behaviour, Serve) else None
        if step is None:
            return behaviour, ()
        return (replace(behaviour, text=step.text) if step.text is not None else behaviour), step.calls

    async def _handle_models(self, request: web.Request) -> web.StreamResponse:
        self._record(request, None, None, "http")
        if not self._authorized(request):
            return openai_failure(401, BAD_KEY)
        api = ModelList(self.models, owned_by=self.name)
        return await self._respond_json(request, api, self.models_behaviour or serve(), openai_failure)

    async def _respond_json(
        self, request: web.Request, api: Api, behaviour: Behaviour, fail: _Fail
    ) -> web.StreamResponse:
        match behaviour:
            case Serve() | Refusal():
                delay = _delay_of(behaviour)
                if delay and await self._pause(delay):
                    return drop(request)
                return web.json_response(api.json_body(reply_for(behaviour, self.name)))
            case Reject(status=status, error=err, delay_s=delay):
                if delay and await self._pause(delay):
                    return drop(request)
                return fail(status, err)
            case Drip(interval_s=interval):
                raw = json.dumps(api.json_body(reply_for(serve(), self.name))).encode()
                return await self._drip(request, raw, interval, "application/json")
            case RawError(status=status, body=body, headers=headers):
                return web.json_response(dict(body), status=status, headers=dict(headers))
            case FailBeforeVisible(terminal="overloaded"):
                return fail(529, MID_STREAM_FAILURE)
            case FailBeforeVisible():
                # Without a stream, a failure before any output is simply the error response.
                return fail(404, MODEL_NOT_FOUND)
            case Hang(seconds=seconds):
                await self._pause(seconds)
                return drop(request)
            case _:  # FailAfterVisible, CutStream, CloseWebsocket: the connection dies mid-response
                return drop(request)

    async def _respond_stream(
        self, request: web.Request, api: StreamingApi, behaviour: Behaviour, fail: _Fail
    ) -> web.StreamResponse:
        match behaviour:
            case Reject() | RawError():
                return await self._respond_json(request, api, behaviour, fail)
            case Hang(seconds=seconds):
                await self._pause(seconds)
                return drop(request)
            case CloseWebsocket():
                return drop(request)
            case Drip(interval_s=interval):
                raw = b"".join(sse_bytes(e) for e in api.events(reply_for(serve(), self.name)))
                return await self._drip(request, raw, interval, "text/event-stream")
        events, cut = stream_plan(api, behaviour, self.name)
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **self.answer_headers}
        coding = self._coding(request)
        encode: Callable[[bytes], bytes] = lambda data: data  # noqa: E731
        if coding is not None:
            # Each event compressed and flushed at once (as servers that compress streams do), so
            # the stream stays live; aiohttp's own compression would hold events back until the end.
            compressor = zlib.compressobj(wbits=31 if coding is ContentCoding.gzip else 15)
            headers["Content-Encoding"] = coding.value

            def encode(data: bytes) -> bytes:
                return compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)

        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        delay = _delay_of(behaviour)
        try:
            for event in events:
                if delay and await self._pause(delay):
                    return drop(request)
                await response.write(encode(sse_bytes(event)))
        except ConnectionError:
            return response  # the client went away; aiohttp then ends the connection quietly
        if cut:
            return drop(request)
        if isinstance(behaviour, Serve) and behaviour.linger_s and await self._pause(behaviour.linger_s):
            return drop(request)  # the fake is stopping
        if coding is not None:
            await response.write(compressor.flush())
        await response.write_eof()
        return response

    async def _drip(
        self, request: web.Request, raw: bytes, interval: float, content_type: str
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": content_type, "Content-Length": str(len(raw))})
        await response.prepare(request)
        try:
            for n in range(len(raw)):
                await response.write(raw[n : n + 1])
                if await self._pause(interval):
                    return drop(request)
        except ConnectionError:
            return response
        await response.write_eof()
        return response

    # -- websocket ------------------------------------------------------------------------------------

    async def _handle_websocket(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(timeout=1.0)  # bounds the wait for the peer's close frame
        if not ws.can_prepare(request).ok:
            self._record(request, None, None, "http")
            return openai_failure(400, _NOT_A_WEBSOCKET)
        if not self._authorized(request):
            # The only websocket hit without a frame: it lets a test see the key that was refused.
            self._record(request, None, None, "websocket")
            return openai_failure(401, BAD_KEY)
        ws.headers.update(self.answer_headers)  # the handshake's answer
        await ws.prepare(request)
        running = self._require_running()
        running.websockets.add(ws)
        with self._lock:
            self._ws_connections += 1
        try:
            async for message in ws:
                if message.type != WSMsgType.TEXT or not await self._answer_frame(request, ws, message.data):
                    break
        except ConnectionError:
            pass  # the client went away mid-answer
        finally:
            running.websockets.discard(ws)
        return ws

    async def _answer_frame(self, request: web.Request, ws: web.WebSocketResponse, frame: str) -> bool:
        """Answer one `response.create` frame; False once the connection is closed or dropped."""
        body = _parse_object(frame)
        model = _model_of(body)
        self._record(request, model, body, "websocket")
        if body is None or body.get("type") != "response.create":
            await ws.send_json(_ws_error(400, {"error": openai_error(_BAD_FRAME)}))
            return True
        if model is None:
            await ws.send_json(_ws_error(400, {"error": openai_error(_MISSING_MODEL)}))
            return True
        unknown = self._unknown_previous(body)
        if unknown is not None:
            await ws.send_json(_ws_error(400, {"error": openai_error(_previous_not_found(unknown))}))
            return True
        missing = self._missing_file(body)
        if missing is not None:
            await ws.send_json(_ws_error(404, {"error": openai_error(no_such_file(missing))}))
            return True
        behaviour = self._behaviour_for(model)
        match behaviour:
            case Reject(status=status, error=err):
                await ws.send_json(_ws_error(status, {"error": openai_error(err)}))
                return True
            case RawError(status=status, body=raw):
                await ws.send_json(_ws_error(status, raw))
                return True
            case Hang(seconds=seconds):
                await self._pause(seconds)
                drop(request)
                return False
            case CloseWebsocket(code=code):
                await ws.close(code=code)
                return False
        api = Responses(Call(model, body))
        self._stores(api, behaviour)
        events, cut = stream_plan(api, behaviour, self.name)
        delay = _delay_of(behaviour)
        for event in events:
            if delay and await self._pause(delay):
                drop(request)
                return False
            await ws.send_json(event.data)
        if cut:
            drop(request)
            return False
        return True


def _ws_error(status: int, body: Mapping[str, Any]) -> JsonObject:
    """A rejection in Responses websocket mode: an `error` event carrying the HTTP status it stands for."""
    return {"type": "error", "status": status, **body}
