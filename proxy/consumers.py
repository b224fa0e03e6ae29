"""Websocket `/v1/responses`: the Responses websocket mode (SPEC §6.3), a thin Channels consumer.

The client authenticates in the handshake (`Authorization: Bearer <key>` or `x-api-key: <key>`) and
sends JSON text frames `{"type": "response.create", ...Responses body...}`. Each one is a request of
its own: `proxy.ingress.prepare` routes it (the same code as HTTP, route class `websocket`) and the
Relay runs it through `proxy.ws_relay.WebsocketDispatch`; the upstream's events come back one frame
each. Once an upstream connection has served a response it is live, and every later frame is
hard-pinned to it (`PinKind.WEBSOCKET`). A response a Chat- or Messages-shaped account served (over
HTTP, translated) keeps its conversation in this connection's memory (`proxy.ws_relay.Conversations`),
so a later frame can continue it with `previous_response_id`; so does a prewarm (`generate: false`) the
gateway answered itself because its plan went to such an account first (`proxy.ws_relay.prewarm`).

Frames are handled one at a time, in order: a frame sent while a response streams waits its turn
(at most MAX_PENDING wait); a frame's deadline (`x-gateway-deadline-ms` of the handshake) runs from
its arrival, or from the end of the response it waited behind. A bad frame (binary, not JSON, not
an object, an unknown `type`, over GATEWAY_MAX_BODY_BYTES) gets a typed `error` event
(`invalid_request` / `request_too_large`, error type `invalid_request_error`), reaches no upstream,
and the connection stays usable. Typed routing outcomes (`model_not_found`, `no_eligible_backend`,
...) are `error` events shaped like the HTTP errors, with the HTTP status they stand for.

Close codes (the reason is always sent):
- 4401 "invalid gateway key": the handshake had no valid key, or the key stopped being valid. The
  handshake is accepted first so that the code and reason reach the client (a refusal before the
  upgrade can only be a bare HTTP 403).
- 1013 "gateway unavailable": the database could not be reached to check the key.
- 1014 "upstream connection closed" (Bad Gateway): the live upstream connection ended.
- 1008 "too many pending frames": more than MAX_PENDING frames waiting behind a response.
- 1011 "internal error": a gateway bug (logged with its traceback, never with content).
The ASGI server closes a connection itself, before the consumer sees the frame (RFC 6455): 1007 for
a text frame that is not UTF-8, 1009 for a message over its own size limit (uvicorn's `ws_max_size`,
16 MiB by default; a frame between GATEWAY_MAX_BODY_BYTES and that limit gets `request_too_large`).
A database error while a frame is routed is a typed `gateway_unavailable` event (503); the
connection stays open.
Closing either side closes the other: when the client goes, the response in flight is cancelled
(ledger: `cancelled`) and the upstream connection closed before the consumer returns.

The database is touched only through `runtime.db.run` (its own long-lived pool), so the consumer is a
runtime.consumer.DirectConsumer: no per-message thread hop in Channels' dispatch, and no channel layer
(nothing is ever sent to this connection from elsewhere, and an idle connection keeps no task of its
own beyond the upstream watcher).
"""

import asyncio
import logging
import time
import uuid
from collections import deque
from contextlib import aclosing, suppress
from datetime import UTC, datetime

from django.conf import settings
from django.db import DatabaseError

from pools.selectors import key_authenticate
from proxy.edge import read_timeout_s
from proxy.ingress import RequestFailed, bearer, decode_json, prepare, validate_body
from proxy.ledger.exchange import Exchange, Final, Stream, settle
from proxy.ledger.recorder import record
from proxy.wire.sse import Dialect
from proxy.ws_relay import Conversations, UpstreamLink, WebsocketDispatch, error_frame, prewarm
from routing.policy.conversation import SESSION_HEADERS
from routing.policy.errors import ErrorCode
from routing.policy.plan import HardPin, PinKind
from routing.policy.types import RouteClass
from routing.policy.vocabulary import ClientRoute, Outcome
from routing.request_state import READER
from runtime import db
from runtime.consumer import DirectConsumer

log = logging.getLogger("gateway")

ROUTE = ClientRoute.RESPONSES
MAX_PENDING = 8
# The handshake headers a frame's routing reads; nothing else of the handshake is kept.
KEPT_HEADERS = frozenset(
    {"authorization", "x-api-key", "x-gateway-requirements", "x-gateway-deadline-ms", "x-gateway-session"}
) | frozenset(SESSION_HEADERS)  # the agents' own session headers name a conversation too (§5.4)

CLOSE_INVALID_KEY = (4401, "invalid gateway key")
CLOSE_GATEWAY_UNAVAILABLE = (1013, "gateway unavailable")
CLOSE_UPSTREAM_CLOSED = (1014, "upstream connection closed")
CLOSE_TOO_MANY_PENDING = (1008, "too many pending frames")
CLOSE_INTERNAL_ERROR = (1011, "internal error")

