"""Google OAuth 2.0 access tokens for service-account key files, exchanged by google-auth (never by hand) and
kept until they expire: Vertex AI's calls (`proxy.google_token`) and its model listing (catalog discovery)
share them.

A key file is the JSON Google issues for a service account (`type: service_account`, `project_id`,
`private_key`, `client_email`, `token_uri`). google-auth signs a JWT assertion with its private key and
exchanges it at its `token_uri` (RFC 7523's JWT bearer grant) for an access token of the cloud-platform
scope. The credentials object holds the token and its expiry and is kept here per key file (by the file's
digest, never the file), so one exchange serves every request until the token is within google-auth's
refresh margin of its expiry (`Credentials.valid`). One key file's exchanges are serialised: the first
thread exchanges, the others wait and take its token. A token the API refuses is `forget`-ten, so the next
request exchanges again.

The exchange's HTTP request is the caller's `google.auth.transport.Request`: the proxy's goes through its
guarded upstream client, discovery's through its guarded httpx client (`HttpxRequest`), so a token endpoint
is held to every upstream's destination rules (SPEC §11).

Failures, as the caller classifies them: `KeyFileError` (not a key file google-auth reads, or one without
its `project_id`) and a `RefreshError` the endpoint gave as final are the account's credential refused;
a `RefreshError` google-auth calls retryable (the endpoint's 429 or 5xx, after google-auth's own retries)
and a `TransportError` are the endpoint unavailable, nothing sent to the API.
"""

import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
from google.auth import exceptions, transport
from google.oauth2 import service_account

SCOPE = "https://www.googleapis.com/auth/cloud-platform"
# Key files kept at once: one per Vertex assignment; a rotated key's old entry is the oldest to go.
MAX_KEY_FILES = 256


class KeyFileError(ValueError):
    """The credential is not a service-account key file google-auth can use (in the gateway's words only:
    nothing of the file is in it)."""


@dataclass(slots=True)
class _Entry:
    credentials: service_account.Credentials
    lock: threading.Lock


_entries: dict[bytes, _Entry] = {}
_entries_lock = threading.Lock()


def _digest(key_file: str) -> bytes:
    return hashlib.sha256(key_file.encode()).digest()


def key_file_info(key_file: str) -> dict[str, str]:
    """The parsed key file; KeyFileError when it is not a service account's JSON with a `project_id`."""
    try:
        info = json.loads(key_file)
    except ValueError:
        raise KeyFileError("the credential is not JSON") from None
    if not isinstance(info, dict) or info.get("type") != "service_account":
        raise KeyFileError("the credential is not a service account's key file")
    if not isinstance(info.get("project_id"), str) or not info["project_id"]:
        raise KeyFileError("the key file names no project_id")
    return info


def _entry(key_file: str) -> _Entry:
    digest = _digest(key_file)
    with _entries_lock:
        entry = _entries.get(digest)
        if entry is not None:
            return entry
    info = key_file_info(key_file)
    try:
        # Scoped, so google-auth exchanges at token_uri rather than signing a self-issued JWT.
        credentials = service_account.Credentials.from_service_account_info(info, scopes=[SCOPE])
    except (ValueError, KeyError, TypeError):
        raise KeyFileError("the key file is missing a field or its private key does not load") from None
    with _entries_lock:
        entry = _entries.setdefault(digest, _Entry(credentials, threading.Lock()))
        while len(_entries) > MAX_KEY_FILES:
            del _entries[next(iter(_entries))]
    return entry


def cached_token(key_file: str) -> str | None:
    """The key file's token while it is valid, without any I/O (None: `access_token` must exchange)."""
    with _entries_lock:
        entry = _entries.get(_digest(key_file))
    if entry is None or not entry.credentials.valid:
        return None
    token = entry.credentials.token
    return token if isinstance(token, str) else None


def access_token(key_file: str, request: transport.Request) -> str:
    """The key file's access token, exchanged through `request` unless a valid one is kept. Blocks (run
    it on a thread). Raises KeyFileError, google.auth's RefreshError or TransportError."""
    entry = _entry(key_file)
    with entry.lock:
        if not entry.credentials.valid:
            entry.credentials.refresh(request)
        token = entry.credentials.token
    if not isinstance(token, str) or not token:
        raise exceptions.RefreshError("the token endpoint answered no access token")
    return token


def forget(key_file: str) -> None:
    """Drop the key file's token (the API refused it): the next request exchanges again."""
    with _entries_lock:
        _entries.pop(_digest(key_file), None)


def refused(error: Exception) -> bool:
    """Whether an exchange's failure is the credential's (True) or the token endpoint's trouble (False)."""
    if isinstance(error, KeyFileError):
        return True
    return isinstance(error, exceptions.RefreshError) and not getattr(error, "retryable", False)


@dataclass(frozen=True, slots=True)
class Answer(transport.Response):
    """A token endpoint's answer, as google-auth reads it."""

    status_code: int
    header_map: Mapping[str, str]
    body: bytes

    @property
    def status(self) -> int:
        return self.status_code

    @property
    def headers(self) -> Mapping[str, str]:
        return self.header_map

    @property
    def data(self) -> bytes:
        return self.body


class HttpxRequest(transport.Request):
    """google-auth's requests over an httpx client (discovery's guarded one): a failure to reach the
    endpoint is google-auth's TransportError."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    def __call__(
        self,
        url: str,
        method: str = "GET",
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        **kwargs: object,
    ) -> Answer:
        try:
            response = self.client.request(method, url, content=body, headers=dict(headers or {}))
        except httpx.HTTPError:
            raise exceptions.TransportError("the token endpoint could not be reached") from None
        return Answer(response.status_code, dict(response.headers), response.content)
