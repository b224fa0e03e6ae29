"""The Responses websocket transport of the attempt loop (SPEC §6.3): `WebsocketDispatch` plugs into
`proxy.relay.Relay`, so a `response.create` frame is routed, classified, withheld, failed over and
recorded exactly like an SSE request; only the wire differs.

Contract:
- One `UpstreamLink` per client websocket holds at most one live upstream connection. An attempt on
  the live connection's assignment reuses it; any other attempt opens a new connection to its
  candidate (`base_url` with http->ws, https->wss, plus `/responses`) and sends the frame there.
- A new connection that ends its attempt without output (a pre-visible failure, a refusal to
  connect) is closed before the next candidate is tried: the client never sees it. A connection
  whose response released output to the client becomes live; from then on the consumer pins every
  later `response.create` to its assignment (`HardPin(PinKind.WEBSOCKET, ...)`), which never fails
  over.
- Each upstream event is one frame and one `Block` (`data` is the frame's text), so the SSE
  classification and withholding apply unchanged; a response ends at its terminal event while the
  connection stays open. A response cut mid-way (client gone, upstream silent or closed) drops the
  connection: its state is unknown, so it is never reused.
- The gateway's own errors are Responses `error` events carrying the HTTP status they stand for.
- A candidate whose provider speaks no Responses (a Chat- or Messages-shaped account, its request
  translated by `proxy.wire.providers`) is dispatched over HTTP as an SSE stream (`proxy.dispatch`), and its
  translated events are sent one frame each: the same withholding and failover rules, no upstream
  connection kept, so no pin follows it.
- `previous_response_id` of such a bridged response: the upstream keeps no state, and the gateway stores
  no prompt or completion (SPEC §7.3). The conversation of each response a bridged candidate completed on
  this client connection is kept in that connection's memory only (`Conversations`: never persisted,
  never logged, dropped at close, as OpenAI's own websocket mode keeps its previous response), and a
  `response.create` that continues one is sent with the whole conversation as its `input` (to whichever
  candidate serves it). Any other `previous_response_id` is sent as it came. What is kept is bounded by
  bytes (`GATEWAY_MAX_BODY_BYTES` a connection) and cycle-free whatever an upstream's ids are (the
  response ids are the gateway's own, `proxy.ledger.exchange.new_response_id`).
- A prewarm (`response.create` with `generate: false`, Codex's first frame: the turn's request, to be
  continued by the next frame with `previous_response_id` and only what is new) is relayed as it is
  to a native candidate or on the live connection. When the plan's first candidate is bridged, the
  gateway answers it as OpenAI does, with no upstream call (`prewarm`): `response.created` and
  `response.completed` with no output, under an id of its own, and its conversation is kept like a
  completed response's, so the next frame continues it whole. Its ledger row has no attempt (nothing
  was sent, so no account's health or latency learns anything from it). A bridged candidate later in
  an attempt loop refuses `generate` (a Chat or Messages upstream would generate).
"""

import json
import time
from collections.abc import AsyncGenerator
from typing import Any

from django.conf import settings

from proxy import upstream_ws
from proxy.dispatch import HttpDispatch
from proxy.ledger.exchange import Failure, Final, new_response_id
from proxy.relay import Relay, call_for
from proxy.transport import Answer, EventSource, TransportFailure
from proxy.upstream_ws import HandshakeRejected, UpstreamSocket
from proxy.wire.apis import responses
from proxy.wire.apis.responses import responses_error_event
from proxy.wire.providers.base import UpstreamCall
from proxy.wire.providers.registry import provider
from proxy.wire.sse import Block, Dialect, SSEParser
from proxy.wire.translations.responses_over_chat_answer import prewarmed
from proxy.wire.translations.translate import RequestTranslationError
from routing.policy.failures import Observation
from routing.policy.types import Candidate


def error_frame(status: int | None, *, type: str, code: str | None, param: str | None, message: str) -> bytes:
    """One gateway `error` event as a websocket frame (UTF-8 JSON)."""
    body = responses_error_event(type=type, code=code, param=param, message=message, status=status)
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


_SMALLEST = {"input": "."}


