"""Amazon Bedrock (`bedrock`, the Converse API): a Chat-shaped account. Chat Completions are translated to
Converse / ConverseStream and answers back (`bedrock_translate`); an Anthropic Messages client and a
Responses client go through Chat on the way (no `previous_response_id` over HTTP: the gateway keeps no
conversation). Count_tokens, embeddings and files are not carried.

An Anthropic Messages client asking for an Anthropic model (`anthropic.claude-...`, or an inference profile
of one such as `us.anthropic.claude-...`) is served by InvokeModel instead, with its own Messages body:
`/model/{modelId}/invoke` or `/invoke-with-response-stream`, the body as sent without `model` and `stream`,
with `anthropic_version: "bedrock-2023-05-31"` and the client's `anthropic-beta` flags as the body's
`anthropic_beta` list, so every field (`thinking`, `top_k`, cache control...) reaches the model as it
would reach Anthropic's own API. The answer is the Messages JSON as it comes; each stream frame's `chunk`
carries one Messages event (base64), relayed as that SSE event (`InvokeChunks`), and an exception frame
ends the stream with a Messages `error` event of its kind. Errors are named as for Converse.

- `base_url` is the runtime endpoint, `https://bedrock-runtime.<region>.amazonaws.com`; the model id is in
  the path (`/model/{modelId}/converse`, `/converse-stream`), percent-encoded as the AWS SDKs send it.
- Every request is signed with SigV4 (service `bedrock`) by the transport, with botocore's signer, for
  the region the host names, or, for a host that names none (a proxy, a private endpoint, a local
  double), the assignment's `region`.
- The credential is `ACCESS_KEY_ID:SECRET_ACCESS_KEY`, or `...:SESSION_TOKEN` for temporary credentials.
- ConverseStream answers AWS event-stream frames, decoded by botocore's parser in the transport
  (`proxy.framing`); answers, errors and streams reach the relay on the Chat wire (`BedrockWire`).
- Errors are named by `x-amzn-ErrorType` (or a body's `__type`), never by their message:
  ThrottlingException is a 429 (`rate_limited`), ServiceUnavailableException a 503 (`unavailable`),
  ValidationException a 400 only a candidate of another model may fix (SPEC §5.6: an unknown or
  not-enabled model), AccessDeniedException and the signature refusals a 403 of the account's
  credential (`credential_rejected`). A `content_filtered` or `guardrail_intervened` stop is a terminal
  refusal.
- Catalog discovery asks the control plane, `bedrock.<region>.amazonaws.com` (the runtime host's twin; any
  other host, a proxy or a local double, is asked as it is), signed like every request:
  ListFoundationModels (`GET /foundation-models`), listing a model Converse serves by its id: text out
  (`outputModalities` has TEXT) and on-demand (`inferenceTypesSupported` has ON_DEMAND), not an embedding
  or image model, nor one served only through an inference profile or provisioned throughput; and
  ListInferenceProfiles (`GET /inference-profiles`, system-defined and the account's own application
  profiles, paged by `nextToken`), listing each ACTIVE profile by what a call names: a cross-region
  profile's id (`us.anthropic.claude-sonnet-4-...`), an application profile's ARN. A profile id or ARN is a
  model like any (`/model/{id}/converse`, InvokeModel for a Claude one); the listing does not say what a
  profile's models output, so a profile of an embedding model is listed too.

PURE: it decides; the transport reads the credential, signs and sends.
"""

import base64
import json
import re
from collections.abc import Mapping

from proxy.wire.providers import bedrock_translate
from proxy.wire.providers.base import (
    AWS_EVENTSTREAM,
    BETA,
    CHAT,
    MESSAGES,
    NO_HEADERS,
    RESPONSES,
    Json,
    ModelPage,
    SigV4,
    StreamTranslator,
    UpstreamCall,
    include_usage,
    messages_over_chat,
    path_segment,
    responses_over_chat,
    url,
)
from proxy.wire.sse import Block, Dialect, encode_block
from proxy.wire.translations.messages_over_chat import (
    anthropic_to_chat_request,
)
from routing.policy.failures import ErrorShape
from routing.policy.route import Target
from routing.policy.types import Requirements

SERVICE = "bedrock"
ANTHROPIC_VERSION = "bedrock-2023-05-31"  # InvokeModel's Messages body version
_REGION_HOST = re.compile(r"(?:^|[./])bedrock(?:-runtime)?(?:-fips)?\.(?P<region>[a-z]{2}(?:-[a-z]+)+-\d+)\.")
# The runtime host, whose control-plane twin serves the model listing.
_RUNTIME_HOST = re.compile(r"^(?P<scheme>https?://)bedrock-runtime(?P<fips>-fips)?\.")


def region_of(base_url: str, assignment_region: str) -> str:
    """The AWS region a request is signed for: the one the endpoint's host names, else the assignment's."""
    found = _REGION_HOST.search(base_url)
    return found["region"] if found else assignment_region


