"""What an upstream provider module gives the gateway: the `Provider` protocol, and the one attempt's
upstream request a provider builds (`UpstreamCall`).

A provider is one module of `proxy.wire.providers` holding one object that satisfies `Provider`; the registry
(`proxy.wire.providers.registry`) keys them by their `Adapter` value. Everything that differs between two
upstream APIs is decided behind this protocol: which client routes the provider carries (as sent or
translated), its URLs, its credential headers, the request it is sent and how its answer comes back to
the client, where its error bodies keep their canonical fields, and how it lists its models.
"""

import json
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from proxy.wire.sse import Block, Dialect
from proxy.wire.translations.messages_over_chat import ChatToAnthropicStream, chat_to_anthropic_response
from proxy.wire.translations.responses_over_chat import namespaced, responses_to_chat_request
from proxy.wire.translations.responses_over_chat_answer import chat_to_responses_response, echo
from proxy.wire.translations.responses_over_chat_stream import ChatToResponsesStream
from proxy.wire.translations.translate import ResponseTranslationError
from routing.policy.failures import ErrorShape
from routing.policy.route import Target
from routing.policy.types import Requirements
from routing.policy.vocabulary import ClientRoute

# The client's headers a provider may be handed (`Provider.call`): none, and Anthropic's beta flags.
NO_HEADERS: Mapping[str, str] = MappingProxyType({})
BETA = "anthropic-beta"

# The client routes as providers speak them: without `/v1` (`ClientRoute.tail`).
CHAT = ClientRoute.CHAT_COMPLETIONS.tail
RESPONSES = ClientRoute.RESPONSES.tail
COMPACT = ClientRoute.RESPONSES_COMPACT.tail
MESSAGES = ClientRoute.MESSAGES.tail
COUNT_TOKENS = ClientRoute.COUNT_TOKENS.tail
FILES = ClientRoute.FILES.tail
EMBEDDINGS = ClientRoute.EMBEDDINGS.tail


Json = dict[str, Any]  # a parsed JSON object


# An account behind an AWS-fronted endpoint (a Bedrock-compatible proxy) may answer with AWS's top-level
# `__type` instead of its provider's envelope: the OpenAI- and Anthropic-shaped providers read it as the type.
AWS_FRONTED = ErrorShape(type_field="__type")


class StreamTranslator(Protocol):
    """Upstream SSE blocks in, client SSE bytes out (`proxy.wire.translations.messages_over_chat` and
    `proxy.wire.translations.chat_over_messages`)."""

    @property
    def ended(self) -> bool: ...

    def feed(self, block: Block) -> bytes: ...

    def finish(self) -> bytes: ...


@runtime_checkable
class NamesResponse(Protocol):
    """A stream translator into the Responses API: it names the response the client is shown (the id a
    `previous_response_id` would give back), once its first event is out."""

    @property
    def response_id(self) -> str | None: ...


SSE = "sse"
AWS_EVENTSTREAM = "aws-eventstream"  # AWS's binary event-stream frames (Bedrock's ConverseStream)


@dataclass(frozen=True, slots=True)
class SigV4:
    """An AWS Signature Version 4 the transport adds over the request as it is sent (its final URL,
    headers and body bytes), with botocore's signer."""

    service: str
    region: str
    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class GoogleOAuth:
    """A Google service account whose OAuth 2.0 access token the transport sends as `authorization: Bearer`:
    exchanged by google-auth at the key file's `token_uri` and kept until it expires (`runtime.google_oauth`).
    A key file google-auth cannot read, or a token endpoint that refuses it, is the account's credential
    rejected, with nothing sent to the API (SPEC §5.6)."""

    key_file: str = field(repr=False)  # the service-account JSON, as the credential stores it


class Wire(Protocol):
    """A provider whose own wire the relay sees as the Chat Completions one: each plain answer, error and
    stream is rewritten at the transport seam (`proxy.relay.HttpDispatch`, `proxy.framing`) before the
    relay reads it, so usage, finish reasons, refusals and errors are read as for any Chat upstream and a
    client of another API is translated from Chat as for an `openai` account."""

    @property
    def framing(self) -> str:
        """How a streamed answer arrives: `SSE` or `AWS_EVENTSTREAM` (each frame a block named by its
        event type, or `exception` with `{"type": <name>}`)."""
        ...

    @property
    def sigv4(self) -> SigV4 | None:
        """The signature the request needs, if any."""
        ...

    def answer(self, status: int, headers: Mapping[str, str], raw: bytes) -> tuple[int, bytes]:
        """A plain answer or error body, and its status, as the Chat wire has them (the status is kept
        except where the provider's module documents one that means another)."""
        ...

    def stream(self) -> StreamTranslator | None:
        """A fresh rewriter of one streamed answer's blocks into Chat SSE bytes (None: as they come)."""
        ...


