"""Server-sent-event framing for the SSE transport (SPEC §6.2): parse, classify, withhold, encode.

PURE: standard library only, no I/O, no clock. The relay feeds it bytes and blocks and carries out
its decisions.

Contract:

- `SSEParser.feed(chunk)` takes upstream bytes split anywhere (inside a UTF-8 sequence, between
  `\\r` and `\\n`) and returns the complete blocks, in order. A block is everything up to and including
  the blank line that ends it; `Block.raw` is those exact bytes, so relaying `raw` relays the upstream
  unchanged, and the concatenation of every block's `raw` (including `flush()`'s) is the input.
  Blank lines before a block's first line (stray extra blank lines) belong to that block's `raw`.
  Fields follow the WHATWG EventSource rules: `\\n`, `\\r\\n` and `\\r` end lines, a line starting
  with `:` is a comment, one space after `field:` is dropped, `data` lines join with `\\n`, a leading
  BOM is ignored. Any split of the same bytes yields the same blocks with the same `raw`.
- `SSEParser.flush()` at EOF returns the last block if the stream did not end with a blank line
  (`Block.terminated` is False: an EventSource would not dispatch it; the caller decides).
- A block over `max_block_bytes` raises `SSEBlockTooLarge` as soon as its size is known to exceed
  the limit, complete or not: an upstream cannot make the gateway buffer without bound.
- `classify(block, rule)` says whether a block shows anything to the user or agent (`Visibility`):
  the cases every stream shares are decided here (no data, `[DONE]`, not a JSON object), the rest by
  `rule`, the visibility rule of the client API the stream is framed in (`proxy.wire.apis`; by `Dialect`:
  `proxy.wire.apis.registry.classify`). When unsure a rule says VISIBLE: a block wrongly called visible only
  ends withholding early, while a block wrongly withheld could be retried away and the output shown
  twice or lost. A terminal failure carries the upstream error's canonical fields (`StreamError`),
  never its message.
- `Withholder` is the §6.2 state machine: withhold leading non-visible blocks (at most `limit`),
  release them in order with the first visible block (or the `limit + 1`-th block), pass the rest
  through, and report terminal failures as pre- or post-visible. Every block fed to it is handed back
  at most once, in feed order: in a RELEASE/PASS decision, or through `withheld()`. The upstream's
  own error block is never handed back (its message must not reach the client).
- `encode_block` builds the gateway's own blocks (each client API frames its error event with it:
  `proxy.wire.apis`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

# SPEC §6.2: at most 32 leading blocks are withheld.
WITHHOLD_LIMIT = 32
# Real LLM events are a few KiB; a 1 MiB block is an upstream bug or an attack, not output.
MAX_BLOCK_BYTES = 1024 * 1024

_CR = 0x0D
_LF = 0x0A
_BOM = b"\xef\xbb\xbf"
_EOL = re.compile(rb"[\r\n]")
_NEWLINES = re.compile(r"\r\n|\r|\n")
_DONE = "[DONE]"


# ---------------------------------------------------------------------------------------------------
# Errors


class SSEProtocolError(Exception):
    """The upstream's byte stream is not a usable SSE stream."""


class SSEBlockTooLarge(SSEProtocolError):
    """One block exceeds the parser's limit; the stream cannot be relayed safely."""

    def __init__(self, *, size: int, limit: int) -> None:
        super().__init__(f"SSE block of at least {size} bytes exceeds the {limit}-byte limit")
        self.size = size
        self.limit = limit


class WithholderClosedError(RuntimeError):
    """A block was fed after the stream's outcome was settled (a caller bug, not an upstream one)."""


# ---------------------------------------------------------------------------------------------------
# Parsing


@dataclass(frozen=True, slots=True)
class Block:
    """One SSE block: its exact bytes and the fields an EventSource would see."""

    raw: bytes
    event: str | None  # the last non-empty `event:` value; None means the default ("message")
    data: str | None  # `data:` lines joined with "\n"; None when the block has no data line
    comment_only: bool  # at least one comment line and no field line (`: keep-alive`)
    terminated: bool = True  # False only for flush()'s block: EOF came before its blank line


