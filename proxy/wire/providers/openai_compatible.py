"""Self-hosted and hosted OpenAI-compatible servers (`openai_compatible`: vLLM, Ollama, Groq, Together,
Mistral...): the OpenAI wire without what such servers commonly lack.

- Chat Completions, and an Anthropic Messages or OpenAI Responses client translated to it
  (`proxy.wire.translations.messages_over_chat`, `proxy.wire.translations.responses_over_chat`), and
  embeddings: no native
  Responses (so no `previous_response_id` over HTTP), no compact, no Files API, so eligibility keeps
  those requests away (`capability`).
- `stream_options` is the assignment's declared capability (`capabilities: {stream_options: ...}`):
  - unknown (the default): a stream is sent as the client asked; the gateway adds no `stream_options`
    (older vLLM and some hosted servers reject the field), and a stream whose server reports no usage
    is recorded with unknown usage and cost (NULL), never zero;
  - true: a stream is asked for its usage as on an `openai` account (the usage-only chunk the client did
    not ask for is read for the ledger and not relayed), so its cost is known;
  - false: the field is never sent, not even the client's own (the server would refuse the request);
    the client then gets whatever usage the server reports by itself.
- Tools are the assignment's declared capability, as on any account: `capabilities: {tools: false}` for a
  server without function calling, and a turn that offers tools is then ineligible there (never stripped
  of them). The credential, if any, is a Bearer token.
"""

from collections.abc import Mapping

from proxy.wire.providers.base import (
    CHAT,
    EMBEDDINGS,
    MESSAGES,
    NO_HEADERS,
    RESPONSES,
    Json,
    UpstreamCall,
    json_headers,
    responses_over_chat,
    url,
)
from proxy.wire.providers.openai import OpenAI
from routing.policy.route import Target
from routing.policy.types import Requirements, TriState


class OpenAICompatible(OpenAI):
    name = "openai_compatible"
    routes = frozenset({CHAT, RESPONSES, MESSAGES, EMBEDDINGS})

    def asks_stream_usage(self, target: Target) -> bool:
        return target.stream_options is TriState.TRUE

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
        if path != RESPONSES:
            if target.stream_options is TriState.FALSE:
                body = {name: value for name, value in body.items() if name != "stream_options"}
            return super().call(
                path,
                target,
                body,
                model=model,
                requirements=requirements,
                credential=credential,
                created=created,
                client_headers=client_headers,
            )
        return responses_over_chat(
            url(target.base_url, CHAT),
            json_headers(self.auth_headers(credential)),
            body,
            model,
            created=created,
            response_id=response_id,
            upstream=lambda chat: self.shape(chat, requirements),
            stream_usage=self.asks_stream_usage(target),
        )


PROVIDER = OpenAICompatible()
