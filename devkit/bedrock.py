"""A fake Amazon Bedrock runtime: Converse, ConverseStream and InvokeModel (Anthropic), SigV4-checked,
streams in AWS event-stream framing, errors named the way botocore reads them.

Contract (as Bedrock answers, checked against boto3's `bedrock-runtime` client in tests/providers):
- `POST /model/{modelId}/converse` answers the Converse JSON (`output.message.content`, `stopReason`,
  `usage.inputTokens/outputTokens/totalTokens`); `POST /model/{modelId}/converse-stream` answers
  `application/vnd.amazon.eventstream` frames (`messageStart`, `contentBlockDelta`, `contentBlockStop`,
  `messageStop`, `metadata` with the usage), an exception inside a 200 stream being a frame with
  `:message-type: exception`. `GET /foundation-models` is the control plane's model listing
  (ListFoundationModels, one page): `models` as on-demand text models, then `listed`, models the listing
  names with their own summary fields (an embedding model's `outputModalities: ["EMBEDDING"]`, a model
  served only through an inference profile) that Converse does not serve by their id.
- Inference profiles: `profiles` maps a system-defined (cross-region) profile's id
  (`us.anthropic.claude-...`) to the models it routes to, `application_profiles` an application profile's id
  to its models. A call names a system profile by its id or ARN, an application profile by its ARN
  (`arn:aws:bedrock:<region>:<account>:application-inference-profile/<id>`), and is served as a model
  (scripts are per name, as sent); an application profile's bare id is a `ValidationException`.
  `GET /inference-profiles` is ListInferenceProfiles: `type=SYSTEM_DEFINED` (the default, as the API
  lists) or `APPLICATION`, `maxResults` per page (default 1000), the next page's `nextToken`.
- `POST /model/{modelId}/invoke` (InvokeModel) takes an Anthropic model's own Messages body, which must
  carry `anthropic_version: "bedrock-2023-05-31"` and no `model` or `stream` (else 400
  `ValidationException`, as Bedrock answers), and answers the Messages JSON (`Refusal` as
  `stop_reason: "refusal"`); `/invoke-with-response-stream` answers event-stream `chunk` frames, each
  `{"bytes": <base64 of one Messages stream event>}`, `message_stop` carrying Bedrock's
  `amazon-bedrock-invocationMetrics`.
- Every request must carry a SigV4 signature (service `bedrock`, the fake's region) by the fake's access
  key, checked by recomputing it with botocore's own signer over the headers the request says it signed:
  a wrong secret is 403 `InvalidSignatureException`, an unknown key 403 `UnrecognizedClientException`, a
  signature over five minutes old 403 `InvalidSignatureException`.
- Errors: the status, `x-amzn-ErrorType: <Name>:<namespace>` and `{"message": ...}`; a model the account
  cannot use is 400 `ValidationException`, as Bedrock answers for an unknown or not-enabled model.
- Usage: `inputTokens` excludes the cache's reads and writes (`cacheReadInputTokens`,
  `cacheWriteInputTokens`); InvokeModel's is Anthropic's. Tool steps (`tool_steps`, devkit.tool_steps) answer
  `toolUse` blocks (`stopReason: tool_use`; streamed as `contentBlockStart` with the tool's id and name, one
  `contentBlockDelta` with the input as a JSON string, `contentBlockStop`), and InvokeModel Anthropic's
  `tool_use` blocks.
- Scripting, hits and the behaviours are `FakeUpstream`'s (`Serve`, `Refusal` as
  `stopReason: content_filtered`, `Reject` with the exception's name as its `type`, `FailBeforeVisible`,
  `FailAfterVisible`, `CutStream`, `Hang`); the frame *encoder* lives here only, decoding is botocore's.
"""

from __future__ import annotations

import base64
import hmac
import json
import re
import struct
import uuid
import zlib
from datetime import UTC, datetime
from typing import Any, cast

from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from devkit import tool_steps
from devkit.behaviours import (
    ApiError,
    CutStream,
    FailAfterVisible,
    FailBeforeVisible,
    Hang,
    RawError,
    Refusal,
    Reject,
    Serve,
    serve,
)
from devkit.server import drop
from devkit.upstream import FakeUpstream
from devkit.wire import Call, Messages, Reply, reply_for

