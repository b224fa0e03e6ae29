"""One attempt's upstream output as the attempt loop reads it and relays it (SPEC §6.0, §6.2, §6.3): a
plain answer (`plain_answer`), an event stream (`AttemptStream`) or a body (`relay_body`).

`AttemptStream.first_output` withholds the leading non-visible events and returns a `Stream` at the
first visible one, or the `Failure` that ended the attempt before anything was shown (the loop may
then hand the request on). After that the stream is relayed as it arrives and never retried: an
upstream error event becomes the gateway's sanitized error event, a cut stream the typed
`upstream_interrupted` (or `gateway_shutting_down`) event. Whatever the transport, the events are
`proxy.wire.sse.Block`s classified in the upstream's dialect and written in the client's (translated when
the APIs differ), so "visible" means the same on SSE and on a websocket.

What an event tells the ledger (usage, a response id, a refusal; never content) is noted on the
attempt's `AttemptLog` and the `Exchange` as it passes. When the stream ends, `ended` (the loop's)
settles its health writes and the exchange.

A client that leaves once output began, before the upstream has said all the ledger needs (its stream's
end and its usage: a Chat stream's usage chunk comes after the finish reason, a Messages stream's output
tokens in `message_delta`, a Responses stream's usage in `response.completed`), does not end the upstream
call at once: the rest of the stream is read, never relayed, for the usage it reports, within
SETTLE_READ_S and SETTLE_READ_BYTES, and the request is settled from it, recorded `cancelled`. So what a
request costs its key never falls below what its upstream said it cost (issue 45 finding 6: six clients
that left between the finish reason and the usage were charged 126 micros for 18,000). A stream that
does not report its usage within the bounds keeps its reservation as its cost (SPEC §7.4), its attempt
flagged `usage_unreported`.
"""

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import UTC, datetime

from django.conf import settings

from proxy import shutdown
from proxy.ledger.exchange import AttemptLog, Exchange, Failure, Final, Stream, settle
from proxy.transport import Answer, Body, Dispatch, EventSource, TransportFailure
from proxy.wire import payloads
from proxy.wire.apis.registry import classify as classify_block
from proxy.wire.providers.base import NamesResponse, UpstreamCall
from proxy.wire.providers.registry import provider
from proxy.wire.sse import Action, Block, Classification, Dialect, Visibility, Withholder
from proxy.wire.translations.translate import ResponseTranslationError
from routing.policy.failures import (
    REFUSAL_FINISH_REASONS,
    CanonicalError,
    DispatchState,
    FailureClass,
    Observation,
    TransportEvent,
)
from routing.policy.pricing import cost_micros
from routing.policy.sanitize import sanitized
from routing.policy.types import Candidate
from routing.policy.vocabulary import AttemptStatus, Outcome
from runtime import fastjson

INTERRUPTED_MESSAGE = "The upstream stream ended abnormally after output began."
STOPPING_MESSAGE = "The gateway is shutting down; the response was cut short and not retried."
POST_VISIBLE_MESSAGE = "The upstream failed after output began; the request was not retried."

TERMINAL = frozenset({Visibility.TERMINAL_SUCCESS, Visibility.TERMINAL_FAILURE})

# How much of a stream is read after its client left, for its usage (module docstring). A stream's usage
# comes within milliseconds of its last output; these bound one whose client left mid-answer (the
# upstream generating on) and one that never reports any.
SETTLE_READ_S = 30.0
SETTLE_READ_BYTES = 4 * 1024 * 1024
# The error code of an attempt settled at its reservation: its client left and its upstream reported
# no usage within those bounds.
USAGE_UNREPORTED = "usage_unreported"


def attempt_cost(c: Candidate, log: AttemptLog) -> int | None:
    """What the attempt cost at `c`'s price (cached input at the cached rates), when the upstream
    reported both token counts."""
    if log.input_tokens is None or log.output_tokens is None:
        return None
    return cost_micros(
        c.price,
        input_tokens=log.input_tokens,
        output_tokens=log.output_tokens,
        cached_read_tokens=log.cached_read_tokens or 0,
        cached_write_tokens=log.cached_write_tokens or 0,
    )


