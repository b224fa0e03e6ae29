"""Azure OpenAI (`azure_openai`): the OpenAI wire behind Azure's URLs, credential header and error codes.

Two surfaces, chosen by the assignment's `base_url`:
- `https://<resource>.openai.azure.com/openai/v1`: Azure's OpenAI-shaped surface; every route goes there
  as it would to OpenAI, the model in the body.
- `https://<resource>.openai.azure.com` (the resource endpoint): Chat Completions (and an Anthropic
  Messages client translated to it) and embeddings go to the deployment the model names
  (`/openai/deployments/{model}/...?api-version=API_VERSION`: the catalog's model id is the
  deployment's name), Responses to the resource's `/openai/v1` surface, which every resource has.
The key travels in `api-key`. A credential written `Bearer <token>` is a Microsoft Entra ID access token
(the operator's explicit choice: Azure keys never carry a scheme) and travels in `authorization` instead,
on every request and on the deployments listing; the token is used as stored, never refreshed here. A
prompt Azure's content filter blocks is its 400 code `content_filter`, a safety refusal like a
`content_filter` finish reason (SPEC §5.6, terminal). A deployment the resource does not have is its 404
code `DeploymentNotFound`: this account lacks the model, so it reads as OpenAI's
`model_not_found` (`model_unavailable`: another account may serve it). No Files API is carried (Azure's
differs in purposes and lifetime).

Catalog discovery lists the resource's deployments, on either surface: the model a request names is a
deployment's name, on `/openai/v1` too, and `/openai/v1/models` lists the base models the resource may
deploy, not the deployments it serves. The listing is the data plane's `GET /openai/deployments` with
`api-version=LISTING_VERSION` (the last version that kept it; later ones answer 404), one page, with the
same credential header. A deployment whose `status` is not `succeeded` (being created, failed, deleted) is
not listed.

The deployment surface's API_VERSION (2024-10-21, GA) takes a Chat Completions body of its own shape: the
fields, roles and user content parts of `createChatCompletionRequest` in the version's OpenAPI spec
(Azure/azure-rest-api-specs, `specification/cognitiveservices/data-plane/AzureOpenAI/inference/stable/
2024-10-21/inference.yaml`; the version lifecycle page, learn.microsoft.com/azure/ai-services/openai/
api-version-deprecation, lists what each later preview added). Later fields (`reasoning_effort`,
`store`, `metadata`, `modalities`, `audio`, `prediction`, `service_tier`, `prompt_cache_key`, ...),
the `developer` role and user parts other than text and images (`input_audio`, `file`) are answered by
Azure with a 400 (`Unrecognized request argument supplied`, `invalid_value`): each is refused before
dispatch naming it (a preview version is not chosen instead: previews are retired on a schedule), so
another account may serve the request and an Azure 400 after dispatch stays the client's own error,
never "the model is not here" (SPEC §5.6). A Chat body the version takes is sent unchanged. The
`reasoning_effort` an Anthropic client's thinking becomes (`messages_over_chat`) is dropped there
instead, as it is for any model that takes none. The `/openai/v1` surface takes no version and every field.
"""

import json
from collections.abc import Mapping
from dataclasses import replace

from proxy.wire.providers.base import (
    CHAT,
    COMPACT,
    EMBEDDINGS,
    MESSAGES,
    NO_HEADERS,
    RESPONSES,
    SSE,
    Json,
    ModelPage,
    SigV4,
    StreamTranslator,
    UpstreamCall,
    path_segment,
    url,
)
from proxy.wire.providers.chat_request import refuse
from proxy.wire.providers.openai import OpenAI
from routing.policy.route import Target
from routing.policy.types import Requirements

