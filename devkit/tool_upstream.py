"""A fake Anthropic Messages account that works through a tool turn, on a real loopback socket, for the
Responses bridge's end-to-end tests (a bridged conversation with tool calls).

- `POST /v1/messages`, plain JSON or SSE (`"stream": true`), in Anthropic's real event sequence
  (`message_start`, `content_block_start` / `_delta` / `_stop`, `message_delta`, `message_stop`), with
  usage; it refuses a request without `anthropic-version` or `max_tokens`, as Anthropic does.
- It answers from what it received: when tools are offered and the last user turn holds no
  `tool_result`, it calls the first tool (`tool_use`, input `{"path": "notes.txt"}`, stop reason
  `tool_use`, the input streamed as `input_json_delta` fragments); after a tool result it answers
  `done: <the result's text>` (`end_turn`); without tools, `hello`.
- `POST /v1/chat/completions` streams `hello` as Chat chunks and a `stop` finish, and ends without
  `[DONE]` when `chat_done` is False, as some OpenAI-compatible servers do.
- A plain answer is gzip-compressed when the request offers it, as Anthropic's front end does.
- Every request body is recorded in `hits`.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from aiohttp import web

from devkit.threaded_app import ThreadedApp, gzip_when_offered

TOOL_INPUT = {"path": "notes.txt"}


def _last_tool_result(body: dict[str, Any]) -> str | None:
    """The text of the tool result in the last user turn, if it holds one."""
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    content = last.get("content") if last.get("role") == "user" else None
    for block in content if isinstance(content, list) else []:
        if block.get("type") == "tool_result":
            inner = block.get("content", "")
            if isinstance(inner, list):
                inner = "".join(part.get("text", "") for part in inner)
            return str(inner)
    return None


def _sse(kind: str, **fields: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()


class ToolUpstream(ThreadedApp):
    thread_name = "tool-upstream"

    def __init__(self, *, models: tuple[str, ...] = ("claude-test",), chat_done: bool = True) -> None:
        self.models = models
        self.chat_done = chat_done
        self.hits: list[dict[str, Any]] = []
        super().__init__()

    def application(self) -> web.Application:
        app = web.Application(middlewares=[gzip_when_offered])
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    @staticmethod
    def _error(status: int, kind: str, message: str) -> web.Response:
        return web.json_response(
            {"type": "error", "error": {"type": kind, "message": message}}, status=status
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.hits.append(body)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        head = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
            "object": "chat.completion.chunk",
            "model": body["model"],
        }
        for delta, finish in (
            ({"role": "assistant", "content": ""}, None),
            ({"content": "hello"}, None),
            ({}, "stop"),
        ):
            chunk = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if self.chat_done:
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.hits.append(body)
        if "anthropic-version" not in request.headers:
            return self._error(400, "invalid_request_error", "anthropic-version: header is required")
        if not isinstance(body.get("max_tokens"), int):
            return self._error(400, "invalid_request_error", "max_tokens: Field required")
        if body.get("model") not in self.models:
            return self._error(404, "not_found_error", f"model: {body.get('model')}")
        result = _last_tool_result(body)
        tools = body.get("tools") or []
        call = tools[0]["name"] if tools and result is None else None
        text = "hello" if not tools else f"done: {result}" if call is None else ""
        message_id = f"msg_{uuid.uuid4().hex[:16]}"
        tool_id = f"toolu_{uuid.uuid4().hex[:12]}"
        usage = {"input_tokens": 20, "output_tokens": 7}
        stop = "tool_use" if call else "end_turn"
        if not body.get("stream"):
            content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
            if call:
                content.append({"type": "tool_use", "id": tool_id, "name": call, "input": TOOL_INPUT})
            answer = {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": body["model"],
                "content": content,
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": usage,
            }
            return web.json_response(answer)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        start = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 20, "output_tokens": 1},
        }
        events = [_sse("message_start", message=start)]
        if text:
            events += [
                _sse("content_block_start", index=0, content_block={"type": "text", "text": ""}),
                _sse("content_block_delta", index=0, delta={"type": "text_delta", "text": text}),
                _sse("content_block_stop", index=0),
            ]
        if call:
            arguments = json.dumps(TOOL_INPUT)
            block = {"type": "tool_use", "id": tool_id, "name": call, "input": {}}
            events.append(_sse("content_block_start", index=0, content_block=block))
            for fragment in (arguments[:5], arguments[5:]):
                delta = {"type": "input_json_delta", "partial_json": fragment}
                events.append(_sse("content_block_delta", index=0, delta=delta))
            events.append(_sse("content_block_stop", index=0))
        events += [
            _sse(
                "message_delta",
                delta={"stop_reason": stop, "stop_sequence": None},
                usage={"output_tokens": 7},
            ),
            _sse("message_stop"),
        ]
        for event in events:
            await response.write(event)
        await response.write_eof()
        return response
