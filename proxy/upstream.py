"""The one upstream HTTP client of the process, and the seam that turns transport failures into
what the router needs to know: was the request sent?

The client is one aiohttp `ClientSession` per event loop (a server runs one loop; tests may run
several), called directly: no other module knows the library. Its connector refuses forbidden
destinations after name resolution (`GuardedResolver`), keeps up to 1,000 connections with a 30 s
keep-alive, and verifies TLS against certifi's CA bundle without reading the environment (no proxy, no
SSL_CERT_FILE). A request offers gzip and deflate (`accept-encoding`), never follows a redirect, never
carries a cookie (no jar: one account's cookie would reach another's requests), and comes back as a
`Response`: its status, its headers, its body decoded as it is read.

The dispatch state is decided from aiohttp's own exception, conservatively: only a failure to connect
(refused, its connect timeout, or an URL the client refuses to connect to) is "not sent"; a disconnect
or reset once connected may have executed the request, and a read timeout is one.
"""

import asyncio
import functools
import logging
import math
import socket
import ssl
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import aiohttp
import certifi
from aiohttp.abc import AbstractResolver, ResolveResult
from django.conf import settings
from yarl import URL

from pools import destinations
from proxy.transport import TransportFailure
from proxy.wire.providers.base import SigV4
from routing.policy.failures import TransportEvent
from runtime import fastjson
from runtime.sigv4 import sign

logger = logging.getLogger("gateway")

# What the gateway offers to decode (aiohttp decodes it as the body is read); fixed, so the offer does
# not change with the compression libraries installed.
ACCEPT_ENCODING = "gzip, deflate"

_sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}


def _client() -> aiohttp.ClientSession:
    """The shared session of the running event loop."""
    loop = asyncio.get_running_loop()
    shared = _sessions.get(loop)
    if shared is None:
        for stale in [other for other, session in _sessions.items() if session.closed]:
            del _sessions[stale]
        shared = _sessions[loop] = _session()
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
    connector = aiohttp.TCPConnector(
        limit=1000,
        keepalive_timeout=30,
        ssl=ssl.create_default_context(cafile=certifi.where()),
        resolver=GuardedResolver(),
    )
    # No cookie jar: one session serves every account, and a cookie one account's answer set (a
    # provider edge's load-balancer or bot-management cookie) would go out with another's requests.
    return aiohttp.ClientSession(
        connector=connector,
        headers={"accept-encoding": ACCEPT_ENCODING},
        cookie_jar=aiohttp.DummyCookieJar(),
    )


def _forbidden(exc: BaseException | None) -> bool:
    while exc is not None:
        if isinstance(exc, destinations.ForbiddenDestination):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


async def close_client() -> None:
    """Close the running loop's shared session (at server shutdown)."""
    shared = _sessions.pop(asyncio.get_running_loop(), None)
    if shared is not None:
        await shared.close()


def transport_event(exc: BaseException) -> TransportEvent:
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return TransportEvent.CONNECT_TIMEOUT
    if isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.InvalidURL)):
        # An URL the client refuses (`http://2130706433/v1`: yarl takes only an address's canonical
        # spelling) is refused before any connection: nothing was sent.
        return TransportEvent.CONNECT_REFUSED
    if isinstance(exc, TimeoutError):  # aiohttp's read timeouts are TimeoutErrors too
        return TransportEvent.READ_TIMEOUT
    # A disconnect or reset once connected: the request may have been executed.
    return TransportEvent.RESET_AFTER_SEND


# What a failing aiohttp call raises (its read timeouts are TimeoutErrors too).
_FAILURES = (aiohttp.ClientError, TimeoutError)


@functools.lru_cache(maxsize=1024)
def _target(url: str) -> tuple[URL, bool]:
    """An upstream URL parsed once, and whether its host is refused before any resolution (SPEC §11):
    the accounts' few URLs come back on every request, and both are functions of the URL alone (the
    host check parsed an address literal twice, about 6 us a request). A URL is immutable: one is
    shared."""
    target = URL(url)
    return target, destinations.host_forbidden(target.host or "")