def note_usage(log: AttemptLog, payload: object) -> None:
    """Streams report usage in parts (Anthropic: input in message_start, output in message_delta): a
    later event updates what it names and keeps the rest. Counts are cumulative, never added up."""
    found = payloads.usage(payload)
    if found.input is not None:
        log.input_tokens = found.input
    if found.output is not None:
        log.output_tokens = found.output
    if found.cached_read is not None:
        log.cached_read_tokens = found.cached_read
    if found.cached_write is not None:
        log.cached_write_tokens = found.cached_write


def note_refusal(log: AttemptLog, exchange: Exchange, payload: object) -> None:
    # classify's refusal rule for an answer that is not an error: its finish reason alone (without an
    # Observation and the error parsing classify does first, on every request's answer).
    if payloads.finish_reason(payload) in REFUSAL_FINISH_REASONS:
        log.failure_class = str(FailureClass.SAFETY_REFUSAL)
        exchange.outcome = Outcome.TERMINAL_REFUSAL


def plain_answer(
    answer: Answer, call: UpstreamCall, *, candidate: Candidate, log: AttemptLog, exchange: Exchange
) -> tuple[Failure | Final, str | None]:
    """A plain upstream answer: the client's Final (in its API) or the attempt's Failure, and the
    answer's response id (a Responses object's)."""
    status = answer.status
    try:
        parsed = fastjson.loads(answer.body)
    except ValueError:
        parsed = None
    body = parsed if isinstance(parsed, dict) else None
    # A failed attempt is charged too when the upstream reported usage with its error.
    note_usage(log, body)
    if not 200 <= status < 300:
        observation = Observation(
            status=status,
            body=body,
            provenance=candidate.provenance,
            errors=provider(candidate.adapter).errors,
        )
        return Failure.observed(observation, retry_after=answer.retry_after), None
    note_refusal(log, exchange, body)
    try:
        final = Final(status=status, body=call.response(answer.body))
    except ResponseTranslationError:
        # The upstream answered, but in a form the client's API cannot carry (a tool call's
        # arguments that are not an object): a typed failure, never a guess, never a replay.
        return Failure.unrelayable(status, "upstream_untranslatable"), None
    # A translated answer's id is the one the client was given (a Responses client over another API).
    shown = body if call.answer is None else fastjson.loads(final.body)
    return final, payloads.response_id(shown)


