"""Capability qualification over the network (SPEC §8.1): replay the corpus of `catalog.qualification`
through a route, the way client traffic reaches it, and judge each answer with that module's checks.

Contract:
- Each probe is a Chat Completions request and goes through `proxy.providers.registry.upstream_call`, the
  function the router's attempt loop calls, once per client API a coding agent may use: as a Chat client
  (`/chat/completions`) and as an Anthropic Messages client (`/messages`, the probe in its Messages form).
  An `openai`/`openrouter` route receives the Chat request as sent and the Messages one translated; an
  `anthropic` route receives the same translated request either way (judged once). Answers are
  translated back as the client would get them. So a verdict is about the paths real traffic takes.
- A probe the upstream rejected with a 4xx (other than an account or model problem) fails; a probe that
  could not be judged (transport failure, 5xx, rate limit, credential or model rejected) makes the whole
  route inconclusive: nothing is recorded for it.
- Nothing here keeps a prompt or an answer: a probe's outcome is a pass flag and one of the check codes
  of `catalog.qualification`, and the token counts the upstream reported.
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
from proxy.adapters.chat_over_messages import anthropic_to_chat_response, chat_to_anthropic_request
from proxy.adapters.translate import RequestTranslationError, ResponseTranslationError
from proxy.providers.base import UpstreamCall
from proxy.providers.registry import provider, upstream_call
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
        answer = json.loads(call.response(raw))
        if call.client_path == MESSAGES:
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
    choices = answer.get("choices")
    finish = choices[0].get("finish_reason") if isinstance(choices, list) and choices else None
    if classify(Observation(status=status, finish_reason=finish)) is FailureClass.SAFETY_REFUSAL:
        return REFUSED
    return judge(probe, call, answer, expect)


async def replay(
    target: Target, model: str, corpus: Corpus, *, timeout_s: float, tokens: Mapping[str, str] | None = None
) -> RouteRun:
    """Every probe of the corpus through `target` serving `model`, in order, once per client API that
    reaches the route differently (a Chat client and an Anthropic Messages client: on an `openai` route
    the second goes through the Messages -> Chat translation, on an `anthropic` route the two send the
    same request, which is judged once). A probe passes when every way passed. Raises Inconclusive."""
    tokens = tokens or nonces()
    run = RouteRun()
    for probe in corpus.probes:
        body, expect = render(probe, tokens, corpus.values)
        sent: list[dict] = []
        outcome = Outcome(probe.id, True, OK)
        for path in CLIENT_ROUTES:
            label = probe.id if path == CLIENT_ROUTE else f"{probe.id}@messages"
            try:
                client_body = body if path == CLIENT_ROUTE else chat_to_anthropic_request(body)
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
                outcome = Outcome(label, False, UNTRANSLATABLE)
                break
            if call.wire is not None and call.wire.stream() is not None:
                # A provider with its own API (gemini, bedrock): the checks read bodies on the Chat
                # wire, so verdicts on its translated request would be about the wrong body.
                raise Inconclusive(probe.id, "not judged: the route speaks its provider's own API")
            if call.payload in sent:
                continue
            sent.append(call.payload)
            code = await _attempt(
                probe, call, expect, run, timeout_s=timeout_s, errors=provider(target.adapter).errors
            )
            if code != OK:
                outcome = Outcome(label, False, code)
                break
        run.outcomes[probe.id] = outcome
    return run
