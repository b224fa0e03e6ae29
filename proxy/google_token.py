"""The access token of a call that a Google service account authorizes (`UpstreamCall.oauth`, Vertex AI), as
the transport adds it: kept while valid (no I/O on the event loop), else exchanged by
google-auth on a worker thread whose HTTP request runs on the event loop's own upstream client
(`proxy.upstream`, with its destination guard), so the token endpoint is an upstream like any other.

What the loop sees of a failed exchange (`runtime.google_oauth.refused`): the credential refused is a
`Refused` (the caller reports it as the account's 401: `credential_rejected`, SPEC §5.6); the token
endpoint unreachable or failing is a TransportFailure before anything was sent (`unavailable`).
"""

import asyncio
from collections.abc import Mapping

from django.conf import settings
from google.auth import exceptions, transport

from proxy import upstream
from proxy.transport import TransportFailure
from proxy.wire.providers.base import GoogleOAuth
from routing.policy.failures import TransportEvent
from runtime import google_oauth


class Refused(Exception):
    """The account's key file is not usable, or its token endpoint refused it."""


class LoopRequest(transport.Request):
    """google-auth's request, sent from a worker thread by the event loop `loop` over the shared upstream
    client."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def __call__(
        self,
        url: str,
        method: str = "GET",
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        **kwargs: object,
    ) -> google_oauth.Answer:
        sent = asyncio.run_coroutine_threadsafe(_send(url, method, body, dict(headers or {})), self.loop)
        return sent.result()


async def _send(url: str, method: str, body: bytes | None, headers: dict[str, str]) -> google_oauth.Answer:
    try:
        response = await upstream.open_stream(
            method,
            url,
            headers=headers,
            json=None,
            content=body,
            read_timeout_s=settings.GATEWAY_UPSTREAM_CONNECT_TIMEOUT_S,
        )
        raw = await upstream.read_body(response, limit=1 << 20)
    except (TransportFailure, upstream.ResponseTooLarge):
        raise exceptions.TransportError("the token endpoint could not be reached") from None
    return google_oauth.Answer(response.status, dict(response.headers), raw)


async def bearer(oauth: GoogleOAuth) -> str:
    """The `authorization` header's value for `oauth`. Raises Refused or TransportFailure."""
    token = google_oauth.cached_token(oauth.key_file)
    if token is None:
        request = LoopRequest(asyncio.get_running_loop())
        try:
            token = await asyncio.to_thread(google_oauth.access_token, oauth.key_file, request)
        except (google_oauth.KeyFileError, exceptions.GoogleAuthError) as failed:
            if google_oauth.refused(failed):
                raise Refused from None
            raise TransportFailure(TransportEvent.CONNECT_REFUSED) from None
    return f"Bearer {token}"


def forget(oauth: GoogleOAuth) -> None:
    """The API refused the token (401): the next call exchanges the key file again."""
    google_oauth.forget(oauth.key_file)
