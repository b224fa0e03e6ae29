"""The HTTP transport of the attempt loop (a `proxy.transport.Dispatch`): one attempt's call over the
process's shared upstream client (`proxy.upstream`), its answer as the loop reads it (an `Answer` read
whole, or an `SSESource` when the client asked for a stream and the upstream said 200), and the
gateway's own errors in the client's envelope.
"""

from collections.abc import AsyncGenerator
from dataclasses import replace
from datetime import UTC, datetime

from django.conf import settings

from proxy import framing, google_token, upstream
from proxy.ledger.exchange import Failure, Final
from proxy.transport import Answer, EventSource, TransportFailure
from proxy.wire.apis import chat
from proxy.wire.apis.base import ClientApi
from proxy.wire.providers.base import UpstreamCall
from proxy.wire.sse import Block, Dialect, SSEParser, SSEProtocolError
from routing.policy import headroom
from routing.policy.errors import ErrorCode
from routing.policy.failures import Observation, TransportEvent
from routing.policy.headroom import Headroom
from routing.policy.types import Candidate


class SSESource:
    """An upstream SSE response; closing it before its end drops the connection."""

    ends_at_terminal = False
    status = 200
    first_event_at = None  # its headers were its first byte

    def __init__(self, response: upstream.Response, headroom: Headroom | None = None) -> None:
        self.response = response
        self.headroom = headroom

    async def batches(self) -> AsyncGenerator[list[Block], None]:
        parser = SSEParser()
        try:
            async for chunk in self.response.chunks():  # decoded; a transport failure is raised as it is
                yield parser.feed(chunk)
            tail = parser.flush()
            if tail is not None:
                yield [tail]
        except SSEProtocolError:
            raise TransportFailure(TransportEvent.STREAM_TRUNCATED) from None

    def released(self) -> None:
        pass

    async def aclose(self, *, complete: bool) -> None:
        await self.response.aclose()


async def read_answer(response: upstream.Response, headroom: Headroom | None = None) -> Failure | Answer:
    """A plain upstream answer, read whole: the Answer, or the Failure that ended its reading.
    `headroom`: what its headers said of the account's rate limits."""
    try:
        raw = await upstream.read_body(response)
    except TransportFailure as failure:
        return Failure.observed(Observation(status=response.status, transport=failure.event))
    except upstream.ResponseTooLarge:
        return Failure.unrelayable(response.status, ErrorCode.UPSTREAM_RESPONSE_TOO_LARGE)
    retry_after = upstream.retry_after_s(response.headers.get("retry-after"))
    return Answer(response.status, raw, retry_after=retry_after, headroom=headroom)


class HttpDispatch:
    """Plain HTTP and SSE over the shared upstream client (`proxy.upstream`). `api`: the client's API, whose
    envelope, error types and error events the gateway's own errors take."""

    def __init__(self, *, api: ClientApi = chat.API) -> None:
        self.api = api

    async def open(self, c: Candidate, call: UpstreamCall, *, stream: bool) -> Failure | Answer | EventSource:
        wire = call.wire  # a provider whose wire is not the relay's (its signature, framing, answers)
        headers = call.headers
        try:
            if call.oauth is not None:  # a Google service account's token (Vertex)
                headers = {**headers, "authorization": await google_token.bearer(call.oauth)}
        except google_token.Refused:
            return Failure.observed(Observation(status=401))  # the account's credential: nothing sent
        except TransportFailure as failure:
            return Failure.observed(Observation(transport=failure.event))
        try:
            response = await upstream.open_stream(
                "POST",
                call.url,
                headers=headers,
                json=call.payload,
                read_timeout_s=settings.GATEWAY_UPSTREAM_READ_TIMEOUT_S,
                sigv4=wire.sigv4 if wire is not None else None,
            )
        except TransportFailure as failure:
            return Failure.observed(Observation(transport=failure.event))
        if response.status == 401 and call.oauth is not None:
            google_token.forget(call.oauth)  # revoked before it expired: the next call exchanges again
        # Read on every answer, errors included (a 429 says when its limit resets), as it arrives: the
        # resets of OpenAI's headers are durations from now.
        limits = headroom.read(response.headers, datetime.now(UTC))
        if response.status == 200 and stream:
            return framing.source(response, wire, SSESource(response, limits))
        answer = await read_answer(response, limits)
        if wire is not None and isinstance(answer, Answer):
            status, body = wire.answer(answer.status, response.headers, answer.body)
            answer = replace(answer, status=status, body=body)
        return answer

    def pack(self, parts: list[bytes]) -> list[bytes]:
        return [b"".join(parts)] if parts else []  # one write for all of them

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
        del dialect  # the client's API frames its own streams' errors
        type = self.api.error_type(type, code=code, status=status or 500, param=param)
        return self.api.error_event(type=type, code=code, param=param, message=message, status=status)

    def error_final(
        self,
        status: int,
        *,
        message: str,
        type: str,  # the wire name of the field
        code: str | None,
        param: str | None,
    ) -> Final:
        type = self.api.error_type(type, code=code, status=status, param=param)
        return Final(status, self.api.error_body(type=type, code=code, param=param, message=message))

    def events_final(self, parts: list[bytes]) -> Final:
        return Final(200, b"".join(parts), content_type="text/event-stream")