def prewarm(relay: Relay, body: dict[str, Any]) -> tuple[list[bytes], dict[str, Any]] | None:
    """The gateway's answer to a prewarm frame whose plan goes to a bridged candidate first (module
    docstring): its frames and the response they complete; None when the frame is no prewarm or is
    relayed (a native candidate first)."""
    if body.get("generate") is not False or not relay.plan.order:
        return None
    first = relay.plan.order[0]
    # Whether its account speaks Responses is its provider's, whatever the body: asked of the smallest
    # request (the prewarm's own input may be one no translation carries, e.g. instructions alone,
    # and is never sent).
    try:
        call = call_for(relay.path, relay.view, first, _SMALLEST, relay.requirements, None)
    except RequestTranslationError:
        return None
    if call.dialect is Dialect.RESPONSES:
        return None
    events = prewarmed(body, model=first.model, created=int(time.time()), response_id=new_response_id())
    frames = [json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode() for event in events]
    return frames, events[-1]["response"]


class UpstreamLink:
    """The upstream side of one client websocket: at most one live connection."""

    def __init__(self) -> None:
        self.live: UpstreamSocket | None = None

    @property
    def dead(self) -> bool:
        """The live upstream connection is gone: the client connection must end too."""
        return self.live is not None and not self.live.open

    async def close(self) -> None:
        live, self.live = self.live, None
        if live is not None:
            await live.close()


class WebsocketSource:
    """The events of one response on an upstream websocket, one frame per batch. A connection opened
    for this attempt becomes the client's live one once its output is released; until then the
    client has never seen it, and it is closed when the attempt ends."""

    ends_at_terminal = True
    status = None

    def __init__(self, socket: UpstreamSocket, link: UpstreamLink, *, fresh: bool) -> None:
        self.socket = socket
        self.link = link
        self.fresh = fresh  # opened for this attempt (not the client's live connection)
        # Its handshake's word on the rate limits, for the attempt that opened it (later turns learn nothing).
        self.headroom = socket.headroom if fresh else None
        self.first_event_at: float | None = None  # the turn's first upstream event: its first byte

    async def batches(self) -> AsyncGenerator[list[Block], None]:
        while True:
            text = await self.socket.recv(settings.GATEWAY_UPSTREAM_READ_TIMEOUT_S)
            if self.first_event_at is None:
                self.first_event_at = time.monotonic()
            yield [Block(raw=text.encode(), event=None, data=text, comment_only=False)]

    def released(self) -> None:
        if self.fresh:
            # It served output: live from now on (the consumer pins every later frame to it, so
            # there is no other live connection to replace).
            self.link.live = self.socket
            self.fresh = False

    async def aclose(self, *, complete: bool) -> None:
        if not complete:
            self.socket.abort()
            await self.socket.wait_closed()
        elif self.fresh:
            await _close(self.socket)  # the client never saw it; the next candidate gets a new one


async def _close(socket: UpstreamSocket) -> None:
    try:
        await socket.close()
    except BaseException:
        socket.abort()
        raise


_FINISHED = frozenset({"response.completed", "response.incomplete"})


class WebsocketDispatch:
    """The Responses websocket mode (a `proxy.transport.Dispatch`); one per `response.create`.
    `added_stream`: the consumer set `stream` for the bridged candidates' HTTP requests; it is not sent
    on an upstream websocket."""

    def __init__(self, link: UpstreamLink, *, added_stream: bool = False) -> None:
        self.link = link
        self.added_stream = added_stream
        self.bridged = False  # the last attempt went over HTTP, its events translated
        self.finished: dict[str, Any] | None = None  # the response a bridged attempt completed
        self.finished_bytes = 0  # the size of the event that carried it

    async def open(self, c: Candidate, call: UpstreamCall, *, stream: bool) -> Failure | Answer | EventSource:
        self.bridged = call.dialect is not Dialect.RESPONSES
        if self.bridged:
            return await HttpDispatch(api=responses.API).open(c, call, stream=True)
        url, headers, payload = call.url, dict(call.headers), call.payload
        if self.added_stream:
            payload = {name: value for name, value in payload.items() if name != "stream"}
        headers.pop("content-type", None)
        live = self.link.live
        fresh = live is None or live.assignment_id != c.assignment_id
        if fresh:
            try:
                socket = await upstream_ws.open_socket(
                    upstream_ws.websocket_url(url), headers=headers, assignment_id=c.assignment_id
                )
            except TransportFailure as failure:
                return Failure.observed(Observation(transport=failure.event))
            except HandshakeRejected as rejected:
                return Failure.observed(
                    Observation(
                        status=rejected.status,
                        body=rejected.body,
                        provenance=c.provenance,
                        errors=provider(c.adapter).errors,
                    )
                )
        else:
            assert live is not None
            socket = live
        try:
            await socket.send(json.dumps({"type": "response.create", **payload}))
        except TransportFailure as failure:  # the frame could not be sent
            if fresh:
                await _close(socket)
            return Failure.observed(Observation(transport=failure.event))
        except BaseException:
            if fresh:
                socket.abort()  # cancelled before it served anything: nobody will ever use it
            raise
        return WebsocketSource(socket, self.link, fresh=fresh)

    def pack(self, parts: list[bytes]) -> list[bytes]:
        return self._frames(parts) if self.bridged else parts  # one event per frame

    def _frames(self, parts: list[bytes]) -> list[bytes]:
        """A bridged attempt's output (translated SSE blocks, or the gateway's own error frames) as
        frames; the response it completes is kept for `Conversations`."""
        frames: list[bytes] = []
        for part in parts:
            if part.startswith(b"{"):  # the gateway's own error frame
                frames.append(part)
                continue
            for block in SSEParser().feed(part):
                if block.data is None:
                    continue  # a keep-alive comment: a websocket has its own pings
                frames.append(block.data.encode())
                if block.event in _FINISHED:
                    event = json.loads(block.data)
                    self.finished, self.finished_bytes = event["response"], len(frames[-1])
        return frames

    def error_event(
        self,
        dialect: Dialect,
        *,
        type: str,  # the wire name of the field
        code: str | None,
        param: str | None,
        message: str,
        status: int | None,
    ) -> bytes:
        return error_frame(status, type=type, code=code, param=param, message=message)

    def error_final(
        self,
        status: int,
        *,
        message: str,
        type: str,  # the wire name of the field
        code: str | None,
        param: str | None,
    ) -> Final:
        frame = error_frame(status, type=type, code=code, param=param, message=message)
        return Final(status, b"", frames=(frame,))

    def events_final(self, parts: list[bytes]) -> Final:
        return Final(200, b"", frames=tuple(self._frames(parts) if self.bridged else parts))


