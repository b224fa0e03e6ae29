"""A fake Azure OpenAI resource: the OpenAI wire behind Azure's URLs, credential header and errors.

Contract (as Azure OpenAI answers, checked against `openai.AzureOpenAI` in tests/providers):
- Deployment URLs `/openai/deployments/{deployment}/chat/completions` and `.../embeddings` need the
  `api-version` query parameter (without it: 404 `Resource not found`, Azure's own envelope); the model
  served is the deployment's name, whatever the body says. A deployment not in `models` is Azure's 404
  `DeploymentNotFound`.
- A deployment's `chat/completions` at api-version `2024-10-21` (the GA version, whose request schema is
  `createChatCompletionRequest` in Azure/azure-rest-api-specs' `inference/stable/2024-10-21/
  inference.yaml`) takes only that version's fields, roles and user content parts: another field is
  Azure's 400 `Unrecognized request argument supplied: <field>`, another role (e.g. `developer`, added
  later) or part type its 400 `invalid_value` naming the path. Any later version takes them all.
- The `/openai/v1/` surface (`chat/completions`, `responses`, `embeddings`, `models`) takes the model in
  the body, as OpenAI does, and needs no `api-version`.
- `GET /openai/deployments?api-version=` (2022-12-01 to 2023-03-15-preview, the versions that kept the
  data plane's deployment listing; any other is 404 `Resource not found`) lists the deployments, one
  page: `models` with status `succeeded`, then `pending` (deployments still being created, status
  `creating`, which serve nothing yet).
- The key comes in `api-key` (or as an Entra ID bearer token); a wrong one is Azure's 401
  (`{"error": {"code": "401", "message": ...}}`).
- Everything else (scripts, hits, streams, compression) is `FakeUpstream`'s; `prompt_filtered()` is the
  400 `content_filter` a prompt blocked by Azure's content filter gets, and `Refusal` the completion cut
  with `finish_reason: "content_filter"`.
"""

from __future__ import annotations

from aiohttp import web

from devkit.behaviours import RawError, error
from devkit.upstream import _ROUTES, FakeUpstream

# Azure's content filter verdict on a blocked prompt: every category, one of them filtered.
_FILTER_RESULT = {
    "hate": {"filtered": False, "severity": "safe"},
    "jailbreak": {"filtered": True, "detected": True},
    "self_harm": {"filtered": False, "severity": "safe"},
    "sexual": {"filtered": False, "severity": "safe"},
    "violence": {"filtered": False, "severity": "safe"},
}


def prompt_filtered() -> RawError:
    """The 400 Azure answers when its content filter blocks the prompt."""
    return error(
        400,
        {
            "error": {
                "message": "The response was filtered due to the prompt triggering Azure OpenAI's content "
                "management policy.",
                "type": None,
                "param": "prompt",
                "code": "content_filter",
                "status": 400,
                "innererror": {
                    "code": "ResponsibleAIPolicyViolation",
                    "content_filter_result": _FILTER_RESULT,
                },
            }
        },
    )


# What the GA version 2024-10-21 takes in a Chat Completions request (module docstring); later versions
# take every field.
_GA_FIELDS = frozenset(
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
_GA_ROLES = ("system", "assistant", "user", "function", "tool")
_GA_USER_PARTS = ("text", "image_url")
VERSIONED_CHAT = {"2024-10-21": (_GA_FIELDS, _GA_ROLES, _GA_USER_PARTS)}


def _invalid(message: str, param: str | None, code: str | None) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}},
        status=400,
    )


def _unversioned(version: str, body: object) -> web.Response | None:
    """Azure's 400 for what `version` does not take in a Chat body, else None."""
    if version not in VERSIONED_CHAT or not isinstance(body, dict):
        return None
    fields, roles, parts = VERSIONED_CHAT[version]
    for key in body:
        if key not in fields:
            return _invalid(f"Unrecognized request argument supplied: {key}", None, None)
    for index, message in enumerate(body.get("messages") or ()):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in roles:
            supported = ", ".join(f"'{r}'" for r in roles[:-1]) + f", and '{roles[-1]}'"
            return _invalid(
                f"Invalid value: '{role}'. Supported values are: {supported}.",
                f"messages[{index}].role",
                "invalid_value",
            )
        content = message.get("content")
        for at, part in enumerate(content if role == "user" and isinstance(content, list) else ()):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in parts:
                return _invalid(
                    f"Invalid value: '{kind}'. Supported values are: 'text' and 'image_url'.",
                    f"messages[{index}].content[{at}].type",
                    "invalid_value",
                )
    return None


