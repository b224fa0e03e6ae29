"""Google Vertex AI (`vertex`): Gemini models and Anthropic's Claude models on one Google Cloud account,
authorized by a service account.

- The credential is the service account's JSON key file, stored encrypted like any credential. The
  transport exchanges it for an OAuth 2.0 access token with google-auth at the file's `token_uri` and keeps
  the token until it expires (`UpstreamCall.oauth`, `proxy.google_token`): one exchange per key file and
  hour, never one per request. A file that is not a key file, a refused exchange and a 401 from the API are
  the account's credential rejected (SPEC §5.6: the next account is tried, the assignment's circuit opens).
- `base_url` is the API root with its version, `https://aiplatform.googleapis.com/v1`; the project is the key
  file's `project_id` unless the root names another (`.../v1/projects/{project}`). The location is the one
  a regional host names (`us-east5-aiplatform.googleapis.com`, `aiplatform.eu.rep.googleapis.com`), else the
  assignment's `region`, else `global`; on the global host a location other than `global` is sent to its
  regional host (`{location}-aiplatform.googleapis.com`; `us` and `eu` to `aiplatform.{us,eu}.rep...`), as
  Google's SDKs do. Any other host (a proxy, a private endpoint, a local double) is asked as it is.
- A model whose id names Claude (`claude-...`, e.g. `claude-sonnet-4@20250514`) is Anthropic's publisher
  model: `.../publishers/anthropic/models/{model}:rawPredict` (`:streamRawPredict` for a stream), the
  Messages body without `model` and with `anthropic_version: "vertex-2023-10-16"`; a Messages client's
  body goes as sent (its `anthropic-beta` header too), a Chat or Responses client's is translated as for an
  `anthropic` account (`proxy.wire.providers.anthropic`). Every other model is Google's:
  `.../publishers/google/models/{model}:generateContent` (`:streamGenerateContent?alt=sse`), translated as
  for a `gemini` account (`proxy.wire.providers.gemini`, thought signatures included).
- Errors: Google's envelope (`{"error": {"code", "status"}}`, from Vertex itself, e.g. a quota's 429
  RESOURCE_EXHAUSTED or an IAM 403 PERMISSION_DENIED) is read as for Gemini; a Claude model's own errors
  come in Anthropic's envelope and are read as Anthropic's.
- Count_tokens, embeddings and files are not carried.
- Discovery lists Model Garden's Google publisher models (`GET {root}/v1beta1/publishers/google/models`,
  google-genai's listing of Vertex's base models), paged by `pageToken`, keeping the Gemini models. Claude
  models are configured: Model Garden lists Anthropic's models without the dated id a call names
  (`claude-sonnet-4@20250514`), and whether the project has enabled one is not in the listing.

PURE: it decides; the transport exchanges the key file, sends and reads.
"""

import json
import re
from collections.abc import Mapping
from dataclasses import replace

from proxy.wire.providers import anthropic, gemini, gemini_translate
from proxy.wire.providers.base import (
    BETA,
    CHAT,
    MESSAGES,
    NO_HEADERS,
    RESPONSES,
    SSE,
    GoogleOAuth,
    Json,
    ModelPage,
    SigV4,
    StreamTranslator,
    UpstreamCall,
    path_segment,
)
from proxy.wire.providers.tool_ids import strip_signatures
from routing.policy.failures import ErrorShape
from routing.policy.route import Target
from routing.policy.types import Requirements

ANTHROPIC_VERSION = "vertex-2023-10-16"  # the Messages body's version on Vertex (Anthropic's Vertex guide)
GLOBAL = "global"
GLOBAL_HOST = "aiplatform.googleapis.com"
MULTI_REGIONS = frozenset({"us", "eu"})  # served by aiplatform.{us,eu}.rep.googleapis.com
_URL = re.compile(r"^(?P<scheme>https?://)(?P<host>[^/?#]+)(?P<path>[^?#]*)$")
_REGIONAL_HOST = re.compile(r"^(?P<region>[a-z]+-[a-z]+[0-9]+)-aiplatform\.googleapis\.com(?::\d+)?$")
_MULTI_HOST = re.compile(r"^aiplatform\.(?P<region>us|eu)\.rep\.googleapis\.com(?::\d+)?$")
_PROJECT = re.compile(r"/projects/(?P<project>[^/]+)/?$")
_VERSION = re.compile(r"/v1(?:beta1)?/?$")


def anthropic_model(model: str) -> bool:
    """A Claude model, served by Anthropic's publisher on Vertex."""
    return model.startswith("claude-")


def _parts(base_url: str) -> tuple[str, str, str]:
    """(scheme, host, path) of `base_url` (urllib is out of reach of a pure module)."""
    found = _URL.match(base_url.strip())
    if found is None:
        return "https://", GLOBAL_HOST, base_url
    return found["scheme"], found["host"].lower(), found["path"]


def location_of(base_url: str, region: str) -> str:
    """The Vertex location requests name: the regional host's, else the assignment's region, else global."""
    host = _parts(base_url)[1]
    found = _REGIONAL_HOST.match(host) or _MULTI_HOST.match(host)
    return found["region"] if found else region or GLOBAL


def _host(host: str, location: str) -> str:
    if host != GLOBAL_HOST or location == GLOBAL:
        return host
    return f"aiplatform.{location}.rep.googleapis.com" if location in MULTI_REGIONS else f"{location}-{host}"


