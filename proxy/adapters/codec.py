"""Which upstream request a client route becomes on a given assignment, and how the answer comes back.

PURE apart from reading the upstream credential from the environment (through the adapters). The relay
asks `upstream_call` once per attempt; everything that depends on the pair (client API, upstream
adapter) is decided here and nowhere else:

| client route | `openai` / `openrouter` assignment | `anthropic` assignment |
| --- | --- | --- |
| `/chat/completions` | as sent (a stream asks for usage) | translated to `/messages` and back |
| `/responses`, `/responses/compact` | as sent | not carried (no Anthropic form) |
| `/messages` | translated to `/chat/completions` and back | as sent |
| `/messages/count_tokens` | not carried (no OpenAI form) | as sent |
| `/embeddings` | as sent (plain only) | not carried (no Anthropic form) |

A route an adapter cannot carry is excluded by eligibility before dispatch (`routing.routes` becomes
`Requirements.adapters`), so `upstream_call` never sees one. A request the translation refuses raises
`RequestTranslationError` before anything is sent.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from proxy.adapters import anthropic as anthropic_adapter
from proxy.adapters import openai as openai_adapter
from proxy.adapters.translate import (
    AnthropicToChatStream,
    ChatToAnthropicStream,
    ResponseTranslationError,
    anthropic_to_chat_request,
    anthropic_to_chat_response,
    chat_to_anthropic_request,
    chat_to_anthropic_response,
)
from proxy.sse import Block, Dialect
from routing.route import Target
from routing.routes import ANTHROPIC_FAMILY
from routing.types import Requirements

CHAT = "/chat/completions"
MESSAGES = "/messages"
COUNT_TOKENS = "/messages/count_tokens"
FILES = "/files"
ANTHROPIC_ROUTES = frozenset({MESSAGES, COUNT_TOKENS})


class StreamTranslator(Protocol):
    """Upstream SSE blocks in, client SSE bytes out (`proxy.adapters.translate`)."""

    @property
    def ended(self) -> bool: ...

    def feed(self, block: Block) -> bytes: ...

    def finish(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class UpstreamCall:
    """One attempt's upstream request, and how its answer reaches the client."""

    url: str
    headers: dict[str, str]
    payload: dict
    dialect: Dialect  # what the upstream streams in
    translated: bool  # the client speaks the other API: answers are translated back
    client_path: str
    model: str
    include_usage: bool = False  # a Chat client's `stream_options.include_usage`
    # The gateway asked a Chat stream for usage the client did not ask for: its usage-only chunk is
    # read for the ledger and not relayed (SPEC §6.0).
    strip_usage: bool = False

    def response(self, raw: bytes) -> bytes:
        """A successful plain answer as the client's API has it; ResponseTranslationError when the
        upstream's answer cannot be carried."""
        if not self.translated:
            return raw
        try:
            parsed = json.loads(raw)
        except ValueError:
            raise ResponseTranslationError("body") from None
        if not isinstance(parsed, dict):
            raise ResponseTranslationError("body")
        if self.client_path == MESSAGES:
            return _dumps(chat_to_anthropic_response(parsed, model=self.model))
        return _dumps(anthropic_to_chat_response(parsed, model=self.model))

    def stream(self) -> StreamTranslator | None:
        """A fresh translator for one streamed answer (None: relayed as it comes)."""
        if not self.translated:
            return None
        if self.client_path == MESSAGES:
            return ChatToAnthropicStream(model=self.model)
        return AnthropicToChatStream(model=self.model, include_usage=self.include_usage)


def _dumps(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _include_usage(body: Mapping) -> bool:
    options = body.get("stream_options")
    return isinstance(options, Mapping) and options.get("include_usage") is True


def upstream_call(
    path: str,
    target: Target,
    body: dict,
    *,
    model: str,
    requirements: Requirements,
    anthropic_beta: str | None = None,
) -> UpstreamCall:
    """The request for client route `path` (without `/v1`) on `target`, serving `model`."""
    if path == FILES or path.startswith(FILES + "/"):
        # The Files API: no model, no translation; only `openai` accounts are eligible (routing.files).
        url, headers = openai_adapter.files_request(target, path)
        return UpstreamCall(url, headers, {}, Dialect.CHAT, False, path, model)
    anthropic_upstream = target.adapter in ANTHROPIC_FAMILY
    if path in ANTHROPIC_ROUTES and anthropic_upstream:
        url, headers, payload = anthropic_adapter.build_request(
            target, path, body, model=model, requirements=requirements, anthropic_beta=anthropic_beta
        )
        return UpstreamCall(url, headers, payload, Dialect.ANTHROPIC, False, path, model)
    if path == MESSAGES:
        chat = anthropic_to_chat_request(body)
        url, headers, payload = openai_adapter.build_request(
            target, CHAT, chat, model=model, requirements=requirements
        )
        return UpstreamCall(url, headers, payload, Dialect.CHAT, True, path, model)
    if path == CHAT and anthropic_upstream:
        messages = chat_to_anthropic_request(body)
        url, headers, payload = anthropic_adapter.build_request(
            target, MESSAGES, messages, model=model, requirements=requirements
        )
        return UpstreamCall(
            url, headers, payload, Dialect.ANTHROPIC, True, path, model, include_usage=_include_usage(body)
        )
    if anthropic_upstream or path == COUNT_TOKENS:
        # Eligibility keeps such candidates out of every plan (`routing.routes`).
        raise ValueError(f"{target.adapter} cannot carry {path}")
    url, headers, payload = openai_adapter.build_request(
        target, path, body, model=model, requirements=requirements
    )
    if path != CHAT:
        return UpstreamCall(url, headers, payload, Dialect.RESPONSES, False, path, model)
    strip_usage = False
    if body.get("stream") is True and not _include_usage(body):
        # OpenAI streams report usage only when asked: without it a streamed answer is never charged.
        options = body.get("stream_options")
        payload["stream_options"] = {
            **(options if isinstance(options, Mapping) else {}),
            "include_usage": True,
        }
        strip_usage = True
    return UpstreamCall(url, headers, payload, Dialect.CHAT, False, path, model, strip_usage=strip_usage)
