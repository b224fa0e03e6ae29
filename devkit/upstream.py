"""A fake LLM provider on a real loopback socket, for end-to-end tests of the gateway.

Contract:
- `FakeUpstream` speaks the wire formats the gateway relays: OpenAI Chat Completions and Responses
  (JSON, SSE, and Responses websocket mode at `/v1/responses`), `/v1/responses/compact`, `/v1/models`,
  `/v1/embeddings`, and Anthropic `/v1/messages` (JSON, SSE) and `/v1/messages/count_tokens`.
  `"stream": true` in the body selects SSE. OpenAI routes answer errors in the OpenAI envelope,
  Anthropic routes in the Anthropic one.
- It runs an aiohttp server on 127.0.0.1 in its own thread and event loop, so sync tests and async tests
  (which own their loop) can both drive it. `start()` returns once the port listens; `stop()` wakes
  hanging handlers, closes every connection and joins the thread.
- Behaviour is scripted per model: `script(model, b1, b2, ...)` gives b1 to the first request for that
  model, b2 to the second, and repeats the last one. A model in `models` that is not scripted is
  served; any other model gets the provider's real "model not found" error.
- Every request (every `response.create` frame on a websocket) is recorded in `hits` before the key
  check and the behaviour apply, so tests can see what the gateway sent even when it was rejected.
- Like ordinary servers, it compresses what it answers over HTTP (JSON, errors and SSE, each event
  flushed) whenever the request's `Accept-Encoding` offers gzip or deflate (`compression` picks which
  it prefers, or "identity" to never compress). `answer_digests` are the SHA-256 of the plain bodies
  it answered, before compression.
- OpenAI's Files API (`POST /v1/files` multipart with `purpose` and `file`, `GET /v1/files/{id}`,
  `GET /v1/files/{id}/content`, `DELETE /v1/files/{id}`): the upload is parsed as a stream and kept on
  disk (never whole in memory), answered with a file object; an id this account does not hold gets
  OpenAI's 404 (`invalid_request_error`, param `id`), and so does a request that references a
  `file-...` id it does not hold. `script_files(...)` scripts these requests
  (an upload's body is read before a scripted rejection, as a server does).
- Like OpenAI, it stores the Responses it served: a `previous_response_id` it never created gets
  400 `previous_response_not_found` (another account's response is unknown to this one).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import shutil
import struct
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol, Self, cast

from aiohttp import BodyPartReader, WSCloseCode, WSMsgType, hdrs, web
from aiohttp.web import ContentCoding

Transport = Literal["http", "sse", "websocket"]
JsonObject = dict[str, Any]

# ---------------------------------------------------------------------------------------------------
# Behaviours: what the fake does with one request.


@dataclass(frozen=True)
class Behaviour:
    """Base of every behaviour; build them with the factory functions below."""


@dataclass(frozen=True)
class Serve(Behaviour):
    """A successful answer; on streams, one visible delta per word of `text`."""

    text: str | None = None  # None: "hello from <fake name>"
    input_tokens: int = 10
    output_tokens: int | None = None  # None: the number of streamed deltas
    delay_s: float = 0.0  # pause before each stream event, or before a JSON body


@dataclass(frozen=True)
class ApiError:
    """The canonical fields of a provider error; rendered in each route's own envelope."""

    type: str
    message: str
    code: str | None = None
    param: str | None = None


@dataclass(frozen=True)
class Reject(Behaviour):
    """An HTTP error before any output (a websocket `error` event with this status)."""

    status: int
    error: ApiError
    delay_s: float = 0.0  # a slow failure: the error comes after this pause


@dataclass(frozen=True)
class Drip(Behaviour):
    """A 200 whose bytes trickle in, `interval_s` apart, one byte at a time: a plain JSON body (with
    its full content-length) or an SSE stream whose leading bytes never complete a visible event in
    time. Each byte resets a per-read timeout; only a wall-clock bound cuts it."""

    interval_s: float = 1.0


