"""Capability qualification over the network (SPEC §8.1): replay the corpus of `catalog.qualification`
through a route, the way client traffic reaches it, and judge each answer with that module's checks.

Contract:
- Each probe is a Chat Completions request and goes through `proxy.providers.registry.upstream_call`, the
  function the router's attempt loop calls, once per client API a coding agent may use: as a Chat client
  (`/chat/completions`) and as an Anthropic Messages client (`/messages`, the probe in its Messages form);
  a streamed probe again with `"stream": true` both ways, its SSE answer read through the stream
  translation the relay uses and assembled as the client would (`ChatAnswer`); every way `samples` times.
  An `openai`/`openrouter` route receives the Chat request as sent and the Messages one translated; an
  `anthropic` route receives the same translated request either way (judged once). Answers are
  translated back as the client would get them. So a verdict is about the paths real traffic takes.
- A probe the upstream rejected with a 4xx (other than an account or model problem) fails; a probe that
  could not be judged (transport failure, 5xx, rate limit, credential or model rejected) makes the whole
  route inconclusive: nothing is recorded for it.
- A route's replay stops, inconclusive, once it has spent more than the corpus's `token_budget`.
- Nothing here keeps a prompt or an answer: a probe's outcome is a pass flag and one of the check codes
  of `catalog.qualification`, and the token counts the upstream reported (per probe: `RouteRun.costs`).
"""

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from catalog.models import Provenance
from catalog.qualification import (
    MALFORMED,
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
from proxy import upstream
from proxy.adapters.chat_chunks import ChatChunkReader
from proxy.adapters.chat_over_messages import (
    AnthropicToChatStream,
    anthropic_to_chat_response,
    chat_to_anthropic_request,
)
from proxy.adapters.translate import RequestTranslationError, ResponseTranslationError
from proxy.providers.base import UpstreamCall
from proxy.providers.registry import provider, upstream_call
from proxy.sse import Block, SSEParser
from proxy.upstream import ResponseTooLarge, TransportFailure
from routing.failures import ErrorShape, FailureClass, Observation, classify
from routing.route import Target
from routing.types import Requirements

CLIENT_ROUTE = "/chat/completions"  # the corpus's own form
MESSAGES = "/messages"
CLIENT_ROUTES = (CLIENT_ROUTE, MESSAGES)  # every client API a route serves coding agents through


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


def streamed_answer(call: UpstreamCall, raw: bytes) -> dict[str, Any]:
    """A streamed answer as the client's API has it (through the relay's translation), in its Chat form."""
    translator = call.stream()
    blocks = _blocks(raw)
    if translator is not None:
        blocks = _blocks(b"".join(translator.feed(b) for b in blocks) + translator.finish())
    if call.client_path == MESSAGES:
        chat = AnthropicToChatStream(model=call.model, include_usage=True, created=0)
        blocks = _blocks(b"".join(chat.feed(b) for b in blocks) + chat.finish())
    reader = ChatAnswer()
    for block in blocks:
        reader.feed(block)
    reader.finish()
    return reader.answer()


async def send(call: UpstreamCall, timeout_s: float) -> tuple[int, bytes]:
    """One plain request over the gateway's own upstream client (`proxy.upstream`)."""
    response = await upstream.open_stream(
        "POST", call.url, headers=call.headers, json=call.payload, read_timeout_s=timeout_s
    )
    return response.status, await upstream.read_body(response)


async def _attempt(
    probe: Probe,
    call: UpstreamCall,
    expect: Mapping[str, Any],
    run: RouteRun,
    *,
    timeout_s: float,
    errors: ErrorShape,
) -> str:
    """One probe's request as the upstream receives it, judged: a check code. Raises Inconclusive."""
    try:
        status, raw = await send(call, timeout_s)
    except TransportFailure as failure:
        raise Inconclusive(probe.id, f"{failure.event}") from None
    except ResponseTooLarge:
        raise Inconclusive(probe.id, "upstream_response_too_large") from None
    if not 200 <= status < 300:
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        reason = _inconclusive_reason(status, parsed if isinstance(parsed, dict) else None, errors)
        if reason is not None:
            raise Inconclusive(probe.id, reason)
        return f"{REJECTED}_{status}"
    try:
        if call.payload.get("stream") is True:
            answer = streamed_answer(call, raw)
        else:
            answer = json.loads(call.response(raw))
        if call.client_path == MESSAGES and call.payload.get("stream") is not True:
            # Judged in one shape whatever the client API: the Chat form of the Messages answer.
            answer = anthropic_to_chat_response(answer, model=call.model, created=0)  # judged, never shown
    except (ResponseTranslationError, ValueError, TypeError, AttributeError):
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


def ways(probe: Probe) -> list[tuple[int, bool, str]]:
    """Every (sample, streamed, client route) a probe is sent through, in order."""
    streams = (False, True) if probe.stream else (False,)
    return [
        (n, stream, path) for n in range(1, probe.samples + 1) for stream in streams for path in CLIENT_ROUTES
    ]


def label(probe: Probe, sample: int, stream: bool, path: str) -> str:
    """`tool_call`, `tool_call@messages/sse#3`: which way of which sample decided a probe."""
    way = ("@messages" if path == MESSAGES else "") + ("/sse" if stream else "")
    return f"{probe.id}{way}{f'#{sample}' if sample > 1 else ''}"


async def replay(
    target: Target, model: str, corpus: Corpus, *, timeout_s: float, tokens: Mapping[str, str] | None = None
) -> RouteRun:
    """Every probe of the corpus through `target` serving `model`, in order, through every way
    (`ways`): as a Chat client and as an Anthropic Messages client (on an `openai` route the second goes
    through the Messages -> Chat translation; on an `anthropic` route the two send the same request,
    which is judged once per sample), plain and, for a streamed probe, over SSE; `samples` times. A
    probe passes when every way passed. Raises Inconclusive (over the token budget too)."""
    tokens = tokens or nonces()
    run = RouteRun()
    for probe in corpus.probes:
        body, expect = render(probe, tokens, corpus.values)
        sent: list[tuple[int, dict]] = []
        outcome = Outcome(probe.id, True, OK)
        for sample, stream, path in ways(probe):
            name = label(probe, sample, stream, path)
            try:
                chat_body = (
                    {**body, "stream": True, "stream_options": {"include_usage": True}} if stream else body
                )
                client_body = chat_body if path == CLIENT_ROUTE else chat_to_anthropic_request(chat_body)
                call = upstream_call(
                    path,
                    target,
                    client_body,
                    model=model,
                    requirements=Requirements(),
                    credential=credential_of(target),
                    created=int(time.time()),
                )
            except RequestTranslationError:
                outcome = Outcome(name, False, UNTRANSLATABLE)
                break
            if call.wire is not None and call.wire.stream() is not None:
                # A provider with its own API (gemini, bedrock): the checks read bodies on the Chat
                # wire, so verdicts on its translated request would be about the wrong body.
                raise Inconclusive(probe.id, "not judged: the route speaks its provider's own API")
            if (sample, call.payload) in sent:
                continue
            sent.append((sample, call.payload))
            code = await _attempt(
                probe, call, expect, run, timeout_s=timeout_s, errors=provider(target.adapter).errors
            )
            if run.tokens > corpus.token_budget:
                raise Inconclusive(name, f"over the corpus's token budget ({corpus.token_budget} tokens)")
            if code != OK:
                outcome = Outcome(name, False, code)
                break
        run.outcomes[probe.id] = outcome
    return run
