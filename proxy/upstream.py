"""The one upstream HTTP client of the process, and the seam that turns transport failures into
what the router needs to know: was the request sent?

httpx is the API; the transport is httpx-aiohttp, because plain httpx's pool collapses at 40+
concurrent requests (encode/httpx#3215). That transport maps *every* aiohttp connection error,
including a server disconnect after the request went out, to `httpx.ConnectTimeout`; reading that
at face value would replay a request that may have executed. So the dispatch state is decided from
the original aiohttp exception (`__cause__`), conservatively: only a failure to connect is
"not sent".
"""

import asyncio
import functools
import logging
import math
import socket
from collections.abc import AsyncIterable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import aiohttp
import httpx
from aiohttp.abc import AbstractResolver, ResolveResult
from django.conf import settings
from httpx_aiohttp import AiohttpTransport

from pools import destinations
from proxy.providers.base import SigV4
from proxy.transport import TransportFailure
from routing.failures import TransportEvent
from runtime.sigv4 import sign

logger = logging.getLogger("gateway")

_clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}


def client() -> httpx.AsyncClient:
    """The shared client of the running event loop (a server runs one loop; tests may run several)."""
    loop = asyncio.get_running_loop()
    shared = _clients.get(loop)
    if shared is None:
        for stale in [other for other in _clients if other.is_closed()]:
            del _clients[stale]
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200, keepalive_expiry=30)
        shared = httpx.AsyncClient(
            transport=AiohttpTransport(limits=limits, trust_env=False, client=_session),
        )
        _clients[loop] = shared
    return shared


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver, refusing a name that resolves to a link-local or metadata address (SPEC §11):
    the addresses checked are the ones connected to, so a record that changes after the check
    (DNS rebinding) cannot slip through. Address literals skip resolvers: `open_stream` checks them."""

    def __init__(self) -> None:
        self._resolver = aiohttp.DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if destinations.host_forbidden(host):
            raise destinations.ForbiddenDestination(f"{host} is a forbidden destination")
        hosts = await self._resolver.resolve(host, port, family)
        if not hosts:
            raise OSError(f"{host} resolves to no address")
        if any(destinations.address_forbidden(h["host"]) for h in hosts):
            raise destinations.ForbiddenDestination(f"{host} resolves to a forbidden address")
        return hosts

    async def close(self) -> None:
        await self._resolver.close()


def _session() -> aiohttp.ClientSession:
    """What AiohttpTransport would build (its pool limits, httpx's TLS context), with GuardedResolver."""
    connector = aiohttp.TCPConnector(
        limit=1000,
        keepalive_timeout=30,
        ssl=httpx.create_ssl_context(trust_env=False),
        resolver=GuardedResolver(),
    )
    return aiohttp.ClientSession(connector=connector)


def _forbidden(exc: BaseException | None) -> bool:
    while exc is not None:
        if isinstance(exc, destinations.ForbiddenDestination):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


async def close_client() -> None:
    """Close the running loop's shared client (at server shutdown)."""
    shared = _clients.pop(asyncio.get_running_loop(), None)
    if shared is not None:
        await shared.aclose()


def transport_event(exc: Exception) -> TransportEvent:
    cause = exc.__cause__ or exc
    if isinstance(cause, aiohttp.ConnectionTimeoutError | httpx.ConnectTimeout):
        return TransportEvent.CONNECT_TIMEOUT
    if isinstance(cause, aiohttp.ClientConnectorError | httpx.ConnectError):
        return TransportEvent.CONNECT_REFUSED
    if isinstance(cause, aiohttp.ServerTimeoutError | httpx.TimeoutException | TimeoutError):
        return TransportEvent.READ_TIMEOUT
    # A disconnect or reset once connected: the request may have been executed.
    return TransportEvent.RESET_AFTER_SEND


@functools.lru_cache(maxsize=1024)
def _url(url: str) -> httpx.URL:
    """An upstream URL parsed once: the accounts' few URLs come back on every request, and parsing one
    was about a third of httpx's cost to build a request. httpx.URL is immutable: one is shared."""
    return httpx.URL(url)


async def open_stream(
    method: str,
    url: str,
    *,
    headers: dict[str, str],
    json: object,
    read_timeout_s: float,
    content: AsyncIterable[bytes] | None = None,
    sigv4: SigV4 | None = None,
) -> httpx.Response:
    """Send the request and return the response with its body unread (the caller streams or reads
    it and must close it). Raises TransportFailure with what is known of the dispatch. `content`
    (instead of `json`): a body sent as it is produced, never held whole (a file upload). `sigv4`: the
    AWS signature added over the request as it will be sent (its final URL, headers and body bytes)."""
    timeout = httpx.Timeout(read_timeout_s, connect=settings.GATEWAY_UPSTREAM_CONNECT_TIMEOUT_S)
    if content is not None:
        request = client().build_request(method, _url(url), headers=headers, content=content, timeout=timeout)
    else:
        request = client().build_request(method, _url(url), headers=headers, json=json, timeout=timeout)
    if sigv4 is not None:
        sign(request, sigv4)
    if destinations.host_forbidden(request.url.host):
        logger.warning("upstream host %r is a forbidden destination: nothing sent", request.url.host)
        raise TransportFailure(TransportEvent.CONNECT_REFUSED)
    try:
        return await client().send(request, stream=True)
    except (httpx.HTTPError, aiohttp.ClientError, TimeoutError) as exc:
        if _forbidden(exc):
            logger.warning("upstream host %r resolves to a forbidden address: nothing sent", request.url.host)
        raise TransportFailure(transport_event(exc)) from None


class ResponseTooLarge(Exception):
    """A plain upstream answer longer than GATEWAY_MAX_RESPONSE_BYTES (decoded): relayed as the typed 502
    `upstream_response_too_large`, never cut short into a 200 (SPEC §4)."""


async def read_body(response: httpx.Response, limit: int | None = None) -> bytes:
    """The whole decoded body of an upstream response (httpx undoes the gzip/deflate it offered); a
    read failure is a reset after send, a body over `limit` (default GATEWAY_MAX_RESPONSE_BYTES, counted
    after decoding, so a compression bomb stops there too) is ResponseTooLarge."""
    limit = settings.GATEWAY_MAX_RESPONSE_BYTES if limit is None else limit
    chunks, size = [], 0
    try:
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > limit:
                raise ResponseTooLarge
            chunks.append(chunk)
    except (httpx.HTTPError, aiohttp.ClientError, TimeoutError) as exc:
        raise TransportFailure(transport_event(exc)) from None
    finally:
        await response.aclose()
    # One copy at the end; the chunks go with this frame.
    return b"".join(chunks)


MAX_RETRY_AFTER_S = 3600


def retry_after_s(value: str | None, *, now: datetime | None = None) -> int | None:
    """An upstream's `retry-after` (seconds, or an HTTP date) as whole seconds within 0..3600; None
    when absent or unreadable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if not math.isfinite(seconds):
        return None
    return min(max(math.ceil(seconds), 0), MAX_RETRY_AFTER_S)
