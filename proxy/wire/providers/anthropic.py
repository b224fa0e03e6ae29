"""Anthropic (`anthropic`): Messages and count_tokens as sent; a Chat Completions client is translated to
Messages and back, and so is a Responses client, through Chat
(`proxy.wire.translations.responses_over_messages`).
Responses state (`previous_response_id`) is not carried over HTTP; compact has no Anthropic form.

The body is forwarded with only `model` set to the candidate's model. The client's `anthropic-beta`
header travels with the body it describes (beta features change the request's meaning). Zero retention
is an assignment property checked by eligibility: Anthropic has no per-request privacy block.
"""

from collections.abc import Mapping
from functools import partial

from proxy.wire.providers.base import (
    AWS_FRONTED,
    BETA,
    CHAT,
    COUNT_TOKENS,
    MESSAGES,
    NO_HEADERS,
    RESPONSES,
    Json,
    ModelPage,
    UpstreamCall,
    answered_as,
    data_ids,
    include_usage,
    json_headers,
    url,
)
from proxy.wire.sse import Dialect
from proxy.wire.translations.chat_over_messages import (
    AnthropicToChatStream,
    anthropic_to_chat_response,
    chat_to_anthropic_request,
)
from proxy.wire.translations.responses_over_messages import (
    AnthropicToResponsesStream,
    anthropic_to_responses_response,
    responses_to_anthropic_request,
)
from routing.policy.route import Target
from routing.policy.types import Requirements

VERSION = "2023-06-01"


class Anthropic:
    name = "anthropic"
    routes = frozenset({CHAT, RESPONSES, MESSAGES, COUNT_TOKENS})
    protocol = {"anthropic-version": VERSION}
    errors = AWS_FRONTED

    def auth_headers(self, credential: str) -> dict[str, str]:
        return {**self.protocol, "x-api-key": credential} if credential else dict(self.protocol)

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
        headers = json_headers(self.auth_headers(credential))
        if path == CHAT:
            messages = {**chat_to_anthropic_request(body), "model": model}
            return UpstreamCall(
                url(target.base_url, MESSAGES),
                headers,
                messages,
                Dialect.ANTHROPIC,
                path,
                model,
                answer=partial(anthropic_to_chat_response, model=model, created=created),
                translator=partial(
                    AnthropicToChatStream, model=model, include_usage=include_usage(body), created=created
                ),
            )
        if path == RESPONSES:
            answered = answered_as(body, model=model, created=created, response_id=response_id)
            return UpstreamCall(
                url(target.base_url, MESSAGES),
                headers,
                {**responses_to_anthropic_request(body), "model": model},
                Dialect.ANTHROPIC,
                path,
                model,
                answer=partial(anthropic_to_responses_response, **answered),
                translator=partial(AnthropicToResponsesStream, **answered),
            )
        if BETA in client_headers:
            headers[BETA] = client_headers[BETA]
        return UpstreamCall(
            url(target.base_url, path), headers, {**body, "model": model}, Dialect.ANTHROPIC, path, model
        )

    def models_url(self, base_url: str) -> str:
        return url(base_url, "/models")

    def model_page(self, payload: object) -> ModelPage:
        """Anthropic pages its listing: `has_more` with `last_id`, asked for again as `after_id`."""
        ids = data_ids(payload)
        more = isinstance(payload, dict) and payload.get("has_more") is True
        cursor = payload.get("last_id") if more and isinstance(payload, dict) else None
        return ModelPage(ids, {"after_id": cursor} if isinstance(cursor, str) and cursor else None)


PROVIDER = Anthropic()