class SSEParser:
    """Incremental SSE parser; one per upstream response. Discard it after an `SSEProtocolError`."""

    def __init__(self, *, max_block_bytes: int = MAX_BLOCK_BYTES) -> None:
        if max_block_bytes < 1:
            raise ValueError("max_block_bytes must be positive")
        self._limit = max_block_bytes
        # Bytes of the current, not yet complete block (plus at most one held-back CR).
        self._buf = bytearray()
        self._line_start = 0  # offset of the first line not yet parsed
        self._search_from = 0  # where to look for the next line end; avoids rescanning long lines
        self._at_stream_start = True
        self._reset_fields()

    def _reset_fields(self) -> None:
        self._event: str | None = None
        self._data: list[str] | None = None
        self._comments = 0
        self._fields = 0

    def feed(self, chunk: bytes) -> list[Block]:
        """The blocks completed by `chunk`, in stream order."""
        buf = self._buf
        buf += chunk
        blocks: list[Block] = []
        block_start = 0
        while (match := _EOL.search(buf, self._search_from)) is not None:
            end = match.start()
            if buf[end] == _CR:
                if end + 1 == len(buf):
                    # A CR at the end of what has arrived may be the first half of a CRLF. Holding it
                    # until the next byte (or flush) keeps `raw` independent of where TCP split the
                    # stream; dispatching now would leak the LF into the next block's bytes.
                    self._search_from = end
                    break
                after = end + 2 if buf[end + 1] == _LF else end + 1
            else:
                after = end + 1
            line = bytes(buf[self._line_start : end])
            self._line_start = self._search_from = after
            if self._take_line(line):
                blocks.append(self._dispatch(bytes(buf[block_start:after]), terminated=True))
                block_start = after
        else:  # no line end left: the next feed searches only the new bytes
            self._search_from = len(buf)
        # One compaction per feed, not per block: a chunk holding many blocks stays linear.
        del buf[:block_start]
        self._line_start -= block_start
        self._search_from -= block_start
        if len(buf) > self._limit:
            self._fail(len(buf))
        return blocks

    def flush(self) -> Block | None:
        """At EOF: the remaining bytes as a final block, or None when nothing remains.

        The parser is empty afterwards and may be reused for a new stream.
        """
        buf = self._buf
        tail = bytes(buf[self._line_start :])
        dispatched = False
        if tail:
            # Whatever is left holds at most one line end: a held-back CR as its last byte.
            line = tail[:-1] if tail[-1] == _CR else tail
            dispatched = self._take_line(line)
        block = None
        if buf:
            block = self._dispatch(bytes(buf), terminated=dispatched)
        self._buf = bytearray()
        self._line_start = self._search_from = 0
        self._at_stream_start = True
        self._reset_fields()
        return block

    def _take_line(self, line: bytes) -> bool:
        """Apply one line to the current block; True when it is the blank line that ends the block."""
        if self._at_stream_start:
            self._at_stream_start = False
            if line.startswith(_BOM):
                line = line[len(_BOM) :]
        if not line:
            # A blank line before any field is a stray separator, not an empty event.
            return self._comments + self._fields > 0
        # LF and CR are ASCII and never occur inside a UTF-8 sequence, so a complete line is always a
        # complete UTF-8 string; invalid bytes become U+FFFD as in EventSource (`raw` keeps them).
        text = line.decode("utf-8", errors="replace")
        if text.startswith(":"):
            self._comments += 1
            return False
        self._fields += 1
        name, colon, value = text.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            if self._data is None:
                self._data = []
            self._data.append(value)
        elif name == "event":
            self._event = value or None
        # `id`, `retry` and unknown fields do not affect classification; `raw` carries them on.
        return False

    def _dispatch(self, raw: bytes, *, terminated: bool) -> Block:
        if len(raw) > self._limit:
            self._fail(len(raw))
        block = Block(
            raw=raw,
            event=self._event,
            data=None if self._data is None else "\n".join(self._data),
            comment_only=self._comments > 0 and self._fields == 0,
            terminated=terminated,
        )
        self._reset_fields()
        return block

    def _fail(self, size: int) -> None:
        # Drop the buffer at once: the point of the limit is to stop holding the bytes.
        self._buf = bytearray()
        self._line_start = self._search_from = 0
        self._reset_fields()
        raise SSEBlockTooLarge(size=size, limit=self._limit)


