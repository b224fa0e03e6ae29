"""An OpenAI Responses client on a Chat Completions upstream: the Chat stream as the Responses event
sequence (`response.created`, `response.in_progress`, `response.output_item.added`,
`response.content_part.added`, `response.output_text.delta` ... `response.completed`), each event with its
`sequence_number`.

PURE: standard library and `proxy.wire.sse` only, no I/O, no clock. The decisions (statuses, ids, usage) are
`proxy.wire.translations.responses_over_chat`'s, the pieces shared with the whole answer (usage, status,
items) `proxy.wire.translations.responses_over_chat_answer`'s; the stream contract (never raise on upstream
content, close only on the upstream's own terminator) is `proxy.wire.translations.translate`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.wire.sse import encode_block
from proxy.wire.translations.chat_chunks import ChatChunkReader
from proxy.wire.translations.responses_over_chat_answer import (
    _function_item,
    _message_item,
    _response,
    _status,
    _text_part,
    _usage,
)
from proxy.wire.translations.translate import _json


class ChatToResponsesStream(ChatChunkReader):
    """Chat Completions chunks in, Responses events out (each with its `sequence_number`; read by
    `ChatChunkReader`). One per upstream response.

    The first chunk opens the response (`response.created`, `response.in_progress`); text opens a
    message item and its part, each tool call a `function_call` item. Chat sends the finish reason,
    then (when asked) usage, then `[DONE]`: the finish reason closes every open item at once, and
    `response.completed` (or `response.incomplete`) waits for `[DONE]` (or `finish()` at EOF), where
    the usage is known.
    """

    def __init__(
        self,
        *,
        model: str,
        echoed: Mapping[str, Any],
        created: int,
        response_id: str,
        names: Mapping[str, tuple[str, str]],
    ) -> None:
        super().__init__()
        self._model = model
        self._echoed = echoed
        self._names = names  # `namespaced(request)`: a namespaced call's name as the client declared it
        self._created = created  # every snapshot's `created_at` (Unix seconds)
        self._sequence = 0
        self._id = response_id  # the gateway's, whatever ids the chunks carry
        self._output: list[dict[str, Any]] = []
        self._message: int | None = None  # the output index of the open message item
        # The open part's kind (the Chat delta's field: `content` or `refusal`) and content index.
        self._part: tuple[str, int] | None = None
        self._tools: dict[int, int] = {}  # Chat tool-call index -> output index

    @property
    def response_id(self) -> str | None:
        """The id of the response the client is shown (known from the first chunk on)."""
        return self._id if self._started else None

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return encode_block(kind, _json(payload))

    def _snapshot(self, status: str, **fields: Any) -> dict[str, Any]:
        return _response(self._id, self._model, self._created, status, self._echoed, **fields)

    def _opening(self, chunk_id: object) -> bytes:
        started = self._snapshot("in_progress")
        return self._event("response.created", response=started) + self._event(
            "response.in_progress", response=started
        )

    def _text(self, kind: str, text: str) -> bytes:
        out = b""
        if self._message is None:
            self._message = len(self._output)
            item = _message_item(self._id, "in_progress", [])
            self._output.append(item)
            out += self._event("response.output_item.added", output_index=self._message, item=dict(item))
        item = self._output[self._message]
        if self._part is not None and self._part[0] != kind:
            out += self._close_part()
        at = {"item_id": item["id"], "output_index": self._message}
        if self._part is None:
            self._part = (kind, len(item["content"]))
            empty = _text_part("") if kind == "content" else {"type": "refusal", "refusal": ""}
            item["content"].append(empty)
            out += self._event(
                "response.content_part.added", **at, content_index=self._part[1], part=dict(empty)
            )
        part = item["content"][self._part[1]]
        at["content_index"] = self._part[1]
        if kind == "content":
            part["text"] += text
            return out + self._event("response.output_text.delta", **at, delta=text, logprobs=[])
        part["refusal"] += text
        return out + self._event("response.refusal.delta", **at, delta=text)

    def _close_part(self) -> bytes:
        if self._part is None or self._message is None:
            return b""
        kind, index = self._part
        self._part = None
        item = self._output[self._message]
        part = item["content"][index]
        at = {"item_id": item["id"], "output_index": self._message, "content_index": index}
        if kind == "content":
            done = self._event("response.output_text.done", **at, text=part["text"], logprobs=[])
        else:
            done = self._event("response.refusal.done", **at, refusal=part["refusal"])
        return done + self._event("response.content_part.done", **at, part=dict(part))

    def _close_message(self, status: str) -> bytes:
        if self._message is None:
            return b""
        out = self._close_part()
        index, self._message = self._message, None
        self._output[index]["status"] = status
        return out + self._event("response.output_item.done", output_index=index, item=self._output[index])

    def _tool(self, call: Mapping[str, Any]) -> bytes:
        position = call.get("index", 0)
        position = position if isinstance(position, int) else 0
        function = call.get("function")
        function = function if isinstance(function, Mapping) else {}
        out = b""
        if position not in self._tools:
            out += self._close_message("completed")
            given, named = call.get("id"), function.get("name")
            call_id = given if isinstance(given, str) and given else f"call_{position}"
            name = named if isinstance(named, str) else ""
            self._tools[position] = len(self._output)
            item = _function_item(call_id, name, "", "in_progress", self._names)
            self._output.append(item)
            out += self._event(
                "response.output_item.added", output_index=self._tools[position], item=dict(item)
            )
        index = self._tools[position]
        item = self._output[index]
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            # Fragments go to their call's item even if another item opened since (SDKs accumulate by
            # output index).
            item["arguments"] += arguments
            out += self._event(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=index,
                delta=arguments,
            )
        return out

    def _closing(self) -> bytes:
        status = "completed" if _status(self._finish)[0] == "completed" else "incomplete"
        out = self._close_message(status)
        for index in self._tools.values():
            item = self._output[index]
            item["status"] = "completed"
            out += self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=item["arguments"],
            )
            out += self._event("response.output_item.done", output_index=index, item=item)
        return out

    def _ending(self) -> bytes:
        status, details = _status(self._finish)
        final = self._snapshot(
            status, output=self._output, incomplete_details=details, usage=_usage(self._usage)
        )
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return self._event(kind, response=final)
