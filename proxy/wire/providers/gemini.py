"""Google Gemini (`gemini`, the Generative Language API): a Chat-shaped account. Chat Completions are
translated to generateContent / streamGenerateContent (SSE) and answers back (`gemini_translate`); an
Anthropic Messages client and a Responses client go through Chat on the way (no `previous_response_id`
over HTTP: the gateway keeps no conversation). Count_tokens, embeddings and files are not carried.

- `base_url` is the API root with its version (`https://generativelanguage.googleapis.com/v1beta`); the
  model is in the URL (`/models/{model}:generateContent`), the key in `x-goog-api-key`.
- Answers reach the relay on the Chat wire (`GeminiWire`): usage, finish reasons and errors are then read
  like any Chat upstream's. A safety block (`finishReason: SAFETY` and its kin, or a blocked prompt) is
  Chat's `content_filter`: a terminal refusal (SPEC §5.6).
- Errors keep Google's status as their type and the ErrorInfo reason as their code, never the message.
  Google answers a rejected key with 400 INVALID_ARGUMENT / API_KEY_INVALID where other providers answer
  401: it is read as the 401 it means (`credential_rejected`), so a wrong key fails over and opens the
  assignment's circuit instead of failing every request as the client's mistake. RESOURCE_EXHAUSTED is a
  429 (`rate_limited`), UNAVAILABLE a 503, NOT_FOUND a bare 404 (only another model may serve it).
- Model listing: `GET {base_url}/models`, ids without the `models/` prefix, paged by `pageToken`; a model
  whose `supportedGenerationMethods` lacks `generateContent` (an embedding or image model) is not one this
  adapter can serve, so it is not listed.

PURE: it decides; the transport reads the credential and sends.
"""

import json
from collections.abc import Mapping

from proxy.wire.providers import gemini_translate
from proxy.wire.providers.base import (
    CHAT,
    MESSAGES,
    NO_HEADERS,
    RESPONSES,
    SSE,
    Json,
    ModelPage,
    SigV4,
    StreamTranslator,
    UpstreamCall,
    include_usage,
    json_headers,
    messages_over_chat,
    path_segment,
    responses_over_chat,
    url,
)
from proxy.wire.sse import Dialect
from proxy.wire.translations.messages_over_chat import (
    anthropic_to_chat_request,
)
from routing.policy.failures import ErrorShape
from routing.policy.route import Target
from routing.policy.types import Requirements

KEY_REJECTED = "API_KEY_INVALID"
GENERATE = "generateContent"


class GeminiWire:
    """Gemini's answers, errors and streams as the Chat wire has them (one per attempt)."""

    framing = SSE
    sigv4: SigV4 | None = None

    def __init__(self, model: str, created: int) -> None:
        self.model = model
        self.created = created  # the call's: every answer and chunk carries it

    def answer(self, status: int, headers: Mapping[str, str], raw: bytes) -> tuple[int, bytes]:
        try:
            payload = json.loads(raw)
        except ValueError:
            return status, raw  # not Google's JSON (a proxy's page): classified by its status alone
        if not isinstance(payload, dict):
            return status, raw
        error = payload.get("error")
        if status >= 400 or isinstance(error, dict):
            chat = gemini_translate.chat_error(error if isinstance(error, dict) else {})
            if status == 400 and chat["error"]["code"] == KEY_REJECTED:
                status = 401
            chat.pop("status", None)
            return status, json.dumps(chat).encode()
        answer = gemini_translate.gemini_to_chat_response(payload, model=self.model, created=self.created)
        return status, json.dumps(answer, separators=(",", ":"), ensure_ascii=False).encode()

    def stream(self) -> StreamTranslator | None:
        return gemini_translate.GeminiToChatStream(model=self.model, created=self.created)


class Gemini:
    name = "gemini"
    routes = frozenset({CHAT, RESPONSES, MESSAGES})
    protocol: dict[str, str] = {}
    errors = ErrorShape()  # its errors reach the relay already on the Chat wire (GeminiWire)

    def auth_headers(self, credential: str) -> dict[str, str]:
        return {"x-goog-api-key": credential} if credential else {}

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
        chat = anthropic_to_chat_request(body) if path == MESSAGES else body
        stream = chat.get("stream") is True
        method = "streamGenerateContent?alt=sse" if stream else "generateContent"
        where = url(target.base_url, f"/models/{path_segment(model)}:{method}")
        headers = json_headers(self.auth_headers(credential))
        wire = GeminiWire(model, created)
        if path == RESPONSES:
            upstream = gemini_translate.chat_to_gemini_request
            return responses_over_chat(
                where,
                headers,
                body,
                model,
                created=created,
                response_id=response_id,
                upstream=upstream,
                wire=wire,
            )
        payload = gemini_translate.chat_to_gemini_request(chat)
        if path == MESSAGES:
            return messages_over_chat(where, headers, payload, model, wire)
        # Gemini always reports usage: a Chat client that did not ask for it does not see it.
        strip = stream and not include_usage(body)
        return UpstreamCall(where, headers, payload, Dialect.CHAT, path, model, strip_usage=strip, wire=wire)

    def models_url(self, base_url: str) -> str:
        return url(base_url, "/models")

    def model_page(self, payload: object) -> ModelPage:
        models = payload.get("models") if isinstance(payload, dict) else None
        if not isinstance(payload, dict) or not isinstance(models, list):
            raise ValueError("not a model list")
        ids = []
        for item in models:
            name = item.get("name") if isinstance(item, dict) else None
            if not isinstance(name, str) or not name.startswith("models/") or name == "models/":
                raise ValueError("not a model list")
            methods = item.get("supportedGenerationMethods")
            if not isinstance(methods, list) or GENERATE in methods:
                ids.append(name.removeprefix("models/"))
        token = payload.get("nextPageToken")
        return ModelPage(ids, {"pageToken": token} if isinstance(token, str) and token else None)


PROVIDER = Gemini()