@dataclass(frozen=True)
class RawError(Behaviour):
    """An HTTP error whose JSON body is sent verbatim, to build any provider's envelope."""

    status: int
    body: Mapping[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Refusal(Behaviour):
    """A provider safety refusal, answered with status 200 in each API's refusal shape."""


@dataclass(frozen=True)
class Hang(Behaviour):
    """Read the request, send nothing for `seconds`, then drop the connection."""

    seconds: float


@dataclass(frozen=True)
class FailAfterVisible(Behaviour):
    """Stream up to the first visible delta, then a terminal error event (carrying `error` as its
    error object when given, e.g. to put anything an upstream might write into its fields)."""

    error: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class FailBeforeVisible(Behaviour):
    """Stream only non-visible lifecycle events, then a terminal failure: model_not_found (in the
    Responses event `terminal` names), or a transient overload when `terminal` is "overloaded"."""

    # Responses streams only: which terminal event carries the error.
    terminal: Literal["response.failed", "error"] = "response.failed"


@dataclass(frozen=True)
class CutStream(Behaviour):
    """Close the TCP connection mid stream, without a terminal event or websocket close frame."""

    after_visible: bool = True  # False: cut among the leading lifecycle events
    clean: bool = False  # True: end the body properly (chunked EOF) yet still without a terminal event


@dataclass(frozen=True)
class CloseWebsocket(Behaviour):
    """Close the websocket with `code` on receiving the frame (drops the connection on HTTP)."""

    code: int = 1011


def serve(text: str | None = None, *, input_tokens: int = 10, output_tokens: int | None = None) -> Serve:
    return Serve(text=text, input_tokens=input_tokens, output_tokens=output_tokens)


def large(size: int) -> Serve:
    """An answer whose text is `size` bytes (one word: cheap to build, however large)."""
    return Serve(text="x" * size)


def drip(interval_s: float = 1.0) -> Drip:
    return Drip(interval_s)


def revoked_key() -> Reject:
    """OpenAI's answer to a revoked or wrong API key (401 invalid_api_key)."""
    return Reject(401, _BAD_KEY)


def slow_unavailable(delay_s: float, status: int = 503) -> Reject:
    """A server error that takes `delay_s` to come back (an overloaded account)."""
    return Reject(status, ApiError("server_error", "The server is overloaded.", None, None), delay_s)


def end_without_terminal() -> CutStream:
    """A stream that shows output, then ends cleanly without its terminal event ([DONE],
    response.completed, message_stop): the answer is incomplete though no error was raised."""
    return CutStream(after_visible=True, clean=True)


def slow_stream(delay_s: float, text: str | None = None) -> Serve:
    return Serve(text=text, delay_s=delay_s)


def model_not_found(status: int = 404) -> Reject:
    return Reject(status, _MODEL_NOT_FOUND)


def codeless_404() -> Reject:
    """OpenAI's model 404 without a code: model_unavailable only when the catalog knows the model."""
    return Reject(404, ApiError("invalid_request_error", "The model does not exist.", None, "model"))


def generic_404() -> Reject:
    """OpenAI's 404 for a path it does not know: typed, coded, and about no model, so never a model
    failure (an Anthropic `not_found_error` or a bodiless 404 is the *bare* 404 of SPEC §5.6)."""
    return Reject(404, ApiError("invalid_request_error", "Unknown request URL.", code="unknown_url"))


def error(status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> RawError:
    return RawError(status, body, dict(headers or {}))


def rate_limited(retry_after: str | None = None) -> Reject | RawError:
    """OpenAI's 429; with `retry_after`, the `retry-after` header it sends (seconds, as text)."""
    err = ApiError("requests", "Rate limit reached.", "rate_limit_exceeded")
    if retry_after is None:
        return Reject(429, err)
    return RawError(429, {"error": _openai_error(err)}, {"retry-after": retry_after})


def quota() -> Reject:
    return Reject(
        429, ApiError("insufficient_quota", "You exceeded your current quota.", "insufficient_quota")
    )


def unavailable(status: int = 503) -> Reject:
    return Reject(status, ApiError("server_error", "The server is overloaded or not ready yet."))


def refusal() -> Refusal:
    return Refusal()


def hang(seconds: float = 30) -> Hang:
    return Hang(seconds)


def fail_after_visible(error: Mapping[str, Any] | None = None) -> FailAfterVisible:
    return FailAfterVisible(error)


def fail_before_visible(
    terminal: Literal["response.failed", "error"] = "response.failed",
) -> FailBeforeVisible:
    return FailBeforeVisible(terminal)


def overloaded_before_visible() -> FailBeforeVisible:
    """A transient in-stream failure before any output (Anthropic `overloaded_error`)."""
    return FailBeforeVisible("overloaded")


def cut_stream(*, after_visible: bool = True) -> CutStream:
    return CutStream(after_visible)


def close_websocket(code: int = 1011) -> CloseWebsocket:
    return CloseWebsocket(code)


_MODEL_NOT_FOUND = ApiError(
    "invalid_request_error",
    "The model does not exist or you do not have access to it.",
    "model_not_found",
    "model",
)
_MID_STREAM_FAILURE = ApiError("server_error", "The server had an error while processing your request.")
_BAD_JSON = ApiError("invalid_request_error", "We could not parse the JSON body of your request.")
_MISSING_MODEL = ApiError("invalid_request_error", "You must provide a model parameter.", None, "model")


FILE_PURPOSES = frozenset({"assistants", "batch", "fine-tune", "vision", "user_data", "evals"})
FILES_SCRIPT = "(files)"  # the script key of Files API requests (they name no model)


def _missing_parameter(name: str) -> ApiError:
    return ApiError(
        "invalid_request_error", f"Missing required parameter: '{name}'.", "missing_required_parameter", name
    )


def _no_such_file(file_id: str) -> ApiError:
    return ApiError("invalid_request_error", f"No such File object: {file_id}", None, "id")


@dataclass(frozen=True)
class StoredFile:
    """A file an account holds: its object's fields, the SHA-256 of its bytes and where they are."""

    id: str
    filename: str
    purpose: str
    bytes: int
    sha256: str
    created_at: int
    path: Path

    def object(self) -> JsonObject:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": None,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


def _previous_not_found(previous: str) -> ApiError:
    return ApiError(
        "invalid_request_error",
        f"Previous response with id '{previous}' not found.",
        "previous_response_not_found",
        "previous_response_id",
    )


_BAD_KEY = ApiError("invalid_request_error", "Incorrect API key provided.", "invalid_api_key")
_NOT_A_WEBSOCKET = ApiError("invalid_request_error", "Expected a websocket upgrade.")
_BAD_FRAME = ApiError("invalid_request_error", "Expected a response.create JSON text frame.", None, "type")
_REFUSAL_TEXT = "I can't help with that."

# Anthropic errors carry no code: the type follows the status.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def _openai_error(err: ApiError) -> JsonObject:
    return {"message": err.message, "type": err.type, "param": err.param, "code": err.code}


def _error_envelope(status: int, err: ApiError, *, anthropic: bool) -> JsonObject:
    if anthropic:
        default = "api_error" if status >= 500 else "invalid_request_error"
        return {
            "type": "error",
            "error": {"type": _ANTHROPIC_TYPES.get(status, default), "message": err.message},
        }
    return {"error": _openai_error(err)}


# ---------------------------------------------------------------------------------------------------
# Recording.


@dataclass(frozen=True)
class Hit:
    """One request as the fake received it (one `response.create` frame on a websocket)."""

    path: str
    method: str
    model: str | None
    headers: dict[str, str]  # lowercased names
    body: JsonObject | None  # None: no body, or not a JSON object
    transport: Transport


# ---------------------------------------------------------------------------------------------------
# Wire shapes, one renderer per API, built per request so related ids stay consistent.


@dataclass(frozen=True)
class _Reply:
    deltas: tuple[str, ...]
    input_tokens: int
    output_tokens: int
    refused: bool = False

    @property
    def text(self) -> str:
        return "".join(self.deltas)


def _reply(behaviour: Behaviour, fake_name: str) -> _Reply:
    """The answer a behaviour streams or returns; failures reuse the default answer's leading events."""
    if isinstance(behaviour, Refusal):
        return _Reply((), input_tokens=10, output_tokens=0, refused=True)
    served = behaviour if isinstance(behaviour, Serve) else Serve()
    text = served.text if served.text is not None else f"hello from {fake_name}"
    deltas = tuple(re.findall(r"\s*\S+", text)) or (text,)
    return _Reply(deltas, served.input_tokens, served.output_tokens or len(deltas))


@dataclass(frozen=True)
class _Event:
    name: str | None  # the SSE `event:` line; None for Chat Completions' bare `data:` lines
    data: JsonObject | str
    visible: bool = False  # shows output to the user (SPEC §6.2)


def _typed(name: str, visible: bool = False, **fields: Any) -> _Event:
    return _Event(name, {"type": name, **fields}, visible)


def _new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


@dataclass(frozen=True)
class _Call:
    model: str
    body: JsonObject


class _Api(Protocol):
    def json_body(self, reply: _Reply) -> JsonObject: ...


class _StreamingApi(_Api, Protocol):
    sequenced: bool  # events carry `sequence_number`

    def events(self, reply: _Reply) -> list[_Event]: ...

    def after_visible_failure(self) -> list[_Event]: ...

    def before_visible_failure(self, terminal: str) -> list[_Event]:
        """`terminal` picks the Responses event that carries the error; other APIs have one shape."""
        ...


class _Chat:
    sequenced = False

    def __init__(self, call: _Call) -> None:
        self.call = call
        self.id = _new_id("chatcmpl-")
        self.created = int(time.time())

    def _head(self, obj: str) -> JsonObject:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.call.model,
            "system_fingerprint": None,
        }

    @staticmethod
    def _usage(reply: _Reply) -> JsonObject:
        total = reply.input_tokens + reply.output_tokens
        return {
            "prompt_tokens": reply.input_tokens,
            "completion_tokens": reply.output_tokens,
            "total_tokens": total,
        }

    @staticmethod
    def _finish(reply: _Reply) -> str:
        return "content_filter" if reply.refused else "stop"

    def json_body(self, reply: _Reply) -> JsonObject:
        message = {
            "role": "assistant",
            "content": None if reply.refused else reply.text,
            "refusal": None,
            "annotations": [],
        }
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": self._finish(reply)}
        return {**self._head("chat.completion"), "choices": [choice], "usage": self._usage(reply)}

    def events(self, reply: _Reply) -> list[_Event]:
        options = self.call.body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True

        def chunk(delta: JsonObject, finish: str | None = None, visible: bool = False) -> _Event:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            data = {**self._head("chat.completion.chunk"), "choices": [choice]}
            if include_usage:
                data["usage"] = None
            return _Event(None, data, visible)

        events = [chunk({"role": "assistant", "content": "", "refusal": None})]
        events += [chunk({"content": delta}, visible=True) for delta in reply.deltas]
        events.append(chunk({}, self._finish(reply)))
        if include_usage:
            events.append(
                _Event(
                    None, {**self._head("chat.completion.chunk"), "choices": [], "usage": self._usage(reply)}
                )
            )
        return [*events, _Event(None, "[DONE]")]

    def after_visible_failure(self) -> list[_Event]:
        # Chat streams report a failure as a bare error object, and never send [DONE] after it.
        return [_Event(None, {"error": _openai_error(_MID_STREAM_FAILURE)})]

    def before_visible_failure(self, terminal: str) -> list[_Event]:
        error = _MID_STREAM_FAILURE if terminal == "overloaded" else _MODEL_NOT_FOUND
        return [_Event(None, {"error": _openai_error(error)})]


class _Responses:
    sequenced = True

    def __init__(self, call: _Call) -> None:
        self.call = call
        self.id = _new_id("resp_")
        self.message_id = _new_id("msg_")
        self.created_at = int(time.time())

    def _response(self, status: str, output: list[JsonObject], **fields: Any) -> JsonObject:
        previous = self.call.body.get("previous_response_id")
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "model": self.call.model,
            "output": output,
            "previous_response_id": previous,
            "usage": None,
            "metadata": {},
            **fields,
        }

    @staticmethod
    def _usage(reply: _Reply) -> JsonObject:
        return {
            "input_tokens": reply.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": reply.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": reply.input_tokens + reply.output_tokens,
        }

    def _message(self, status: str, content: list[JsonObject]) -> JsonObject:
        return {
            "id": self.message_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        }

    @staticmethod
    def _part(reply: _Reply, *, empty: bool = False) -> JsonObject:
        if reply.refused:
            return {"type": "refusal", "refusal": "" if empty else _REFUSAL_TEXT}
        return {"type": "output_text", "text": "" if empty else reply.text, "annotations": [], "logprobs": []}

    def _final(self, reply: _Reply) -> JsonObject:
        # A refusal is both a refusal content part and an incomplete response cut by the content filter.
        if reply.refused:
            item = self._message("incomplete", [self._part(reply)])
            return self._response(
                "incomplete",
                [item],
                usage=self._usage(reply),
                incomplete_details={"reason": "content_filter"},
            )
        item = self._message("completed", [self._part(reply)])
        return self._response("completed", [item], usage=self._usage(reply))

    def json_body(self, reply: _Reply) -> JsonObject:
        return self._final(reply)

    def _lifecycle(self) -> list[_Event]:
        started = self._response("in_progress", [])
        return [
            _typed("response.created", response=started),
            _typed("response.in_progress", response=started),
        ]

    def events(self, reply: _Reply) -> list[_Event]:
        final = self._final(reply)
        at = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        events = [
            *self._lifecycle(),
            _typed("response.output_item.added", output_index=0, item=self._message("in_progress", [])),
            _typed("response.content_part.added", **at, part=self._part(reply, empty=True)),
        ]
        if reply.refused:
            events += [
                _typed("response.refusal.delta", True, **at, delta=_REFUSAL_TEXT),
                _typed("response.refusal.done", **at, refusal=_REFUSAL_TEXT),
            ]
        else:
            events += [
                _typed("response.output_text.delta", True, **at, delta=d, logprobs=[]) for d in reply.deltas
            ]
            events.append(_typed("response.output_text.done", **at, text=reply.text, logprobs=[]))
        terminal = "response.incomplete" if reply.refused else "response.completed"
        return [
            *events,
            _typed("response.content_part.done", **at, part=self._part(reply)),
            _typed("response.output_item.done", output_index=0, item=final["output"][0]),
            _typed(terminal, response=final),
        ]

    def after_visible_failure(self) -> list[_Event]:
        return [_typed("error", error=_openai_error(_MID_STREAM_FAILURE))]

    def before_visible_failure(self, terminal: str) -> list[_Event]:
        if terminal == "overloaded":
            return [_typed("error", error=_openai_error(_MID_STREAM_FAILURE))]
        if terminal == "error":
            return [_typed("error", error=_openai_error(_MODEL_NOT_FOUND))]
        failure = {"code": _MODEL_NOT_FOUND.code, "message": _MODEL_NOT_FOUND.message}
        return [_typed("response.failed", response=self._response("failed", [], error=failure))]


