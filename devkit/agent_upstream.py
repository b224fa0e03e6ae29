"""A tiny deterministic agent model on a real loopback socket, for driving the real coding-agent CLIs
(Claude Code, Codex CLI, OpenCode) through the gateway in tests/agents/.

It speaks what those clients' accounts speak: OpenAI Chat Completions and Responses (plain, SSE and the
Responses websocket mode, `GET /v1/responses`) and Anthropic Messages (plain and SSE), and lists its
models (`GET /v1/models`). Each answer is decided from the request alone, so any account in a pool and
any transport answers a conversation alike:

- a conversation that offers a shell tool (`SHELL_TOOLS`) and holds no tool result yet: a call of
  that tool running `COMMAND` (it creates `PROOF_FILE` in the client's working directory);
- anything else (after the tool's result, or a request without that tool, e.g. a title): `MARKER`.

A websocket `response.create` frame with `generate: false` (a prewarm) gets `response.created` and
`response.completed` with no output, as OpenAI answers it. `failing=STATUS` makes every request fail
with that status in the route's error envelope (503 `unavailable`, 404 `model_not_found`), as a
preferred account that is down or lost the model. Every request is recorded in `hits`
(path, transport, body).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from aiohttp import WSMsgType, web

from devkit.threaded_app import ThreadedApp

MARKER = "AGENT-MARKER-5f1c9e"
PROOF_FILE = "agent-proof.txt"
COMMAND = f"echo agent-ok > {PROOF_FILE}"
# The shell tool of each client, and the argument that takes the command line.
SHELL_TOOLS = {"Bash": "command", "bash": "command", "exec_command": "cmd", "shell": "command"}
_FAILURES = {
    503: ("unavailable", "server_error", "overloaded_error", "The account is unavailable."),
    404: ("model_not_found", "invalid_request_error", "not_found_error", "The model does not exist."),
}
_USAGE_IN, _USAGE_OUT = 30, 9


def _shell_tool(tools: object) -> str | None:
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        if function.get("name") in SHELL_TOOLS:
            return str(function["name"])
    return None


def _arguments(tool: str) -> dict[str, Any]:
    arguments: dict[str, Any] = {SHELL_TOOLS[tool]: COMMAND}
    if tool in ("Bash", "bash"):
        arguments["description"] = "Create the proof file"
    return arguments


def _chat_has_result(body: dict[str, Any]) -> bool:
    return any(m.get("role") == "tool" for m in body.get("messages") or [] if isinstance(m, dict))


def _messages_has_result(body: dict[str, Any]) -> bool:
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content
        ):
            return True
    return False


def _responses_has_result(body: dict[str, Any]) -> bool:
    items = body.get("input")
    return isinstance(items, list) and any(
        isinstance(i, dict) and i.get("type") in ("function_call_output", "custom_tool_call_output")
        for i in items
    )


def _sse(event: str | None, payload: dict[str, Any]) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(payload)}\n\n".encode()


class AgentUpstream(ThreadedApp):
    thread_name = "agent-upstream"

    def __init__(self, *, failing: int | None = None) -> None:
        super().__init__()
        self.failing = failing
        self.hits: list[tuple[str, str, dict[str, Any]]] = []

    def application(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/responses", self._websocket)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_get("/v1/models", self._models)
        return app

    def _failure(self, *, anthropic: bool) -> web.Response:
        assert self.failing is not None
        code, kind, anthropic_kind, message = _FAILURES[self.failing]
        if anthropic:
            body: dict[str, Any] = {"type": "error", "error": {"type": anthropic_kind, "message": message}}
        else:
            body = {"error": {"message": message, "type": kind, "code": code, "param": None}}
        return web.json_response(body, status=self.failing)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})

    async def _body(self, request: web.Request, transport: str) -> dict[str, Any]:
        body = await request.json()
        self.hits.append((request.path, transport if body.get("stream") else "http", body))
        return body

    # -- Chat Completions ---------------------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request, "sse")
        if self.failing:
            return self._failure(anthropic=False)
        tool = None if _chat_has_result(body) else _shell_tool(body.get("tools"))
        head = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "created": 0, "model": body.get("model")}
        usage = {"prompt_tokens": _USAGE_IN, "completion_tokens": _USAGE_OUT, "total_tokens": 39}
        call_id = f"call_{uuid.uuid4().hex[:12]}"
        call = {"id": call_id, "type": "function", "function": {"name": tool, "arguments": ""}}
        if tool is not None:
            call["function"]["arguments"] = json.dumps(_arguments(tool))
        finish = "tool_calls" if tool else "stop"
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": None if tool else MARKER}
            if tool:
                message["tool_calls"] = [call]
            choice = {"index": 0, "message": message, "finish_reason": finish}
            return web.json_response(
                {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
            )
        delta: dict[str, Any] = {"role": "assistant", "content": None if tool else MARKER}
        if tool:
            delta["tool_calls"] = [{"index": 0, **call}]
        chunks = [
            {"index": 0, "delta": delta, "finish_reason": None},
            {"index": 0, "delta": {}, "finish_reason": finish},
        ]
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for choice in chunks:
            await response.write(_sse(None, {**head, "object": "chat.completion.chunk", "choices": [choice]}))
        final = {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}
        await response.write(_sse(None, final) + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    # -- Responses (HTTP, SSE and websocket) --------------------------------------------------------

    @staticmethod
    def _response_events(body: dict[str, Any]) -> list[dict[str, Any]]:
        response_id = f"resp_{uuid.uuid4().hex[:16]}"
        base = {"id": response_id, "object": "response", "created_at": 0, "model": body.get("model")}
        started = {**base, "status": "in_progress", "output": []}
        if body.get("generate") is False:
            return [
                {"type": "response.created", "response": started},
                {"type": "response.completed", "response": {**base, "status": "completed", "output": []}},
            ]
        tool = None if _responses_has_result(body) else _shell_tool(body.get("tools"))
        if tool is not None:
            item: dict[str, Any] = {
                "id": f"fc_{uuid.uuid4().hex[:12]}",
                "type": "function_call",
                "status": "completed",
                "call_id": f"call_{uuid.uuid4().hex[:12]}",
                "name": tool,
                "arguments": json.dumps(_arguments(tool)),
            }
        else:
            part = {"type": "output_text", "text": MARKER, "annotations": []}
            item = {
                "id": f"msg_{uuid.uuid4().hex[:12]}",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
        usage = {
            "input_tokens": _USAGE_IN,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": _USAGE_OUT,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": _USAGE_IN + _USAGE_OUT,
        }
        done = {**base, "status": "completed", "output": [item], "usage": usage}
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": started},
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**item, "status": "in_progress"},
            },
        ]
        if tool is None:
            at = {"item_id": item["id"], "output_index": 0, "content_index": 0}
            events.append({"type": "response.output_text.delta", **at, "delta": MARKER})
        events += [
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            {"type": "response.completed", "response": done},
        ]
        return events

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request, "sse")
        if self.failing:
            return self._failure(anthropic=False)
        events = self._response_events(body)
        if not body.get("stream"):
            return web.json_response(events[-1]["response"])
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for number, event in enumerate(events):
            await response.write(_sse(event["type"], {**event, "sequence_number": number}))
        await response.write_eof()
        return response

    async def _websocket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(timeout=1.0)
        await ws.prepare(request)
        async for message in ws:
            if message.type != WSMsgType.TEXT:
                break
            frame = json.loads(message.data)
            self.hits.append((request.path, "websocket", frame))
            if self.failing:
                code, kind, _, text = _FAILURES[self.failing]
                error = {"type": kind, "code": code, "message": text, "param": None}
                await ws.send_json({"type": "error", "status": self.failing, "error": error})
                continue
            for number, event in enumerate(self._response_events(frame)):
                await ws.send_json({**event, "sequence_number": number})
        return ws

    # -- Anthropic Messages -------------------------------------------------------------------------

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request, "sse")
        if self.failing:
            return self._failure(anthropic=True)
        tool = None if _messages_has_result(body) else _shell_tool(body.get("tools"))
        block: dict[str, Any]
        if tool is not None:
            block = {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:12]}", "name": tool, "input": {}}
        else:
            block = {"type": "text", "text": ""}
        stop = "tool_use" if tool else "end_turn"
        message = {
            "id": f"msg_{uuid.uuid4().hex[:16]}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "stop_sequence": None,
        }
        usage = {"input_tokens": _USAGE_IN, "output_tokens": _USAGE_OUT}
        if not body.get("stream"):
            full = {**block, "input": _arguments(tool)} if tool else {**block, "text": MARKER}
            return web.json_response({**message, "content": [full], "stop_reason": stop, "usage": usage})
        if tool is not None:
            delta = {"type": "input_json_delta", "partial_json": json.dumps(_arguments(tool))}
        else:
            delta = {"type": "text_delta", "text": MARKER}
        events = [
            {
                "type": "message_start",
                "message": {**message, "content": [], "stop_reason": None, "usage": usage},
            },
            {"type": "content_block_start", "index": 0, "content_block": block},
            {"type": "content_block_delta", "index": 0, "delta": delta},
            {"type": "content_block_stop", "index": 0},
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": _USAGE_OUT},
            },
            {"type": "message_stop"},
        ]
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            await response.write(_sse(event["type"], event))
        await response.write_eof()
        return response