def _error_name(headers: Mapping[str, str], payload: object) -> str | None:
    named = headers.get("x-amzn-errortype")
    if named is None and isinstance(payload, dict):
        named = payload.get("__type")
    if not isinstance(named, str):
        return None
    # `ThrottlingException:http://internal...` or `com.amazonaws.bedrock#ThrottlingException`.
    return named.rpartition("#")[2].partition(":")[0] or None


def _aws_error(headers: Mapping[str, str], raw: bytes) -> bytes:
    """An AWS error body as the Chat wire's, named by its exception, never its message."""
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = None
    return json.dumps(bedrock_translate.chat_error(_error_name(headers, payload), None)).encode()


class BedrockWire:
    """Bedrock's answers, errors and event-stream frames as the Chat wire has them (one per attempt)."""

    framing = AWS_EVENTSTREAM

    def __init__(self, model: str, sigv4: SigV4, created: int) -> None:
        self.model = model
        self.sigv4 = sigv4
        self.created = created  # the call's: every answer and chunk carries it

    def answer(self, status: int, headers: Mapping[str, str], raw: bytes) -> tuple[int, bytes]:
        if status >= 400:
            return status, _aws_error(headers, raw)
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            return status, raw
        answer = bedrock_translate.converse_to_chat_response(
            payload,
            model=self.model,
            request_id=headers.get("x-amzn-requestid", "bedrock"),
            created=self.created,
        )
        return status, json.dumps(answer, separators=(",", ":"), ensure_ascii=False).encode()

    def stream(self) -> StreamTranslator | None:
        return bedrock_translate.ConverseToChatStream(model=self.model, created=self.created)


class InvokeWire:
    """InvokeModel's answers for an Anthropic model: the Messages API's own body as it comes, errors as
    Converse's (`BedrockWire`), each event-stream `chunk` frame one Messages stream event."""

    framing = AWS_EVENTSTREAM

    def __init__(self, sigv4: SigV4) -> None:
        self.sigv4 = sigv4

    def answer(self, status: int, headers: Mapping[str, str], raw: bytes) -> tuple[int, bytes]:
        return (status, _aws_error(headers, raw)) if status >= 400 else (status, raw)

    def stream(self) -> StreamTranslator | None:
        return InvokeChunks()


# An exception frame inside an InvokeModel stream, as the Messages API's stream error type the relay reads.
_STREAM_ERROR_TYPES = {
    "throttlingException": "rate_limit_error",
    "serviceUnavailableException": "overloaded_error",
    "validationException": "invalid_request_error",
}


class InvokeChunks:
    """InvokeModelWithResponseStream frames in, Messages SSE bytes out: a `chunk` frame's `bytes` (base64)
    is one Messages stream event, sent as it is; an exception frame ends the stream with a Messages
    `error` event naming only its type. One per upstream response."""

    def __init__(self) -> None:
        self._ended = False

    @property
    def ended(self) -> bool:
        return self._ended

    def feed(self, block: Block) -> bytes:
        if self._ended:
            return b""
        try:
            payload = json.loads(block.data) if block.data is not None else None
        except (ValueError, RecursionError):
            payload = None
        if not isinstance(payload, dict):
            return b""
        if block.event == "exception":
            name = payload.get("type")
            kind = _STREAM_ERROR_TYPES.get(name, "api_error") if isinstance(name, str) else "api_error"
            self._ended = True
            error = {
                "type": "error",
                "error": {"type": kind, "message": f"Bedrock stream exception ({kind})"},
            }
            return encode_block("error", json.dumps(error))
        try:
            event = json.loads(base64.b64decode(payload.get("bytes") or "", validate=True))
        except (ValueError, RecursionError):
            return b""
        if block.event != "chunk" or not isinstance(event, dict) or not isinstance(event.get("type"), str):
            return b""
        self._ended = event["type"] == "message_stop"
        return encode_block(event["type"], json.dumps(event, separators=(",", ":"), ensure_ascii=False))

    def finish(self) -> bytes:
        return b""  # a stream cut before `message_stop` stays cut: the relay reads it as interrupted