class _Compact:
    def __init__(self, call: _Call) -> None:
        self.call = call

    def json_body(self, reply: _Reply) -> JsonObject:
        usage = {
            "input_tokens": reply.input_tokens,
            "output_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
        }
        item = {"type": "compaction", "id": _new_id("cmp_"), "encrypted_content": _new_id("enc_")}
        return {
            "id": _new_id("resp_"),
            "object": "response.compaction",
            "created_at": int(time.time()),
            "model": self.call.model,
            "output": [item],
            "usage": usage,
        }


class _Messages:
    sequenced = False

    def __init__(self, call: _Call) -> None:
        self.call = call
        self.id = _new_id("msg_")

    def _message(self, content: list[JsonObject], stop_reason: str | None, usage: JsonObject) -> JsonObject:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.call.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": usage,
        }

    @staticmethod
    def _stop_reason(reply: _Reply) -> str:
        return "refusal" if reply.refused else "end_turn"

    def json_body(self, reply: _Reply) -> JsonObject:
        content = [] if reply.refused else [{"type": "text", "text": reply.text}]
        usage = {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens}
        return self._message(content, self._stop_reason(reply), usage)

    def events(self, reply: _Reply) -> list[_Event]:
        start = self._message([], None, {"input_tokens": reply.input_tokens, "output_tokens": 1})
        events = [_typed("message_start", message=start)]
        if not reply.refused:
            events.append(_typed("content_block_start", index=0, content_block={"type": "text", "text": ""}))
        events.append(_typed("ping"))
        if not reply.refused:
            events += [
                _typed("content_block_delta", True, index=0, delta={"type": "text_delta", "text": d})
                for d in reply.deltas
            ]
            events.append(_typed("content_block_stop", index=0))
        return [
            *events,
            _typed(
                "message_delta",
                delta={"stop_reason": self._stop_reason(reply), "stop_sequence": None},
                usage={"output_tokens": reply.output_tokens},
            ),
            _typed("message_stop"),
        ]

    def after_visible_failure(self) -> list[_Event]:
        return [_typed("error", error={"type": "overloaded_error", "message": "Overloaded"})]

    def before_visible_failure(self, terminal: str) -> list[_Event]:
        if terminal == "overloaded":
            return [_typed("error", error={"type": "overloaded_error", "message": "Overloaded"})]
        # Anthropic has no error codes: its unknown-model error is a not_found_error naming the model.
        return [_typed("error", error={"type": "not_found_error", "message": f"model: {self.call.model}"})]


