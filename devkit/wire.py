"""The wire shapes of the APIs the fake upstream speaks, one renderer per API, built per request so
related ids stay consistent: OpenAI Chat Completions, Responses (and its compaction), embeddings and the
model list; Anthropic Messages and its token count. A streaming API renders its SSE events too, and the
events a failure before or after the first visible one leaves (`stream_plan`)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

from devkit.behaviours import (
    MID_STREAM_FAILURE,
    MODEL_NOT_FOUND,
    Behaviour,
    CutStream,
    FailAfterVisible,
    FailBeforeVisible,
    JsonObject,
    Refusal,
    Serve,
    openai_error,
)

_REFUSAL_TEXT = "I can't help with that."


@dataclass(frozen=True)
class Reply:
    deltas: tuple[str, ...]
    input_tokens: int
    output_tokens: int
    refused: bool = False
    cached_read_tokens: int = 0  # parts of input_tokens (Serve's)
    cached_write_tokens: int = 0
    reasoning_tokens: int = 0  # part of output_tokens

    @property
    def anthropic_usage(self) -> JsonObject:
        """Anthropic's input fields: its input_tokens exclude the cache reads and writes."""
        uncached = self.input_tokens - self.cached_read_tokens - self.cached_write_tokens
        if not (self.cached_read_tokens or self.cached_write_tokens):
            return {"input_tokens": uncached}
        return {
            "input_tokens": uncached,
            "cache_creation_input_tokens": self.cached_write_tokens,
            "cache_read_input_tokens": self.cached_read_tokens,
        }

    @property
    def text(self) -> str:
        return "".join(self.deltas)


def reply_for(behaviour: Behaviour, fake_name: str) -> Reply:
    """The answer a behaviour streams or returns; failures reuse the default answer's leading events."""
    if isinstance(behaviour, Refusal):
        return Reply((), input_tokens=10, output_tokens=0, refused=True)
    served = behaviour if isinstance(behaviour, Serve) else Serve()
    text = served.text if served.text is not None else f"hello from {fake_name}"
    deltas = tuple(re.findall(r"\s*\S+", text)) or (text,)
    return Reply(
        deltas,
        served.input_tokens,
        served.output_tokens or len(deltas),
        cached_read_tokens=served.cached_read_tokens,
        cached_write_tokens=served.cached_write_tokens,
        reasoning_tokens=served.reasoning_tokens,
    )


@dataclass(frozen=True)
class Event:
    name: str | None  # the SSE `event:` line; None for Chat Completions' bare `data:` lines
    data: JsonObject | str
    visible: bool = False  # shows output to the user (SPEC §6.2)


def _typed(name: str, visible: bool = False, **fields: Any) -> Event:
    return Event(name, {"type": name, **fields}, visible)


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Call:
    model: str
    body: JsonObject
    # A tool step's calls (name, input), answered instead of text (devkit.tool_steps).
    calls: tuple[tuple[str, JsonObject], ...] = ()

    def tool_calls(self, prefix: str) -> list[tuple[str, str, JsonObject]]:
        """(id, name, input) of each call, ids fresh for this answer."""
        return [(new_id(prefix)[: len(prefix) + 24], name, args) for name, args in self.calls]


class Api(Protocol):
    def json_body(self, reply: Reply) -> JsonObject: ...


class StreamingApi(Api, Protocol):
    sequenced: bool  # events carry `sequence_number`

    def events(self, reply: Reply) -> list[Event]: ...

    def after_visible_failure(self) -> list[Event]: ...

    def before_visible_failure(self, terminal: str) -> list[Event]:
        """`terminal` picks the Responses event that carries the error; other APIs have one shape."""
        ...


