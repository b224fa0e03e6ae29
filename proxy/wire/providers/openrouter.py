"""OpenRouter (`openrouter`): OpenAI's Chat Completions, Responses and embeddings, without a Files API,
and with its privacy routing block whenever the turn requires zero retention (a route that cannot honour
privacy is ineligible, never stripped of it)."""

from proxy.wire.providers.base import CHAT, COMPACT, EMBEDDINGS, MESSAGES, RESPONSES, Json
from proxy.wire.providers.openai import OpenAI
from routing.policy.types import Requirements

PRIVACY = {"data_collection": "deny", "zdr": True, "require_parameters": True}


class OpenRouter(OpenAI):
    name = "openrouter"
    routes = frozenset({CHAT, RESPONSES, COMPACT, MESSAGES, EMBEDDINGS})

    def shape(self, payload: Json, requirements: Requirements) -> Json:
        if requirements.zero_retention:
            provider = payload.get("provider")
            payload["provider"] = {**(provider if isinstance(provider, dict) else {}), **PRIVACY}
        return payload


PROVIDER = OpenRouter()