# ---------------------------------------------------------------------------------------------------
# Visibility


class Dialect(StrEnum):
    CHAT = "chat"  # OpenAI Chat Completions chunks
    RESPONSES = "responses"  # OpenAI Responses events
    ANTHROPIC = "anthropic"  # Anthropic Messages events


class Visibility(StrEnum):
    NOT_VISIBLE = "not_visible"  # lifecycle or keep-alive: nothing reaches the user or agent
    VISIBLE = "visible"  # output, or anything not known to be lifecycle
    TERMINAL_SUCCESS = "terminal_success"  # the response ended without an error; relay, never retry
    TERMINAL_FAILURE = "terminal_failure"  # the upstream reported an error; `Classification.error`


@dataclass(frozen=True, slots=True)
class StreamError:
    """The canonical fields of an in-stream upstream error. The provider's message is deliberately
    absent: SPEC §4 forbids relaying, storing or logging it, and nothing classifies on it."""

    type: str | None = None
    code: str | None = None
    param: str | None = None
    status: int | None = None  # the HTTP status an `error` event says it stands for (websocket mode)


@dataclass(frozen=True, slots=True)
class Classification:
    visibility: Visibility
    error: StreamError | None = None  # TERMINAL_FAILURE only; None when the event carried no error object
    # The parsed JSON data (None when absent or not JSON), so the relay can read ids and usage without
    # parsing again. Excluded from equality and repr: it is the upstream's content.
    payload: Any = field(default=None, compare=False, repr=False)


# Where an error object may sit in an event, in SPEC §5.6's fixed lookup order.
_ERROR_PATHS = (("response", "error"), ("error",), ("status_details", "error"))

# A client API's visibility rule for one JSON-object event (`proxy.wire.apis`): the generic cases (no data,
# `[DONE]`, not JSON, not an object) are decided here before it is asked.
VisibilityRule = Callable[[Block, dict[str, Any]], Visibility]


def classify(block: Block, rule: VisibilityRule) -> Classification:
    """How `block` counts for withholding, `rule` being its stream's client API's (module docstring)."""
    if block.data is None:
        # Comments, and blocks with no data line: an EventSource dispatches nothing for them. An
        # explicit `event: error` still ends the stream, even without a body to classify.
        if block.event == "error":
            return Classification(Visibility.TERMINAL_FAILURE)
        return Classification(Visibility.NOT_VISIBLE)
    if block.data.strip() == _DONE:
        # Chat's terminator; some upstreams also end Responses/Messages streams with it.
        return Classification(Visibility.TERMINAL_SUCCESS)
    try:
        payload = json.loads(block.data)
    except (ValueError, RecursionError):
        # Not JSON in a JSON dialect: relay it rather than guess what it means.
        return Classification(Visibility.VISIBLE)
    if not isinstance(payload, dict):
        return Classification(Visibility.VISIBLE, payload=payload)
    visibility = rule(block, payload)
    error = _stream_error(payload) if visibility is Visibility.TERMINAL_FAILURE else None
    return Classification(visibility, error=error, payload=payload)


# The shared vocabulary of the visibility rules.


def event_kind(block: Block, payload: Mapping[str, Any]) -> str | None:
    """An event's kind: the data's `type`, which SDKs dispatch on; the SSE event name is the fallback."""
    kind = payload.get("type")
    return kind if isinstance(kind, str) else block.event


def blank(value: object) -> bool:
    return value is None or (isinstance(value, str | list | dict) and len(value) == 0)


def fields_blank(obj: Mapping[str, Any], *, ignore: tuple[str, ...] = ()) -> bool:
    return all(blank(value) for key, value in obj.items() if key not in ignore)


def part_blank(part: object) -> bool:
    """Whether a content part shows nothing: {"type": "output_text", "text": "", "annotations": []}
    announces a part; a number, bool or any non-empty field might be shown, so it is not blank."""
    return isinstance(part, dict) and fields_blank(part, ignore=("type",))


def parts_blank(parts: object) -> bool:
    return blank(parts) or (isinstance(parts, list) and all(part_blank(part) for part in parts))


