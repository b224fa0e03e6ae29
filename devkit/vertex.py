"""A fake Google Vertex AI: a service account's OAuth token exchange, Gemini's and Anthropic's publisher
models, Model Garden's listing, Google's error envelope.

Contract (as Vertex and Google's token endpoint answer, checked against google-auth, `google-genai` with
`vertexai=True` and `anthropic.AnthropicVertex` in tests/providers):
- `key_file()` is a service account's JSON key file (`type: service_account`, `project_id`, an RSA
  `private_key` with its `private_key_id`, `client_email`) whose `token_uri` is this fake's `POST /token`.
  The token endpoint takes RFC 7523's JWT bearer grant (`grant_type=urn:ietf:params:oauth:grant-type:
  jwt-bearer`, `assertion=<JWT>`): an RS256 JWT whose `kid` names the key, signed by it, with `iss` the
  account's email, `aud` Google's token endpoint (`AUDIENCE`, wherever the key file's `token_uri` points),
  `scope` with cloud-platform and a lifetime of at most an hour; anything else is Google's 400
  `invalid_grant` (`unsupported_grant_type` for another grant), and a revoked key (`revoke_key()`)
  `invalid_grant` too. It answers `{"access_token", "expires_in",
  "token_type": "Bearer"}` (`token_lifetime_s`, default 3599); `exchanges` counts them.
- The API takes `Authorization: Bearer <a token it issued, not expired, not revoked (`revoke_tokens()`)>`,
  else 401 `UNAUTHENTICATED`. The project in the URL must be the key file's (else 403 `PERMISSION_DENIED`)
  and the location the fake's `location` (else 400 `INVALID_ARGUMENT`); the API root is served under
  `/v1` and `/v1beta1`.
- `POST /{v}/projects/{p}/locations/{l}/publishers/google/models/{model}:generateContent` and
  `:streamGenerateContent?alt=sse` answer as the Gemini API does (`devkit.gemini.GeminiFake`, tool steps
  and thought signatures included).
- `POST .../publishers/anthropic/models/{model}:rawPredict` and `:streamRawPredict` take a Messages body
  that must carry `anthropic_version: "vertex-2023-10-16"`, `messages` and `max_tokens` and no `model`
  (else Anthropic's 400 `invalid_request_error`), `stream: true` exactly on `:streamRawPredict`, and
  answer the Messages JSON or SSE (`devkit.wire.Messages`, tool steps as `FakeUpstream`'s). A model id is
  Claude's when it starts with `claude-`; an unknown model of either publisher is 404 `NOT_FOUND`.
- `GET /v1beta1/publishers/{publisher}/models` (Model Garden) lists `publishers/{publisher}/models/{id}`
  (the Gemini models and `garden`, Google's other models, for `google`; the Claude ones for `anthropic`),
  `pageSize` (default 50) per page, the next one named by `nextPageToken`, asked back as `pageToken`.
- Errors: `{"error": {"code", "message", "status"}}`; `Reject` with a Google status as its type
  (`RESOURCE_EXHAUSTED`, `UNAVAILABLE`: `devkit.gemini.status_error`) answers it so on either publisher (a
  quota is Vertex's); any other `Reject` of a Claude model answers in Anthropic's envelope.
"""

from __future__ import annotations

import base64
import functools
import json
import secrets
import time
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import parse_qs

from aiohttp import web
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from devkit import tool_steps
from devkit.behaviours import ApiError, Behaviour, Reject, error_envelope
from devkit.gemini import _STATUS_CODES, GeminiFake, status_error
from devkit.wire import Call, Messages, StreamingApi

ANTHROPIC_VERSION = "vertex-2023-10-16"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
AUDIENCE = "https://oauth2.googleapis.com/token"  # a grant's `aud`, wherever its token_uri points
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
_MAX_LIFETIME_S = 3600
_PAGE_SIZE = 50
_UNAUTHENTICATED = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other "
    "valid authentication credential."
)


