"""Capability qualification over the network (SPEC §8.1): replay the corpus of `catalog.qualification`
through a route, the way client traffic reaches it, and judge each answer with that module's checks.

Contract:
- Each probe is written as a Chat Completions request and goes through
  `proxy.wire.providers.registry.upstream_call`, the function the router's attempt loop calls, once per client
  API a coding agent may use and the route serves: as a Chat client (`/chat/completions`), as an
  Anthropic Messages client (`/messages`, the probe in its Messages form, `messages_form`) and as a
  Responses client (`/responses`, `responses_form`); a streamed probe again with `"stream": true` every
  way, its SSE answer read through the stream translation the relay uses and assembled as the client
  would (`ChatAnswer`, `streamed_response`), and over the Responses websocket where the route's upstream
  has one (a `response.create` frame, its events one frame each: `ws_exchange`); a route that serves the
  websocket through the gateway's bridge is sent the same HTTP stream as the SSE way, judged once. Every
  way `samples` times. A way that sends the upstream a request another way already sent in that sample
  (an `anthropic` route receives the same translated Messages request from every client) is judged
  once. Answers are translated back as the client would get them. So a verdict is about the paths real
  traffic takes.
- A way the gateway cannot translate the probe to fails it (`untranslatable`), except for a
  `carried_only` probe (a file): a way whose translation refuses a file is one by which no client's file
  reaches the route, so it is not sent; such a probe no way carries passes as `not_carried`. An
  `optional` probe is sent only when the run has its value (`image_url`).
- A probe the upstream rejected with a 4xx (other than an account or model problem) fails; a probe that
  could not be judged (transport failure, 5xx, rate limit, credential or model rejected) makes the whole
  route inconclusive: nothing is recorded for it.
- A route's replay stops, inconclusive, once it has spent more than the corpus's `token_budget`.
- Nothing here keeps a prompt or an answer: a probe's outcome is a pass flag and one of the check codes
  of `catalog.qualification`, and the token counts the upstream reported (per probe: `RouteRun.costs`).
"""

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from catalog.models import Provenance
from catalog.qualification import (
    MALFORMED,
    NOT_CARRIED,
    OK,
    REFUSED,
    REJECTED,
    UNTRANSLATABLE,
    Corpus,
    Outcome,
    Probe,
    judge,
    nonces,
    render,
)
from pools.credentials import credential_of
from proxy import upstream, upstream_ws
from proxy.ledger.exchange import new_response_id
from proxy.upstream import ResponseTooLarge, TransportFailure
from proxy.upstream_ws import HandshakeRejected
from proxy.wire.providers.base import MESSAGES, RESPONSES, UpstreamCall
from proxy.wire.providers.registry import provider, upstream_call
from proxy.wire.sse import Block, Dialect, SSEParser
from proxy.wire.translations.chat_chunks import ChatChunkReader
from proxy.wire.translations.chat_over_messages import (
    AnthropicToChatStream,
    anthropic_to_chat_response,
    chat_to_anthropic_request,
)
from proxy.wire.translations.translate import RequestTranslationError, ResponseTranslationError
from routing.policy.errors import ErrorCode
from routing.policy.failures import ErrorShape, FailureClass, Observation, classify
from routing.policy.route import Target
from routing.policy.types import Requirements

CLIENT_ROUTE = "/chat/completions"  # the corpus's own form
CLIENT_ROUTES = (CLIENT_ROUTE, MESSAGES, RESPONSES)  # every client API a route serves coding agents through

# How a way's request travels.
PLAIN, SSE, WS = "plain", "sse", "ws"
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


class Inconclusive(Exception):
    """The route could not be judged now (it was unreachable, overloaded, refused the account or the
    model): `reason` is the gateway's own words, e.g. `unavailable (HTTP 503)`."""

    def __init__(self, probe: str, reason: str) -> None:
        super().__init__(f"{probe}: {reason}")
        self.probe = probe
        self.reason = reason


@dataclass(slots=True)
class RouteRun:
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    costs: dict[str, int] = field(default_factory=dict)  # tokens spent per probe, every way and sample
    input_tokens: int = 0
    output_tokens: int = 0
    usage_missing: int = 0  # probes whose answer reported no usage

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def _usage(answer: Mapping[str, Any]) -> tuple[int | None, int | None]:
    usage = answer.get("usage")
    if not isinstance(usage, dict):
        return None, None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (
        prompt if isinstance(prompt, int) else None,
        completion if isinstance(completion, int) else None,
    )