BINARY_FRAME = "Binary frames are not supported; send response.create as a JSON text frame."
NOT_AN_OBJECT = "The frame is not a JSON object."
UNKNOWN_TYPE = "Unknown event type; this endpoint accepts response.create frames."


class _Binary:
    """A binary frame waiting its turn (its bytes are not kept)."""


class _TooLarge:
    """A frame over the size limit waiting its turn (its text is not kept)."""


class _ClientGone(Exception):
    """The client connection ended while the gateway was writing to it."""


class BadFrame(RequestFailed):
    """A frame that is not a usable `response.create`, with the gateway's own words for why."""

    def __init__(self, code: str, message: str | None = None, param: str | None = None) -> None:
        super().__init__(code, param)
        self.message = message


class ResponsesConsumer(DirectConsumer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.headers: dict[str, str] = {}
        self.key_id: int | None = None
        self.link = UpstreamLink()
        self.conversations = Conversations()  # never persisted: dropped with the connection
        # Each waiting frame with the time it arrived: its deadline runs from then, or from the end of
        # the response it waited behind (`free_at`), whichever is later.
        self.pending: deque[tuple[str | _Binary | _TooLarge, float]] = deque()
        self.free_at = 0.0
        self.authenticating: asyncio.Task | None = None
        self.worker: asyncio.Task | None = None
        self.watcher: asyncio.Task | None = None
        self.closing = False

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # However the connection ends (disconnect, server shutdown), nothing outlives it.
            await settle(self._shutdown())

    # -- the client side --------------------------------------------------------------------------

    async def connect(self) -> None:
        self.headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in self.scope["headers"]
            if name.decode("latin-1").lower() in KEPT_HEADERS
        }
        await self.accept()
        # The key is checked beside the connection, not before it: frames that arrive meanwhile are
        # taken in (and their deadlines start) while the database answers, and are served after it.
        self.authenticating = asyncio.create_task(self._authenticate())

    async def _authenticate(self) -> bool:
        try:
            authenticated = await db.run_within(
                read_timeout_s(self.headers), key_authenticate, bearer(self.headers)
            )
        except DatabaseError:
            await self._close(*CLOSE_GATEWAY_UNAVAILABLE)
            return False
        if authenticated is None:
            await self._close(*CLOSE_INVALID_KEY)
            return False
        self.key_id = authenticated.key.key_id
        return True

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.closing:
            return
        if len(self.pending) >= MAX_PENDING:
            await self._close(*CLOSE_TOO_MANY_PENDING)
            await self._abandon(1)  # this frame's answer is the close
            return
        arrived = time.monotonic()
        if text_data is None:
            self.pending.append((_Binary(), arrived))
        elif len(text_data) > settings.GATEWAY_MAX_BODY_BYTES:  # characters <= bytes: surely too large
            self.pending.append((_TooLarge(), arrived))
        else:
            self.pending.append((text_data, arrived))
        if self.worker is None:
            self.worker = asyncio.create_task(self._drain())

    async def disconnect(self, code: int) -> None:
        self.closing = True
        await self._shutdown()

    async def _send(self, frame: bytes) -> None:
        if self.closing:
            raise _ClientGone
        try:
            await self.send(text_data=frame.decode())
        except (OSError, RuntimeError):  # the server's "client disconnected" / "already closed"
            self.closing = True
            raise _ClientGone from None

    async def _close(self, code: int, reason: str) -> None:
        if self.closing:
            return
        self.closing = True
        with suppress(OSError, RuntimeError):
            await self.close(code=code, reason=reason)

    async def _abandon(self, frames: int) -> None:
        """Frames the connection ended before serving still get their ledger row: `cancelled`. Frames
        of a connection whose key was never accepted were no key's requests: they get none."""
        if self.key_id is None:
            return
        for _ in range(frames):
            exchange = self._exchange()
            exchange.outcome, exchange.status_code = Outcome.CANCELLED, 499
            await record(exchange)

    async def _shutdown(self) -> None:
        self.closing = True
        waiting = len(self.pending)
        self.pending.clear()
        await self._abandon(waiting)
        for task in (self.authenticating, self.worker, self.watcher):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
                with suppress(asyncio.CancelledError):
                    await task
        await self.link.close()

    # -- frames, one at a time ----------------------------------------------------------------------

    async def _drain(self) -> None:
        try:
            assert self.authenticating is not None  # connect() started it before any frame
            if not await self.authenticating:
                return  # the connection is closed; its waiting frames get their rows at the disconnect
            while self.pending and not self.closing:
                if self.link.dead:
                    break
                item, arrived = self.pending.popleft()
                with READER.answering():
                    await self._frame(item, started=max(arrived, self.free_at))
                self.free_at = time.monotonic()
            # Checked with no await before `worker` is cleared, so the watcher cannot miss it.
            if self.link.dead:
                # Frames still waiting were pinned to the upstream that is gone: each gets its typed
                # answer and its ledger row before the client connection closes.
                while self.pending and not self.closing:
                    self.pending.popleft()
                    await self._typed(
                        self._exchange(), RequestFailed(ErrorCode.PIN_UNAVAILABLE), bad_frame=False
                    )
                await self._close(*CLOSE_UPSTREAM_CLOSED)
        except _ClientGone:
            pass
        except Exception:
            log.exception("websocket: the relay failed")
            await self._close(*CLOSE_INTERNAL_ERROR)
        finally:
            self.worker = None

    async def _watch(self) -> None:
        """An idle live upstream that closes closes the client; a busy one is handled by `_drain`."""
        live = self.link.live
        assert live is not None
        await live.wait_closed()
        if self.worker is None:
            await self._close(*CLOSE_UPSTREAM_CLOSED)

    def _exchange(self) -> Exchange:
        return Exchange(
            request_id=uuid.uuid4().hex,
            key_id=self.key_id,
            route=ROUTE,
            transport=str(RouteClass.WEBSOCKET),
            requested_model="",
            started_at=datetime.now(UTC),
        )

    async def _frame(self, item: str | _Binary | _TooLarge, *, started: float) -> None:
        exchange = self._exchange()
        try:
            body, size = self._parse(item)
        except RequestFailed as failed:
            await self._typed(exchange, failed, bad_frame=True)
            return
        live = self.link.live
        sent, previous = self.conversations.continued(body)
        # A bridged candidate is asked for a stream over HTTP; a frame is a stream by itself.
        added_stream = "stream" not in sent
        dispatch = WebsocketDispatch(self.link, added_stream=added_stream)
        try:
            relay = await prepare(
                exchange,
                headers=self.headers,
                path=ROUTE,
                body={**sent, "stream": True} if added_stream else sent,
                body_error=None,
                body_size=size,
                started=started,
                route_class=RouteClass.WEBSOCKET,
                dialect=Dialect.RESPONSES,
                dispatch=dispatch,
                pins=[HardPin(PinKind.WEBSOCKET, live.assignment_id)] if live is not None else [],
                raw=item if isinstance(item, str) and sent is body else None,
            )
        except RequestFailed as failed:
            await self._typed(exchange, failed, bad_frame=False)
            if failed.code == ErrorCode.AUTHENTICATION_ERROR:
                await self._close(*CLOSE_INVALID_KEY)
            return
        answered = prewarm(relay, sent) if live is None else None
        if answered is not None:
            frames, response = answered
            await relay.answered()
            for frame in frames:
                await self._send(frame)
            self.conversations.remember(previous, body, response, size=size + len(frames[-1]))
            return
        result = await relay.run()
        if isinstance(result, Stream):
            try:
                async with aclosing(result.chunks) as chunks:
                    async for frame in chunks:
                        await self._send(frame)
            except DatabaseError:
                # The response reached the client; only the bookkeeping after it failed.
                log.warning("websocket: a health write failed after the response was relayed")
        else:
            assert isinstance(result, Final)
            for frame in result.frames:
                await self._send(frame)
        if dispatch.finished is not None:
            self.conversations.remember(
                previous, body, dispatch.finished, size=size + dispatch.finished_bytes
            )
        if self.link.live is not None and self.watcher is None:
            self.watcher = asyncio.create_task(self._watch())

    @staticmethod
    def _parse(item: str | _Binary | _TooLarge) -> tuple[dict, int]:
        """The Responses body of a `response.create` frame and its size, or RequestFailed."""
        if isinstance(item, _Binary):
            raise BadFrame(ErrorCode.INVALID_REQUEST, BINARY_FRAME)
        if isinstance(item, _TooLarge):
            raise BadFrame(ErrorCode.REQUEST_TOO_LARGE)
        size = len(item.encode())
        if size > settings.GATEWAY_MAX_BODY_BYTES:
            raise BadFrame(ErrorCode.REQUEST_TOO_LARGE)
        try:
            frame = decode_json(item)
        except RequestFailed:
            raise BadFrame(ErrorCode.INVALID_REQUEST, NOT_AN_OBJECT) from None
        if not isinstance(frame, dict):
            raise BadFrame(ErrorCode.INVALID_REQUEST, NOT_AN_OBJECT)
        if frame.get("type") != "response.create":
            raise BadFrame(ErrorCode.INVALID_REQUEST, UNKNOWN_TYPE, "type")
        body = {name: value for name, value in frame.items() if name != "type"}
        return validate_body(body), size

    async def _typed(self, exchange: Exchange, failed: RequestFailed, *, bad_frame: bool) -> None:
        """A typed gateway error as an `error` event, and its own ledger row."""
        status, message = failed.code.status, failed.code.message
        exchange.refused(failed.code, failed.param, status)
        await record(exchange)
        # A bad frame is the client's protocol error: OpenAI's error type for those. Routing outcomes
        # keep the HTTP API's shape, whose error type is the code.
        await self._send(
            error_frame(
                status,
                type="invalid_request_error" if bad_frame else failed.code,
                code=failed.code,
                param=failed.param,
                message=failed.message or message,
            )
        )


class NoSuchRoute(DirectConsumer):
    """A websocket to any path but `/v1/responses`: refused at the handshake (the server answers 403),
    never a routing exception and a server error."""

    async def connect(self) -> None:
        await self.close()