class Bedrock:
    name = "bedrock"
    routes = frozenset({CHAT, RESPONSES, MESSAGES})
    protocol: dict[str, str] = {}
    errors = ErrorShape(type_field="__type")  # its errors reach the relay on the Chat wire (BedrockWire)

    def auth_headers(self, credential: str) -> dict[str, str]:
        return {}  # the request is signed over its final bytes instead (SigV4, by the transport)

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
        sigv4 = self.signature(target.base_url, target.region, credential)
        if path == MESSAGES and anthropic_model(model):
            return _invoke(target, body, model, sigv4, client_headers.get(BETA))
        chat = anthropic_to_chat_request(body) if path == MESSAGES else body
        stream = chat.get("stream") is True
        operation = "converse-stream" if stream else "converse"
        where = url(target.base_url, f"/model/{path_segment(model)}/{operation}")
        wire = BedrockWire(model, sigv4, created)
        headers = {"content-type": "application/json"}
        if path == RESPONSES:
            upstream = bedrock_translate.chat_to_converse_request
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
        payload = bedrock_translate.chat_to_converse_request(chat)
        if path == MESSAGES:
            return messages_over_chat(where, headers, payload, model, wire)
        # Bedrock always reports usage: a Chat client that did not ask for it does not see it.
        strip = stream and not include_usage(body)
        return UpstreamCall(where, headers, payload, Dialect.CHAT, path, model, strip_usage=strip, wire=wire)

    def signature(self, base_url: str, region: str, credential: str) -> SigV4:
        """The signature of every request of an account on `base_url` (its calls and its listing)."""
        key_id, _, rest = credential.partition(":")
        secret, _, token = rest.partition(":")
        return SigV4(SERVICE, region_of(base_url, region), key_id, secret, token)

    def models_url(self, base_url: str) -> str:
        return url(_control(base_url), "/foundation-models")

    def listings(self, base_url: str, region: str) -> tuple[str, ...]:
        """ListFoundationModels, then ListInferenceProfiles for each type (the API lists only the system's
        unless asked for the account's own), as many per page as it gives."""
        profiles = url(_control(base_url), "/inference-profiles?maxResults=1000&type=")
        return (self.models_url(base_url), f"{profiles}SYSTEM_DEFINED", f"{profiles}APPLICATION")

    def model_page(self, payload: object) -> ModelPage:
        if isinstance(payload, dict) and "inferenceProfileSummaries" in payload:
            return _profile_page(payload)
        summaries = payload.get("modelSummaries") if isinstance(payload, dict) else None
        if not isinstance(summaries, list):
            raise ValueError("not a model list")
        ids = []
        for summary in summaries:
            model = summary.get("modelId") if isinstance(summary, dict) else None
            if not isinstance(model, str) or not model:
                raise ValueError("not a model list")
            if _listed(summary, "outputModalities", "TEXT") and _listed(
                summary, "inferenceTypesSupported", "ON_DEMAND"
            ):
                ids.append(model)
        return ModelPage(ids)


def _control(base_url: str) -> str:
    """The control plane's root: the runtime host's twin, or any other host as it is."""
    return _RUNTIME_HOST.sub(r"\g<scheme>bedrock\g<fips>.", base_url.strip())


def _profile_page(payload: Json) -> ModelPage:
    """A ListInferenceProfiles page: each ACTIVE profile by the name a call gives it, a system-defined
    profile's id (`us.anthropic.claude-...`) or an application profile's ARN (its id alone names no model
    to Converse), the next page by `nextToken`."""
    summaries = payload.get("inferenceProfileSummaries")
    if not isinstance(summaries, list):
        raise ValueError("not a model list")
    ids = []
    for summary in summaries:
        if not isinstance(summary, dict):
            raise ValueError("not a model list")
        named = summary.get(
            "inferenceProfileArn" if summary.get("type") == "APPLICATION" else "inferenceProfileId"
        )
        if not isinstance(named, str) or not named:
            raise ValueError("not a model list")
        if summary.get("status") == "ACTIVE":
            ids.append(named)
    token = payload.get("nextToken")
    return ModelPage(ids, {"nextToken": token} if isinstance(token, str) and token else None)


def anthropic_model(model: str) -> bool:
    """An Anthropic model's id (`anthropic.claude-...`) or an inference profile of one (`us.anthropic...`)."""
    return model.startswith("anthropic.") or ".anthropic." in model


def _invoke(target: Target, body: Json, model: str, sigv4: SigV4, beta: str | None) -> UpstreamCall:
    """A Messages client on an Anthropic model: its own body to InvokeModel, every field kept (Converse
    would have to refuse or drop what it has no form for: `thinking`, `top_k`, cache control...)."""
    stream = body.get("stream") is True
    operation = "invoke-with-response-stream" if stream else "invoke"
    payload = {name: value for name, value in body.items() if name not in ("model", "stream")}
    payload["anthropic_version"] = ANTHROPIC_VERSION
    if beta:  # Bedrock takes the client's beta flags in the body, not a header
        payload["anthropic_beta"] = [flag.strip() for flag in beta.split(",") if flag.strip()]
    where = url(target.base_url, f"/model/{path_segment(model)}/{operation}")
    headers = {"content-type": "application/json"}
    return UpstreamCall(where, headers, payload, Dialect.ANTHROPIC, MESSAGES, model, wire=InvokeWire(sigv4))


def _listed(summary: Json, field: str, value: str) -> bool:
    values = summary.get(field)
    return isinstance(values, list) and value in values


PROVIDER = Bedrock()