# Statuses with which an upstream refuses the request's content (an image, a tool, a role): a verdict.
# Any other failure is about the account, the model or the moment (401, 403, 404, 429, 5xx...).
CONTENT_REJECTIONS = frozenset({400, 413, 415, 422})


def _inconclusive_reason(status: int, body: Mapping[str, Any] | None, errors: ErrorShape) -> str | None:
    """None when a non-2xx answer is the route refusing the probe itself (a verdict: not qualified);
    else why the route cannot be judged now, in the gateway's words. `errors`: the provider's shape."""
    # Every route qualified is in the catalog: a model 404 is the account's, not the probe's content.
    observation = Observation(status=status, body=body, provenance=Provenance.CONFIGURED, errors=errors)
    failure = classify(observation)
    if status in CONTENT_REJECTIONS and failure in (FailureClass.CLIENT_ERROR, FailureClass.CONTEXT_OVERFLOW):
        return None
    return f"{failure or FailureClass.UPSTREAM_ERROR} (HTTP {status})"


class ChatAnswer(ChatChunkReader):
    """A Chat Completions stream assembled into the answer a plain request would have had (text, tool
    calls with their argument fragments joined, finish reason, usage), for the checks."""

    def __init__(self) -> None:
        super().__init__()
        self.message: dict[str, Any] = {"role": "assistant", "content": None}
        self._calls: dict[int, dict[str, Any]] = {}

    def answer(self) -> dict[str, Any]:
        if self._calls:
            self.message["tool_calls"] = [self._calls[i] for i in sorted(self._calls)]
        choice = {"index": 0, "message": self.message, "finish_reason": self._finish}
        return {"choices": [choice], **({"usage": dict(self._usage)} if self._usage else {})}

    def _opening(self, chunk_id: object) -> bytes:
        return b""

    def _text(self, kind: str, text: str) -> bytes:
        if kind == "content":
            self.message["content"] = (self.message["content"] or "") + text
        return b""

    def _tool(self, call: Mapping[str, Any]) -> bytes:
        index = call.get("index")
        entry = self._calls.setdefault(
            index if isinstance(index, int) else len(self._calls),
            {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
        )
        function = call.get("function") if isinstance(call.get("function"), Mapping) else {}
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        for key in ("name", "arguments"):
            if isinstance(function.get(key), str):
                entry["function"][key] += function[key]
        return b""

    def _closing(self) -> bytes:
        return b""

    def _ending(self) -> bytes:
        return b""


def _blocks(raw: bytes) -> list[Block]:
    parser = SSEParser()
    blocks = parser.feed(raw)
    last = parser.flush()
    return blocks + ([last] if last is not None else [])


def _client_blocks(call: UpstreamCall, raw: bytes) -> list[Block]:
    """A streamed answer's blocks as the client's API has them (through the relay's translation)."""
    translator = call.stream()
    blocks = _blocks(raw)
    if translator is None:
        return blocks
    return _blocks(b"".join(translator.feed(b) for b in blocks) + translator.finish())


def streamed_answer(call: UpstreamCall, raw: bytes) -> dict[str, Any]:
    """A streamed answer as the client's API has it (through the relay's translation), in its Chat form."""
    blocks = _client_blocks(call, raw)
    if call.client_path == RESPONSES:
        events = (json.loads(b.data) for b in blocks if b.data is not None and b.data != "[DONE]")
        return responses_chat_form(streamed_response(events))
    if call.client_path == MESSAGES:
        chat = AnthropicToChatStream(model=call.model, include_usage=True, created=0)
        blocks = _blocks(b"".join(chat.feed(b) for b in blocks) + chat.finish())
    reader = ChatAnswer()
    for block in blocks:
        reader.feed(block)
    reader.finish()
    return reader.answer()


# ---------------------------------------------------------------------------------------------------
# The Responses client: the probe in its form, and its answers in the Chat form the checks read.


def _data_url(url: str) -> tuple[str, str] | None:
    """(media type, base64 data) of a `data:` URL."""
    head, sep, data = url.partition(";base64,")
    return (head.removeprefix("data:"), data) if sep and head.startswith("data:") else None


def messages_form(chat: Mapping[str, Any]) -> dict[str, Any]:
    """The probe as an Anthropic Messages client sends it: the gateway's Chat -> Messages translation,
    and a PDF attached to the last message as the `document` block such a client attaches (Chat has no
    document a translation could carry; a file anywhere else is refused by it)."""
    messages = list(chat.get("messages") or [])
    last = messages[-1] if messages else {}
    parts = last.get("content") if isinstance(last.get("content"), list) else []
    files = [p for p in parts if isinstance(p, dict) and p.get("type") == "file"]
    if not files:
        return chat_to_anthropic_request(chat)
    rest = [p for p in parts if p not in files]
    body = chat_to_anthropic_request({**chat, "messages": [*messages[:-1], {**last, "content": rest}]})
    documents = []
    for part in files:
        found = _data_url(str(part["file"].get("file_data", "")))
        if found is None:
            raise RequestTranslationError("messages.content.file")
        documents.append(
            {"type": "document", "source": {"type": "base64", "media_type": found[0], "data": found[1]}}
        )
    turn = body["messages"][-1]
    content = turn["content"]
    turn["content"] = documents + (
        [{"type": "text", "text": content}] if isinstance(content, str) else content
    )
    return body


def _responses_content(content: object) -> object:
    if not isinstance(content, list):
        return content
    parts = []
    for part in content:
        match part.get("type"):
            case "text":
                parts.append({"type": "input_text", "text": part["text"]})
            case "image_url":
                parts.append({"type": "input_image", "image_url": part["image_url"]["url"], "detail": "auto"})
            case "file":
                parts.append({"type": "input_file", **part["file"]})
    return parts


def responses_form(chat: Mapping[str, Any]) -> dict[str, Any]:
    """The probe as a Responses client (Codex) sends it: the system text as `instructions`, the turns
    as input items (a tool call a `function_call`, its result a `function_call_output`), the tools
    flat, nothing stored at the provider."""
    instructions, items = [], []
    for message in chat.get("messages") or []:
        role, content = message["role"], message.get("content")
        if role in ("system", "developer"):
            instructions.append(content)
        elif role == "tool":
            items.append(
                {"type": "function_call_output", "call_id": message["tool_call_id"], "output": content}
            )
        else:
            if content:
                items.append({"type": "message", "role": role, "content": _responses_content(content)})
            for call in message.get("tool_calls") or []:
                function = call["function"]
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call["id"],
                        "name": function["name"],
                        "arguments": function["arguments"],
                    }
                )
    tools = [
        {
            "type": "function",
            **{k: v for k, v in t["function"].items() if k in ("name", "description", "parameters")},
        }
        for t in chat.get("tools") or []
    ]
    body: dict[str, Any] = {"input": items, "store": False}
    if instructions:
        body["instructions"] = "\n\n".join(instructions)
    if tools:
        body["tools"] = tools
    if "max_completion_tokens" in chat:
        body["max_output_tokens"] = chat["max_completion_tokens"]
    if chat.get("stream") is True:
        body["stream"] = True
    return body