NAMESPACE = "http://internal.amazon.com/coral/com.amazon.bedrock/"
ANTHROPIC_VERSION = "bedrock-2023-05-31"
_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/(?P<service>[^/]+)/"
    r"aws4_request, ?SignedHeaders=(?P<signed>[^,]+), ?Signature=(?P<signature>[0-9a-f]{64})$"
)
_SKEW_S = 300


def exception(status: int, name: str, message: str) -> Reject:
    """A Bedrock exception `name` (e.g. ThrottlingException) with its status, before any output."""
    return Reject(status, ApiError(name, message))


def validation(message: str = "The provided model identifier is invalid.") -> Reject:
    return exception(400, "ValidationException", message)


def throttled() -> Reject:
    return exception(429, "ThrottlingException", "Too many requests, please wait before trying again.")


def access_denied() -> Reject:
    return exception(
        403, "AccessDeniedException", "You don't have access to the model with the specified model ID."
    )


def service_unavailable() -> Reject:
    return exception(503, "ServiceUnavailableException", "Bedrock is unable to process your request.")


def frame(headers: dict[str, str], payload: bytes) -> bytes:
    """One AWS event-stream message: prelude (lengths + CRC32), string headers, payload, message CRC32."""
    encoded = b"".join(
        bytes([len(name)]) + name + b"\x07" + struct.pack(">H", len(value)) + value
        for name, value in ((k.encode(), v.encode()) for k, v in headers.items())
    )
    prelude = struct.pack(">II", 12 + len(encoded) + len(payload) + 4, len(encoded))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + encoded + payload
    return message + struct.pack(">I", zlib.crc32(message))


def _event(name: str, payload: dict[str, Any]) -> bytes:
    headers = {":event-type": name, ":content-type": "application/json", ":message-type": "event"}
    return frame(headers, json.dumps(payload).encode())


