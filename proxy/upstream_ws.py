"""The upstream websocket client (SPEC §6.3), and the seam that turns the `websockets` library's
failures into what the router needs to know: was the `response.create` frame sent?

Over a websocket the whole opening handshake happens before the frame goes out, so every failure
to open (refused, timed out, an HTTP status instead of the upgrade) is "not sent": a refusal or a
timeout is a transport event, a status is classified like an HTTP rejection. Once the frame is
written, a close or a silence is "unknown": the upstream may be executing it.

An idle connection holds no buffer of its own: no compression (a permessage-deflate context costs
hundreds of KiB per connection), a bounded incoming message size, and the library's default small
queues.
"""

import asyncio
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlsplit

from django.conf import settings
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.protocol import State

from pools import destinations
from proxy.transport import TransportFailure
from proxy.wire.sse import MAX_BLOCK_BYTES
from routing.policy import headroom
from routing.policy.failures import TransportEvent
from routing.policy.headroom import Headroom

logger = logging.getLogger("gateway")


class _NoWireTrace(logging.Filter):
    """The `websockets` library traces the wire at DEBUG: the handshake's headers (the credential) and
    every frame (`< TEXT '{...}'`: a prompt or a completion). None of it is ever logged (SPEC §10, §11),
    whatever the log level; its warnings and errors are."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.DEBUG


logging.getLogger("websockets.client").addFilter(_NoWireTrace())

# One upstream event per frame: the same bound as one SSE block of the same event.
MAX_FRAME_BYTES = MAX_BLOCK_BYTES
# A well-behaved peer answers a close at once; a stuck one is dropped after this.
CLOSE_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class HandshakeRejected(Exception):
    """The upstream answered the upgrade with an HTTP status: nothing was sent, the status says why."""

    status: int
    body: dict | None


def websocket_url(http_url: str) -> str:
    """`http://host/v1/responses` -> `ws://host/v1/responses` (and https -> wss), SPEC §3."""
    if http_url.startswith("https://"):
        return "wss://" + http_url.removeprefix("https://")
    if http_url.startswith("http://"):
        return "ws://" + http_url.removeprefix("http://")
    return http_url


class UpstreamSocket:
    """One upstream websocket connection, bound to the assignment it was opened for. `headroom`: the rate
    limits its handshake's answer reported (`routing.policy.headroom`)."""

    def __init__(
        self, connection: ClientConnection, assignment_id: int, headroom: Headroom | None = None
    ) -> None:
        self._connection = connection
        self.assignment_id = assignment_id
        self.headroom = headroom

    @property
    def open(self) -> bool:
        return self._connection.state is State.OPEN

    async def send(self, text: str) -> None:
        try:
            await self._connection.send(text)
        except ConnectionClosed:
            # websockets raises before writing anything when the connection is already closing.
            raise TransportFailure(TransportEvent.RESET_BEFORE_SEND) from None

    async def recv(self, timeout_s: float) -> str:
        """The next text frame. Raises TransportFailure: READ_TIMEOUT after `timeout_s` of silence,
        STREAM_TRUNCATED when the connection closes (or sends a binary frame, which the Responses
        protocol never does)."""
        try:
            async with asyncio.timeout(timeout_s):
                frame = await self._connection.recv()
        except TimeoutError:
            raise TransportFailure(TransportEvent.READ_TIMEOUT) from None
        except ConnectionClosed:
            raise TransportFailure(TransportEvent.STREAM_TRUNCATED) from None
        if not isinstance(frame, str):
            raise TransportFailure(TransportEvent.STREAM_TRUNCATED)
        return frame

    async def close(self) -> None:
        """The closing handshake, bounded by CLOSE_TIMEOUT_S."""
        await self._connection.close()

    def abort(self) -> None:
        """Drop the TCP connection at once (mid-response: the upstream should stop generating now,
        not after a closing handshake it may not answer while it streams)."""
        transport = self._connection.transport
        if transport is not None:
            transport.abort()

    async def wait_closed(self) -> None:
        await self._connection.wait_closed()


def _json_object(raw: bytes) -> dict | None:
    try:
        parsed = json.loads(raw)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


async def open_socket(url: str, *, headers: dict[str, str], assignment_id: int) -> UpstreamSocket:
    """Open an upstream websocket. Raises TransportFailure (CONNECT_REFUSED / CONNECT_TIMEOUT) or
    HandshakeRejected; either way nothing was sent. The host is resolved here and connected to by the
    address checked (SPEC §11: never a link-local or metadata address); TLS still verifies the name."""
    parts = urlsplit(url)
    try:
        addresses = await asyncio.wait_for(
            destinations.resolve_allowed(
                parts.hostname or "", parts.port or (443 if parts.scheme == "wss" else 80)
            ),
            settings.GATEWAY_UPSTREAM_CONNECT_TIMEOUT_S,
        )
    except destinations.ForbiddenDestination:
        logger.warning("upstream host %r resolves to a forbidden address: nothing sent", parts.hostname)
        raise TransportFailure(TransportEvent.CONNECT_REFUSED) from None
    except TimeoutError:
        raise TransportFailure(TransportEvent.CONNECT_TIMEOUT) from None
    except (OSError, ValueError):
        raise TransportFailure(TransportEvent.CONNECT_REFUSED) from None
    try:
        connection = await connect(
            url,
            host=addresses[0],
            additional_headers=headers,
            compression=None,
            proxy=None,  # like the HTTP client (trust_env=False): no proxy from the environment
            open_timeout=settings.GATEWAY_UPSTREAM_CONNECT_TIMEOUT_S,
            close_timeout=CLOSE_TIMEOUT_S,
            max_size=MAX_FRAME_BYTES,
        )
    except InvalidStatus as rejected:
        response = rejected.response
        raise HandshakeRejected(response.status_code, _json_object(response.body or b"")) from None
    except TimeoutError:
        raise TransportFailure(TransportEvent.CONNECT_TIMEOUT) from None
    except (OSError, InvalidHandshake, InvalidURI):
        raise TransportFailure(TransportEvent.CONNECT_REFUSED) from None
    return UpstreamSocket(connection, assignment_id, _handshake_headroom(connection))


def _handshake_headroom(connection: ClientConnection) -> Headroom | None:
    # A plain dict of the headers (the last of a repeated one): websockets' own `get` raises on a
    # repeated header, and reading them never may.
    response = connection.response
    if response is None:
        return None
    headers = {name.lower(): value for name, value in response.headers.raw_items()}
    return headroom.read(headers, datetime.now(UTC))