def client_body(chat: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The probe's body as a client of `path` sends it. RequestTranslationError: no such client's turn
    can carry it."""
    if path == MESSAGES:
        return messages_form(chat)
    if path == RESPONSES:
        return responses_form(chat)
    return dict(chat)


def responses_chat_form(response: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses answer in the Chat form the checks read: its text, its function calls as tool calls,
    its end as a finish reason (a content filter's, a length's), its usage."""
    text, calls = "", []
    for item in response.get("output") or []:
        if item.get("type") == "message":
            text += "".join(
                p.get("text", "") for p in item.get("content") or [] if p.get("type") == "output_text"
            )
        elif item.get("type") == "function_call":
            function = {"name": item.get("name"), "arguments": item.get("arguments")}
            calls.append({"id": item.get("call_id"), "type": "function", "function": function})
    reason = (response.get("incomplete_details") or {}).get("reason")
    if calls:
        finish = "tool_calls"
    elif response.get("status") == "incomplete":
        finish = "content_filter" if reason == "content_filter" else "length"
    else:
        finish = "stop"
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    answer: dict[str, Any] = {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}
    usage = response.get("usage")
    if isinstance(usage, dict):
        answer["usage"] = {
            "prompt_tokens": usage.get("input_tokens"),
            "completion_tokens": usage.get("output_tokens"),
        }
    return answer


def streamed_response(events: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A Responses stream's events (SSE or websocket) assembled as the client reads them: each output
    item as announced, its text and its call's arguments from the deltas, the rest (status, usage) from
    the terminal event."""
    items: dict[int, dict[str, Any]] = {}
    final: Mapping[str, Any] = {}
    for event in events:
        kind, index = event.get("type"), event.get("output_index")
        if kind == "response.output_item.added":
            item = dict(event["item"])
            if item.get("type") == "function_call":
                item["arguments"] = ""
            else:
                item["content"] = [{"type": "output_text", "text": ""}]
            items[index] = item
        elif kind == "response.output_text.delta":
            items[index]["content"][0]["text"] += event["delta"]
        elif kind == "response.function_call_arguments.delta":
            items[index]["arguments"] += event["delta"]
        elif kind in TERMINAL:
            final = event["response"]
    return {**final, "output": [items[i] for i in sorted(items)]}


# ---------------------------------------------------------------------------------------------------
# Sending one way's request.


async def send(call: UpstreamCall, timeout_s: float) -> tuple[int, bytes]:
    """One plain request over the gateway's own upstream client (`proxy.upstream`)."""
    response = await upstream.open_stream(
        "POST", call.url, headers=call.headers, json=call.payload, read_timeout_s=timeout_s
    )
    return response.status, await upstream.read_body(response)


async def ws_exchange(
    call: UpstreamCall, assignment_id: int, timeout_s: float
) -> tuple[int, list[dict[str, Any]] | dict[str, Any] | None]:
    """One `response.create` over the upstream's Responses websocket, through the gateway's own client
    (`proxy.upstream_ws`): (200, the response's events) or (the status an error stands for, its body).
    Raises TransportFailure."""
    headers = {k: v for k, v in call.headers.items() if k != "content-type"}
    try:
        socket = await upstream_ws.open_socket(
            upstream_ws.websocket_url(call.url), headers=headers, assignment_id=assignment_id
        )
    except HandshakeRejected as rejected:
        return rejected.status, rejected.body
    try:
        frame = {"type": "response.create", **{k: v for k, v in call.payload.items() if k != "stream"}}
        await socket.send(json.dumps(frame))
        events: list[dict[str, Any]] = []
        while not events or events[-1].get("type") not in TERMINAL:
            event = json.loads(await socket.recv(timeout_s))
            if event.get("type") == "error":
                status = event.get("status")
                return status if isinstance(status, int) else 500, {"error": event.get("error")}
            events.append(event)
        return 200, events
    finally:
        await socket.close()


async def _exchange(
    call: UpstreamCall, transport: str, assignment_id: int, timeout_s: float, probe: str
) -> tuple[int, bytes | list[dict[str, Any]] | dict[str, Any] | None]:
    """One way's request sent: its status and its body (or events). Raises Inconclusive."""
    try:
        if transport == WS:
            return await ws_exchange(call, assignment_id, timeout_s)
        return await send(call, timeout_s)
    except TransportFailure as failure:
        raise Inconclusive(probe, f"{failure.event}") from None
    except ResponseTooLarge:
        raise Inconclusive(probe, ErrorCode.UPSTREAM_RESPONSE_TOO_LARGE) from None


def _client_answer(call: UpstreamCall, body: bytes | list[dict[str, Any]]) -> dict[str, Any]:
    """The answer as the client's API has it, in the Chat form the checks read."""
    if isinstance(body, list):  # a websocket's events
        return responses_chat_form(streamed_response(body))
    if call.payload.get("stream") is True:
        return streamed_answer(call, body)
    answer = json.loads(call.response(body))
    if call.client_path == MESSAGES:
        return anthropic_to_chat_response(answer, model=call.model, created=0)  # judged, never shown
    if call.client_path == RESPONSES:
        return responses_chat_form(answer)
    return answer


async def _attempt(
    probe: Probe,
    call: UpstreamCall,
    transport: str,
    expect: Mapping[str, Any],
    run: RouteRun,
    *,
    target: Target,
    timeout_s: float,
) -> str:
    """One probe's request as the upstream receives it, judged: a check code. Raises Inconclusive."""
    status, body = await _exchange(call, transport, target.assignment_id, timeout_s, probe.id)
    if not 200 <= status < 300:
        if isinstance(body, bytes):
            try:
                body = json.loads(body)
            except ValueError:
                body = None
        errors = provider(target.adapter).errors
        reason = _inconclusive_reason(status, body if isinstance(body, dict) else None, errors)
        if reason is not None:
            raise Inconclusive(probe.id, reason)
        return f"{REJECTED}_{status}"
    assert isinstance(body, bytes | list)
    try:
        answer = _client_answer(call, body)
    except (ResponseTranslationError, ValueError, TypeError, AttributeError, KeyError):
        return MALFORMED
    if not isinstance(answer, dict):
        return MALFORMED
    prompt, completion = _usage(answer)
    if prompt is None and completion is None:
        run.usage_missing += 1
    run.input_tokens += prompt or 0
    run.output_tokens += completion or 0
    run.costs[probe.id] = run.costs.get(probe.id, 0) + (prompt or 0) + (completion or 0)
    choices = answer.get("choices")
    finish = choices[0].get("finish_reason") if isinstance(choices, list) and choices else None
    if classify(Observation(status=status, finish_reason=finish)) is FailureClass.SAFETY_REFUSAL:
        return REFUSED
    return judge(probe, call, answer, expect)


def ways(probe: Probe, routes: frozenset[str]) -> list[tuple[int, str, str]]:
    """Every (sample, transport, client route) a probe is sent through on a route whose provider
    carries `routes`, in order: plain, then (a streamed probe) SSE and the Responses websocket."""
    paths = [path for path in CLIENT_ROUTES if path in routes]
    found = []
    for n in range(1, probe.samples + 1):
        found += [(n, PLAIN, path) for path in paths]
        if probe.stream:
            found += [(n, SSE, path) for path in paths]
            found += [(n, WS, RESPONSES)] if RESPONSES in paths else []
    return found


def label(probe: Probe, sample: int, transport: str, path: str) -> str:
    """`tool_call`, `tool_call@messages/sse#3`, `tool_call@responses/ws`: which way of which sample
    decided a probe."""
    client = {MESSAGES: "@messages", RESPONSES: "@responses"}.get(path, "")
    way = client + ("" if transport == PLAIN else f"/{transport}")
    return f"{probe.id}{way}{f'#{sample}' if sample > 1 else ''}"


async def replay(
    target: Target,
    model: str,
    corpus: Corpus,
    *,
    timeout_s: float,
    tokens: Mapping[str, str] | None = None,
    image_url: str | None = None,
) -> RouteRun:
    """Every probe of the corpus through `target` serving `model`, in order, through every way
    (`ways`): as a Chat, an Anthropic Messages and a Responses client (translated as the route needs;
    a request the upstream already received in that sample is not sent again), plain and, for a
    streamed probe, over SSE and the Responses websocket; `samples` times. A probe passes when every
    way passed. `image_url`: where the operator published the corpus's JPEG (without it the `optional`
    image_url probe is not sent). Raises Inconclusive (over the token budget too)."""
    tokens = {**(tokens or nonces()), **({"image_url": image_url} if image_url else {})}
    routes = provider(target.adapter).routes
    run = RouteRun()
    for probe in corpus.probes:
        if probe.optional is not None and probe.optional not in tokens:
            continue
        body, expect = render(probe, tokens, corpus.values)
        sent: list[tuple[int, bool, dict]] = []
        outcome = Outcome(probe.id, True, NOT_CARRIED if probe.carried_only else OK)
        for sample, transport, path in ways(probe, routes):
            name = label(probe, sample, transport, path)
            stream = transport != PLAIN
            try:
                chat_body = (
                    {**body, "stream": True, "stream_options": {"include_usage": True}} if stream else body
                )
                call = upstream_call(
                    path,
                    target,
                    client_body(chat_body, path),
                    model=model,
                    requirements=Requirements(),
                    credential=credential_of(target),
                    created=int(time.time()),
                    response_id=new_response_id(),
                )
            except RequestTranslationError:
                if probe.carried_only:
                    continue  # no client's file reaches the route this way
                outcome = Outcome(name, False, UNTRANSLATABLE)
                break
            if (call.wire is not None and call.wire.stream() is not None) or call.oauth is not None:
                # A provider with its own API (gemini, bedrock, vertex): the checks read bodies on the Chat
                # wire, so verdicts on its translated request would be about the wrong body.
                raise Inconclusive(probe.id, "not judged: the route speaks its provider's own API")
            # A websocket to a route without one of its own is the gateway's bridge: the SSE request.
            socket = transport == WS and call.dialect is Dialect.RESPONSES
            if (sample, socket, call.payload) in sent:
                continue
            sent.append((sample, socket, call.payload))
            code = await _attempt(
                probe, call, WS if socket else transport, expect, run, target=target, timeout_s=timeout_s
            )
            if run.tokens > corpus.token_budget:
                raise Inconclusive(name, f"over the corpus's token budget ({corpus.token_budget} tokens)")
            if code != OK:
                outcome = Outcome(name, False, code)
                break
            outcome = Outcome(probe.id, True, OK)
        run.outcomes[probe.id] = outcome
    return run
