"""A fake Google Gemini (Generative Language API): generateContent, streamGenerateContent over SSE, the
model listing, Google's error envelope.

Contract (as the API answers, checked against the `google-genai` client in tests/providers):
- `POST /v1beta/models/{model}:generateContent` (and the same under `/v1`) answers a
  GenerateContentResponse: `candidates[0]` with `content.parts[].text` and `finishReason`, and
  `usageMetadata` (`promptTokenCount`, `candidatesTokenCount`, `totalTokenCount`).
  `:streamGenerateContent?alt=sse` answers the same objects as SSE `data:` events separated by CRLF
  blank lines, one text delta each, the last one with `finishReason` and the full usage.
  `GET /v1beta/models` lists `models/{id}` with token limits and `supportedGenerationMethods`,
  `pageSize` (default `page_size`, 50, at most 1000) per page, the next one named by an opaque
  `nextPageToken` asked back as `pageToken` (an unknown token is 400 `INVALID_ARGUMENT`); `embedders`
  are listed too, with `embedContent` as their only method, and serve no `generateContent`.
- The key comes in `x-goog-api-key` (or `?key=`); a wrong one is Google's 400 `INVALID_ARGUMENT` with
  reason `API_KEY_INVALID` (not a 401). An unknown model is 404 `NOT_FOUND`.
- Tools, as Gemini 3 answers them: when the request declares functions (and `toolConfig` does not say
  NONE) and the current turn (the contents after the last user text) holds fewer than `tool_steps`
  (0 unless a test sets it: a plain answer) model steps, the answer calls every declared function at
  once (`functionCall` parts with `args {"step": n}`, the first part carrying a fresh `thoughtSignature`,
  standard base64 with `+`, `/` and `=` in it); after them it answers
  `done: <the last functionResponse's content>`. A request whose current turn has a model step whose
  first `functionCall` part lacks its `thoughtSignature` is 400 `INVALID_ARGUMENT`, as is a signature
  this fake never gave (Gemini: "Corrupted thought signature"); Google's documented stand-ins for
  history from another model (`DUMMY_SIGNATURES`) are accepted. `signatures` holds every one given.
- Usage: `Serve`'s cached reads are `cachedContentTokenCount` (within `promptTokenCount`), its reasoning
  tokens `thoughtsTokenCount` (apart from `candidatesTokenCount`, as Gemini counts thoughts).
- Errors: `{"error": {"code", "message", "status"}}`; `Reject` renders its `type` as the `status`
  (`RESOURCE_EXHAUSTED`, `UNAVAILABLE`...). `Refusal` is an answer cut with `finishReason: SAFETY` and
  no content; `prompt_blocked()` a 200 with `promptFeedback.blockReason` and no candidates.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from devkit.behaviours import (
    ApiError,
    Behaviour,
    CutStream,
    FailAfterVisible,
    FailBeforeVisible,
    Hang,
    RawError,
    Refusal,
    Reject,
    Serve,
)
from devkit.server import drop
from devkit.upstream import FakeUpstream
from devkit.wire import reply_for

API_VERSION = "v1beta"
_PAGE_SIZE, _MAX_PAGE_SIZE = 50, 1000
_TOKEN = "Cg"  # what an opaque page token starts with here, before the offset it stands for
API_VERSIONS = ("v1", "v1beta")  # the stable surface (google-genai's default) and the beta one
_STATUS_CODES = {
    "INVALID_ARGUMENT": 400,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "RESOURCE_EXHAUSTED": 429,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
}


DUMMY_SIGNATURES = frozenset({"skip_thought_signature_validator", "context_engineering_is_the_way_to_go"})


def _current_turn(contents: list[Any]) -> list[dict[str, Any]]:
    """The contents after the last user content holding a text part (Gemini's "current turn")."""
    start = 0
    for index, content in enumerate(contents):
        parts = content.get("parts") if isinstance(content, dict) else None
        if content.get("role") == "user" and any("text" in p for p in parts or [] if isinstance(p, dict)):
            start = index + 1
    return [c for c in contents[start:] if isinstance(c, dict)]


def _calls(content: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in content.get("parts") or [] if isinstance(p, dict) and "functionCall" in p]


@dataclass(frozen=True)
class PromptBlocked(Behaviour):
    """A prompt the safety filters block: 200, `promptFeedback.blockReason`, no candidates."""

    reason: str = "SAFETY"


def prompt_blocked(reason: str = "SAFETY") -> PromptBlocked:
    return PromptBlocked(reason)


def status_error(status: str, message: str) -> Reject:
    """Google's error `status` (e.g. RESOURCE_EXHAUSTED) with its HTTP code, before any output."""
    return Reject(_STATUS_CODES[status], ApiError(status, message))


def resource_exhausted() -> Reject:
    return status_error("RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota).")


def unavailable() -> Reject:
    return status_error("UNAVAILABLE", "The model is overloaded. Please try again later.")


def _error(code: int, status: str, message: str, details: list[Any] | None = None) -> web.Response:
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details is not None:
        error["details"] = details
    return web.json_response({"error": error}, status=code)


class GeminiFake(FakeUpstream):
    """A fake Gemini API on 127.0.0.1 (see the module docstring)."""

    def __init__(
        self,
        name: str = "gemini",
        models: tuple[str, ...] | list[str] = ("gemini-2.5-flash",),
        *,
        embedders: tuple[str, ...] = (),
        **kw: Any,
    ):
        super().__init__(name, models, **kw)
        self.embedders = embedders
        self.page_size = _PAGE_SIZE  # when the request names no pageSize
        self.tool_steps = 0  # a test sets how many tool steps a turn takes before the text answer
        self.signatures: set[str] = set()

    def _signature_problem(self, contents: list[Any]) -> str | None:
        for content in _current_turn(contents):
            calls = _calls(content) if content.get("role") == "model" else []
            signature = calls[0].get("thoughtSignature") if calls else None
            if calls and signature is None:
                name = calls[0]["functionCall"].get("name")
                return f"Function call `{name}` in the current turn is missing a `thought_signature`."
            if calls and signature not in self.signatures and signature not in DUMMY_SIGNATURES:
                return "Corrupted thought signature."
        return None

    def _tool_answer(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The parts of a tool step this request gets, or None for a text answer (module docstring)."""
        declared = [d for tool in body.get("tools") or [] for d in tool.get("functionDeclarations") or []]
        mode = ((body.get("toolConfig") or {}).get("functionCallingConfig") or {}).get("mode")
        turn = _current_turn(body["contents"])
        steps = sum(1 for c in turn if c.get("role") == "model" and _calls(c))
        if not declared or mode == "NONE" or not self.tool_steps:
            return None
        if steps >= self.tool_steps:
            results = [
                p["functionResponse"] for c in turn for p in c.get("parts") or [] if "functionResponse" in p
            ]
            return {"text": f"done: {results[-1].get('response', {}).get('content')}"} if results else None
        signature = base64.b64encode(b"\xfb\xff\xbf" + os.urandom(200)).decode()
        with self._lock:
            self.signatures.add(signature)
        parts: list[dict[str, Any]] = [
            {"functionCall": {"name": d["name"], "args": {"step": steps + 1}}} for d in declared
        ]
        parts[0]["thoughtSignature"] = signature
        return {"parts": parts}

    @property
    def endpoint(self) -> str:
        """What `genai.Client(http_options={"base_url": ...})` names."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The API root an assignment names: `.../v1beta`."""
        return f"{self.endpoint}/{API_VERSION}"

    def _add_routes(self, app: web.Application) -> None:
        for version in API_VERSIONS:
            app.router.add_post(f"/{version}/models/{{target}}", self._generate)
            app.router.add_get(f"/{version}/models", self._list)

    def _authorized(self, request: web.Request) -> bool:
        given = request.headers.get("x-goog-api-key") or request.query.get("key")
        return self.require_key is None or given == self.require_key

    def _bad_key(self) -> web.Response:
        info = {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": "API_KEY_INVALID",
            "domain": "googleapis.com",
        }
        return _error(400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid API key.", [info])

    async def _list(self, request: web.Request) -> web.StreamResponse:
        self._record(request, None, None, "http")
        if not self._authorized(request):
            return self._bad_key()
        listed = [(m, ["generateContent", "countTokens"]) for m in self.models]
        listed += [(m, ["embedContent"]) for m in self.embedders]
        try:
            size = min(int(request.query.get("pageSize") or self.page_size), _MAX_PAGE_SIZE)
            start = int(request.query.get("pageToken", f"{_TOKEN}0").removeprefix(_TOKEN))
        except ValueError:
            start = -1
        if start < 0:
            return _error(400, "INVALID_ARGUMENT", "Invalid page token.")
        size = size if size > 0 else self.page_size
        models = [
            {
                "name": f"models/{model}",
                "version": "001",
                "displayName": model,
                "inputTokenLimit": 1048576,
                "outputTokenLimit": 65536,
                "supportedGenerationMethods": methods,
            }
            for model, methods in listed[start : start + size]
        ]
        page: dict[str, Any] = {"models": models}
        if start + size < len(listed):
            page["nextPageToken"] = f"{_TOKEN}{start + size}"
        return web.json_response(page)

    def _behaviour_for(self, model: str) -> Behaviour:
        with self._lock:
            scripted = model in self._scripts
        if scripted or model in self.models:
            return super()._behaviour_for(model)
        return status_error(
            "NOT_FOUND",
            f"models/{model} is not found for API version {API_VERSION}, or is not supported for "
            "generateContent. Call ListModels to see the list of available models and their supported "
            "methods.",
        )

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        model, _, method = request.match_info["target"].partition(":")
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        stream = method == "streamGenerateContent"
        self._record(request, model, body if isinstance(body, dict) else None, "sse" if stream else "http")
        if not self._authorized(request):
            return self._bad_key()
        if method not in ("generateContent", "streamGenerateContent"):
            return _error(404, "NOT_FOUND", "Method not found.")
        if not isinstance(body, dict) or not isinstance(body.get("contents"), list):
            return _error(
                400, "INVALID_ARGUMENT", "* GenerateContentRequest.contents: contents is not specified"
            )
        if problem := self._signature_problem(body["contents"]):
            return _error(400, "INVALID_ARGUMENT", problem)
        behaviour = self._behaviour_for(model)
        match behaviour:
            case Reject(status=status, error=err, delay_s=delay):
                if delay and await self._pause(delay):
                    return drop(request)
                return _error(status, err.type, err.message)
            case RawError(status=status, body=payload, headers=headers):
                return web.json_response(dict(payload), status=status, headers=dict(headers))
            case Hang(seconds=seconds):
                await self._pause(seconds)
                return drop(request)
            case PromptBlocked(reason=reason):
                return web.json_response(
                    {
                        "promptFeedback": {"blockReason": reason},
                        "usageMetadata": _usage(10, 0),
                        "modelVersion": model,
                    }
                )
        answer = _Answer(model)
        if isinstance(behaviour, Serve) and (tool := self._tool_answer(body)) is not None:
            behaviour = replace(behaviour, text=tool.get("text", ""))
            answer.parts = tool.get("parts")
        if not stream:
            if not isinstance(behaviour, Serve | Refusal):
                return drop(request)
            if isinstance(behaviour, Serve) and behaviour.delay_s and await self._pause(behaviour.delay_s):
                return drop(request)
            reply = reply_for(behaviour, self.name)
            return web.json_response(answer.chunk(None if reply.refused else reply.text, reply, final=True))
        return await self._stream(request, behaviour, answer)

    async def _stream(
        self, request: web.Request, behaviour: Behaviour, answer: _Answer
    ) -> web.StreamResponse:
        if request.query.get("alt") != "sse":
            return _error(400, "INVALID_ARGUMENT", "This fake streams only with alt=sse.")
        reply = reply_for(behaviour, self.name)
        if reply.refused:
            chunks = [answer.chunk(None, reply, final=True)]
        else:
            last = len(reply.deltas) - 1
            chunks = [answer.chunk(d, reply, final=i == last) for i, d in enumerate(reply.deltas)]
        internal = {
            "error": {"code": 500, "message": "An internal error has occurred.", "status": "INTERNAL"}
        }
        overloaded = {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}
        cut = False
        match behaviour:
            case FailBeforeVisible():
                # Google reports a failure before any output as the HTTP error, not an event.
                return _error(503, "UNAVAILABLE", "The model is overloaded. Please try again later.")
            case FailAfterVisible():
                chunks = [chunks[0], internal]
            case CutStream(after_visible=after_visible, clean=clean):
                chunks = chunks[:1] if after_visible else []
                cut = not clean
            case Serve() | Refusal():
                pass
            case _:
                chunks = [overloaded]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        delay = behaviour.delay_s if isinstance(behaviour, Serve) else 0.0
        try:
            for chunk in chunks:
                if delay and await self._pause(delay):
                    return drop(request)
                await response.write(f"data: {json.dumps(chunk)}\r\n\r\n".encode())
        except ConnectionError:
            return response
        if cut:
            return drop(request)
        await response.write_eof()
        return response


class _Answer:
    """One answer's chunks, sharing its response id."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.id = uuid.uuid4().hex[:22]
        self.parts: list[dict[str, Any]] | None = None  # a tool step's function calls, in its last chunk

    def chunk(self, text: str | None, reply: Any, *, final: bool) -> dict[str, Any]:
        candidate: dict[str, Any] = {"index": 0}
        parts = [{"text": text}] if text else []
        if final and self.parts:
            parts += self.parts
        if parts:
            candidate["content"] = {"parts": parts, "role": "model"}
        if final:
            candidate["finishReason"] = "SAFETY" if reply.refused else "STOP"
        if reply.refused:
            candidate["safetyRatings"] = [
                {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH", "blocked": True}
            ]
        usage = _usage(reply.input_tokens, reply.output_tokens if final else 0)
        if final and reply.reasoning_tokens:  # thoughts are counted apart from the candidates
            usage["candidatesTokenCount"] -= reply.reasoning_tokens
            usage["thoughtsTokenCount"] = reply.reasoning_tokens
        if reply.cached_read_tokens:  # part of the prompt, as Google counts it
            usage["cachedContentTokenCount"] = reply.cached_read_tokens
        return {
            "candidates": [candidate],
            "usageMetadata": usage,
            "modelVersion": self.model,
            "responseId": self.id,
        }


def _usage(prompt: int, candidates: int) -> dict[str, int]:
    usage = {"promptTokenCount": prompt, "totalTokenCount": prompt + candidates}
    if candidates:
        usage["candidatesTokenCount"] = candidates
    return usage