class _CountTokens:
    def __init__(self, call: _Call) -> None:
        self.call = call

    def json_body(self, reply: _Reply) -> JsonObject:
        return {"input_tokens": reply.input_tokens}


class _Embeddings:
    """OpenAI's embeddings: one vector per input (a string, a token array, or a list of either), as
    floats or, when `encoding_format` is "base64" (what the openai SDK asks for), as little-endian
    float32 bytes in base64."""

    DIMENSIONS = 8

    def __init__(self, call: _Call) -> None:
        self.call = call

    def _inputs(self) -> list[Any]:
        value = self.call.body.get("input")
        if isinstance(value, list) and value and all(isinstance(v, str | list) for v in value):
            return value
        return [value]

    def _vector(self, item: Any) -> list[float]:
        digest = hashlib.sha256(json.dumps(item).encode()).digest()
        return [b / 255 for b in digest[: self.DIMENSIONS]]

    def json_body(self, reply: _Reply) -> JsonObject:
        data = []
        for index, item in enumerate(self._inputs()):
            vector: Any = self._vector(item)
            if self.call.body.get("encoding_format") == "base64":
                vector = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": vector})
        usage = {"prompt_tokens": reply.input_tokens, "total_tokens": reply.input_tokens}
        return {"object": "list", "data": data, "model": self.call.model, "usage": usage}


