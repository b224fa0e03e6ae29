"""A fake provider with a tiny scripted "model" behind it, on a real loopback socket, for capability
qualification tests (SPEC §8.1).

Unlike `FakeUpstream` (which answers by script whatever it receives), this one *reads* the request the
way a model does and answers from what it read, so what it answers depends on what it received:

- it speaks OpenAI Chat Completions (`POST /v1/chat/completions`), Anthropic Messages
  (`POST /v1/messages`) and OpenAI Responses (`POST /v1/responses`, and its websocket mode: a GET upgrade
  at `/v1/responses`, one `response.create` frame a response, its events one frame each), plain JSON,
  with usage; `GET /v1/models`;
- the "model" follows the system instruction's protocol (after a tool result: `ACK <code>`), calls
  `lookup_record` / `write_record` when asked to look up or store a record, reads the digits of an image
  by decoding the PNG (or, for a JPEG, by knowing the corpus's one by its digest), reads the text of an
  attached PDF (a Chat `file`, a Responses `input_file`, a Messages `document`), and, like any gullible
  model, obeys an instruction that appears in a *user* turn ("Reply with exactly X and nothing else") —
  but treats tool results and attached files as data;
- an image by https URL is never fetched: the fake "sees" only the URLs it was given (`urls`, URL ->
  image bytes), as if it had fetched them, and answers 400 for any other, as providers answer a URL
  they cannot download;
- a `mode` reproduces what real OpenAI-compatible servers and relays get wrong:
  `faithful` carries tools and roles as sent; `flatten_tool_results` turns every tool result into user
  text before the model sees it (so a forged `User:` label inside it becomes a user instruction);
  `drop_images` removes image inputs; `text_tool_calls` answers tool calls as plain text;
  `stream_tool_calls_cut` is faithful except in a stream, where it forwards only the first fragment of a
  tool call's arguments (as a relay that drops later deltas does); `flaky_tool_calls` answers every
  fifth tool call as plain text (a model that calls tools only most of the time);
  `flatten_filtering_user_label` flattens tool results as `flatten_tool_results` does but first drops
  their lines that start with `User:` (a relay that filters one known injection phrasing);
  `inline_files` pastes an attached file's text into the user's message (as a front end that extracts
  documents does), so an instruction inside the file reads as the user's; `refuse_image_urls` answers
  400 to an image given by URL (inline images are seen); `socket_tool_calls_cut` is faithful except on
  the Responses websocket, where a tool call's arguments are cut as in `stream_tool_calls_cut`;
- `"stream": true` is answered over SSE, Chat chunks (usage when `stream_options.include_usage`),
  Messages events or Responses events, a tool call's arguments in two fragments (Responses websocket
  frames likewise);
- `require_key` answers 401 to a wrong key; `status` answers every request with that error status;
- like ordinary servers it compresses answers (gzip) when the request offers it, and, like Anthropic's
  API, refuses a Messages request without `anthropic-version`;
- every request body is recorded in `hits`, and `canary` (when set) is appended to every text answer.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import WSMsgType, web

from devkit.threaded_app import ThreadedApp, gzip_when_offered

Mode = Literal[
    "faithful",
    "flatten_tool_results",
    "drop_images",
    "text_tool_calls",
    "stream_tool_calls_cut",
    "flaky_tool_calls",
    "flatten_filtering_user_label",
    "inline_files",
    "refuse_image_urls",
    "socket_tool_calls_cut",
]

# The fake's own copy of a 3x5 digit font: its "eyes" (independent of the gateway's renderer).
GLYPHS = {
    ("###", "#.#", "#.#", "#.#", "###"): "0",
    (".#.", "##.", ".#.", ".#.", "###"): "1",
    ("###", "..#", "###", "#..", "###"): "2",
    ("###", "..#", "###", "..#", "###"): "3",
    ("#.#", "#.#", "###", "..#", "..#"): "4",
    ("###", "#..", "###", "..#", "###"): "5",
    ("###", "#..", "###", "#.#", "###"): "6",
    ("###", "..#", ".#.", ".#.", ".#."): "7",
    ("###", "#.#", "###", "#.#", "###"): "8",
    ("###", "#.#", "###", "..#", "###"): "9",
}


# The JPEGs the model knows by their SHA-256 (it decodes no JPEG): the corpus's own, showing 7305.
KNOWN_JPEGS = {"0082769eed09f99966b6e297bfbf4435d1e26dbb01b3f48250738bc523d658e6": "7305"}


def read_digits(png: bytes) -> str | None:
    """What the model sees in a greyscale PNG of 3x5 digits on a 7-cell-high grid, or in a JPEG it
    knows; None: unreadable."""
    if png.startswith(b"\xff\xd8\xff"):
        return KNOWN_JPEGS.get(hashlib.sha256(png).hexdigest())
    if not png.startswith(b"\x89PNG\r\n\x1a\n"):
        return None
    pos, idat, width = 8, b"", 0
    height = 0
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind, data = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", data[:10])
            if (depth, colour) != (8, 0):
                return None
        elif kind == b"IDAT":
            idat += data
    raw = zlib.decompress(idat)
    rows = [raw[y * (width + 1) : (y + 1) * (width + 1)] for y in range(height)]
    if any(row[0] != 0 for row in rows):
        return None
    cell = height // 7
    cols = width // cell

    def ink(cx: int, cy: int) -> str:
        return "#" if rows[cy * cell + cell // 2][1 + cx * cell + cell // 2] < 128 else "."

    digits = ""
    for start in range(1, cols - 2, 4):
        glyph = tuple("".join(ink(start + x, 1 + y) for x in range(3)) for y in range(5))
        if glyph not in GLYPHS:
            return None
        digits += GLYPHS[glyph]
    return digits or None


@dataclass
class Turn:
    role: str  # system | user | assistant | tool
    text: str = ""
    images: list[bytes] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # the text of each attached file


class Unfetchable(Exception):
    """An image by URL the model cannot see: the request is answered 400, as a provider answers a URL
    it could not download."""


def _data_url_bytes(url: str) -> bytes | None:
    if not url.startswith("data:") or ";base64," not in url:
        return None
    return base64.b64decode(url.split(";base64,", 1)[1])


def _image(url: str, urls: Mapping[str, bytes]) -> bytes:
    """An image as the model sees it: inline, or one of the URLs it was given (never fetched)."""
    if (data := _data_url_bytes(url)) is not None:
        return data
    if url in urls:
        return urls[url]
    raise Unfetchable(url)


PDF_TEXT = re.compile(rb"\(((?:[^\\()]|\\.)*)\) Tj")


def pdf_text(pdf: bytes) -> str:
    """The text a PDF shows (its `(...) Tj` strings, a line each): what the model reads of a file."""
    lines = (re.sub(rb"\\(.)", rb"\1", m.group(1)).decode("latin-1") for m in PDF_TEXT.finditer(pdf))
    return "\n".join(lines)


def _chat_turns(body: dict[str, Any], urls: Mapping[str, bytes]) -> list[Turn]:
    turns = []
    for m in body.get("messages") or []:
        content = m.get("content")
        turn = Turn(role="system" if m.get("role") == "developer" else m.get("role", "user"))
        if isinstance(content, str):
            turn.text = content
        elif isinstance(content, list):
            for part in content:
                if part.get("type") == "text":
                    turn.text += part.get("text", "")
                elif part.get("type") == "image_url":
                    url = (
                        part["image_url"]["url"] if isinstance(part["image_url"], dict) else part["image_url"]
                    )
                    turn.images.append(_image(url, urls))
                elif part.get("type") == "file" and (data := _data_url_bytes(part["file"]["file_data"])):
                    turn.files.append(pdf_text(data))
        turns.append(turn)
    return turns


def _anthropic_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if b.get("type") == "text")


def _anthropic_turns(body: dict[str, Any], urls: Mapping[str, bytes]) -> list[Turn]:
    turns = []
    if body.get("system"):
        turns.append(Turn("system", _anthropic_text(body["system"])))
    for m in body.get("messages") or []:
        content = m.get("content")
        if isinstance(content, str):
            turns.append(Turn(m["role"], content))
            continue
        turn = Turn(m["role"])
        for block in content or []:
            kind = block.get("type")
            source = block.get("source") or {}
            if kind == "text":
                turn.text += block["text"]
            elif kind == "image" and source.get("type") == "base64":
                turn.images.append(base64.b64decode(source["data"]))
            elif kind == "image" and source.get("type") == "url":
                turn.images.append(_image(source["url"], urls))
            elif kind == "document" and source.get("type") == "base64":
                turn.files.append(pdf_text(base64.b64decode(source["data"])))
            elif kind == "tool_result":
                if turn.text or turn.images or turn.files:
                    turns.append(turn)
                    turn = Turn(m["role"])
                turns.append(Turn("tool", _anthropic_text(block.get("content"))))
        if turn.text or turn.images or turn.files or m["role"] == "assistant":
            turns.append(turn)
    return turns


def _responses_turns(body: dict[str, Any], urls: Mapping[str, bytes]) -> list[Turn]:
    turns = [Turn("system", body["instructions"])] if body.get("instructions") else []
    items = body.get("input")
    for item in [{"role": "user", "content": items}] if isinstance(items, str) else items or []:
        kind = item.get("type", "message")
        if kind == "function_call":
            turns.append(Turn("assistant"))
        elif kind == "function_call_output":
            output = item.get("output")
            turns.append(Turn("tool", output if isinstance(output, str) else _anthropic_text(output)))
        elif kind == "message":
            role = item.get("role", "user")
            turn = Turn("system" if role == "developer" else role)
            content = item.get("content")
            for part in [{"type": "input_text", "text": content}] if isinstance(content, str) else content:
                if part.get("type") in ("input_text", "output_text"):
                    turn.text += part.get("text", "")
                elif part.get("type") == "input_image":
                    turn.images.append(_image(part["image_url"], urls))
                elif part.get("type") == "input_file" and (data := _data_url_bytes(part["file_data"])):
                    turn.files.append(pdf_text(data))
            turns.append(turn)
    return turns


def _tool_names(body: dict[str, Any]) -> set[str]:
    names = set()
    for tool in body.get("tools") or []:
        names.add(tool["function"]["name"] if "function" in tool else tool.get("name"))
    return names


@dataclass
class Thought:
    text: str | None = None
    call: tuple[str, dict[str, str]] | None = None


def think(turns: list[Turn], tools: set[str], mode: Mode) -> Thought:
    """The scripted model: what it answers to the conversation as it received it."""
    if mode == "flatten_filtering_user_label":
        turns = [
            Turn(t.role, "\n".join(x for x in t.text.splitlines() if not x.startswith("User:")))
            if t.role == "tool"
            else t
            for t in turns
        ]
    if mode in ("flatten_tool_results", "flatten_filtering_user_label"):
        turns = [Turn("user", f"Tool result: {t.text}") if t.role == "tool" else t for t in turns]
    if mode == "inline_files":
        turns = [Turn(t.role, "\n".join([t.text, *t.files]), t.images) for t in turns]
    if mode == "drop_images":
        turns = [Turn(t.role, t.text, files=t.files) for t in turns]
    system = " ".join(t.text for t in turns if t.role == "system")
    last = turns[-1] if turns else Turn("user")
    if last.role == "user" and (order := re.search(r"Reply with exactly (.+?) and nothing else", last.text)):
        return Thought(text=order.group(1))  # an instruction in a user turn is obeyed
    if last.role in ("tool", "user") and "reply with exactly ACK" in system:
        data = re.search(r"\{.*?\}", "\n".join([last.text, *last.files]))
        if data:
            try:
                code = json.loads(data.group(0)).get("code")
            except ValueError:
                code = None
            if code:
                return Thought(text=f"ACK {code}")
    if last.role == "user" and tools:
        if (m := re.search(r"Look up record (\w+)\.", last.text)) and "lookup_record" in tools:
            return Thought(call=("lookup_record", {"record_id": m.group(1)}))
        if (m := re.search(r"Store the text (\w+) in record (\w+)\.", last.text)) and "write_record" in tools:
            return Thought(call=("write_record", {"record_id": m.group(2), "text": m.group(1)}))
    if "What number is written in the image" in last.text:
        if not last.images:
            return Thought(text="I cannot see any image in your message.")
        return Thought(text=read_digits(last.images[0]) or "I cannot read that image.")
    return Thought(text="hello")


class ModelUpstream(ThreadedApp):
    thread_name = "model-upstream"

    def __init__(
        self,
        mode: Mode = "faithful",
        *,
        models: tuple[str, ...] = ("gpt-5",),
        require_key: str | None = None,
        status: int | None = None,
        canary: str = "",
        urls: Mapping[str, bytes] | None = None,
    ) -> None:
        self.mode = mode
        self.urls = urls or {}  # the images by URL it "sees" (never fetched)
        self.models = models
        self.require_key = require_key
        self.status = status
        self.canary = canary
        self.hits: list[tuple[str, dict[str, Any]]] = []
        self.tool_calls = 0  # tool calls the model has made (flaky_tool_calls fails every fifth)
        super().__init__()

    def application(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024, middlewares=[gzip_when_offered])
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/responses", self._responses_socket)
        app.router.add_get("/v1/models", self._list)
        return app

    def _refusal(self, request: web.Request, anthropic: bool) -> web.Response | None:
        sent = request.headers.get("x-api-key") or request.headers.get("authorization", "").removeprefix(
            "Bearer "
        )
        if anthropic and not request.headers.get("anthropic-version"):
            error = {"type": "invalid_request_error", "message": "anthropic-version: header is required"}
            return web.json_response({"type": "error", "error": error}, status=400)
        if self.require_key is not None and sent != self.require_key:
            status, kind, message = 401, "authentication_error", "Incorrect API key provided."
        elif self.status is not None:
            status, kind, message = self.status, "api_error", "The server had an error."
        else:
            return None
        if anthropic:
            body = {"type": "error", "error": {"type": kind, "message": message}}
        else:
            code = "invalid_api_key" if status == 401 else None
            body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
        return web.json_response(body, status=status)

    def _seen(self) -> Mapping[str, bytes]:
        """The URLs whose images the model sees (none in `refuse_image_urls`)."""
        return {} if self.mode == "refuse_image_urls" else self.urls

    @staticmethod
    def _unfetchable(url: str, *, anthropic: bool) -> web.Response:
        message = f"Error while downloading {url}."
        if anthropic:
            body = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
        else:
            error = {"message": message, "type": "invalid_request_error", "param": "url", "code": None}
            body = {"error": {**error, "code": "invalid_image_url"}}
        return web.json_response(body, status=400)

    async def _list(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]}
        )

    def _say(self, text: str) -> str:
        return f"{text} {self.canary}".strip()

    def _as_text(self, thought: Thought) -> bool:
        """Whether this tool call is written out as text rather than called natively."""
        if thought.call is None:
            return False
        self.tool_calls += 1
        return self.mode == "text_tool_calls" or (
            self.mode == "flaky_tool_calls" and self.tool_calls % 5 == 0
        )

    def _fragments(self, arguments: str, *, socket: bool = False) -> list[str]:
        """A streamed tool call's arguments in two fragments (only the first in `stream_tool_calls_cut`,
        and on the websocket in `socket_tool_calls_cut`)."""
        half = len(arguments) // 2
        cut = self.mode == "stream_tool_calls_cut" or (socket and self.mode == "socket_tool_calls_cut")
        return [arguments[:half]] if cut else [arguments[:half], arguments[half:]]

    async def _sse(
        self, request: web.Request, events: list[tuple[str | None, dict[str, Any]]]
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for event, data in events:
            head = f"event: {event}\n" if event else ""
            await response.write(f"{head}data: {json.dumps(data)}\n\n".encode())
        if not events or events[-1][0] is None:
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.hits.append(("/chat/completions", body))
        if (refusal := self._refusal(request, anthropic=False)) is not None:
            return refusal
        try:
            turns = _chat_turns(body, self._seen())
        except Unfetchable as url:
            return self._unfetchable(str(url), anthropic=False)
        thought = think(turns, _tool_names(body), self.mode)
        as_text = self._as_text(thought)
        if body.get("stream") is True:
            return await self._sse(request, self._chat_chunks(body, thought, as_text))
        message: dict[str, Any] = {"role": "assistant", "content": None}
        finish = "stop"
        if thought.call is not None and not as_text:
            name, args = thought.call
            message["tool_calls"] = [
                {
                    "id": f"call_{uuid.uuid4().hex[:12]}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
            ]
            finish = "tool_calls"
        else:
            message["content"] = self._say(self._text_of(thought))
        return web.json_response(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
                "object": "chat.completion",
                "created": 1,
                "model": body.get("model"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 40, "completion_tokens": 7, "total_tokens": 47},
            }
        )

    def _chat_chunks(
        self, body: dict[str, Any], thought: Thought, as_text: bool
    ) -> list[tuple[str | None, dict[str, Any]]]:
        base = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion.chunk", "created": 1}
        base["model"] = body.get("model")

        def chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[None, dict[str, Any]]:
            return None, {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        chunks = [chunk({"role": "assistant", "content": ""})]
        if thought.call is not None and not as_text:
            name, args = thought.call
            call_id = f"call_{uuid.uuid4().hex[:12]}"
            for i, piece in enumerate(self._fragments(json.dumps(args))):
                head = {"id": call_id, "type": "function", "function": {"name": name}} if i == 0 else {}
                function = {**head.pop("function", {}), "arguments": piece}
                chunks.append(chunk({"tool_calls": [{"index": 0, **head, "function": function}]}))
            chunks.append(chunk({}, "tool_calls"))
        else:
            chunks.append(chunk({"content": self._say(self._text_of(thought))}))
            chunks.append(chunk({}, "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 40, "completion_tokens": 7, "total_tokens": 47}
            chunks.append((None, {**base, "choices": [], "usage": usage}))
        return chunks

    @staticmethod
    def _text_of(thought: Thought) -> str:
        if thought.call is not None:
            name, args = thought.call
            return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(args)}}}</tool_call>'
        return thought.text or ""

    def _message_events(
        self, body: dict[str, Any], thought: Thought, as_text: bool
    ) -> list[tuple[str | None, dict[str, Any]]]:
        message = {
            "id": f"msg_{uuid.uuid4().hex[:12]}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 40, "output_tokens": 0},
        }
        events: list[tuple[str | None, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": message})
        ]
        if thought.call is not None and not as_text:
            name, args = thought.call
            block = {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:12]}", "name": name, "input": {}}
            deltas = [
                {"type": "input_json_delta", "partial_json": piece}
                for piece in self._fragments(json.dumps(args))
            ]
            stop = "tool_use"
        else:
            block = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": self._say(self._text_of(thought))}]
            stop = "end_turn"
        events.append(
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block})
        )
        events += [
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": d}) for d in deltas
        ]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
        delta = {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}}
        events.append(("message_delta", {**delta, "usage": {"output_tokens": 7}}))
        events.append(("message_stop", {"type": "message_stop"}))
        return events

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.hits.append(("/messages", body))
        if (refusal := self._refusal(request, anthropic=True)) is not None:
            return refusal
        try:
            turns = _anthropic_turns(body, self._seen())
        except Unfetchable as url:
            return self._unfetchable(str(url), anthropic=True)
        thought = think(turns, _tool_names(body), self.mode)
        as_text = self._as_text(thought)
        if body.get("stream") is True:
            return await self._sse(request, self._message_events(body, thought, as_text))
        stop = "end_turn"
        if thought.call is not None and not as_text:
            name, args = thought.call
            content = [
                {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:12]}", "name": name, "input": args}
            ]
            stop = "tool_use"
        else:
            content = [{"type": "text", "text": self._say(self._text_of(thought))}]
        return web.json_response(
            {
                "id": f"msg_{uuid.uuid4().hex[:12]}",
                "type": "message",
                "role": "assistant",
                "model": body.get("model"),
                "content": content,
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": {"input_tokens": 40, "output_tokens": 7},
            }
        )

    # -- Responses --------------------------------------------------------------------------------------

    def _response_events(
        self, body: dict[str, Any], thought: Thought, as_text: bool, *, streamed: bool, socket: bool = False
    ) -> tuple[dict[str, Any], list[tuple[str | None, dict[str, Any]]]]:
        """The response as the answer (`streamed`: its stream's last event) has it, and its stream's
        events (`response.created` to `response.completed`, each with its `sequence_number`)."""
        response_id = f"resp_{uuid.uuid4().hex[:12]}"

        def response(status: str, output: list[dict[str, Any]], usage: dict | None) -> dict[str, Any]:
            return {
                "id": response_id,
                "object": "response",
                "created_at": 1,
                "status": status,
                "error": None,
                "incomplete_details": None,
                "model": body.get("model"),
                "output": output,
                "usage": usage,
            }

        if thought.call is not None and not as_text:
            name, args = thought.call
            arguments = json.dumps(args)
            pieces = self._fragments(arguments, socket=socket) if streamed else [arguments]
            at = {"item_id": f"fc_{uuid.uuid4().hex[:12]}", "output_index": 0}
            item = {"type": "function_call", "id": at["item_id"], "call_id": f"call_{uuid.uuid4().hex[:12]}"}
            item |= {"name": name, "arguments": "".join(pieces), "status": "completed"}
            steps = [
                ("response.output_item.added", {"output_index": 0, "item": {**item, "arguments": ""}}),
                *[("response.function_call_arguments.delta", {**at, "delta": p}) for p in pieces],
                ("response.function_call_arguments.done", {**at, "arguments": item["arguments"]}),
            ]
        else:
            text = self._say(self._text_of(thought))
            at = {"item_id": f"msg_{uuid.uuid4().hex[:12]}", "output_index": 0, "content_index": 0}
            part = {"type": "output_text", "text": text, "annotations": []}
            item = {"type": "message", "id": at["item_id"], "status": "completed", "role": "assistant"}
            item["content"] = [part]
            steps = [
                ("response.output_item.added", {"output_index": 0, "item": {**item, "content": []}}),
                ("response.content_part.added", {**at, "part": {**part, "text": ""}}),
                ("response.output_text.delta", {**at, "delta": text}),
                ("response.output_text.done", {**at, "text": text}),
                ("response.content_part.done", {**at, "part": part}),
            ]
        usage = {"input_tokens": 40, "output_tokens": 7, "total_tokens": 47}
        final = response("completed", [item], usage)
        steps = [
            ("response.created", {"response": response("in_progress", [], None)}),
            ("response.in_progress", {"response": response("in_progress", [], None)}),
            *steps,
            ("response.output_item.done", {"output_index": 0, "item": item}),
            ("response.completed", {"response": final}),
        ]
        return final, [(kind, {"type": kind, "sequence_number": n, **d}) for n, (kind, d) in enumerate(steps)]

    def _responses_thought(self, body: dict[str, Any]) -> tuple[Thought, bool]:
        thought = think(_responses_turns(body, self._seen()), _tool_names(body), self.mode)
        return thought, self._as_text(thought)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.hits.append(("/responses", body))
        if (refusal := self._refusal(request, anthropic=False)) is not None:
            return refusal
        try:
            thought, as_text = self._responses_thought(body)
        except Unfetchable as url:
            return self._unfetchable(str(url), anthropic=False)
        final, events = self._response_events(body, thought, as_text, streamed=body.get("stream") is True)
        if body.get("stream") is True:
            return await self._sse(request, list(events))
        return web.json_response(final)

    async def _responses_socket(self, request: web.Request) -> web.StreamResponse:
        """The Responses websocket mode: a refused key or an error status answers the upgrade itself."""
        if (refusal := self._refusal(request, anthropic=False)) is not None:
            return refusal
        ws = web.WebSocketResponse(timeout=1.0)
        await ws.prepare(request)
        async for message in ws:
            if message.type != WSMsgType.TEXT:
                break
            body = {k: v for k, v in json.loads(message.data).items() if k != "type"}
            self.hits.append(("websocket /responses", body))
            try:
                thought, as_text = self._responses_thought(body)
            except Unfetchable as url:
                error = json.loads(self._unfetchable(str(url), anthropic=False).text or "{}")
                await ws.send_json({"type": "error", "status": 400, **error})
                continue
            for _, event in self._response_events(body, thought, as_text, streamed=True, socket=True)[1]:
                await ws.send_json(event)
        return ws