@functools.lru_cache(maxsize=1)
def _private_key() -> rsa.RSAPrivateKey:
    """One RSA key per process: generating one is the slowest thing a fake would do."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _b64decode(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def _google_error(code: int, status: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message, "status": status}}, status=code)


def _grant_error(error: str, description: str) -> web.Response:
    return web.json_response({"error": error, "error_description": description}, status=400)


class VertexFake(GeminiFake):
    """A fake Vertex AI on 127.0.0.1 (see the module docstring)."""

    def __init__(
        self,
        name: str = "vertex",
        models: tuple[str, ...] | list[str] = ("gemini-2.5-flash", "claude-sonnet-4@20250514"),
        *,
        project: str = "gateway-test-project",
        location: str = "us-east5",
        garden: tuple[str, ...] = ("imagen-4.0-generate-001", "text-embedding-005"),
        **kw: Any,
    ) -> None:
        super().__init__(name, models, **kw)
        self.project, self.location, self.garden = project, location, garden
        self.key_id = secrets.token_hex(20)
        self.client_email = f"gateway@{project}.iam.gserviceaccount.com"
        self.token_lifetime_s = 3599
        self.exchanges = 0
        self._key_revoked = False
        self._tokens: dict[str, float] = {}  # issued token -> when it expires (time.time())

    # -- the service account --------------------------------------------------------------------------

    @property
    def token_uri(self) -> str:
        return f"{self.endpoint}/token"

    def key_file(self) -> str:
        """The service account's JSON key file, as Google issues it."""
        pem = _private_key().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return json.dumps(
            {
                "type": "service_account",
                "project_id": self.project,
                "private_key_id": self.key_id,
                "private_key": pem.decode(),
                "client_email": self.client_email,
                "client_id": "100000000000000000001",
                "auth_uri": "https://accounts.google.com/o/oauth2/auth",
                "token_uri": self.token_uri,
                "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
                "universe_domain": "googleapis.com",
            }
        )

    def revoke_tokens(self) -> None:
        """Every token issued so far stops working (as when Google revokes them)."""
        with self._lock:
            self._tokens.clear()

    def revoke_key(self) -> None:
        """The key is deleted: no exchange succeeds any more, nor any token issued."""
        with self._lock:
            self._key_revoked = True
            self._tokens.clear()

    def _assertion_problem(self, assertion: str) -> str | None:
        try:
            head, claims, signature = assertion.split(".")
            header, payload = json.loads(_b64decode(head)), json.loads(_b64decode(claims))
            _private_key().public_key().verify(
                _b64decode(signature), f"{head}.{claims}".encode(), padding.PKCS1v15(), hashes.SHA256()
            )
        except (ValueError, InvalidSignature):
            return "Invalid JWT Signature."
        now = time.time()
        if header.get("alg") != "RS256" or header.get("kid") != self.key_id or self._key_revoked:
            return "Invalid JWT Signature."
        if payload.get("iss") != self.client_email or payload.get("aud") != AUDIENCE:
            return "Invalid JWT: Failed audience check."
        if SCOPE not in str(payload.get("scope", "")).split():
            return "Invalid OAuth scope or ID token audience provided."
        issued, expires = payload.get("iat"), payload.get("exp")
        if not isinstance(issued, int | float) or not isinstance(expires, int | float):
            return "Invalid JWT: Token must be a short-lived token and in a reasonable timeframe."
        if expires - issued > _MAX_LIFETIME_S or expires < now or issued > now + 300:
            return (
                "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe."
            )
        return None

    async def _token(self, request: web.Request) -> web.StreamResponse:
        form = {k: v[0] for k, v in parse_qs((await request.read()).decode(errors="replace")).items()}
        self._record(request, None, None, "http")
        if form.get("grant_type") != JWT_BEARER:
            return _grant_error("unsupported_grant_type", f"Invalid grant_type: {form.get('grant_type')}")
        if problem := self._assertion_problem(form.get("assertion", "")):
            return _grant_error("invalid_grant", problem)
        token = f"ya29.c.{secrets.token_urlsafe(48)}"
        with self._lock:
            self.exchanges += 1
            self._tokens[token] = time.time() + self.token_lifetime_s
        return web.json_response(
            {"access_token": token, "expires_in": self.token_lifetime_s, "token_type": "Bearer"}
        )

    # -- the API --------------------------------------------------------------------------------------

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_post("/token", self._token)
        for version in ("v1", "v1beta1"):
            where = f"/{version}/projects/{{project}}/locations/{{location}}/publishers"
            app.router.add_post(f"{where}/google/models/{{target}}", self._in_project(self._generate))
            app.router.add_post(f"{where}/anthropic/models/{{target}}", self._in_project(self._raw_predict))
        app.router.add_get("/v1beta1/publishers/{publisher}/models", self._garden)

    def _authorized(self, request: web.Request) -> bool:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        with self._lock:
            expires = self._tokens.get(token) if scheme.lower() == "bearer" else None
        return expires is not None and expires > time.time()

    def _bad_key(self) -> web.Response:
        return _google_error(401, "UNAUTHENTICATED", _UNAUTHENTICATED)

    def _in_project(self, handle: Callable[[web.Request], Any]) -> Callable[[web.Request], Any]:
        """`handle`, for the key file's project in the fake's location only."""

        async def checked(request: web.Request) -> web.StreamResponse:
            if not self._authorized(request):
                self._record(request, None, None, "http")
                return self._bad_key()
            project, location = request.match_info["project"], request.match_info["location"]
            if project != self.project:
                self._record(request, None, None, "http")
                return _google_error(
                    403, "PERMISSION_DENIED", f"Permission denied on resource project {project}."
                )
            if location != self.location:
                self._record(request, None, None, "http")
                return _google_error(400, "INVALID_ARGUMENT", "Request contains an invalid argument.")
            return cast(web.StreamResponse, await handle(request))

        return checked

    def _behaviour_for(self, model: str) -> Behaviour:
        with self._lock:
            scripted = model in self._scripts
        if scripted or model in self.models:
            return super()._behaviour_for(model)
        publisher = "anthropic" if model.startswith("claude-") else "google"
        return status_error(
            "NOT_FOUND",
            f"Publisher Model `projects/{self.project}/locations/{self.location}/publishers/{publisher}/"
            f"models/{model}` was not found or your project does not have access to it.",
        )

    async def _raw_predict(self, request: web.Request) -> web.StreamResponse:
        model, _, method = request.match_info["target"].partition(":")
        try:
            body = json.loads(await request.read())
        except ValueError:
            body = None
        body = body if isinstance(body, dict) else None
        stream = method == "streamRawPredict"
        self._record(request, model, body, "sse" if stream else "http")

        def fail(status: int, err: ApiError) -> web.Response:
            if err.type in _STATUS_CODES:  # Vertex's own (a quota, an outage): Google's envelope
                return _google_error(status, err.type, err.message)
            return web.json_response(error_envelope(status, err, anthropic=True), status=status)

        if method not in ("rawPredict", "streamRawPredict") or not model.startswith("claude-"):
            return _google_error(404, "NOT_FOUND", "Method not found.")
        if problem := _messages_problem(body, stream):
            return fail(400, ApiError("invalid_request_error", problem))
        behaviour = self._behaviour_for(model)
        if isinstance(behaviour, Reject):
            return fail(behaviour.status, behaviour.error)
        behaviour, calls = self._tool_step(tool_steps.messages, cast(dict[str, Any], body), behaviour)
        api = Messages(Call(model, cast(dict[str, Any], body), calls))
        if stream:
            return await self._respond_stream(request, cast(StreamingApi, api), behaviour, fail)
        return await self._respond_json(request, api, behaviour, fail)

    async def _garden(self, request: web.Request) -> web.StreamResponse:
        self._record(request, None, None, "http")
        if not self._authorized(request):
            return self._bad_key()
        publisher = request.match_info["publisher"]
        claude = [m for m in self.models if m.startswith("claude-")]
        gemini = [m for m in self.models if not m.startswith("claude-")]
        listed = (
            claude if publisher == "anthropic" else [*gemini, *self.garden] if publisher == "google" else []
        )
        try:
            size = int(request.query.get("pageSize") or _PAGE_SIZE)
            start = int(request.query.get("pageToken") or 0)
        except ValueError:
            return _google_error(400, "INVALID_ARGUMENT", "Invalid page token.")
        page: dict[str, Any] = {
            "publisherModels": [
                {
                    "name": f"publishers/{publisher}/models/{model.partition('@')[0]}",
                    "versionId": "001",
                    "openSourceCategory": "PROPRIETARY",
                    "launchStage": "GA",
                    "publisherModelTemplate": f"projects/{{project}}/locations/{{location}}/publishers/"
                    f"{publisher}/models/{model.partition('@')[0]}",
                }
                for model in listed[start : start + size]
            ]
        }
        if start + size < len(listed):
            page["nextPageToken"] = str(start + size)
        return web.json_response(page)


def _messages_problem(body: dict[str, Any] | None, stream: bool) -> str | None:
    """Why a rawPredict body is not one Claude on Vertex takes (Anthropic's words), or None."""
    if body is None:
        return "The request body is not valid JSON."
    if body.get("anthropic_version") != ANTHROPIC_VERSION:
        return f"anthropic_version: must be {ANTHROPIC_VERSION}"
    if "model" in body:
        return "model: Extra inputs are not permitted"
    if not isinstance(body.get("messages"), list):
        return "messages: Field required"
    if not isinstance(body.get("max_tokens"), int):
        return "max_tokens: Field required"
    if (body.get("stream") is True) != stream:
        return "stream: must be true on streamRawPredict, and only there"
    return None