def _root(base_url: str, location: str) -> tuple[str, str | None]:
    """The API root with its version on the location's host, and the project `base_url` names, if any."""
    scheme, host, path = _parts(base_url)
    named = _PROJECT.search(path)
    if named is not None:
        path = path[: named.start()]
    return f"{scheme}{_host(host, location)}{path.rstrip('/')}", named["project"] if named else None


def _project(key_file: str) -> str:
    """The key file's `project_id` ("" when it has none: the transport refuses such a file first)."""
    try:
        info = json.loads(key_file)
    except ValueError:
        return ""
    project = info.get("project_id") if isinstance(info, dict) else None
    return project if isinstance(project, str) else ""


def model_url(base_url: str, region: str, credential: str, publisher: str, model: str) -> str:
    """Where a call of `model` by `publisher` goes, up to its method."""
    location = location_of(base_url, region)
    root, project = _root(base_url, location)
    project = project or _project(credential)
    return (
        f"{root}/projects/{path_segment(project)}/locations/{path_segment(location)}"
        f"/publishers/{publisher}/models/{path_segment(model)}"
    )


class ClaudeWire:
    """A Claude model's answers on Vertex: Anthropic's own bodies and SSE as they come; an error in Google's
    envelope (from Vertex itself: a quota, IAM, an unknown model) is rewritten in the Chat wire's, its
    status as the type and its ErrorInfo reason as the code, never its message (as for Gemini)."""

    framing = SSE
    sigv4: SigV4 | None = None

    def answer(self, status: int, headers: Mapping[str, str], raw: bytes) -> tuple[int, bytes]:
        if status < 400:
            return status, raw
        try:
            payload = json.loads(raw)
        except ValueError:
            return status, raw  # a proxy's page: classified by its status alone
        error = payload.get("error") if isinstance(payload, dict) else None
        if not isinstance(error, dict) or not isinstance(error.get("status"), str):
            return status, raw  # Anthropic's envelope, read as Anthropic's
        chat = gemini_translate.chat_error(error)
        chat.pop("status", None)
        return status, json.dumps(chat).encode()

    def stream(self) -> StreamTranslator | None:
        return None  # Anthropic's SSE, read as Anthropic's


_CLAUDE_WIRE = ClaudeWire()


class Vertex:
    name = "vertex"
    routes = frozenset({CHAT, RESPONSES, MESSAGES})
    protocol = {"anthropic_version": ANTHROPIC_VERSION}
    errors = ErrorShape()  # Google's errors reach the relay on the Chat wire, Anthropic's as they come

    def auth_headers(self, credential: str) -> dict[str, str]:
        return {}  # the access token is the transport's (`oauth`)

    def oauth(self, credential: str) -> GoogleOAuth:
        return GoogleOAuth(credential)

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
        if anthropic_model(model):
            return self._claude(path, target, body, model, credential, created, response_id, client_headers)
        # Gemini's own call, sent to the publisher model's URL with the account's token instead of a key.
        call = gemini.PROVIDER.call(
            path,
            target,
            body,
            model=model,
            requirements=requirements,
            credential="",
            created=created,
            response_id=response_id,
        )
        method = call.url.rpartition("/models/")[2].partition(":")[2]
        where = model_url(target.base_url, target.region, credential, "google", model)
        return replace(
            call,
            url=f"{where}:{method}",
            headers={"content-type": "application/json"},
            oauth=self.oauth(credential),
        )

    def _claude(
        self,
        path: str,
        target: Target,
        body: Json,
        model: str,
        credential: str,
        created: int,
        response_id: str,
        client_headers: Mapping[str, str],
    ) -> UpstreamCall:
        call = anthropic.PROVIDER.call(
            path,
            target,
            strip_signatures(body),  # Gemini's thought signatures are for Gemini only
            model=model,
            requirements=Requirements(),
            credential="",
            created=created,
            response_id=response_id,
            client_headers=client_headers,
        )
        payload = {name: value for name, value in call.payload.items() if name != "model"}
        payload["anthropic_version"] = ANTHROPIC_VERSION
        method = "streamRawPredict" if payload.get("stream") is True else "rawPredict"
        where = model_url(target.base_url, target.region, credential, "anthropic", model)
        headers = {"content-type": "application/json"}
        if BETA in client_headers and path == MESSAGES:
            headers[BETA] = client_headers[BETA]
        return replace(
            call,
            url=f"{where}:{method}",
            headers=headers,
            payload=payload,
            wire=_CLAUDE_WIRE,
            oauth=self.oauth(credential),
        )

    def models_url(self, base_url: str) -> str:
        return self.listings(base_url, "")[0]

    def listings(self, base_url: str, region: str) -> tuple[str, ...]:
        root = _root(base_url, location_of(base_url, region))[0]
        return (f"{_VERSION.sub('', root)}/v1beta1/publishers/google/models",)

    def model_page(self, payload: object) -> ModelPage:
        models = payload.get("publisherModels", []) if isinstance(payload, dict) else None
        if not isinstance(payload, dict) or not isinstance(models, list):
            raise ValueError("not a model list")
        ids = []
        for item in models:
            name = item.get("name") if isinstance(item, dict) else None
            if not isinstance(name, str) or not name.startswith("publishers/google/models/"):
                raise ValueError("not a model list")
            model = name.removeprefix("publishers/google/models/")
            if model.startswith("gemini-"):  # not Imagen, Veo, embeddings or open models to deploy
                ids.append(model)
        token = payload.get("nextPageToken")
        return ModelPage(ids, {"pageToken": token} if isinstance(token, str) and token else None)


PROVIDER = Vertex()