# The api-versions whose data plane still lists deployments.
LISTING_VERSIONS = frozenset({"2022-12-01", "2023-03-15-preview"})


def _azure_error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


class AzureFake(FakeUpstream):
    """A fake Azure OpenAI resource on 127.0.0.1 (see the module docstring)."""

    pending: tuple[str, ...] = ()  # deployments being created: listed, serving nothing

    @property
    def endpoint(self) -> str:
        """What `openai.AzureOpenAI(azure_endpoint=...)` and an assignment's deployment URLs start with."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The `/openai/v1` API root (the surface that takes the model in the body)."""
        return f"{self.endpoint}/openai/v1"

    def _authorized(self, request: web.Request) -> bool:
        bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
        return self.require_key is None or self.require_key in (bearer, request.headers.get("api-key"))

    def _add_routes(self, app: web.Application) -> None:
        for name in ("chat/completions", "embeddings"):
            app.router.add_post(f"/openai/deployments/{{deployment}}/{name}", self._deployment(name))
        for name in ("chat/completions", "responses", "embeddings"):
            app.router.add_post(f"/openai/v1/{name}", self._keyed(self._http_handler(_ROUTES[f"/v1/{name}"])))
        app.router.add_get("/openai/v1/models", self._keyed(self._handle_models))
        app.router.add_get("/openai/deployments", self._keyed(self._deployments))

    async def _deployments(self, request: web.Request) -> web.StreamResponse:
        self._record(request, None, None, "http")
        if request.query.get("api-version") not in LISTING_VERSIONS:
            return _azure_error(404, "404", "Resource not found")
        listed = [(name, "succeeded") for name in self.models] + [(name, "creating") for name in self.pending]
        deployments = [
            {
                "id": name,
                "model": name,
                "owner": "organization-owner",
                "object": "deployment",
                "status": status,
                "scale_settings": {"scale_type": "standard"},
                "created_at": 1700000000,
                "updated_at": 1700000000,
            }
            for name, status in listed
        ]
        return web.json_response({"data": deployments, "object": "list"})

    def _keyed(self, handler):
        async def handle(request: web.Request) -> web.StreamResponse:
            if not self._authorized(request):
                await request.read()
                self._record(request, None, None, "http")
                return _azure_error(
                    401,
                    "401",
                    "Access denied due to invalid subscription key or wrong API endpoint. Make sure to "
                    "provide a valid key for an active subscription and use a correct regional API endpoint "
                    "for your resource.",
                )
            return await handler(request)

        return handle

    def _deployment(self, name: str):
        served = self._http_handler(
            _ROUTES[f"/v1/{name}"], model_in_path=lambda r: r.match_info["deployment"]
        )

        async def handle(request: web.Request) -> web.StreamResponse:
            if "api-version" not in request.query:
                await request.read()
                self._record(request, None, None, "http")
                return _azure_error(404, "404", "Resource not found")
            deployment = request.match_info["deployment"]
            with self._lock:
                scripted = deployment in self._scripts
            if deployment not in self.models and not scripted:
                await request.read()
                self._record(request, deployment, None, "http")
                return _azure_error(
                    404,
                    "DeploymentNotFound",
                    "The API deployment for this resource does not exist. If you created the deployment "
                    "within the last 5 minutes, please wait a moment and try again.",
                )
            if name == "chat/completions":
                try:
                    body = await request.json()
                except ValueError:
                    body = None
                refused = _unversioned(request.query["api-version"], body)
                if refused is not None:
                    self._record(request, deployment, body, "http")
                    return refused
            return await served(request)

        return self._keyed(handle)
