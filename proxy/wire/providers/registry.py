"""The upstream providers by `Adapter` value. Adding a provider is one module
(`proxy/wire/providers/<name>.py`
holding an object that satisfies `proxy.wire.providers.base.Provider`), its tests, its `Adapter` choice and
one line here.

PURE, like every provider module (they decide; the caller reads the credential and sends): the catalog
(discovery, capability hashes), routing (`routing_explain`'s carriers) and the proxy all look providers up
here.
"""

from collections.abc import Mapping

from proxy.wire.providers import (
    anthropic,
    azure_openai,
    bedrock,
    gemini,
    openai,
    openai_compatible,
    openrouter,
    vertex,
)
from proxy.wire.providers.base import NO_HEADERS, Json, Provider, UpstreamCall
from proxy.wire.providers.tool_ids import strip_signatures
from routing.policy.route import Target
from routing.policy.routes import carrier_table
from routing.policy.types import Requirements

_ALL: tuple[Provider, ...] = (
    openai.PROVIDER,
    anthropic.PROVIDER,
    openrouter.PROVIDER,
    azure_openai.PROVIDER,
    openai_compatible.PROVIDER,
    gemini.PROVIDER,
    bedrock.PROVIDER,
    vertex.PROVIDER,
)
PROVIDERS: Mapping[str, Provider] = {p.name: p for p in _ALL}

# Client route -> the adapters that carry it, for eligibility (`Requirements.adapters`).
CARRIERS = carrier_table({name: p.routes for name, p in PROVIDERS.items()})


def provider(adapter: str) -> Provider:
    return PROVIDERS[adapter]


def carriers(route: str) -> frozenset[str] | None:
    """The adapters that can serve client route `route` (None: a route no provider declares, such as
    the model list, which the gateway answers itself)."""
    return CARRIERS.get(route)


def upstream_call(
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
    """The request for client route `path` (without `/v1`) on `target`, serving `model`, carrying
    `credential` (decrypted, `pools.credentials.credential_of`, read at call time), made at `created`
    (Unix seconds, `Provider.call`). A route the target's provider cannot carry is excluded by
    eligibility before dispatch (`CARRIERS`), so it is a caller bug here; a request the translation
    refuses raises RequestTranslationError before anything is sent. Gemini's thought signatures ride in
    tool-call ids (`tool_ids`): only a Gemini model is sent them (a Vertex account strips them for Claude)."""
    chosen = PROVIDERS[target.adapter]
    route = "/files" if path.startswith("/files/") else path
    if route not in chosen.routes:
        raise ValueError(f"{target.adapter} cannot carry {path}")
    return chosen.call(
        path,
        target,
        body if chosen in (gemini.PROVIDER, vertex.PROVIDER) else strip_signatures(body),
        model=model,
        requirements=requirements,
        credential=credential,
        created=created,
        response_id=response_id,
        client_headers=client_headers,
    )