@dataclass(frozen=True, slots=True)
class UpstreamCall:
    """One attempt's upstream request, and how its answer reaches the client."""

    url: str
    headers: dict[str, str]
    payload: Json
    dialect: Dialect  # what the upstream streams in
    client_path: str
    model: str
    # The client speaks another API: a plain answer goes through `answer`, a stream through a fresh
    # `translator()` (None: relayed as it comes).
    answer: Callable[[Json], Json] | None = None
    translator: Callable[[], StreamTranslator] | None = None
    # The gateway asked a Chat stream for usage the client did not ask for: its usage-only chunk is
    # read for the ledger and not relayed (SPEC §6.0).
    strip_usage: bool = False
    # A provider whose wire is not the one `dialect` names (its answers reach the relay rewritten).
    wire: Wire | None = None
    # The service account whose access token the transport adds (None: `headers` carry the credential).
    oauth: GoogleOAuth | None = None

    def response(self, raw: bytes) -> bytes:
        """A successful plain answer as the client's API has it; ResponseTranslationError when the
        upstream's answer cannot be carried."""
        if self.answer is None:
            return raw
        try:
            parsed = json.loads(raw)
        except ValueError:
            raise ResponseTranslationError("body") from None
        if not isinstance(parsed, dict):
            raise ResponseTranslationError("body")
        return json.dumps(self.answer(parsed), separators=(",", ":"), ensure_ascii=False).encode()

    def stream(self) -> StreamTranslator | None:
        """A fresh translator for one streamed answer (None: relayed as it comes)."""
        return self.translator() if self.translator is not None else None


@dataclass(frozen=True, slots=True)
class ModelPage:
    """One page of a provider's model listing: the ids, and the query of the next page (None: last)."""

    ids: list[str]
    next_query: dict[str, str] | None = None


class Provider(Protocol):
    """One upstream provider (an `Adapter` value). Implementations are stateless module-level objects."""

    @property
    def name(self) -> str:
        """The `Adapter` value: the registry's key and a trace's `gen_ai.provider.name`."""
        ...

    @property
    def routes(self) -> frozenset[str]:
        """The client routes (without `/v1`) it carries, as sent or translated: eligibility keeps
        every other route's requests away from it (`routing.policy.routes`)."""
        ...

    @property
    def protocol(self) -> Mapping[str, str]:
        """The protocol settings sent with every request (e.g. an API version header): part of a
        route's configuration hash, so a change invalidates capability evidence."""
        ...

    @property
    def errors(self) -> ErrorShape:
        """Where its error bodies keep the canonical type, code and param (SPEC §5.6)."""
        ...

    def auth_headers(self, credential: str) -> dict[str, str]:
        """The headers that carry `credential` (and the protocol settings); none for ""."""
        ...

    def call(
        self,
        path: str,
        target: Target,
        body: Json,
        *,
        model: str,
        requirements: Requirements,
        credential: str,
        created: int,
        response_id: str = "",
        client_headers: Mapping[str, str] = NO_HEADERS,
    ) -> UpstreamCall:
        """The upstream request for client route `path` (one of `routes`) on `target`, serving
        `model`. `created`: when the call is made (Unix seconds, the caller's clock), the `created` or
        `created_at` of every answer translated from its upstream's wire, each chunk of a stream alike.
        `response_id`: the id a Responses answer translated from another wire is given (the caller's
        `proxy.ledger.exchange.new_response_id`: never an upstream's, issue 45). `client_headers`: the
        client's request headers its API passes on (`ClientApi.forwarded_headers`, lowercase names), for
        the provider to carry as its upstream expects them (Anthropic's `anthropic-beta`).
        RequestTranslationError when the body cannot be carried to this API."""
        ...

    def models_url(self, base_url: str) -> str:
        """Where its model listing (SPEC §8 discovery) starts."""
        ...

    def model_page(self, payload: object) -> ModelPage:
        """One parsed listing page; ValueError when it is not a model list."""
        ...


