"""What a fake upstream does with one request, and the provider errors it answers with.

A test scripts a fake (devkit.upstream.FakeUpstream and the other providers' fakes) with behaviours:
build them with the factory functions (`serve()`, `model_not_found()`, `hang(5)`...), or the dataclasses
for a shape no factory names. `ApiError` is an error's canonical fields, rendered by each route in its
own envelope (`error_envelope`: OpenAI's or Anthropic's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class Behaviour:
    """Base of every behaviour; build them with the factory functions below."""


@dataclass(frozen=True)
class Serve(Behaviour):
    """A successful answer; on streams, one visible delta per word of `text`."""

    text: str | None = None  # None: "hello from <fake name>"
    input_tokens: int = 10  # every input token, cached ones included (as OpenAI counts them)
    output_tokens: int | None = None  # None: the number of streamed deltas
    # Parts of input_tokens read from and written to the prompt cache, reported in each API's own
    # fields (Anthropic's input_tokens then excludes them); 0: not mentioned, as before.
    cached_read_tokens: int = 0
    cached_write_tokens: int = 0
    # Part of output_tokens the model spent reasoning, in each API's own field where it has one (OpenAI's
    # `reasoning_tokens`, Gemini's `thoughtsTokenCount`); 0: not mentioned.
    reasoning_tokens: int = 0
    delay_s: float = 0.0  # pause before each stream event, or before a JSON body
    linger_s: float = 0.0  # on streams: the connection stays open this long after the last event


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


def serve(
    text: str | None = None,
    *,
    input_tokens: int = 10,
    output_tokens: int | None = None,
    cached_read_tokens: int = 0,
    cached_write_tokens: int = 0,
    reasoning_tokens: int = 0,
) -> Serve:
    return Serve(
        text=text,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_read_tokens=cached_read_tokens,
        cached_write_tokens=cached_write_tokens,
        reasoning_tokens=reasoning_tokens,
    )


def large(size: int) -> Serve:
    """An answer whose text is `size` bytes (one word: cheap to build, however large)."""
    return Serve(text="x" * size)


def drip(interval_s: float = 1.0) -> Drip:
    return Drip(interval_s)


def revoked_key() -> Reject:
    """OpenAI's answer to a revoked or wrong API key (401 invalid_api_key)."""
    return Reject(401, BAD_KEY)


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
    return Reject(status, MODEL_NOT_FOUND)


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
    return RawError(429, {"error": openai_error(err)}, {"retry-after": retry_after})


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


# ---------------------------------------------------------------------------------------------------
# The providers' errors, as the fakes answer them.

MODEL_NOT_FOUND = ApiError(
    "invalid_request_error",
    "The model does not exist or you do not have access to it.",
    "model_not_found",
    "model",
)
MID_STREAM_FAILURE = ApiError("server_error", "The server had an error while processing your request.")
BAD_KEY = ApiError("invalid_request_error", "Incorrect API key provided.", "invalid_api_key")


def missing_parameter(name: str) -> ApiError:
    return ApiError(
        "invalid_request_error", f"Missing required parameter: '{name}'.", "missing_required_parameter", name
    )


def no_such_file(file_id: str) -> ApiError:
    return ApiError("invalid_request_error", f"No such File object: {file_id}", None, "id")


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


def openai_error(err: ApiError) -> JsonObject:
    return {"message": err.message, "type": err.type, "param": err.param, "code": err.code}


def error_envelope(status: int, err: ApiError, *, anthropic: bool) -> JsonObject:
    if anthropic:
        default = "api_error" if status >= 500 else "invalid_request_error"
        return {
            "type": "error",
            "error": {"type": _ANTHROPIC_TYPES.get(status, default), "message": err.message},
        }
    return {"error": openai_error(err)}