@functools.lru_cache(maxsize=64)
def _timeout(read_s: float, connect_s: float) -> aiohttp.ClientTimeout:
    # `connect` bounds waiting for a pooled connection and connecting; `sock_connect` the TCP and TLS
    # handshake alone; `sock_read` each wait for the upstream's next bytes. No total: a stream may last.
    return aiohttp.ClientTimeout(sock_connect=connect_s, sock_read=read_s, connect=read_s)


# The most of an upstream body handed on at once. aiohttp's `iter_any` hands over everything buffered,
# which on a fast upstream is hundreds of KiB; a relay whose client stops reading then holds that batch
# several times over (the SSE blocks, their data, the packed write, the server's unsent buffer): about
# 5 MiB for each such client, against a few hundred KiB with this bound. A read never waits for it to fill.
READ_CHUNK_BYTES = 64 * 1024


class Response:
    """An upstream answer whose body is not read yet: the caller reads it (`chunks`) or not, and must
    `aclose` it, which drops the connection unless the body was read to its end."""

    __slots__ = ("_response", "headers", "status")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status: int = response.status
        self.headers: Mapping[str, str] = response.headers  # case-insensitive

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, decoded (gzip and deflate undone), at most READ_CHUNK_BYTES at a time.
        Raises TransportFailure."""
        try:
            async for chunk in self._response.content.iter_chunked(READ_CHUNK_BYTES):
                yield chunk
        except _FAILURES as exc:
            raise TransportFailure(transport_event(exc)) from None

    async def aclose(self) -> None:
        # aiohttp pools the connection of a body read to its end and closes any other (documented).
        self._response.release()


async def open_stream(
    method: str,
    url: str,
    *,
    headers: dict[str, str],
    json: object,
    read_timeout_s: float,
    content: bytes | AsyncIterable[bytes] | None = None,
    sigv4: SigV4 | None = None,
) -> Response:
    """Send the request and return the response with its body unread (the caller streams or reads
    it and must close it). Raises TransportFailure with what is known of the dispatch. `json`: the body,
    encoded compactly as UTF-8 JSON (None: no body); `content` (instead of `json`): bytes, or a body sent
    as it is produced, never held whole (a file upload). `sigv4`: the AWS signature added over the request
    as it will be sent (its URL, headers and body bytes)."""
    target, forbidden = _target(url)
    data: bytes | AsyncIterable[bytes] | None = content
    if content is None and json is not None:
        data = fastjson.dumps(json)
        if "content-type" not in headers:
            headers = {**headers, "content-type": "application/json"}
    if sigv4 is not None:
        body = data if isinstance(data, bytes) else b""
        headers = {**headers, **sign(method, str(target), headers, body, sigv4)}
    if forbidden:
        logger.warning("upstream host %r is a forbidden destination: nothing sent", target.host)
        raise TransportFailure(TransportEvent.CONNECT_REFUSED)
    timeout = _timeout(read_timeout_s, settings.GATEWAY_UPSTREAM_CONNECT_TIMEOUT_S)
    try:
        response = await _client().request(
            method, target, headers=headers, data=data, timeout=timeout, allow_redirects=False
        )
    except _FAILURES as exc:
        if _forbidden(exc):
            logger.warning("upstream host %r resolves to a forbidden address: nothing sent", target.host)
        raise TransportFailure(transport_event(exc)) from None
    return Response(response)


class ResponseTooLarge(Exception):
    """A plain upstream answer longer than GATEWAY_MAX_RESPONSE_BYTES (decoded): relayed as the typed 502
    `upstream_response_too_large`, never cut short into a 200 (SPEC §4)."""


async def read_body(response: Response, limit: int | None = None) -> bytes:
    """The whole decoded body of an upstream response; a read failure is TransportFailure, a body over
    `limit` (default GATEWAY_MAX_RESPONSE_BYTES, counted after decoding, so a compression bomb stops
    there too) is ResponseTooLarge."""
    limit = settings.GATEWAY_MAX_RESPONSE_BYTES if limit is None else limit
    chunks, size = [], 0
    try:
        async for chunk in response.chunks():
            size += len(chunk)
            if size > limit:
                raise ResponseTooLarge
            chunks.append(chunk)
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