class AttemptStream:
    """One attempt's events: read, classified, withheld until visible, then relayed to the client."""

    def __init__(
        self,
        source: EventSource,
        call: UpstreamCall,
        *,
        candidate: Candidate,
        log: AttemptLog,
        exchange: Exchange,
        client_dialect: Dialect,
        framing: Dispatch,
        response_ids: bool,
        ended: Callable[[str, int], Awaitable[None]],
    ) -> None:
        self.source = source
        self.batches = source.batches()
        self.dialect = call.dialect  # what the upstream streams in
        self.translator = call.stream()
        self.strip_usage = call.strip_usage
        self.withholder = Withholder()
        self.candidate = candidate
        self.log = log
        self.exchange = exchange
        self.client_dialect = client_dialect
        self.framing = framing
        self.response_ids = response_ids  # a Responses route: the response id is remembered
        self.ended = ended
        self.response_id: str | None = None
        self.terminal_seen = False  # the stream reached its terminal event (Chat: or its finish reason)
        self.finished = False  # the stream reached its terminal event itself
        self.failed_after_output: FailureClass | None = None  # an upstream error event after output

    def _output(self, blocks: Iterable[Block]) -> list[bytes]:
        """The client's output for `blocks`: as they came, or translated into the client's API."""
        if self.translator is None:
            return [b.raw for b in blocks if not (self.strip_usage and payloads.usage_only_chunk(b))]
        out = [out for out in map(self.translator.feed, blocks) if out]
        if self.response_ids and self.response_id is None and isinstance(self.translator, NamesResponse):
            self.response_id = self.translator.response_id  # the id the client is shown, not the upstream's
        return out

    def _read(self, block: Block) -> Classification:
        """Classify one event and note what it tells the ledger: usage, the response id, a refusal,
        whether the stream reached its end (a terminal event, or, for Chat, whose `[DONE]` some
        compatible servers omit, a chunk carrying the finish reason). Never content."""
        cls = classify_block(self.dialect, block)
        payload = cls.payload
        if payload is not None:
            if self.response_ids and self.response_id is None:
                self.response_id = payloads.response_id(payload)
            note_usage(self.log, payload)
            note_refusal(self.log, self.exchange, payload)
        if cls.visibility in TERMINAL:
            self.terminal_seen = self.finished = True
        elif self.dialect is Dialect.CHAT and payloads.finish_reason(payload) is not None:
            self.terminal_seen = True
        return cls

    def _told_all(self) -> bool:
        """Whether the upstream has said all the ledger needs: its terminal event, or (Chat, whose
        `[DONE]` some servers omit) its finish reason and the usage that follows it."""
        log = self.log
        return self.finished or (
            self.terminal_seen and log.input_tokens is not None and log.output_tokens is not None
        )

    def _observed(self, cls: Classification, status: int | None) -> Observation:
        """An upstream error event (a websocket `error` names the HTTP status it stands for)."""
        return Observation(
            status=status if status and status >= 400 else 200,
            body=cls.payload if isinstance(cls.payload, dict) else None,
            transport=TransportEvent.STREAM_ERROR_EVENT,
            provenance=self.candidate.provenance,
            errors=provider(self.candidate.adapter).errors,
        )

    async def first_output(self) -> Failure | Stream:
        """A Stream at the first visible event, or the Failure that ended the attempt before it."""
        source, batches = self.source, self.batches
        try:
            async for blocks in batches:
                for n, block in enumerate(blocks):
                    cls = self._read(block)
                    decision = self.withholder.feed(block, cls)
                    if decision.action is Action.RELEASE:
                        self.exchange.first_output_at = datetime.now(UTC)
                        source.released()
                        first = self._output(decision.write)
                        done = source.ends_at_terminal and cls.visibility in TERMINAL
                        return Stream(self._relay(first, blocks[n + 1 :], done))
                    if decision.action is Action.PRE_VISIBLE_FAILURE:
                        await batches.aclose()
                        await source.aclose(complete=True)
                        return Failure.observed(
                            self._observed(cls, decision.error.status if decision.error else None),
                            tuple(self._output(self.withholder.withheld())),
                        )
        except TransportFailure as exc:
            await source.aclose(complete=False)
            event = exc.event if exc.event is TransportEvent.READ_TIMEOUT else TransportEvent.STREAM_TRUNCATED
            return Failure.observed(Observation(status=200, transport=event))
        except asyncio.CancelledError:
            await settle(source.aclose(complete=False))
            raise
        await source.aclose(complete=False)
        return Failure.observed(Observation(status=200, transport=TransportEvent.STREAM_TRUNCATED))

    def _relay_batch(self, batch: list[Block]) -> tuple[list[bytes], bool]:
        """The client output for a batch of post-release blocks, and whether the response ended."""
        out: list[bytes] = []
        for block in batch:
            cls = self._read(block)
            decision = self.withholder.feed(block, cls)
            if decision.action is Action.POST_VISIBLE_FAILURE:
                error = decision.error
                # Never retried, but classified like any failed attempt (SPEC §5.6): an upstream that
                # keeps failing mid-stream cools like one that fails before output.
                failed = Failure.observed(self._observed(cls, error.status if error else None))
                fields = sanitized(
                    CanonicalError(error.type, error.code, error.param) if error else CanonicalError(),
                    failed.failure,
                )
                out.append(
                    self.framing.error_event(
                        self.client_dialect,
                        type=fields.type or "upstream_error",
                        code=fields.code,
                        param=fields.param,
                        message=POST_VISIBLE_MESSAGE,
                        status=error.status if error else None,
                    )
                )
                self.log.status, self.log.failure_class = AttemptStatus.FAILED, str(failed.failure)
                self.log.error_code = fields.code or ""
                self.failed_after_output = failed.failure
                self.exchange.outcome = self.exchange.outcome or Outcome.UPSTREAM_ERROR_AFTER_OUTPUT
            else:
                out.extend(self._output(decision.write))
            if self.source.ends_at_terminal and cls.visibility in TERMINAL:
                return out, True
        return out, False

    async def _relay(self, first: list[bytes], pending: list[Block], done: bool) -> AsyncIterator[bytes]:
        log = self.log
        outcome, status = Outcome.OK, 200
        log.status, log.dispatch_state = AttemptStatus.SUCCEEDED, DispatchState.COMPLETED
        started = time.monotonic()
        source, batches = self.source, self.batches
        ended = False  # the exchange is settled (and handed to the ledger): touch it no more
        delivered = False  # the client was sent the stream's end, and the ledger has its usage
        left = False  # the client left before that: the rest is read for the usage (module docstring)
        reading = False  # awaiting the upstream: a cancel there ends `batches` (the rest needs new ones)
        stopping = False

        async def interrupt() -> None:
            nonlocal stopping
            stopping = True
            await source.aclose(complete=False)

        release = shutdown.register(interrupt)
        try:
            out = first
            if pending and not done:
                more, done = self._relay_batch(pending)
                out = [*out, *more]
            while True:
                if done:
                    # A websocket response is over at its terminal event: settle it before the client
                    # sees that event, so a continuation sent at once finds its affinity (and a reader
                    # of the ledger its row).
                    ended = True
                    log.elapsed_ms += int((time.monotonic() - started) * 1000)
                    await settle(self._end(True, self.exchange.outcome or outcome, status))
                for part in self.framing.pack(out):
                    yield part
                delivered = self._told_all()
                if done:
                    return
                try:
                    # After the first visible event the deadline no longer applies (§6.0): the stream
                    # ends when the upstream stays silent for GATEWAY_STREAM_IDLE_S.
                    async with asyncio.timeout(settings.GATEWAY_STREAM_IDLE_S):
                        reading = True
                        batch = await anext(batches)
                        reading = False
                except TimeoutError:
                    raise TransportFailure(TransportEvent.READ_TIMEOUT) from None
                except StopAsyncIteration:
                    if not self.terminal_seen:
                        # Closed without its terminal event: never a success (§7.1).
                        raise TransportFailure(TransportEvent.STREAM_TRUNCATED) from None
                    tail = self.translator.finish() if self.translator is not None else b""
                    if tail:  # a translated stream's closing events, when it is owed them
                        for part in self.framing.pack([tail]):  # one frame per event on a websocket
                            yield part
                    break
                out, done = self._relay_batch(batch)
        except (asyncio.CancelledError, GeneratorExit):
            # GeneratorExit: the client stopped reading before the end (it went away while a write
            # was pending); nobody is left to answer, as with a cancel.
            # A client that closes once it has the stream's end (the SDKs do at `[DONE]`) while the
            # upstream has yet to close its side was served whole: a success, not a cancel.
            if not ended and not delivered:
                left = True
                outcome, status = self._client_left()
            raise
        except TransportFailure:
            outcome, event = self._interrupted(stopping=stopping)
            yield event
        finally:
            try:
                if left:  # still a stream the shutdown interrupts: its grace bounds the reading too
                    await settle(self._settle_after_leaving(started, fresh=reading))
                elif not ended:
                    log.elapsed_ms += int((time.monotonic() - started) * 1000)
                    await settle(self._end(False, self.exchange.outcome or outcome, status))
            finally:
                release()

    def _client_left(self) -> tuple[Outcome, int]:
        """The client left before the stream's end: the attempt is `cancelled` (its upstream may have
        served it whole or not), the exchange's outcome and status."""
        log = self.log
        log.status, log.failure_class = AttemptStatus.CANCELLED, FailureClass.CANCELLED
        log.dispatch_state = DispatchState.UNKNOWN
        return Outcome.CANCELLED, 499

    def _interrupted(self, *, stopping: bool) -> tuple[Outcome, bytes]:
        """The stream was cut after output began, by the upstream or by the gateway's shutdown
        (`stopping`): the attempt failed `interrupted`; the exchange's outcome, and the typed error
        event that ends the client's stream."""
        log = self.log
        log.status, log.failure_class, log.dispatch_state = (
            AttemptStatus.FAILED,
            FailureClass.INTERRUPTED,
            DispatchState.UNKNOWN,
        )
        outcome = Outcome.GATEWAY_SHUTTING_DOWN if stopping else Outcome.UPSTREAM_INTERRUPTED
        event = self.framing.error_event(
            self.client_dialect,
            type="service_unavailable" if stopping else "upstream_error",
            code=outcome,
            param=None,
            message=STOPPING_MESSAGE if stopping else INTERRUPTED_MESSAGE,
            status=None,
        )
        return outcome, event

    async def _settle_after_leaving(self, started: float, *, fresh: bool) -> None:
        """The client left before the upstream said all the ledger needs: the rest of the stream is
        read for it (module docstring), and the attempt, `cancelled`, is settled from what it said."""
        log = self.log
        whole = await self._read_rest(fresh)
        if whole:
            log.dispatch_state = DispatchState.COMPLETED  # it ran to its end upstream
        if log.input_tokens is None or log.output_tokens is None:
            log.error_code = USAGE_UNREPORTED  # charged its reservation (proxy.ledger.services.charge_micros)
        log.cost_micros = attempt_cost(self.candidate, log)
        log.elapsed_ms += int((time.monotonic() - started) * 1000)
        await self._end(whole, self.exchange.outcome or Outcome.CANCELLED, 499)

    async def _read_rest(self, fresh: bool) -> bool:
        """Read the rest of the stream for what it tells the ledger (`_read`), relaying nothing, within
        SETTLE_READ_S and SETTLE_READ_BYTES: whether it reached its end. `fresh`: the client left while
        the stream was being read, which ended that reading's batches: read on from new ones (an SSE
        block the cancel cut in two is lost; if it was the usage, the reservation stays the cost)."""
        batches = self.source.batches() if fresh else self.batches
        read = 0
        try:
            async with asyncio.timeout(SETTLE_READ_S):
                async for batch in batches:
                    for block in batch:
                        read += len(block.raw)
                        if self._read(block).visibility in TERMINAL:
                            return True
                    if read > SETTLE_READ_BYTES:
                        return False
        except (TimeoutError, TransportFailure):
            return False
        finally:
            await batches.aclose()
        return self.terminal_seen  # its end: the upstream closed it after its terminal event

    async def _end(self, done: bool, outcome: str, status: int) -> None:
        # `done` is set only by a terminal event: a websocket at a response boundary stays usable.
        await self.batches.aclose()
        await self.source.aclose(complete=done)
        await self.ended(outcome, status)