class Conversations:
    """The conversations of the responses bridged candidates completed on one client connection, in its
    memory only (module docstring): response id -> (the response it continued, the input items it
    added, its output items). Bounded by size, not only by count: at most `limit` responses and
    `max_bytes` of their frames (the client's frame and the completed event, as they were on the wire)
    are kept, the oldest forgotten first; a response whose conversation is no longer whole is
    forgotten too, never continued from a part of it.

    Cycle-free by construction (issue 45): the ids are the gateway's own (`new_response_id`), an id
    already kept is never kept again, a response is kept only after the one it continues, and a walk
    only ever steps to a response kept earlier, so no upstream id, repeated or forged, can make the
    walk loop."""

    def __init__(self, limit: int = 256, max_bytes: int | None = None) -> None:
        self.limit = limit
        self.max_bytes = settings.GATEWAY_MAX_BODY_BYTES if max_bytes is None else max_bytes
        self.size = 0  # the bytes of the responses kept
        self._kept = 0  # how many responses were ever kept: each one's place in the order
        self._responses: dict[str, tuple[int, str | None, list[Any], list[Any], int]] = {}

    def continued(self, body: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """`body` with the conversation it continues as its `input` (and no `previous_response_id`)
        when that is a response kept here, and the id it continues (None: not one of these)."""
        previous = body.get("previous_response_id")
        history = self._history(previous) if isinstance(previous, str) else None
        if history is None:
            return body, None
        rest = {name: value for name, value in body.items() if name != "previous_response_id"}
        return {**rest, "input": [*history, *_items(body.get("input"))]}, previous

    def remember(
        self, previous: str | None, body: dict[str, Any], response: dict[str, Any], *, size: int
    ) -> None:
        """A completed bridged response: `body` as the client sent it (its own input items only), `size`
        the bytes of its frame and of the completed event."""
        response_id, output = response.get("id"), response.get("output")
        if not isinstance(response_id, str) or not isinstance(output, list) or response_id in self._responses:
            return
        if size > self.max_bytes or (previous is not None and previous not in self._responses):
            return  # it could never be continued whole
        self._kept += 1
        self._responses[response_id] = (self._kept, previous, _items(body.get("input")), output, size)
        self.size += size
        while len(self._responses) > self.limit or self.size > self.max_bytes:
            self.size -= self._responses.pop(next(iter(self._responses)))[4]

    def _history(self, response_id: str) -> list[Any] | None:
        """The whole conversation through `response_id`; None when it is not kept whole."""
        parts: list[list[Any]] = []
        current: str | None = response_id
        place = self._kept + 1
        while current is not None:
            kept = self._responses.get(current)
            if kept is None or kept[0] >= place:  # forgotten, or not kept before the one it continues
                return None
            place, current, added, output, _ = kept
            parts += (output, added)
        return [item for part in reversed(parts) for item in part]


def _items(value: object) -> list[Any]:
    """A Responses `input` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []
