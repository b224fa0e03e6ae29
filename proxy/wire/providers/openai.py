"""OpenAI (`openai`): Chat Completions, Responses, embeddings (plain only) and the Files API as sent; an
Anthropic Messages client is translated to Chat Completions and back (its `top_k` has no Chat field:
refused; its `thinking` and effort are `reasoning_effort` on a reasoning model,
`proxy.wire.translations.messages_over_chat`).

The client's body is forwarded as sent, with only `model` set to the candidate's model (the same model
on every same-model hop). A streamed Chat request always asks for usage (`stream_options`): OpenAI
streams report usage only when asked, and an unasked stream would go uncharged; the usage-only chunk
the client did not ask for is read for the ledger and not relayed.
"""

from collections.abc import Mapping

from proxy.wire.providers.base import (
    AWS_FRONTED,
    CHAT,
    COMPACT,
    EMBEDDINGS,
    FILES,
    MESSAGES,
    NO_HEADERS,
    RESPONSES,
    Json,
    ModelPage,
    UpstreamCall,
    data_ids,
    include_usage,
    json_headers,
    messages_over_chat,
    url,
)
from proxy.wire.sse import Dialect
from proxy.wire.translations.messages_over_chat import anthropic_to_chat_request, chat_only
from routing.policy.route import Target
from routing.policy.types import Requirements


class OpenAI:
    name = "openai"
    routes = frozenset({CHAT, RESPONSES, COMPACT, MESSAGES, EMBEDDINGS, FILES})
    protocol: dict[str, str] = {}
    errors = AWS_FRONTED

    def auth_headers(self, credential: str) -> dict[str, str]:
        return {"authorization": f"Bearer {credential}"} if credential else {}

    def asks_stream_usage(self, target: Target) -> bool:
        """Whether a stream is asked for usage (`stream_options`) the client did not ask for."""
        return True

    def shape(self, payload: Json, requirements: Requirements) -> Json:
        """The request body as this provider takes it (OpenRouter adds its privacy block)."""
        return payload

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
        auth = self.auth_headers(credential)
        if path == FILES or path.startswith(FILES + "/"):
            # No model, no translation; the body (an upload's multipart) and its content type are the
            # client's, as sent.
            return UpstreamCall(url(target.base_url, path), auth, {}, Dialect.CHAT, path, model)
        if path == MESSAGES:
            chat = self.shape(
                {**chat_only(anthropic_to_chat_request(body), model), "model": model}, requirements
            )
            return messages_over_chat(url(target.base_url, CHAT), json_headers(auth), chat, model)
        payload = self.shape({**body, "model": model}, requirements)
        if path != CHAT:
            return UpstreamCall(
                url(target.base_url, path), json_headers(auth), payload, Dialect.RESPONSES, path, model
            )
        strip_usage = (
            self.asks_stream_usage(target) and body.get("stream") is True and not include_usage(body)
        )
        if strip_usage:
            options = body.get("stream_options")
            payload["stream_options"] = {
                **(options if isinstance(options, dict) else {}),
                "include_usage": True,
            }
        return UpstreamCall(
            url(target.base_url, path),
            json_headers(auth),
            payload,
            Dialect.CHAT,
            path,
            model,
            strip_usage=strip_usage,
        )

    def models_url(self, base_url: str) -> str:
        return url(base_url, "/models")

    def model_page(self, payload: object) -> ModelPage:
        return ModelPage(data_ids(payload))


PROVIDER = OpenAI()