def _stream_error(payload: Mapping[str, Any]) -> StreamError | None:
    status = payload.get("status")
    status = status if isinstance(status, int) and not isinstance(status, bool) else None
    for path in _ERROR_PATHS:
        found: object = payload
        for key in path:
            found = found.get(key) if isinstance(found, Mapping) else None
        if isinstance(found, Mapping):
            return StreamError(
                type=_str_or_none(found.get("type")),
                code=_str_or_none(found.get("code")),
                param=_str_or_none(found.get("param")),
                status=status,
            )
    if payload.get("type") == "error":
        # The documented flat Responses shape, {"type": "error", "code", "message", "param"}: the
        # top-level `type` names the event, not the error, so the error type is unknown.
        return StreamError(
            code=_str_or_none(payload.get("code")), param=_str_or_none(payload.get("param")), status=status
        )
    return None


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


# ---------------------------------------------------------------------------------------------------
# Withholding (SPEC §6.2)


class Action(StrEnum):
    WITHHOLD = "withhold"  # keep the block; write nothing
    RELEASE = "release"  # write `Decision.write` (withheld blocks, then this one); from now on PASS
    PASS = "pass"  # write this block now
    PRE_VISIBLE_FAILURE = "pre_visible_failure"  # nothing was written: the next candidate may be tried
    POST_VISIBLE_FAILURE = "post_visible_failure"  # output was written: relay a sanitized event, no retry


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    write: tuple[Block, ...] = ()  # to write to the client now, in this order
    error: StreamError | None = None  # the failure's canonical fields, for the two failure actions


class Withholder:
    """Withholds the leading non-visible blocks of one upstream attempt; one instance per attempt."""

    def __init__(self, *, limit: int = WITHHOLD_LIMIT) -> None:
        if limit < 0:
            raise ValueError("limit must not be negative")
        self._limit = limit
        self._buffer: list[Block] = []
        self._released = False
        self._closed = False

    @property
    def released(self) -> bool:
        """Whether any block of this attempt has been handed to the client (retrying is now forbidden)."""
        return self._released

    def feed(self, block: Block, classification: Classification) -> Decision:
        if self._closed:
            raise WithholderClosedError("the attempt's outcome is settled; stop reading its stream")
        visibility = classification.visibility
        if visibility is Visibility.TERMINAL_FAILURE:
            # The upstream's error block is never written: its message must not reach the client.
            self._closed = True
            action = Action.POST_VISIBLE_FAILURE if self._released else Action.PRE_VISIBLE_FAILURE
            return Decision(action, error=classification.error)
        if self._released:
            return Decision(Action.PASS, (block,))
        if visibility is Visibility.NOT_VISIBLE and len(self._buffer) < self._limit:
            self._buffer.append(block)
            return Decision(Action.WITHHOLD)
        # First visible block, a terminal success, or one block past the limit: past the limit the
        # client has waited long enough, so the stream is committed even though nothing showed yet.
        released_blocks = (*self._buffer, block)
        self._buffer = []
        self._released = True
        return Decision(Action.RELEASE, released_blocks)

    def withheld(self) -> tuple[Block, ...]:
        """Hand over the blocks still withheld, in order, and settle the attempt.

        For the exhausted plan (SPEC §6.2) after a pre-visible failure, a transport error or an early
        EOF. The blocks come out exactly once: a second call, or a call after release, returns `()`,
        and the Withholder accepts no more blocks, so nothing can be written twice.
        """
        blocks = tuple(self._buffer)
        self._buffer = []
        if not self._released:
            self._closed = True
        return blocks


# ---------------------------------------------------------------------------------------------------
# Encoding the gateway's own blocks


def encode_block(event: str | None, data_json: str) -> bytes:
    """One SSE block; `data_json` is already serialized (or a sentinel such as `[DONE]`).

    Line breaks inside `data_json` become separate `data:` lines, so the parser gives back the same
    string (with `\\n` line breaks).
    """
    if event is not None and ("\r" in event or "\n" in event):
        # A line break in the event name would let it inject fields or end the block early.
        raise ValueError("an SSE event name cannot contain a line break")
    head = f"event: {event}\n" if event is not None else ""
    lines = "".join(f"data: {line}\n" for line in _NEWLINES.split(data_json))
    return f"{head}{lines}\n".encode()


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