class Chat:
    sequenced = False

    def __init__(self, call: Call) -> None:
        self.call = call
        self.id = new_id("chatcmpl-")
        self.created = int(time.time())
        self.calls = call.tool_calls("call_")

    def _head(self, obj: str) -> JsonObject:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.call.model,
            "system_fingerprint": None,
        }

    @staticmethod
    def _usage(reply: Reply) -> JsonObject:
        total = reply.input_tokens + reply.output_tokens
        usage: JsonObject = {
            "prompt_tokens": reply.input_tokens,
            "completion_tokens": reply.output_tokens,
            "total_tokens": total,
        }
        if reply.cached_read_tokens or reply.cached_write_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": reply.cached_read_tokens}
            if reply.cached_write_tokens:  # as OpenRouter reports them
                usage["prompt_tokens_details"]["cache_write_tokens"] = reply.cached_write_tokens
        if reply.reasoning_tokens:
            usage["completion_tokens_details"] = {"reasoning_tokens": reply.reasoning_tokens}
        return usage

    def _finish(self, reply: Reply) -> str:
        return "content_filter" if reply.refused else "tool_calls" if self.calls else "stop"

    def json_body(self, reply: Reply) -> JsonObject:
        message: JsonObject = {
            "role": "assistant",
            "content": None if reply.refused or self.calls else reply.text,
            "refusal": None,
            "annotations": [],
        }
        if self.calls:
            message["tool_calls"] = [
                {"id": i, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                for i, name, args in self.calls
            ]
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": self._finish(reply)}
        return {**self._head("chat.completion"), "choices": [choice], "usage": self._usage(reply)}

    def events(self, reply: Reply) -> list[Event]:
        options = self.call.body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True

        def chunk(delta: JsonObject, finish: str | None = None, visible: bool = False) -> Event:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            data = {**self._head("chat.completion.chunk"), "choices": [choice]}
            if include_usage:
                data["usage"] = None
            return Event(None, data, visible)

        events = [chunk({"role": "assistant", "content": "", "refusal": None})]
        if self.calls:  # each call's head, then its arguments in pieces, as OpenAI streams them
            for n, (i, name, args) in enumerate(self.calls):
                head = {"index": n, "id": i, "type": "function", "function": {"name": name, "arguments": ""}}
                events.append(chunk({"tool_calls": [head]}, visible=True))
                text = json.dumps(args)  # in fragments of a few characters, never whole JSON
                events += [
                    chunk({"tool_calls": [{"index": n, "function": {"arguments": text[k : k + 7]}}]})
                    for k in range(0, len(text), 7)
                ]
        else:
            events += [chunk({"content": delta}, visible=True) for delta in reply.deltas]
        events.append(chunk({}, self._finish(reply)))
        if include_usage:
            events.append(
                Event(
                    None, {**self._head("chat.completion.chunk"), "choices": [], "usage": self._usage(reply)}
                )
            )
        return [*events, Event(None, "[DONE]")]

    def after_visible_failure(self) -> list[Event]:
        # Chat streams report a failure as a bare error object, and never send [DONE] after it.
        return [Event(None, {"error": openai_error(MID_STREAM_FAILURE)})]

    def before_visible_failure(self, terminal: str) -> list[Event]:
        error = MID_STREAM_FAILURE if terminal == "overloaded" else MODEL_NOT_FOUND
        return [Event(None, {"error": openai_error(error)})]


class Responses:
    sequenced = True

    def __init__(self, call: Call) -> None:
        self.call = call
        self.id = new_id("resp_")
        self.message_id = new_id("msg_")
        self.created_at = int(time.time())
        self.calls = call.tool_calls("call_")

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
    def _usage(reply: Reply) -> JsonObject:
        return {
            "input_tokens": reply.input_tokens,
            "input_tokens_details": {"cached_tokens": reply.cached_read_tokens},
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
    def _part(reply: Reply, *, empty: bool = False) -> JsonObject:
        if reply.refused:
            return {"type": "refusal", "refusal": "" if empty else _REFUSAL_TEXT}
        return {"type": "output_text", "text": "" if empty else reply.text, "annotations": [], "logprobs": []}

    def _function_call(self, call: tuple[str, str, JsonObject], status: str) -> JsonObject:
        call_id, name, args = call
        arguments = json.dumps(args) if status == "completed" else ""
        item = {"id": "fc_" + call_id.removeprefix("call_"), "type": "function_call", "status": status}
        return {**item, "call_id": call_id, "name": name, "arguments": arguments}

    def _final(self, reply: Reply) -> JsonObject:
        if self.calls and not reply.refused:  # a tool step: its calls are the whole output
            output = [self._function_call(call, "completed") for call in self.calls]
            return self._response("completed", output, usage=self._usage(reply))
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

    def json_body(self, reply: Reply) -> JsonObject:
        return self._final(reply)

    def _lifecycle(self) -> list[Event]:
        started = self._response("in_progress", [])
        return [
            _typed("response.created", response=started),
            _typed("response.in_progress", response=started),
        ]

    def _call_events(self, final: JsonObject) -> list[Event]:
        """A tool step's events: each call's item, then its arguments in pieces, as OpenAI streams them."""
        events = self._lifecycle()
        for n, call in enumerate(self.calls):
            done = final["output"][n]
            at = {"item_id": done["id"], "output_index": n}
            text = done["arguments"]
            events.append(
                _typed(
                    "response.output_item.added",
                    output_index=n,
                    item=self._function_call(call, "in_progress"),
                )
            )
            events += [
                _typed("response.function_call_arguments.delta", True, **at, delta=text[k : k + 7])
                for k in range(0, len(text), 7)
            ]
            events.append(_typed("response.function_call_arguments.done", **at, arguments=text))
            events.append(_typed("response.output_item.done", output_index=n, item=done))
        return [*events, _typed("response.completed", response=final)]

    def events(self, reply: Reply) -> list[Event]:
        final = self._final(reply)
        if self.calls and not reply.refused:
            return self._call_events(final)
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

    def after_visible_failure(self) -> list[Event]:
        return [_typed("error", error=openai_error(MID_STREAM_FAILURE))]

    def before_visible_failure(self, terminal: str) -> list[Event]:
        if terminal == "overloaded":
            return [_typed("error", error=openai_error(MID_STREAM_FAILURE))]
        if terminal == "error":
            return [_typed("error", error=openai_error(MODEL_NOT_FOUND))]
        failure = {"code": MODEL_NOT_FOUND.code, "message": MODEL_NOT_FOUND.message}
        return [_typed("response.failed", response=self._response("failed", [], error=failure))]


class Compact:
    def __init__(self, call: Call) -> None:
        self.call = call

    def json_body(self, reply: Reply) -> JsonObject:
        usage = {
            "input_tokens": reply.input_tokens,
            "output_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
        }
        item = {"type": "compaction", "id": new_id("cmp_"), "encrypted_content": new_id("enc_")}
        return {
            "id": new_id("resp_"),
            "object": "response.compaction",
            "created_at": int(time.time()),
            "model": self.call.model,
            "output": [item],
            "usage": usage,
        }


class Messages:
    sequenced = False

    def __init__(self, call: Call) -> None:
        self.call = call
        self.id = new_id("msg_")
        self.calls = call.tool_calls("toolu_")

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

    def _stop_reason(self, reply: Reply) -> str:
        return "refusal" if reply.refused else "tool_use" if self.calls else "end_turn"

    def tool_uses(self) -> list[JsonObject]:
        return [{"type": "tool_use", "id": i, "name": name, "input": args} for i, name, args in self.calls]

    def json_body(self, reply: Reply) -> JsonObject:
        content = [] if reply.refused else self.tool_uses() or [{"type": "text", "text": reply.text}]
        usage = {**reply.anthropic_usage, "output_tokens": reply.output_tokens}
        return self._message(content, self._stop_reason(reply), usage)

    def events(self, reply: Reply) -> list[Event]:
        start = self._message([], None, {**reply.anthropic_usage, "output_tokens": 1})
        # Anthropic's message_delta usage is cumulative and, with caching, repeats the input fields.
        cached = reply.cached_read_tokens or reply.cached_write_tokens
        final = {**(reply.anthropic_usage if cached else {}), "output_tokens": reply.output_tokens}
        events = [_typed("message_start", message=start)]
        if self.calls:
            return [*events, *self.tool_use_events(), *self._end(reply, final)]
        if not reply.refused:
            events.append(_typed("content_block_start", index=0, content_block={"type": "text", "text": ""}))
        events.append(_typed("ping"))
        if not reply.refused:
            events += [
                _typed("content_block_delta", True, index=0, delta={"type": "text_delta", "text": d})
                for d in reply.deltas
            ]
            events.append(_typed("content_block_stop", index=0))
        return [*events, *self._end(reply, final)]

    def tool_use_events(self) -> list[Event]:
        """Each tool_use block: its start with an empty input, the input as one JSON delta, its stop."""
        events = []
        for n, use in enumerate(self.tool_uses()):
            events.append(_typed("content_block_start", index=n, content_block={**use, "input": {}}))
            delta = {"type": "input_json_delta", "partial_json": json.dumps(use["input"])}
            events.append(_typed("content_block_delta", True, index=n, delta=delta))
            events.append(_typed("content_block_stop", index=n))
        return events

    def _end(self, reply: Reply, usage: JsonObject) -> list[Event]:
        delta = {"stop_reason": self._stop_reason(reply), "stop_sequence": None}
        return [_typed("message_delta", delta=delta, usage=usage), _typed("message_stop")]

    def after_visible_failure(self) -> list[Event]:
        return [_typed("error", error={"type": "overloaded_error", "message": "Overloaded"})]

    def before_visible_failure(self, terminal: str) -> list[Event]:
        if terminal == "overloaded":
            return [_typed("error", error={"type": "overloaded_error", "message": "Overloaded"})]
        # Anthropic has no error codes: its unknown-model error is a not_found_error naming the model.
        return [_typed("error", error={"type": "not_found_error", "message": f"model: {self.call.model}"})]


class CountTokens:
    def __init__(self, call: Call) -> None:
        self.call = call

    def json_body(self, reply: Reply) -> JsonObject:
        return {"input_tokens": reply.input_tokens}


class Embeddings:
    """OpenAI's embeddings: one vector per input (a string, a token array, or a list of either), as
    floats or, when `encoding_format` is "base64" (what the openai SDK asks for), as little-endian
    float32 bytes in base64."""

    DIMENSIONS = 8

    def __init__(self, call: Call) -> None:
        self.call = call

    def _inputs(self) -> list[Any]:
        value = self.call.body.get("input")
        if isinstance(value, list) and value and all(isinstance(v, str | list) for v in value):
            return value
        return [value]

    def _vector(self, item: Any) -> list[float]:
        digest = hashlib.sha256(json.dumps(item).encode()).digest()
        return [b / 255 for b in digest[: self.DIMENSIONS]]

    def json_body(self, reply: Reply) -> JsonObject:
        data = []
        for index, item in enumerate(self._inputs()):
            vector: Any = self._vector(item)
            if self.call.body.get("encoding_format") == "base64":
                vector = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": vector})
        usage = {"prompt_tokens": reply.input_tokens, "total_tokens": reply.input_tokens}
        return {"object": "list", "data": data, "model": self.call.model, "usage": usage}


class ModelList:
    def __init__(self, models: tuple[str, ...], owned_by: str) -> None:
        self.models = models
        self.owned_by = owned_by

    def json_body(self, reply: Reply) -> JsonObject:
        data = [
            {"id": model, "object": "model", "created": 0, "owned_by": self.owned_by} for model in self.models
        ]
        return {"object": "list", "data": data}


def _through_first_visible(events: list[Event]) -> list[Event]:
    first = next(i for i, event in enumerate(events) if event.visible)
    return events[: first + 1]


def _before_first_visible(events: list[Event]) -> list[Event]:
    first = next(i for i, event in enumerate(events) if event.visible)
    return events[:first]


def stream_plan(api: StreamingApi, behaviour: Behaviour, fake_name: str) -> tuple[list[Event], bool]:
    """The events a streaming behaviour sends, and whether the connection is dropped after them."""
    events = api.events(reply_for(behaviour, fake_name))
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


def _numbered(api: StreamingApi, events: list[Event]) -> list[Event]:
    # Numbered last, so a failure appended to a prefix continues the prefix's numbering.
    if not api.sequenced:
        return events
    return [replace(e, data={**cast(JsonObject, e.data), "sequence_number": n}) for n, e in enumerate(events)]


def sse_bytes(event: Event) -> bytes:
    data = event.data if isinstance(event.data, str) else json.dumps(event.data)
    head = f"event: {event.name}\n" if event.name else ""
    return f"{head}data: {data}\n\n".encode()
