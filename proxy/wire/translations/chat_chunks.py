"""Reading a Chat Completions stream for a translator into another API: the one loop over Chat chunks
that `proxy.wire.translations.messages_over_chat.ChatToAnthropicStream` (Anthropic Messages events) and
`proxy.wire.translations.responses_over_chat_stream.ChatToResponsesStream` (Responses events) share; each says
only what every part of the stream becomes in its API.

PURE: standard library and `proxy.wire.sse` only, no I/O, no clock. The stream contract (never raise on
upstream content, close only on the upstream's own terminator) is `proxy.wire.translations.translate`'s.

How a Chat stream is read: the first chunk opens the answer (`_opening`, with the chunk's id); the
first choice's deltas give text (`content`, `refusal`) and tool-call fragments, in order; its finish
reason closes what is open (`_closing`), and nothing of the choice is read after it (Chat ends a
choice there; the request translations never ask for more than one). Usage, sent after the finish
reason when asked, is kept. `[DONE]`, or `finish()` at EOF once the finish reason came, ends the answer
(`_ending`, where the finish reason and usage are both known); a stream cut before then ends with
nothing and `ended` False, so the caller sends its own error event instead of a counterfeit success.
Error chunks and data that is not a JSON object produce nothing; an SSE comment becomes one keep-alive.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from proxy.wire.sse import Block
from proxy.wire.translations.translate import _DONE, _KEEP_ALIVE, _payload


class ChatChunkReader(ABC):
    """Chat Completions chunks in, another API's events out. One per upstream response."""

    def __init__(self) -> None:
        self._started = False
        self._ended = False
        self._finish: str | None = None  # the first choice's finish reason, once it came
        self._usage: Mapping[str, Any] | None = None

    @property
    def ended(self) -> bool:
        """Whether the closing events have been emitted: the client saw a complete answer."""
        return self._ended

    def feed(self, block: Block) -> bytes:
        if self._ended:
            return b""
        if block.data is None:
            return _KEEP_ALIVE if block.comment_only else b""
        if block.data.strip() == _DONE:
            return self._end()
        payload = _payload(block)
        if payload is None or "error" in payload:
            return b""
        out = bytearray(self._start(payload.get("id")))
        if isinstance(payload.get("usage"), Mapping):
            self._usage = payload["usage"]
        choices = payload.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0 or self._finish is not None:
                continue
            delta = choice.get("delta")
            delta = delta if isinstance(delta, Mapping) else {}
            for kind in ("content", "refusal"):
                if isinstance(delta.get(kind), str) and delta[kind]:
                    out += self._text(kind, delta[kind])
            calls = delta.get("tool_calls")
            for call in calls if isinstance(calls, list) else []:
                if isinstance(call, Mapping):
                    out += self._tool(call)
            if isinstance(choice.get("finish_reason"), str):
                self._finish = choice["finish_reason"]
                out += self._closing()
        return bytes(out)

    def finish(self) -> bytes:
        """At upstream EOF: the closing events if the upstream said how the answer ended, else b""."""
        if self._ended or self._finish is None:
            return b""
        return self._end()

    def _start(self, chunk_id: object) -> bytes:
        if self._started:
            return b""
        self._started = True
        return self._opening(chunk_id)

    def _end(self) -> bytes:
        # What is open was closed at the finish reason; a `[DONE]` without one closes it here.
        out = self._start(None) + (self._closing() if self._finish is None else b"") + self._ending()
        self._ended = True
        return out

    @abstractmethod
    def _opening(self, chunk_id: object) -> bytes:
        """The answer's opening events; `chunk_id`: the first chunk's `id` (None: no chunk came)."""

    @abstractmethod
    def _text(self, kind: str, text: str) -> bytes:
        """A fragment of the answer's text: `kind` is the delta's field, `content` or `refusal`."""

    @abstractmethod
    def _tool(self, call: Mapping[str, Any]) -> bytes:
        """One `tool_calls` entry of a delta: a new call (by its `index`) or a fragment of one."""

    @abstractmethod
    def _closing(self) -> bytes:
        """Close whatever is open: the choice ended (the reader calls it once)."""

    @abstractmethod
    def _ending(self) -> bytes:
        """The answer's closing events, with `_finish` (None: never said) and `_usage` known."""
