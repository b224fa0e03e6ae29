"""How a streamed upstream answer is read when its provider's wire is not the relay's (`Wire`,
`proxy.wire.providers.base`): AWS event-stream frames decoded by botocore's parser (never by hand) as blocks,
and any provider's blocks rewritten as Chat SSE blocks as they arrive."""

import json
from collections.abc import AsyncGenerator
from typing import Any

from botocore.eventstream import EventStreamBuffer, ParserError

from proxy import upstream
from proxy.wire.providers.base import AWS_EVENTSTREAM, StreamTranslator, Wire
from proxy.wire.sse import Block, SSEParser
from routing.policy.failures import TransportEvent


def source(response: upstream.Response, wire: Wire | None, sse: Any) -> Any:
    """The event source of a streamed answer: `sse` (the response read as SSE) for a provider on the
    relay's wire, else the provider's frames rewritten as Chat SSE blocks."""
    if wire is None:
        return sse
    inner = EventStreamSource(response) if wire.framing == AWS_EVENTSTREAM else sse
    rewrite = wire.stream()
    return inner if rewrite is None else Rewritten(inner, rewrite)


class EventStreamSource:
    """An `application/vnd.amazon.eventstream` answer: each frame a block named by its `:event-type`
    (data: its JSON payload), or `exception` (data: `{"type": <its :exception-type>}`)."""

    ends_at_terminal = False
    status = 200
    first_event_at = None  # its headers were its first byte
    headroom = None  # Bedrock sends no rate-limit headers

    def __init__(self, response: upstream.Response) -> None:
        self.response = response

    @staticmethod
    def _blocks(buffer: EventStreamBuffer) -> list[Block]:
        blocks = []
        for message in buffer:
            headers = message.headers
            if headers.get(":message-type") == "event":
                name, data = str(headers.get(":event-type")), message.payload.decode("utf-8", "replace")
            else:
                name = "exception"
                data = json.dumps({"type": str(headers.get(":exception-type") or headers.get(":error-code"))})
            blocks.append(Block(raw=message.payload, event=name, data=data, comment_only=False))
        return blocks

    async def batches(self) -> AsyncGenerator[list[Block], None]:
        buffer = EventStreamBuffer()
        try:
            async for chunk in self.response.chunks():  # a transport failure is raised as it is
                buffer.add_data(chunk)
                if blocks := self._blocks(buffer):
                    yield blocks
        except ParserError:  # a frame whose lengths or checksums do not hold: the stream is broken
            raise upstream.TransportFailure(TransportEvent.STREAM_TRUNCATED) from None

    def released(self) -> None:
        pass

    async def aclose(self, *, complete: bool) -> None:
        await self.response.aclose()


class Rewritten:
    """An event source whose blocks a provider's `Wire` rewrites as Chat SSE blocks."""

    ends_at_terminal = False
    status = 200
    first_event_at = None  # its headers were its first byte

    def __init__(self, inner: Any, rewrite: StreamTranslator) -> None:
        self.inner = inner
        self.headroom = inner.headroom
        self.rewrite = rewrite

    async def batches(self) -> AsyncGenerator[list[Block], None]:
        parser = SSEParser()
        async for blocks in self.inner.batches():
            if out := b"".join(self.rewrite.feed(block) for block in blocks):
                yield parser.feed(out)
        if tail := self.rewrite.finish():
            yield parser.feed(tail)

    def released(self) -> None:
        self.inner.released()

    async def aclose(self, *, complete: bool) -> None:
        await self.inner.aclose(complete=complete)
