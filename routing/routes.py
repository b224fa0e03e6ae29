"""Which upstream adapters can carry each client route (SPEC §4, §5.3).

PURE. A Responses turn and an embeddings request have no Anthropic form and count_tokens no OpenAI
one; every other route is
carried by every adapter (as sent, or translated: `proxy.adapters.codec`). Eligibility reads this as
`Requirements.adapters`, so the router, `auto` and `routing_explain` agree on it.
"""

from collections.abc import Mapping

OPENAI_FAMILY = frozenset({"openai", "openrouter"})
ANTHROPIC_FAMILY = frozenset({"anthropic"})

# The client routes, without `/v1`.
CLIENT_ROUTES = (
    "/chat/completions",
    "/responses",
    "/responses/compact",
    "/messages",
    "/messages/count_tokens",
    "/embeddings",
)

# The Files API exists on OpenAI itself, not on OpenRouter or Anthropic-shaped accounts.
FILES_ADAPTERS = frozenset({"openai"})

ROUTE_ADAPTERS: Mapping[str, frozenset[str]] = {
    "/files": FILES_ADAPTERS,
    "/responses": OPENAI_FAMILY,
    "/responses/compact": OPENAI_FAMILY,
    "/messages/count_tokens": ANTHROPIC_FAMILY,
    # Anthropic has no embeddings API.
    "/embeddings": OPENAI_FAMILY,
}


def carriers(route: str) -> frozenset[str] | None:
    """The adapters that can serve client route `route` (None: every adapter)."""
    return ROUTE_ADAPTERS.get(route)