@runtime_checkable
class SignedListing(Protocol):
    """A provider whose model listing is signed with SigV4 rather than carried by `auth_headers` (Bedrock's
    control plane): discovery signs each listing request with what this returns."""

    def signature(self, base_url: str, region: str, credential: str) -> SigV4:
        """The signature of a listing request for an assignment on `base_url` in `region`."""
        ...


@runtime_checkable
class Listings(Protocol):
    """A provider whose models are listed by more than one listing, or at a place that depends on the
    assignment's region (Bedrock's foundation models and inference profiles, Vertex's regional hosts):
    discovery asks each of these instead of `models_url`, page after page, with `model_page`."""

    def listings(self, base_url: str, region: str) -> tuple[str, ...]: ...


@runtime_checkable
class TokenListing(Protocol):
    """A provider whose listing is authorized by a service account's access token (Vertex): discovery
    exchanges the credential as the transport does and sends the token as `authorization: Bearer`."""

    def oauth(self, credential: str) -> GoogleOAuth: ...


# RFC 3986's unreserved characters and the two a path segment also takes as they are (a Bedrock model id
# has a colon): the HTTP client sends these unencoded whatever it is given, and a signature (SigV4) must
# cover the path as sent. Everything else is percent-encoded.
_SEGMENT_SAFE = frozenset(string.ascii_letters + string.digits + "-._~:@")


def path_segment(value: str) -> str:
    """`value` (a model or deployment id) as one URL path segment (urllib.parse is out of reach of a
    pure module: its package also does I/O)."""
    return "".join(ch if ch in _SEGMENT_SAFE else "".join(f"%{b:02X}" for b in ch.encode()) for ch in value)


def url(base_url: str, path: str) -> str:
    return f"{base_url.rstrip('/')}{path}"


def json_headers(auth: dict[str, str]) -> dict[str, str]:
    return {**auth, "content-type": "application/json"}


def data_ids(payload: object) -> list[str]:
    """The ids of a `{"data": [{"id": ...}, ...]}` model list (OpenAI's and Anthropic's shape)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        raise ValueError("not a model list")
    ids = []
    for item in payload["data"]:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not item["id"]:
            raise ValueError("not a model list")
        ids.append(item["id"])
    return ids


def include_usage(body: Json) -> bool:
    options = body.get("stream_options")
    return isinstance(options, Mapping) and options.get("include_usage") is True


def messages_over_chat(
    where: str, headers: dict[str, str], chat: Json, model: str, wire: Wire | None = None
) -> UpstreamCall:
    """A Messages client's call to a Chat-shaped upstream (`chat` already translated): the answer and
    the stream are translated back to Messages."""
    return UpstreamCall(
        where,
        headers,
        chat,
        Dialect.CHAT,
        MESSAGES,
        model,
        answer=partial(chat_to_anthropic_response, model=model),
        translator=partial(ChatToAnthropicStream, model=model),
        wire=wire,
    )


def answered_as(body: Json, *, model: str, created: int, response_id: str) -> Json:
    """The arguments a Responses answer translated for `body` is made with (its echoed fields, the
    client's names of its namespaced functions, and a response id of the gateway's own)."""
    return {
        "model": model,
        "echoed": echo(body),
        "names": namespaced(body),
        "created": created,
        "response_id": response_id,
    }


def responses_over_chat(
    where: str,
    headers: dict[str, str],
    body: Json,
    model: str,
    *,
    created: int,
    response_id: str,
    upstream: Callable[[Json], Json] | None = None,
    stream_usage: bool = True,
    wire: Wire | None = None,
) -> UpstreamCall:
    """A Responses client's call to a Chat-shaped upstream: `body` translated to Chat (with `model`),
    then by `upstream` to the provider's own request when it has one (its refusals renamed to the
    client's fields); the answer and the stream are translated back to Responses, created at `created`.
    `stream_usage`: a stream asks for usage (`stream_options`), as every Responses stream reports it."""
    chat = responses_to_chat_request(body, stream_usage=stream_usage)
    with chat.refusals():
        payload = {**chat.body, "model": model}
        payload = upstream(payload) if upstream is not None else payload
    # What the answer says of the request, in either form: the same minted id for both.
    answered = answered_as(body, model=model, created=created, response_id=response_id)
    return UpstreamCall(
        where,
        headers,
        payload,
        Dialect.CHAT,
        RESPONSES,
        model,
        answer=partial(chat_to_responses_response, **answered),
        translator=partial(ChatToResponsesStream, **answered),
        wire=wire,
    )
