"""The seam between the attempt loop (`proxy.relay`) and its transports: `Dispatch.open` sends one
attempt's call and says what came back, and the loop alone decides what that means.

`open(candidate, call) -> Failure | Answer | EventSource | Body`:
- a `Failure`: nothing relayable came back (a refused connection, a handshake the upstream
  rejected, a body too large), already classified (`Failure.observed`);
- an `Answer`: a plain upstream answer, read whole;
- an `EventSource`: an upstream stream (SSE, or a websocket's frames) as batches of `proxy.wire.sse.Block`s,
  which the loop classifies, withholds and relays the same way whatever the transport;
- a `Body`: bytes relayed as they come, never classified (a file's content).

A transport never calls back into the loop: it reports, the loop reads. Implementations:
`proxy.dispatch.HttpDispatch` (plain JSON and SSE over `proxy.upstream`), `proxy.files.FilesDispatch`,
`proxy.ws_relay.WebsocketDispatch` (the Responses websocket). Each also frames the gateway's own
output for its client (`pack`, `error_event`, `error_final`, `events_final`).
"""

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from proxy.ledger.exchange import Failure, Final
from proxy.wire.providers.base import UpstreamCall
from proxy.wire.sse import Block, Dialect
from routing.policy.failures import TransportEvent
from routing.policy.headroom import Headroom
from routing.policy.types import Candidate


@dataclass(frozen=True, slots=True)
class TransportFailure(Exception):
    """What a transport knows of a request it could not complete: was it sent?"""

    event: TransportEvent


@dataclass(frozen=True, slots=True)
class Answer:
    """A plain upstream answer, read whole (decoded)."""

    status: int
    body: bytes
    retry_after: int | None = None  # its `retry-after`, whole seconds (bounded)
    file_id: str | None = None  # an upload's answer: the file the upstream created
    headroom: Headroom | None = None  # the rate limits its headers reported (`routing.policy.headroom`)


class EventSource(Protocol):
    """One attempt's upstream events, as batches of blocks (SSE: the blocks of one network chunk;
    websocket: one event per frame). `batches` raises TransportFailure when the transport fails."""

    # A websocket response ends at its terminal event while the connection stays open for the next
    # one; an SSE response ends at EOF.
    ends_at_terminal: bool
    status: int | None  # the HTTP status the stream came with (None: a websocket's frames)
    # When its first event came (time.monotonic()), for a source whose opening is not its first byte (a
    # websocket's: the frame is sent, then the upstream answers); None: its opening was (HTTP headers).
    first_event_at: float | None
    # The rate limits its opening reported (`routing.policy.headroom`: an HTTP answer's headers, a websocket's
    # handshake); None: none reported, or none new (a turn on a websocket opened for an earlier one).
    headroom: Headroom | None

    def batches(self) -> AsyncGenerator[list[Block], None]: ...

    def released(self) -> None:
        """The attempt's first output went to the client: the stream serves this client from now on."""
        ...

    async def aclose(self, *, complete: bool) -> None:
        """The attempt is over; `complete`: its response reached a terminal event."""
        ...


@runtime_checkable
class Body(Protocol):
    """An upstream body relayed as it comes. `chunks` raises TransportFailure when the upstream cuts it."""

    status: int

    def chunks(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class Dispatch(Protocol):
    """A transport: how one attempt reaches its upstream, and how the gateway's output is framed for
    its client."""

    async def open(
        self, c: Candidate, call: UpstreamCall, *, stream: bool
    ) -> Failure | Answer | EventSource | Body:
        """Send `call` to `c`. `stream`: the client asked for a stream, so a successful answer is
        returned as an EventSource (a plain one is read whole)."""
        ...

    def pack(self, parts: list[bytes]) -> list[bytes]:
        """The client writes for consecutive output parts (upstream events or gateway errors)."""
        ...

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
        """The gateway's sanitized terminal event in a stream (never the provider's message)."""
        ...

    def error_final(
        self,
        status: int,
        *,
        message: str,
        type: str,  # the wire name of the field
        code: str | None,
        param: str | None,
    ) -> Final:
        """A typed failure before any output."""
        ...

    def events_final(self, parts: list[bytes]) -> Final:
        """A stream that ended before any output: its withheld events and the error, at once."""
        ...