class _ModelList:
    def __init__(self, models: tuple[str, ...], owned_by: str) -> None:
        self.models = models
        self.owned_by = owned_by

    def json_body(self, reply: _Reply) -> JsonObject:
        data = [
            {"id": model, "object": "model", "created": 0, "owned_by": self.owned_by} for model in self.models
        ]
        return {"object": "list", "data": data}


def _through_first_visible(events: list[_Event]) -> list[_Event]:
    first = next(i for i, event in enumerate(events) if event.visible)
    return events[: first + 1]


def _before_first_visible(events: list[_Event]) -> list[_Event]:
    first = next(i for i, event in enumerate(events) if event.visible)
    return events[:first]


def _stream_plan(api: _StreamingApi, behaviour: Behaviour, fake_name: str) -> tuple[list[_Event], bool]:
    """The events a streaming behaviour sends, and whether the connection is dropped after them."""
    events = api.events(_reply(behaviour, fake_name))
    match behaviour:
        case FailAfterVisible(error=error):
            failure = api.after_visible_failure()
            if error is not None:
                failure = [
                    replace(e, data={**cast(JsonObject, e.data), "error": dict(error)}) for e in failure
                ]
            events = _through_first_visible(events) + failure
        case FailBeforeVisible(terminal=terminal):
            events = _before_first_visible(events) + api.before_visible_failure(terminal)
        case CutStream(after_visible=after_visible, clean=clean):
            cut = _through_first_visible if after_visible else _before_first_visible
            return _numbered(api, cut(events)), not clean
    return _numbered(api, events), False


def _numbered(api: _StreamingApi, events: list[_Event]) -> list[_Event]:
    # Numbered last, so a failure appended to a prefix continues the prefix's numbering.
    if not api.sequenced:
        return events
    return [replace(e, data={**cast(JsonObject, e.data), "sequence_number": n}) for n, e in enumerate(events)]


@dataclass(frozen=True)
class _Route:
    make: type[_Api]
    anthropic: bool = False  # errors in the Anthropic envelope
    streams: bool = False


_ROUTES = {
    "/v1/chat/completions": _Route(_Chat, streams=True),
    "/v1/responses": _Route(_Responses, streams=True),
    "/v1/responses/compact": _Route(_Compact),
    "/v1/messages": _Route(_Messages, anthropic=True, streams=True),
    "/v1/messages/count_tokens": _Route(_CountTokens, anthropic=True),
    "/v1/embeddings": _Route(_Embeddings),
}


def _parse_object(raw: bytes | str) -> JsonObject | None:
    try:
        parsed = json.loads(raw)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _sse_bytes(event: _Event) -> bytes:
    data = event.data if isinstance(event.data, str) else json.dumps(event.data)
    head = f"event: {event.name}\n" if event.name else ""
    return f"{head}data: {data}\n\n".encode()


def _model_of(body: JsonObject | None) -> str | None:
    model = body.get("model") if body is not None else None
    return model if isinstance(model, str) else None


def _delay_of(behaviour: Behaviour) -> float:
    return behaviour.delay_s if isinstance(behaviour, Serve) else 0.0


_Fail = Callable[[int, ApiError], web.StreamResponse]


def _openai_failure(status: int, err: ApiError) -> web.Response:
    return web.json_response(_error_envelope(status, err, anthropic=False), status=status)


def _drop(request: web.BaseRequest) -> web.StreamResponse:
    """Close the TCP connection without finishing the response.

    `close()` (not `abort()`) so what was already written still reaches the client. The response
    returned is never sent: aiohttp's write to the closed transport fails with a ConnectionError,
    which it treats as a client disconnect, silently.
    """
    if request.transport is not None:
        request.transport.close()
    return web.Response()


# ---------------------------------------------------------------------------------------------------
# The server.


@dataclass
class _Running:
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    runner: web.AppRunner
    port: int
    stopping: asyncio.Event
    websockets: set[web.WebSocketResponse] = field(default_factory=set)


class FakeUpstream:
    """A scriptable fake provider listening on 127.0.0.1 (see the module docstring for the contract)."""

    def __init__(
        self,
        name: str = "fake",
        models: tuple[str, ...] | list[str] = ("gpt-5",),
        *,
        require_key: str | None = None,
        port: int = 0,
        compression: Literal["gzip", "deflate", "identity"] = "gzip",
    ) -> None:
        """`require_key`: answer 401 unless `Authorization: Bearer KEY` or `x-api-key: KEY` is sent.
        `port`: 0 picks a free port. `compression`: the coding preferred when the request offers it."""
        self.name = name
        self.compression = compression
        self._answer_digests: list[str] = []
        self.models = tuple(models)
        self.require_key = require_key
        # What GET /v1/models does; None lists `models`.
        self.models_behaviour: Behaviour | None = None
        self._requested_port = port
        self._lock = threading.Lock()  # hits and scripts are shared by the test thread and the server
        self._scripts: dict[str, list[Behaviour]] = {}
        self._hits: list[Hit] = []
        self._ws_connections = 0
        self._responses: set[str] = set()  # the Responses it served (and so stores), by id
        self._files: dict[str, StoredFile] = {}
        self._file_dir: Path | None = None
        self._running: _Running | None = None

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> Self:
        """Listen on 127.0.0.1; returns once connections are accepted."""
        if self._running is not None:
            raise RuntimeError(f"fake upstream {self.name} is already running")
        loop = asyncio.new_event_loop()
        thread = threading.Thread(
            target=self._run_loop, args=(loop,), name=f"fake-upstream-{self.name}", daemon=True
        )
        thread.start()
        try:
            self._running = asyncio.run_coroutine_threadsafe(self._listen(loop, thread), loop).result(10)
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            raise
        return self

    def stop(self) -> None:
        """Close every connection (hanging and slow handlers end at once) and join the thread."""
        running = self._running
        if running is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(running), running.loop).result(10)
        running.loop.call_soon_threadsafe(running.loop.stop)
        running.thread.join()
        # Cleared last: handlers still finishing during the shutdown look their state up here.
        self._running = None
        if self._file_dir is not None:
            shutil.rmtree(self._file_dir, ignore_errors=True)
            self._file_dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @staticmethod
    def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        loop.run_forever()
        loop.close()

    def _add_routes(self, app: web.Application) -> None:
        """The provider's paths; a fake of another provider (devkit.azure, devkit.bedrock...) overrides."""
        for path, route in _ROUTES.items():
            app.router.add_post(path, self._http_handler(route))
        app.router.add_get("/v1/responses", self._handle_websocket)
        app.router.add_get("/v1/models", self._handle_models)
        app.router.add_post("/v1/files", self._handle_file_upload)
        app.router.add_get("/v1/files/{file_id}", self._handle_file)
        app.router.add_delete("/v1/files/{file_id}", self._handle_file)
        app.router.add_get("/v1/files/{file_id}/content", self._handle_file_content)

    async def _listen(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> _Running:
        app = web.Application(client_max_size=64 * 1024 * 1024)  # above the gateway's own body limit
        self._add_routes(app)
        # Handlers end promptly on `stopping`; the timeout only bounds a handler stuck elsewhere.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", self._requested_port).start()
        except BaseException:
            await runner.cleanup()
            raise
        return _Running(loop, thread, runner, port=runner.addresses[0][1], stopping=asyncio.Event())

    @staticmethod
    async def _shutdown(running: _Running) -> None:
        running.stopping.set()
        # aiohttp does not close server websockets itself: their handlers would outlive the runner.
        for ws in list(running.websockets):
            await ws.close(code=WSCloseCode.GOING_AWAY)
        await running.runner.cleanup()

    # -- addresses ------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._require_running().port

    @property
    def base_url(self) -> str:
        """The API root an assignment's `base_url` names: `http://127.0.0.1:PORT/v1`."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/responses"

    def _require_running(self) -> _Running:
        if self._running is None:
            raise RuntimeError(f"fake upstream {self.name} is not running")
        return self._running

    # -- scripting and recording ----------------------------------------------------------------------

    def script(self, model: str, first: Behaviour, *then: Behaviour) -> None:
        """Answer the next requests for `model` with these behaviours in order; the last one repeats.

        Replaces any earlier script for `model`; a scripted model need not be in `models`."""
        with self._lock:
            self._scripts[model] = [first, *then]

    @property
    def hits(self) -> list[Hit]:
        with self._lock:
            return list(self._hits)

    def hit_count(self, model: str | None = None, path: str | None = None) -> int:
        """Requests received, optionally only those for `model` and/or to `path` (e.g. "/v1/responses")."""
        return sum(
            1
            for hit in self.hits
            if (model is None or hit.model == model) and (path is None or hit.path == path)
        )

    @property
    def ws_connections(self) -> int:
        """Websocket connections accepted so far."""
        with self._lock:
            return self._ws_connections

    @property
    def ws_open(self) -> int:
        """Websocket connections open right now (a closed or dropped one leaves at once)."""
        running = self._running
        return len(running.websockets) if running is not None else 0

    @property
    def answer_digests(self) -> list[str]:
        """SHA-256 (hex) of each plain body answered, as sent before any compression."""
        with self._lock:
            return list(self._answer_digests)

    def _coding(self, request: web.BaseRequest) -> ContentCoding | None:
        """The content coding to answer with: the preferred one if offered, else the other offered."""
        offered = request.headers.get(hdrs.ACCEPT_ENCODING, "").lower()
        if self.compression == "identity":
            return None
        other = "deflate" if self.compression == "gzip" else "gzip"
        for name in (self.compression, other):
            if name in offered:
                return ContentCoding(name)
        return None

    def _finish(self, request: web.BaseRequest, response: web.StreamResponse) -> web.StreamResponse:
        """Compress a plain answer the way an ordinary server does when the client offered it."""
        if isinstance(response, web.Response) and response.body is not None and not response.prepared:
            body = response.body
            if isinstance(body, bytes):
                with self._lock:
                    self._answer_digests.append(hashlib.sha256(body).hexdigest())
            coding = self._coding(request)
            if coding is not None:
                response.enable_compression(force=coding)
        return response

    def reset(self) -> None:
        """Forget hits, websocket connections, scripts and `models_behaviour`."""
        with self._lock:
            self._hits.clear()
            self._scripts.clear()
            self._ws_connections = 0
            self.models_behaviour = None

    def _record(
        self, request: web.Request, model: str | None, body: JsonObject | None, transport: Transport
    ) -> None:
        headers = {name.lower(): value for name, value in request.headers.items()}
        with self._lock:
            self._hits.append(Hit(request.path, request.method, model, headers, body, transport))

    def _behaviour_for(self, model: str) -> Behaviour:
        with self._lock:
            script = self._scripts.get(model)
            if script:
                return script.pop(0) if len(script) > 1 else script[0]
        return serve() if model in self.models else model_not_found()

    def _unknown_previous(self, body: JsonObject) -> str | None:
        """The body's `previous_response_id` when this account never created it."""
        previous = body.get("previous_response_id")
        if not isinstance(previous, str):
            return None
        with self._lock:
            return None if previous in self._responses else previous

    def _missing_file(self, body: JsonObject) -> str | None:
        """A `file-...` id the body references that this account does not hold (OpenAI's ids: another
        account's file does not exist here)."""
        pending: list[object] = [body]
        while pending:
            item = pending.pop()
            if isinstance(item, dict):
                file_id = item.get("file_id")
                if isinstance(file_id, str) and file_id.startswith("file-") and file_id not in self.files:
                    return file_id
                pending.extend(item.values())
            elif isinstance(item, list):
                pending.extend(item)
        return None

    def _stores(self, api: object, behaviour: Behaviour) -> None:
        if isinstance(api, _Responses) and isinstance(behaviour, Serve | Refusal | FailAfterVisible):
            with self._lock:
                self._responses.add(api.id)

    def _authorized(self, request: web.Request) -> bool:
        bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
        return self.require_key is None or self.require_key in (bearer, request.headers.get("x-api-key"))

    async def _pause(self, seconds: float) -> bool:
        """Sleep `seconds`; True if the fake is stopping meanwhile (the caller then drops the connection)."""
        try:
            await asyncio.wait_for(self._require_running().stopping.wait(), seconds)
        except TimeoutError:
            return False
        return True

    # -- Files API ------------------------------------------------------------------------------------

    def script_files(self, first: Behaviour, *then: Behaviour) -> None:
        """Answer the next Files API requests with these behaviours (`Serve`: as the API would)."""
        self.script(FILES_SCRIPT, first, *then)

    @property
    def files(self) -> dict[str, StoredFile]:
        with self._lock:
            return dict(self._files)

    def _files_behaviour(self) -> Behaviour:
        with self._lock:
            script = self._scripts.get(FILES_SCRIPT)
            if script:
                return script.pop(0) if len(script) > 1 else script[0]
        return serve()

    async def _files_scripted(self, request: web.Request, behaviour: Behaviour) -> web.StreamResponse | None:
        """A scripted Files answer other than Serve, once the request's body has been read."""
        match behaviour:
            case Serve():
                return None
            case Reject(status=status, error=err):
                return _openai_failure(status, err)
            case RawError(status=status, body=body):
                return web.json_response(dict(body), status=status)
            case Hang(seconds=seconds):
                await self._pause(seconds)
        return _drop(request)

    async def _handle_file_upload(self, request: web.Request) -> web.StreamResponse:
        self._record(request, None, None, "http")
        if not self._authorized(request):
            return _openai_failure(401, _BAD_KEY)
        behaviour = self._files_behaviour()
        if not request.content_type.startswith("multipart/"):
            await request.read()
            return _openai_failure(400, _missing_parameter("file"))
        if self._file_dir is None:
            self._file_dir = Path(tempfile.mkdtemp(prefix=f"fake-{self.name}-files-"))
        file_id = _new_id("file-")
        path = self._file_dir / file_id
        purpose: str | None = None
        filename: str | None = None
        size = 0
        digest = hashlib.sha256()
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                continue  # a nested multipart: not part of the Files API
            if part.name == "purpose":
                purpose = await part.text()
            elif part.name == "file":
                filename = part.filename or "upload"
                with path.open("wb") as out:  # streamed to disk, a chunk at a time
                    while chunk := await part.read_chunk(1 << 16):
                        size += len(chunk)
                        digest.update(chunk)
                        out.write(chunk)
            else:
                await part.release()
        scripted = await self._files_scripted(request, behaviour)
        if scripted is not None or filename is None or purpose is None or purpose not in FILE_PURPOSES:
            path.unlink(missing_ok=True)
        if scripted is not None:
            return scripted
        if filename is None:
            return _openai_failure(400, _missing_parameter("file"))
        if purpose is None:
            return _openai_failure(400, _missing_parameter("purpose"))
        if purpose not in FILE_PURPOSES:
            invalid = ApiError(
                "invalid_request_error", f"Invalid value for purpose: '{purpose}'.", None, "purpose"
            )
            return _openai_failure(400, invalid)
        stored = StoredFile(file_id, filename, purpose, size, digest.hexdigest(), int(time.time()), path)
        with self._lock:
            self._files[file_id] = stored
        return web.json_response(stored.object())

    def _stored(self, request: web.Request) -> StoredFile | None:
        with self._lock:
            return self._files.get(request.match_info["file_id"])

    async def _handle_file(self, request: web.Request) -> web.StreamResponse:
        """GET (the file object) and DELETE /v1/files/{id}."""
        self._record(request, None, None, "http")
        if not self._authorized(request):
            return _openai_failure(401, _BAD_KEY)
        scripted = await self._files_scripted(request, self._files_behaviour())
        if scripted is not None:
            return scripted
        stored = self._stored(request)
        if stored is None:
            return _openai_failure(404, _no_such_file(request.match_info["file_id"]))
        if request.method == "DELETE":
            with self._lock:
                self._files.pop(stored.id, None)
            stored.path.unlink(missing_ok=True)
            return web.json_response({"id": stored.id, "object": "file", "deleted": True})
        return web.json_response(stored.object())

    async def _handle_file_content(self, request: web.Request) -> web.StreamResponse:
        self._record(request, None, None, "http")
        if not self._authorized(request):
            return _openai_failure(401, _BAD_KEY)
        scripted = await self._files_scripted(request, self._files_behaviour())
        if scripted is not None:
            return scripted
        stored = self._stored(request)
        if stored is None:
            return _openai_failure(404, _no_such_file(request.match_info["file_id"]))
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = stored.bytes
        await response.prepare(request)
        with stored.path.open("rb") as source:
            while chunk := source.read(1 << 16):
                await response.write(chunk)
        await response.write_eof()
        return response

    # -- HTTP -----------------------------------------------------------------------------------------

    def _http_handler(
        self, route: _Route, model_in_path: Callable[[web.Request], str] | None = None
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """`model_in_path`: the model named by the URL rather than the body (an Azure deployment)."""

        def fail(status: int, err: ApiError) -> web.Response:
            return web.json_response(_error_envelope(status, err, anthropic=route.anthropic), status=status)

        async def handle(request: web.Request) -> web.StreamResponse:
            body = _parse_object(await request.read())
            model = model_in_path(request) if model_in_path is not None else _model_of(body)
            stream = route.streams and body is not None and body.get("stream") is True
            self._record(request, model, body, "sse" if stream else "http")
            if not self._authorized(request):
                return fail(401, _BAD_KEY)
            if body is None:
                return fail(400, _BAD_JSON)
            if model is None:
                return fail(400, _MISSING_MODEL)
            unknown = self._unknown_previous(body) if route.make is _Responses else None
            if unknown is not None:
                return fail(400, _previous_not_found(unknown))
            missing = self._missing_file(body)
            if missing is not None:
                return fail(404, _no_such_file(missing))
            behaviour = self._behaviour_for(model)
            api = route.make(_Call(model, body))
            self._stores(api, behaviour)
            if stream:
                return await self._respond_stream(request, cast(_StreamingApi, api), behaviour, fail)
            return await self._respond_json(request, api, behaviour, fail)

        async def compressed(request: web.Request) -> web.StreamResponse:
            return self._finish(request, await handle(request))

        return compressed

    async def _handle_models(self, request: web.Request) -> web.StreamResponse:
        self._record(request, None, None, "http")
        if not self._authorized(request):
            return _openai_failure(401, _BAD_KEY)
        api = _ModelList(self.models, owned_by=self.name)
        return await self._respond_json(request, api, self.models_behaviour or serve(), _openai_failure)

    async def _respond_json(
        self, request: web.Request, api: _Api, behaviour: Behaviour, fail: _Fail
    ) -> web.StreamResponse:
        match behaviour:
            case Serve() | Refusal():
                delay = _delay_of(behaviour)
                if delay and await self._pause(delay):
                    return _drop(request)
                return web.json_response(api.json_body(_reply(behaviour, self.name)))
            case Reject(status=status, error=err, delay_s=delay):
                if delay and await self._pause(delay):
                    return _drop(request)
                return fail(status, err)
            case Drip(interval_s=interval):
                raw = json.dumps(api.json_body(_reply(serve(), self.name))).encode()
                return await self._drip(request, raw, interval, "application/json")
            case RawError(status=status, body=body, headers=headers):
                return web.json_response(dict(body), status=status, headers=dict(headers))
            case FailBeforeVisible(terminal="overloaded"):
                return fail(529, _MID_STREAM_FAILURE)
            case FailBeforeVisible():
                # Without a stream, a failure before any output is simply the error response.
                return fail(404, _MODEL_NOT_FOUND)
            case Hang(seconds=seconds):
                await self._pause(seconds)
                return _drop(request)
            case _:  # FailAfterVisible, CutStream, CloseWebsocket: the connection dies mid-response
                return _drop(request)

    async def _respond_stream(
        self, request: web.Request, api: _StreamingApi, behaviour: Behaviour, fail: _Fail
    ) -> web.StreamResponse:
        match behaviour:
            case Reject() | RawError():
                return await self._respond_json(request, api, behaviour, fail)
            case Hang(seconds=seconds):
                await self._pause(seconds)
                return _drop(request)
            case CloseWebsocket():
                return _drop(request)
            case Drip(interval_s=interval):
                raw = b"".join(_sse_bytes(e) for e in api.events(_reply(serve(), self.name)))
                return await self._drip(request, raw, interval, "text/event-stream")
        events, cut = _stream_plan(api, behaviour, self.name)
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
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
                    return _drop(request)
                await response.write(encode(_sse_bytes(event)))
        except ConnectionError:
            return response  # the client went away; aiohttp then ends the connection quietly
        if cut:
            return _drop(request)
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
                    return _drop(request)
        except ConnectionError:
            return response
        await response.write_eof()
        return response

    # -- websocket ------------------------------------------------------------------------------------

    async def _handle_websocket(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(timeout=1.0)  # bounds the wait for the peer's close frame
        if not ws.can_prepare(request).ok:
            self._record(request, None, None, "http")
            return _openai_failure(400, _NOT_A_WEBSOCKET)
        if not self._authorized(request):
            # The only websocket hit without a frame: it lets a test see the key that was refused.
            self._record(request, None, None, "websocket")
            return _openai_failure(401, _BAD_KEY)
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
            await ws.send_json(_ws_error(400, {"error": _openai_error(_BAD_FRAME)}))
            return True
        if model is None:
            await ws.send_json(_ws_error(400, {"error": _openai_error(_MISSING_MODEL)}))
            return True
        unknown = self._unknown_previous(body)
        if unknown is not None:
            await ws.send_json(_ws_error(400, {"error": _openai_error(_previous_not_found(unknown))}))
            return True
        missing = self._missing_file(body)
        if missing is not None:
            await ws.send_json(_ws_error(404, {"error": _openai_error(_no_such_file(missing))}))
            return True
        behaviour = self._behaviour_for(model)
        match behaviour:
            case Reject(status=status, error=err):
                await ws.send_json(_ws_error(status, {"error": _openai_error(err)}))
                return True
            case RawError(status=status, body=raw):
                await ws.send_json(_ws_error(status, raw))
                return True
            case Hang(seconds=seconds):
                await self._pause(seconds)
                _drop(request)
                return False
            case CloseWebsocket(code=code):
                await ws.close(code=code)
                return False
        api = _Responses(_Call(model, body))
        self._stores(api, behaviour)
        events, cut = _stream_plan(api, behaviour, self.name)
        delay = _delay_of(behaviour)
        for event in events:
            if delay and await self._pause(delay):
                _drop(request)
                return False
            await ws.send_json(event.data)
        if cut:
            _drop(request)
            return False
        return True


def _ws_error(status: int, body: Mapping[str, Any]) -> JsonObject:
    """A rejection in Responses websocket mode: an `error` event carrying the HTTP status it stands for."""
    return {"type": "error", "status": status, **body}