def _exception_frame(name: str, message: str) -> bytes:
    # In a stream the exception's member name is lower camel case (throttlingException).
    headers = {
        ":exception-type": name[0].lower() + name[1:],
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    return frame(headers, json.dumps({"message": message}).encode())


def _error(status: int, name: str, message: str) -> web.Response:
    return web.json_response(
        {"message": message}, status=status, headers={"x-amzn-ErrorType": f"{name}:{NAMESPACE}"}
    )


class BedrockFake(FakeUpstream):
    """A fake Bedrock runtime on 127.0.0.1 (see the module docstring)."""

    def __init__(
        self,
        name: str = "bedrock",
        models: tuple[str, ...] | list[str] = ("anthropic.claude-sonnet-4-5-v1:0",),
        *,
        region: str = "us-east-1",
        access_key: str = "AKIDEXAMPLEFAKE00001",
        secret_key: str = "fake-secret-key-for-the-bedrock-devkit",  # noqa: S107 (a fake's own)
        **kw: Any,
    ) -> None:
        super().__init__(name, models, compression="identity", **kw)
        self.region, self.access_key, self.secret_key = region, access_key, secret_key
        self.listed: dict[str, dict[str, Any]] = {}
        self.account = "123456789012"
        self.profiles: dict[str, tuple[str, ...]] = {}
        self.application_profiles: dict[str, tuple[str, ...]] = {}

    def profile_arn(self, profile: str) -> str:
        """The ARN of a system-defined profile id, or of an application profile's id."""
        kind = (
            "application-inference-profile" if profile in self.application_profiles else "inference-profile"
        )
        return f"arn:aws:bedrock:{self.region}:{self.account}:{kind}/{profile}"

    def _served(self, model: str) -> bool:
        """A model id, a system profile's id or ARN, or an application profile's ARN this account serves."""
        return (
            model in self.models
            or model in self.profiles
            or any(model == self.profile_arn(p) for p in (*self.profiles, *self.application_profiles))
        )

    @property
    def endpoint(self) -> str:
        """What `boto3.client("bedrock-runtime", endpoint_url=...)` and an assignment's base_url name."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.endpoint

    def _behaviour_for(self, model: str):
        with self._lock:
            scripted = model in self._scripts
        # Bedrock names an unknown or not-enabled model in a ValidationException, not a 404.
        if scripted or model in self.models:
            return super()._behaviour_for(model)
        return serve() if self._served(model) else validation()

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_post("/model/{model_id}/converse", self._converse)
        app.router.add_post("/model/{model_id}/converse-stream", self._converse)
        app.router.add_post("/model/{model_id}/invoke", self._invoke)
        app.router.add_post("/model/{model_id}/invoke-with-response-stream", self._invoke)
        app.router.add_get("/foundation-models", self._foundation_models)
        app.router.add_get("/inference-profiles", self._inference_profiles)

    def _signature_problem(self, request: web.Request, body: bytes) -> tuple[str, str] | None:
        """None when the request is signed by this account for this region; else the AWS error."""
        found = _AUTHORIZATION.match(request.headers.get("authorization", ""))
        if found is None:
            return "MissingAuthenticationTokenException", "Missing Authentication Token"
        if found["key"] != self.access_key:
            return "UnrecognizedClientException", "The security token included in the request is invalid."
        amz_date = request.headers.get("x-amz-date", "")
        try:
            signed_at = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
        except ValueError:
            return "InvalidSignatureException", "Missing or malformed X-Amz-Date."
        if abs((datetime.now(UTC) - signed_at).total_seconds()) > _SKEW_S:
            return "InvalidSignatureException", "Signature expired."
        names = found["signed"].split(";")
        if "host" not in names or any(name not in request.headers for name in names):
            return "InvalidSignatureException", "A signed header is missing."
        aws = AWSRequest(
            method=request.method,
            url=f"http://{request.headers['host']}{request.raw_path}",
            headers={name: request.headers[name] for name in names},
            data=body,
        )
        aws.context["timestamp"] = amz_date
        signer = SigV4Auth(Credentials(self.access_key, self.secret_key), found["service"], found["region"])
        expected = signer.signature(signer.string_to_sign(aws, signer.canonical_request(aws)), aws)
        if found["service"] != "bedrock" or found["region"] != self.region:
            return "InvalidSignatureException", "Credential should be scoped to a valid region and service."
        if not hmac.compare_digest(expected, found["signature"]):
            return (
                "InvalidSignatureException",
                "The request signature we calculated does not match the signature you provided.",
            )
        return None

    async def _foundation_models(self, request: web.Request) -> web.StreamResponse:
        self._record(request, None, None, "http")
        problem = self._signature_problem(request, await request.read())
        if problem is not None:
            return _error(403, *problem)
        summaries = [
            {
                "modelArn": f"arn:aws:bedrock:{self.region}::foundation-model/{model}",
                "modelId": model,
                "modelName": model,
                "providerName": model.split(".", 1)[0],
                "inputModalities": ["TEXT"],
                "outputModalities": ["TEXT"],
                "responseStreamingSupported": True,
                "inferenceTypesSupported": ["ON_DEMAND"],
                "modelLifecycle": {"status": "ACTIVE"},
                **fields,
            }
            for model, fields in [*((m, {}) for m in self.models), *self.listed.items()]
        ]
        return web.json_response({"modelSummaries": summaries})

    async def _inference_profiles(self, request: web.Request) -> web.StreamResponse:
        self._record(request, None, None, "http")
        problem = self._signature_problem(request, await request.read())
        if problem is not None:
            return _error(403, *problem)
        kind = request.query.get("type", "SYSTEM_DEFINED")
        if kind not in ("SYSTEM_DEFINED", "APPLICATION"):
            return _error(400, "ValidationException", "1 validation error detected: Value at 'type' failed.")
        profiles = self.profiles if kind == "SYSTEM_DEFINED" else self.application_profiles
        try:
            size = int(request.query.get("maxResults", "1000"))
            start = int(request.query.get("nextToken", "0"))
        except ValueError:
            return _error(400, "ValidationException", "Invalid pagination token.")
        if not 1 <= size <= 1000 or start < 0:
            return _error(400, "ValidationException", "1 validation error detected: maxResults.")
        summaries = [
            {
                "inferenceProfileName": profile,
                "inferenceProfileArn": self.profile_arn(profile),
                "inferenceProfileId": profile,
                "models": [
                    {"modelArn": f"arn:aws:bedrock:{self.region}::foundation-model/{model}"}
                    for model in models
                ],
                "status": "ACTIVE",
                "type": kind,
            }
            for profile, models in list(profiles.items())[start : start + size]
        ]
        page: dict[str, Any] = {"inferenceProfileSummaries": summaries}
        if start + size < len(profiles):
            page["nextToken"] = str(start + size)
        return web.json_response(page)

    async def _admit(self, request: web.Request, stream: bool, problem_of) -> tuple[Any, Any]:
        """(the request body, the model's behaviour), or (None, the answer already due: a refused
        signature or body, a scripted rejection, a hang); `problem_of(body)` names a malformed body."""
        raw = await request.read()
        model = request.match_info["model_id"]
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        self._record(request, model, body if isinstance(body, dict) else None, "sse" if stream else "http")
        problem = self._signature_problem(request, raw)
        if problem is not None:
            return None, _error(403, *problem)
        if (message := problem_of(body)) is not None:
            return None, _error(400, "ValidationException", message)
        behaviour = self._behaviour_for(model)
        match behaviour:
            case Reject(status=status, error=err, delay_s=delay):
                if delay and await self._pause(delay):
                    return None, drop(request)
                return None, _error(status, err.type, err.message)
            case RawError(status=status, body=payload, headers=headers):
                return None, web.json_response(dict(payload), status=status, headers=dict(headers))
            case Hang(seconds=seconds):
                await self._pause(seconds)
                return None, drop(request)
        if not isinstance(behaviour, Serve | Refusal | FailBeforeVisible | FailAfterVisible | CutStream):
            return None, drop(request)
        return body, behaviour

    async def _converse(self, request: web.Request) -> web.StreamResponse:
        stream = request.path.endswith("/converse-stream")
        body, behaviour = await self._admit(request, stream, _converse_problem)
        if body is None:
            return behaviour
        behaviour, calls = self._tool_step(tool_steps.converse, body, behaviour)
        uses = [{"toolUseId": f"tooluse_{uuid.uuid4().hex[:22]}", "name": n, "input": a} for n, a in calls]
        if not stream:
            if not isinstance(behaviour, Serve | Refusal):
                return drop(request)
            reply = reply_for(behaviour, self.name)
            if isinstance(behaviour, Serve) and behaviour.delay_s and await self._pause(behaviour.delay_s):
                return drop(request)
            content = [] if reply.refused else [{"toolUse": u} for u in uses] or [{"text": reply.text}]
            return web.json_response(
                {
                    "output": {"message": {"role": "assistant", "content": content}},
                    "stopReason": _stop(reply, uses),
                    "usage": _usage(reply),
                    "metrics": {"latencyMs": 1},
                },
                headers={"x-amzn-RequestId": str(uuid.uuid4())},
            )
        reply = reply_for(behaviour, self.name)
        deltas = [
            _event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": d}}) for d in reply.deltas
        ]
        blocks = [_event("contentBlockStop", {"contentBlockIndex": 0})]
        if uses:  # each toolUse block: its start, its input as one JSON string delta, its stop
            deltas, blocks = [], []
            for n, use in enumerate(uses):
                start = {"toolUse": {"toolUseId": use["toolUseId"], "name": use["name"]}}
                deltas.append(_event("contentBlockStart", {"contentBlockIndex": n, "start": start}))
                delta = {"toolUse": {"input": json.dumps(use["input"])}}
                deltas.append(_event("contentBlockDelta", {"contentBlockIndex": n, "delta": delta}))
                deltas.append(_event("contentBlockStop", {"contentBlockIndex": n}))
        tail = [
            *blocks,
            _event("messageStop", {"stopReason": _stop(reply, uses)}),
            _event("metadata", {"usage": _usage(reply), "metrics": {"latencyMs": 1}}),
        ]
        head = [_event("messageStart", {"role": "assistant"})]
        return await self._stream(request, behaviour, head, [] if reply.refused else deltas, tail)

    async def _invoke(self, request: web.Request) -> web.StreamResponse:
        stream = request.path.endswith("/invoke-with-response-stream")
        body, behaviour = await self._admit(request, stream, _invoke_problem)
        if body is None:
            return behaviour
        behaviour, calls = self._tool_step(tool_steps.messages, body, behaviour)
        reply = reply_for(behaviour, self.name)
        model = request.match_info["model_id"]
        messages = Messages(Call(model, body, calls))  # the tool_use blocks, as Anthropic's API has them
        stop = "refusal" if reply.refused else "tool_use" if calls else "end_turn"
        usage = {**reply.anthropic_usage, "output_tokens": reply.output_tokens}
        message = {
            "id": f"msg_bdrk_{uuid.uuid4().hex[:24]}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": []
            if reply.refused
            else messages.tool_uses() or [{"type": "text", "text": reply.text}],
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
        if not stream:
            if not isinstance(behaviour, Serve | Refusal):
                return drop(request)
            if isinstance(behaviour, Serve) and behaviour.delay_s and await self._pause(behaviour.delay_s):
                return drop(request)
            return web.json_response(message, headers={"x-amzn-RequestId": str(uuid.uuid4())})
        started = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
        text_start = {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        }
        head = [
            _chunk({"type": "message_start", "message": started}),
            *([] if calls else [_chunk(text_start)]),
        ]
        deltas = [
            _chunk({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": d}})
            for d in reply.deltas
        ]
        if calls:
            deltas = [_chunk(cast(dict[str, Any], e.data)) for e in messages.tool_use_events()]
        metrics = {
            "inputTokenCount": reply.input_tokens,
            "outputTokenCount": reply.output_tokens,
            "invocationLatency": 1,
            "firstByteLatency": 1,
        }
        tail = [
            *([] if calls else [_chunk({"type": "content_block_stop", "index": 0})]),
            _chunk(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": reply.output_tokens},
                }
            ),
            _chunk({"type": "message_stop", "amazon-bedrock-invocationMetrics": metrics}),
        ]
        return await self._stream(request, behaviour, head, [] if reply.refused else deltas, tail)

    async def _stream(
        self, request: web.Request, behaviour: Any, head: list[bytes], deltas: list[bytes], tail: list[bytes]
    ) -> web.StreamResponse:
        """`head`, then `deltas` and `tail` as `behaviour` says (an exception frame, a cut)."""
        frames = list(head)
        cut = False
        match behaviour:
            case FailBeforeVisible(terminal="overloaded"):
                frames.append(
                    _exception_frame(
                        "ServiceUnavailableException", "Bedrock is unable to process your request."
                    )
                )
            case FailBeforeVisible():
                frames.append(
                    _exception_frame("ValidationException", "The provided model identifier is invalid.")
                )
            case FailAfterVisible():
                frames += [
                    *deltas[:1],
                    _exception_frame("ModelStreamErrorException", "The model failed mid-stream."),
                ]
            case CutStream(after_visible=after_visible, clean=clean):
                frames += deltas[:1] if after_visible else []
                cut = not clean
            case _:
                frames += [*deltas, *tail]
        response = web.StreamResponse(
            headers={
                "Content-Type": "application/vnd.amazon.eventstream",
                "x-amzn-RequestId": str(uuid.uuid4()),
            }
        )
        await response.prepare(request)
        delay = behaviour.delay_s if isinstance(behaviour, Serve) else 0.0
        try:
            for data in frames:
                if delay and await self._pause(delay):
                    return drop(request)
                await response.write(data)
        except ConnectionError:
            return response
        if cut:
            return drop(request)
        await response.write_eof()
        return response


def _chunk(event: dict[str, Any]) -> bytes:
    """One InvokeModelWithResponseStream frame: a Messages stream event, base64 in `bytes` (and the
    random padding `p` Bedrock adds against length side channels)."""
    data = base64.b64encode(json.dumps(event).encode()).decode()
    return _event("chunk", {"bytes": data, "p": "abcdefghijklmnopqrstuvwxyz"[: 1 + len(data) % 26]})


def _converse_problem(body: Any) -> str | None:
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return "1 validation error detected: messages is required."
    return None


def _invoke_problem(body: Any) -> str | None:
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return "messages: field required"
    if body.get("anthropic_version") != ANTHROPIC_VERSION:
        return "Malformed input request: anthropic_version must be bedrock-2023-05-31"
    extraneous = sorted(set(body) & {"model", "stream"})
    if extraneous:
        return f"Malformed input request: extraneous key [{extraneous[0]}] is not permitted"
    return None


def _usage(reply: Reply) -> dict[str, int]:
    """Converse's usage: `inputTokens` without the cache's reads and writes, reported beside it."""
    uncached = reply.input_tokens - reply.cached_read_tokens - reply.cached_write_tokens
    usage = {
        "inputTokens": uncached,
        "outputTokens": reply.output_tokens,
        "totalTokens": reply.input_tokens + reply.output_tokens,
    }
    if reply.cached_read_tokens or reply.cached_write_tokens:
        usage["cacheReadInputTokens"] = reply.cached_read_tokens
        usage["cacheWriteInputTokens"] = reply.cached_write_tokens
    return usage


def _stop(reply: Reply, uses: list[Any]) -> str:
    return "content_filtered" if reply.refused else "tool_use" if uses else "end_turn"