async def relay_body(
    body: Body, log: AttemptLog, ended: Callable[[str, int], Awaitable[None]]
) -> AsyncIterator[bytes]:
    """A body that is no event stream (a file's content), as it comes (never held whole); `ended`
    settles the exchange with "ok" (read to its end), "upstream_interrupted" (the upstream cut it)
    or "cancelled" (the client left)."""
    outcome = Outcome.CANCELLED
    started = time.monotonic()
    try:
        async for chunk in body.chunks():
            yield chunk
        outcome = Outcome.OK
    except TransportFailure:
        outcome = Outcome.UPSTREAM_INTERRUPTED  # the client sees a body cut short, as the upstream cut it
    finally:
        log.elapsed_ms += int((time.monotonic() - started) * 1000)
        cancelled = outcome == Outcome.CANCELLED
        if outcome == Outcome.OK:
            log.status, log.dispatch_state = AttemptStatus.SUCCEEDED, DispatchState.COMPLETED
        else:
            log.status = AttemptStatus.CANCELLED if cancelled else AttemptStatus.FAILED
            log.dispatch_state = DispatchState.UNKNOWN
            log.failure_class = FailureClass.CANCELLED if cancelled else FailureClass.INTERRUPTED
        await settle(body.aclose())
        await settle(ended(outcome, 499 if cancelled else 200))