# The GA data-plane version of the deployment URLs; the /openai/v1 surface takes none.
API_VERSION = "2024-10-21"
V1 = "/openai/v1"
DEPLOYMENT_ROUTES = frozenset({CHAT, MESSAGES, EMBEDDINGS})
LISTING_VERSION = "2023-03-15-preview"
SUCCEEDED = "succeeded"
# What API_VERSION's Chat Completions request takes (module docstring): top-level fields, message roles,
# the types of a user message's content parts.
VERSION_FIELDS = frozenset(
    {
        "model",
        "messages",
        "data_sources",
        "temperature",
        "top_p",
        "n",
        "stream",
        "stream_options",
        "stop",
        "max_tokens",
        "max_completion_tokens",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "user",
        "seed",
        "response_format",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "functions",
        "function_call",
    }
)
VERSION_ROLES = frozenset({"system", "user", "assistant", "tool", "function"})
VERSION_USER_PARTS = frozenset({"text", "image_url"})
# The scheme that marks a credential as an Entra ID token rather than a resource key.
ENTRA = "Bearer "
# Azure's codes for what OpenAI's canonical codes already name.
CANONICAL_CODES = {"DeploymentNotFound": "model_not_found"}


class AzureWire:
    """Azure's errors with their canonical code; answers and streams are OpenAI's as they come."""

    framing = SSE
    sigv4: SigV4 | None = None

    def stream(self) -> StreamTranslator | None:
        return None

    def answer(self, status: int, headers: Mapping[str, str], raw: bytes) -> tuple[int, bytes]:
        if status < 400:
            return status, raw
        try:
            payload = json.loads(raw)
        except ValueError:
            return status, raw
        error = payload.get("error") if isinstance(payload, dict) else None
        if isinstance(error, dict) and error.get("code") in CANONICAL_CODES:
            return status, json.dumps({"error": {**error, "code": CANONICAL_CODES[error["code"]]}}).encode()
        return status, raw


WIRE = AzureWire()


def versioned(chat: Json) -> None:
    """Refuses (RequestTranslationError naming it) what API_VERSION's Chat request does not take; a shape
    it takes but malformed is left to Azure, whose 400 is the client's error either way."""
    for key in chat:
        if key not in VERSION_FIELDS:
            refuse(key)
    messages = chat.get("messages")
    for index, message in enumerate(messages if isinstance(messages, list) else ()):
        if not isinstance(message, dict):
            continue
        if message.get("role") not in VERSION_ROLES:
            refuse(f"messages[{index}].role")
        content = message.get("content")
        if message["role"] == "user" and isinstance(content, list):
            for at, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") not in VERSION_USER_PARTS:
                    refuse(f"messages[{index}].content[{at}].type")


class AzureOpenAI(OpenAI):
    name = "azure_openai"
    routes = frozenset({CHAT, RESPONSES, COMPACT, MESSAGES, EMBEDDINGS})
    protocol = {"api-version": API_VERSION}

    def auth_headers(self, credential: str) -> dict[str, str]:
        if credential.startswith(ENTRA):
            token = credential.removeprefix(ENTRA).strip()
            return {"authorization": f"{ENTRA}{token}"} if token else {}
        return {"api-key": credential} if credential else {}

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
        base = target.base_url.rstrip("/")
        deployment = not base.endswith(V1) and path in DEPLOYMENT_ROUTES
        if deployment:
            root = f"{base}/openai/deployments/{path_segment(model)}"
        else:
            root = base if base.endswith(V1) else base + V1
        call = super().call(
            path,
            replace(target, base_url=root),
            body,
            model=model,
            requirements=requirements,
            credential=credential,
            created=created,
        )
        if not deployment:
            return replace(call, wire=WIRE)
        if path != EMBEDDINGS:
            if path == MESSAGES:
                call.payload.pop("reasoning_effort", None)
            versioned(call.payload)
        return replace(call, url=f"{call.url}?api-version={API_VERSION}", wire=WIRE)

    def models_url(self, base_url: str) -> str:
        endpoint = base_url.rstrip("/").removesuffix(V1)
        return url(endpoint, f"/openai/deployments?api-version={LISTING_VERSION}")

    def model_page(self, payload: object) -> ModelPage:
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list):
            raise ValueError("not a deployment list")
        ids = []
        for item in data:
            name = item.get("id") if isinstance(item, dict) else None
            if not isinstance(name, str) or not name:
                raise ValueError("not a deployment list")
            if item.get("status", SUCCEEDED) == SUCCEEDED:
                ids.append(name)
        return ModelPage(ids)


PROVIDER = AzureOpenAI()
