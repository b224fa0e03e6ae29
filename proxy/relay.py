"""The attempt loop (SPEC §5.6, §6.1, §6.2): dispatch the plan's candidates in order, classify each
failure, and hand the request on only while the client has seen nothing.

One Exchange per client request (per `response.create` on a websocket). `run` returns a Final (a
complete answer or typed failure, for plain HTTP and for streams that ended before any visible
output) or a Stream (the first visible output is ready; the rest is relayed as it arrives, never
retried). Health writes go through the routing services; a success on a healthy candidate writes
nothing.

The transport is a seam, `Dispatch`: how one attempt reaches its upstream (HTTP here;
`proxy.ws_relay` for the Responses websocket) and how output is framed for the client. Whatever
the transport, an upstream's events arrive as an `EventSource` of `proxy.sse.Block`s and go through
the same classification and `Withholder`, so "visible", "pre-visible failure" and "never retry after
output" mean the same thing on SSE and on a websocket.
"""

import asyncio
import json
import logging
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Protocol

import httpx
from django.conf import settings
from django.db import DatabaseError, transaction

from pools.credentials import credential_of
from pools.services import key_budget_reserve, key_budget_settle
from proxy import framing, ledger, payloads, shutdown, upstream
from proxy.adapters.token_estimate import estimate_input_tokens
from proxy.adapters.translate import RequestTranslationError, ResponseTranslationError
from proxy.apis import chat
from proxy.apis.base import ClientApi
from proxy.errors import TYPED_ERRORS, should_retry
from proxy.exchange import AttemptLog, Exchange, Failure, Final, Lease, Memory, Stream, settle
from proxy.providers.base import COUNT_TOKENS, StreamTranslator, UpstreamCall
from proxy.providers.registry import provider, upstream_call
from proxy.sse import (
    Action,
    Block,
    Dialect,
    SSEParser,
    SSEProtocolError,
    Visibility,
    Withholder,
)
from proxy.sse import classify as classify_block
from proxy.upstream import TransportFailure
from routing import breaker, services
from routing.breaker import BreakerSettings, CircuitSnapshot
from routing.eligibility import evaluate
from routing.failures import (
    CanonicalError,
    DispatchState,
    Disposition,
    FailureClass,
    Observation,
    TransportEvent,
    canonical_error,
    circuit_reason,
    classify,
    demotion_reason,
    dispatch_state,
    disposition,
)
from routing.models import AffinityKind
from routing.plan import Plan, next_candidate
from routing.pricing import cost_micros
from routing.route import RoutingView
from routing.sanitize import sanitized
from routing.services import CircuitKey, Seen
from routing.types import Candidate, CircuitReason, Health, IneligibleReason, Requirements, RouteClass
from routing.vocabulary import AttemptStatus, Outcome
from runtime import db

logger = logging.getLogger("gateway")


DB_WAIT_FLOOR_S = 0.5  # a request's shortest wait for a database write (see Relay._db_wait_s)
RESPONSE_AFFINITY_TTL = timedelta(days=30)  # as long as the providers keep stored responses
SESSION_AFFINITY_TTL = timedelta(hours=1)
# Uploaded files stay until deleted (OpenAI keeps them indefinitely); a year bounds a forgotten one.
FILE_AFFINITY_TTL = timedelta(days=365)


def probe_circuit(
    view: RoutingView, route_class: RouteClass, c: Candidate
) -> tuple[CircuitKey, "CircuitSnapshot | None"]:
    """The circuit that governs `c`'s health (its own, or its assignment-wide credential circuit
    while that is not closed) as this request read it: where a probe lease is taken and freed."""
    pool_id = view.targets[c.assignment_id].pool_id
    snapshot, wide = breaker.governing(view.circuits.get(c.key), view.wide.get(c.assignment_id))
    if wide:
        return CircuitKey.wide(pool_id, c.assignment_id), snapshot
    return CircuitKey(pool_id, c.assignment_id, c.model, route_class), snapshot


INTERRUPTED_MESSAGE = "The upstream stream ended abnormally after output began."
STOPPING_MESSAGE = "The gateway is shutting down; the response was cut short and not retried."
UNTRANSLATABLE_MESSAGE = "The request uses a feature the API of the routes able to serve it cannot carry: {}."
POST_VISIBLE_MESSAGE = "The upstream failed after output began; the request was not retried."


class EventSource(Protocol):
    """One attempt's upstream events, as batches of blocks (SSE: the blocks of one network chunk;
    websocket: one event per frame). `batches` raises TransportFailure when the transport fails."""

    # A websocket response ends at its terminal event while the connection stays open for the next
    # one; an SSE response ends at EOF.
    ends_at_terminal: bool

    def batches(self) -> AsyncGenerator[list[Block], None]: ...

    async def aclose(self, *, complete: bool) -> None:
        """The attempt is over; `complete`: its response reached a terminal event."""
        ...


class SSESource:
    """An upstream SSE response; closing it drops the connection (httpx releases it)."""

    ends_at_terminal = False

    def __init__(self, response: httpx.Response) -> None:
        self.response = response

    async def batches(self) -> AsyncGenerator[list[Block], None]:
        parser = SSEParser()
        try:
            async for chunk in self.response.aiter_bytes():  # decoded: httpx undoes gzip/deflate
                yield parser.feed(chunk)
            tail = parser.flush()
            if tail is not None:
                yield [tail]
        except SSEProtocolError:
            raise TransportFailure(TransportEvent.STREAM_TRUNCATED) from None
        except httpx.HTTPError as exc:
            raise TransportFailure(upstream.transport_event(exc)) from None

    async def aclose(self, *, complete: bool) -> None:
        await self.response.aclose()


TERMINAL = frozenset({Visibility.TERMINAL_SUCCESS, Visibility.TERMINAL_FAILURE})


class Reading:
    """One attempt's stream as it is read: the upstream's blocks, classified in its own dialect, and
    the client's output (the blocks as they came, or translated into the client's API)."""

    def __init__(
        self,
        source: EventSource,
        dialect: Dialect,
        translator: StreamTranslator | None,
        strip_usage: bool = False,
    ) -> None:
        self.source = source
        self.batches = source.batches()
        self.dialect = dialect
        self.translator = translator
        self.strip_usage = strip_usage
        self.withholder = Withholder()

    def output(self, blocks: Iterable[Block]) -> list[bytes]:
        if self.translator is None:
            return [b.raw for b in blocks if not (self.strip_usage and payloads.usage_only_chunk(b))]
        return [out for out in map(self.translator.feed, blocks) if out]

    def finish(self) -> bytes:
        """At the upstream's end of stream: a translated stream's closing events, if it is owed them."""
        return self.translator.finish() if self.translator is not None else b""


class Relay:
    def __init__(
        self,
        *,
        exchange: Exchange,
        view: RoutingView,
        plan: Plan,
        breaker_settings: BreakerSettings,
        demotion_seconds: int,
        backoff_base_ms: int,
        requirements: Requirements,
        deadline: float,
        path: str,
        body: dict,
        route_class: RouteClass,
        dialect: Dialect | None,
        on_finish: Callable[[Exchange], Awaitable[None]],
        single_attempt: bool = False,
        memory: Memory | None = None,
        dispatch: "Dispatch | None" = None,
        anthropic_beta: str | None = None,
        lease: Lease | None = None,
    ) -> None:
        self.x = exchange
        self.view = view
        self.plan = plan
        self.bs = breaker_settings
        self.demotion_seconds = demotion_seconds
        self.backoff_base_ms = backoff_base_ms
        self.requirements = requirements
        self.deadline = deadline
        self.path = path
        self.body = body
        self.route_class = route_class
        self.dialect = dialect
        self.on_finish = on_finish
        self.single_attempt = single_attempt
        self.memory = memory or Memory()
        self.dispatch: Dispatch = dispatch or HttpDispatch()
        self.anthropic_beta = anthropic_beta
        self.untranslatable: str | None = None  # the param a translation refused (a candidate passed over)
        self.response_id: str | None = None
        self.file_id: str | None = None  # an upload's answer: the file the upstream created
        self.lease = lease  # taken before dispatch; freed at the end when its candidate was never tried
        self.probe: CircuitKey | None = None  # the circuit whose probe the current attempt holds
        self.terminal_seen = False  # the current stream reached its terminal event
        self.failed_after_output: FailureClass | None = None  # an upstream error event after output
        # The failure-path state writes still running (see `_record_failure`), in submission order.
        self.state_writes: asyncio.Future[None] | None = None
        self.excluded: IneligibleReason | None = None  # why the last candidate was passed over at its turn
        self.last_candidate: Candidate | None = None  # the candidate of the last failed attempt
        self.budget_unreachable = False  # a reservation could not reach the database

    # -- bookkeeping -------------------------------------------------------------------------

    def _log(self, candidate: Candidate, status: str, **fields) -> AttemptLog:
        log = AttemptLog(
            ordinal=len(self.x.attempts) + 1,
            assignment_id=candidate.assignment_id,
            model=candidate.model,
            route_class=str(self.route_class),
            status=status,
            assignment=candidate.assignment,
            pool=candidate.pool,
            adapter=candidate.adapter,
            offset_ms=max(int((datetime.now(UTC) - self.x.started_at).total_seconds() * 1000), 0),
            **fields,
        )
        self.x.attempts.append(log)
        return log

    def _key(self, c: Candidate) -> CircuitKey:
        return CircuitKey(
            self.view.targets[c.assignment_id].pool_id, c.assignment_id, c.model, self.route_class
        )

    async def _finish(self, outcome: str, status: int | None) -> None:
        if self.lease is not None:
            # The lease of a candidate this request never tried (an earlier one served it).
            lease, self.lease = self.lease, None
            await self._write_state(partial(services.circuit_release_probe, key=lease.circuit))
        await self.state_written()
        self.x.outcome = outcome
        self.x.status_code = status
        self.x.finished_at = datetime.now(UTC)
        await self.on_finish(self.x)

    def _remember(self, c: Candidate) -> None:
        now = datetime.now(UTC)
        owner = self.x.key_id
        assert owner is not None  # an authenticated request: every affinity has its key (SPEC §7.2)
        if self.memory.response_ids and self.response_id:
            services.affinity_record(
                gateway_key_id=owner,
                kind=AffinityKind.RESPONSE,
                key=self.response_id,
                assignment_id=c.assignment_id,
                ttl=RESPONSE_AFFINITY_TTL,
                now=now,
            )
        if self.memory.file_upload and self.file_id:
            services.affinity_record(
                gateway_key_id=owner,
                kind=AffinityKind.FILE,
                key=self.file_id,
                assignment_id=c.assignment_id,
                ttl=FILE_AFFINITY_TTL,
                now=now,
            )
        if self.memory.file_deleted:
            services.affinity_forget(
                gateway_key_id=owner, kind=AffinityKind.FILE, key=self.memory.file_deleted
            )
        if self.memory.session and self.memory.session_seen != (c.assignment_id, c.model):
            services.affinity_record(
                gateway_key_id=owner,
                kind=AffinityKind.SESSION,
                key=self.memory.session,
                assignment_id=c.assignment_id,
                model=c.model,
                ttl=SESSION_AFFINITY_TTL,
                now=now,
            )

    async def _record_success(self, c: Candidate) -> None:
        await self.state_written()  # the failures before it first: one request's writes stay in order
        # A probe taken since the plan was read changed the row: then the CAS re-reads.
        probed = self.probe is not None
        seen = None if probed else Seen(self.view.circuits.get(c.key))
        wide = self.view.wide.get(c.assignment_id)
        remember = (
            (self.memory.response_ids and self.response_id)
            or self.memory.session
            or (self.memory.file_upload and self.file_id)
            or self.memory.file_deleted
        )
        writes = probed or (seen is not None and seen.snapshot is not None and not seen.snapshot.clean)
        wide_writes = wide is not None and not wide.clean
        if remember or writes or wide_writes or c.demoted:
            await self._write_state(self._success_state, c, seen, remember, writes, wide_writes)

    def _success_state(
        self, c: Candidate, seen: Seen | None, remember: bool, writes: bool, wide_writes: bool
    ) -> None:
        if remember:
            self._remember(c)
        if writes:
            services.circuit_record_success(key=self._key(c), seen=seen)
        if wide_writes:  # the credential works again: the assignment-wide circuit closes
            services.circuit_record_success(key=CircuitKey.wide(self._key(c).pool_id, c.assignment_id))
        if c.demoted:
            services.demotion_resolve(assignment_id=c.assignment_id, model=c.model)

    def _record_failure(
        self, c: Candidate, failure: FailureClass, probe: CircuitKey | None, retry_after: int | None = None
    ) -> None:
        """Starts the failure's circuit and demotion writes and returns at once: they run while the
        request is handed to the next candidate (they were about 2 ms of every failover, before the
        next dispatch). Each runs after the previous one, and `state_written` (awaited before any
        success write and before the exchange is finished, so before the client's answer ends)
        waits for them all: what a later request or a reader of the response sees is unchanged."""
        if circuit_reason(failure) is None and demotion_reason(failure) is None and probe is None:
            return
        previous = self.state_writes

        async def write() -> None:
            if previous is not None:
                await asyncio.wait([previous])  # its order, not its outcome: it reports its own
            await self._write_state(self._failure_state, c, failure, probe, retry_after)

        # A task of its own: it completes even when this request is cancelled meanwhile.
        self.state_writes = asyncio.ensure_future(write())

    async def state_written(self) -> None:
        """Wait for the failure-path state writes started so far (they log their own errors)."""
        if self.state_writes is not None:
            await asyncio.shield(self.state_writes)

    def _failure_state(
        self, c: Candidate, failure: FailureClass, probe: CircuitKey | None, retry_after: int | None
    ) -> None:
        reason = circuit_reason(failure)
        demotion = demotion_reason(failure)
        now = datetime.now(UTC)
        key = self._key(c)
        seen: Seen | None = Seen(self.view.circuits.get(c.key))
        if reason is CircuitReason.CREDENTIAL_REJECTED:
            # The credential or account, not this model: one circuit for the whole assignment.
            key = CircuitKey.wide(key.pool_id, c.assignment_id)
            seen = Seen(self.view.wide.get(c.assignment_id))
        if probe is not None:
            seen = None  # the probe changed the row since it was read: the CAS reads it again
            if reason is None or probe != key:
                # A verdict-free end for the circuit whose probe was held (a 400, a 429, the client's
                # deadline; or a non-credential failure while probing the credential): free the slot.
                services.circuit_release_probe(key=probe)
        # One transaction (one commit) for the circuit and the demotion of one outcome.
        with transaction.atomic():
            if reason is not None:
                services.circuit_record_failure(key=key, reason=reason, settings=self.bs, now=now, seen=seen)
            if demotion is not None:
                # 429/quota: until the upstream's retry-after (bounded) when it sent one.
                seconds = (
                    retry_after
                    if retry_after is not None and demotion is CircuitReason.RATE_LIMITED
                    else None
                )
                services.demotion_record(
                    assignment_id=c.assignment_id,
                    model=c.model,
                    reason=demotion,
                    until=now + timedelta(seconds=self.demotion_seconds if seconds is None else seconds),
                )

    async def _write_state(self, write, *args) -> None:
        """Health and affinity writes, in one trip to the database. They inform later requests;
        when the database refuses one, or has not answered by the deadline, this request goes on and
        the loss is logged (no content)."""
        try:
            await db.write_within(self._db_wait_s(), partial(write, *args))
        except DatabaseError:
            logger.exception("routing state could not be saved")

    def _db_wait_s(self) -> float:
        """How long this request waits for one database write: what is left of its deadline (a
        stalled database must not hold it past it), at least DB_WAIT_FLOOR_S (a stream past its
        deadline still gets its final writes, e.g. the response id a next turn needs)."""
        return max(self.deadline - time.monotonic(), DB_WAIT_FLOOR_S)

    # -- the loop ----------------------------------------------------------------------------

    def _remaining_ms(self) -> int:
        return max(int((self.deadline - time.monotonic()) * 1000), 0)

    async def _admit(self, c: Candidate) -> tuple[bool, CircuitKey | None]:
        """(dispatch?, the circuit whose probe it holds). Re-gates for the deadline spent so far (no
        attempt with less than `retry.min_attempt_ms` left) and takes a probe when one is admissible."""
        verdict = evaluate(c, replace(self.requirements, deadline_remaining_ms=self._remaining_ms()))
        if verdict.eligible and not await self._reserve(verdict.reservation_micros):
            verdict = replace(verdict, reasons=(IneligibleReason.BUDGET,))
        if not verdict.eligible:
            self._log(c, AttemptStatus.INELIGIBLE, ineligible_reason=str(verdict.reason))
            self.excluded, self.untranslatable = verdict.reason, None
            return False, None
        if c.health is Health.HELD and self.lease is not None and self.lease.candidate == c.key:
            lease, self.lease = self.lease, None  # taken before dispatch: this attempt uses it
            return True, lease.circuit
        if c.health is not Health.PROBE:
            return True, None
        key, snapshot = probe_circuit(self.view, self.route_class, c)
        try:
            won = await db.write_within(
                self._db_wait_s(),
                partial(
                    services.circuit_take_probe,
                    key=key,
                    settings=self.bs,
                    now=datetime.now(UTC),
                    seen=Seen(snapshot),
                ),
                undo=lambda taken: taken and services.circuit_release_probe(key=key),
            )
        except db.DatabaseTimeout:
            won = False  # as if another request had it: the database decides nothing in time
        if won:
            return True, key
        if breaker.blocked_health(snapshot.reason if snapshot else None) is Health.BLOCKED:
            self._log(c, AttemptStatus.INELIGIBLE, ineligible_reason=str(IneligibleReason.CIRCUIT_OPEN))
            self.excluded, self.untranslatable = IneligibleReason.CIRCUIT_OPEN, None
            return False, None
        return True, None

    async def _reserve(self, reservation: int | None) -> bool:
        """Hold the candidate's reservation on a key with a budget before dispatch (SPEC §7.4): one
        conditional UPDATE, only for what this request does not hold yet (a dearer later candidate
        tops it up). False: the budget cannot cover it, and the candidate is passed over."""
        need = (reservation or 0) - self.x.reserved_micros
        if self.requirements.budget_remaining_micros is None or self.x.key_id is None or need <= 0:
            return True
        key_id, period = self.x.key_id, self.x.budget_period
        try:
            held = await db.write_within(
                self._db_wait_s(),
                partial(key_budget_reserve, key_id=key_id, amount=need, period=period, now=datetime.now(UTC)),
                undo=lambda taken: (
                    taken
                    and key_budget_settle(
                        key_id=key_id, released=need, charged=0, period=period, now=datetime.now(UTC)
                    )
                ),
            )
        except DatabaseError as failed:  # no reservation, no dispatch
            if isinstance(failed, db.DatabaseTimeout):  # what it takes late is given back (undo)
                logger.warning("budget reservation: no answer from the database by the deadline")
            else:
                logger.exception("budget reservation failed")
            self.budget_unreachable = True
            return False
        if held:
            self.x.reserved_micros += need
            ledger.writer.held(self.x)  # settled from the journal if this process dies meanwhile
        return held

    async def run(self) -> Final | Stream:
        for verdict in self.plan.ineligible:
            self._log(verdict.candidate, AttemptStatus.INELIGIBLE, ineligible_reason=str(verdict.reason))
        order = self.plan.order
        index: int | None = 0
        last: Failure | None = None
        handing_off: AttemptLog | None = None  # the failed attempt waiting for its handoff to happen
        while index is not None and index < len(order):
            c = order[index]
            call = self._upstream_call(c)
            if call is None:
                index = self._after_passed_over(order, index)
                continue
            dispatch, probe = await self._admit(c)
            self.probe = probe
            if not dispatch:
                index = self._after_passed_over(order, index)
                continue
            if handing_off is not None:
                # Only now has the request really been handed on (SPEC §5.6): a next candidate that
                # turned out ineligible at its turn leaves the failed attempt `failed`.
                handing_off.status = AttemptStatus.RETRYABLE_FAILED
                self.x.retry_count += 1
                handing_off = None
            started = time.monotonic()
            log = self._log(c, AttemptStatus.FAILED)
            self.terminal_seen = False
            try:
                # One wall-clock bound over connect, send and read (§6.0): the whole plain answer, or a
                # stream's first visible event. A dripping upstream is cut like a hanging one. Its end
                # is the client's deadline, so the attempt is neutral for the circuit.
                async with asyncio.timeout(max(self.deadline - time.monotonic(), 0)):
                    result = await self.dispatch.attempt(self, c, log, call)
            except TimeoutError:
                result = self.failure(Observation(transport=TransportEvent.DEADLINE))
            except asyncio.CancelledError:
                log.status, log.failure_class = AttemptStatus.CANCELLED, FailureClass.CANCELLED
                log.dispatch_state = DispatchState.UNKNOWN
                log.elapsed_ms = int((time.monotonic() - started) * 1000)
                await settle(self._end_cancelled(c, probe))
                raise
            log.elapsed_ms = int((time.monotonic() - started) * 1000)
            if not isinstance(result, Failure):
                self.x.served_model = c.model
                self.x.model_fallback = c.cross_model
                return await self._succeed(c, log, result)
            last, self.last_candidate = result, c
            log.cost_micros = self._cost(c, log)  # usage an upstream reported with its failure
            log.failure_class = str(result.failure)
            log.dispatch_state = str(result.dispatch)
            log.upstream_status = result.status
            log.error_code = result.code or ""
            self._record_failure(c, result.failure, probe, result.retry_after)
            action = self.disposition(result)
            nxt = None if self.single_attempt else next_candidate(order, index, action)
            if nxt is None:
                break
            handing_off = log
            await self._backoff()
            index = nxt
        return await self._final_failure(last)

    def _after_passed_over(self, order: tuple[Candidate, ...], index: int) -> int | None:
        """The next candidate after `order[index]` was passed over at its turn: the next one of the same
        model (§5.2); the fallback model's only when every primary candidate turned out excluded by a
        circuit open for upstream_model_unavailable (some only now, another request holding the probe)."""
        nxt = next_candidate(order, index, Disposition.NEXT_CANDIDATE)
        if nxt is None and not order[index].cross_model and self._primary_blocked():
            return next_candidate(order, index, Disposition.NEXT_MODEL)
        return nxt

    def _primary_blocked(self) -> bool:
        circuit_open = str(IneligibleReason.CIRCUIT_OPEN)
        blocked = {
            (a.assignment_id, a.model)
            for a in self.x.attempts
            if a.status == AttemptStatus.INELIGIBLE and a.ineligible_reason == circuit_open
        }
        primary = [c.key for c in self.plan.order if not c.cross_model]
        primary += [v.candidate.key for v in self.plan.ineligible if not v.candidate.cross_model]
        return bool(primary) and all(key in blocked for key in primary)

    def _upstream_call(self, c: Candidate) -> UpstreamCall | None:
        """The request `c` would be sent, or None when the client's request cannot be expressed in
        its API: the candidate is passed over as incapable, and nothing is sent."""
        try:
            return upstream_call(
                self.path,
                self.view.targets[c.assignment_id],
                self.body,
                model=c.model,
                requirements=self.requirements,
                credential=credential_of(self.view.targets[c.assignment_id]),
                anthropic_beta=self.anthropic_beta,
            )
        except RequestTranslationError as refused:
            self._log(c, AttemptStatus.INELIGIBLE, ineligible_reason=str(IneligibleReason.CAPABILITY))
            self.excluded, self.untranslatable = IneligibleReason.CAPABILITY, refused.param
            return None

    async def _end_cancelled(self, c: Candidate, probe: CircuitKey | None) -> None:
        if probe is not None:
            await db.write(services.circuit_release_probe, key=probe)
        await self._finish(Outcome.CANCELLED, 499)

    async def _backoff(self) -> None:
        # Full jitter, inside the one deadline of the whole sequence.
        hops = self.x.attempts_made
        delay = random.uniform(0, self.backoff_base_ms / 1000 * (2 ** min(hops - 1, 6)))  # noqa: S311
        await asyncio.sleep(min(delay, max(self.deadline - time.monotonic(), 0)))

    def read_timeout_s(self) -> float:
        """The gateway's own upstream read timeout (GATEWAY_UPSTREAM_TIMEOUT_S): when it fires, the
        upstream was too slow by the gateway's measure and the circuit counts it. The client's
        deadline is a separate wall-clock bound around the whole attempt (`run`), neutral for health."""
        return settings.GATEWAY_UPSTREAM_READ_TIMEOUT_S

    def failure(
        self, observation: Observation, withheld: tuple[bytes, ...] = (), retry_after: int | None = None
    ) -> Failure:
        failure = classify(observation) or FailureClass.UPSTREAM_ERROR
        # Only sanitized fields go on (SPEC §4): to the client, the ledger, the log and the metrics.
        error = sanitized(canonical_error(observation.body, observation.errors), failure)
        return Failure(
            failure=failure,
            dispatch=dispatch_state(observation.transport, observation.status),
            status=observation.status,
            error_type=error.type,
            code=error.code,
            param=error.param,
            withheld=withheld,
            retry_after=retry_after if observation.status == 429 else None,
        )

    def plain(
        self,
        c: Candidate,
        log: AttemptLog,
        call: UpstreamCall,
        status: int,
        raw: bytes,
        *,
        retry_after: int | None = None,
    ) -> Failure | Final:
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        body = parsed if isinstance(parsed, dict) else None
        if 200 <= status < 300:
            log.input_tokens, log.output_tokens = payloads.usage(body)
            self._note_response_id(body)
            failure = classify(Observation(status=status, finish_reason=payloads.finish_reason(body)))
            if failure is FailureClass.SAFETY_REFUSAL:
                log.failure_class = str(failure)
                self.x.outcome = Outcome.TERMINAL_REFUSAL
            try:
                return Final(status=status, body=call.response(raw))
            except ResponseTranslationError:
                # The upstream answered, but in a form the client's API cannot carry (a tool call's
                # arguments that are not an object): a typed failure, never a guess, never a replay.
                return self.unrelayable(status, "upstream_untranslatable")
        # A failed attempt is charged too when the upstream reported usage with its error.
        log.input_tokens, log.output_tokens = payloads.usage(body)
        observation = Observation(
            status=status,
            body=body,
            has_provenance=c.provenance is not None,
            errors=provider(c.adapter).errors,
        )
        return self.failure(observation, retry_after=retry_after)

    @staticmethod
    def unrelayable(status: int, code: str) -> Failure:
        """An answer the upstream completed that the client cannot be given (too large, or not
        expressible in its API): a typed 502, never a guess, never a replay."""
        return Failure(
            failure=FailureClass.UPSTREAM_ERROR,
            dispatch=DispatchState.COMPLETED,
            status=status,
            error_type="upstream_error",
            code=code,
            param=None,
            final=True,
        )

    @staticmethod
    def disposition(failure: Failure) -> Disposition:
        return Disposition.RETURN_FAILURE if failure.final else disposition(failure.failure, failure.dispatch)

    async def read_events(
        self, c: Candidate, log: AttemptLog, source: EventSource, call: UpstreamCall | None = None
    ) -> Failure | Stream:
        """Withhold the leading non-visible events; return a Stream at the first visible one, or the
        Failure that ended the attempt before anything was shown (SPEC §6.2, §6.3). Events are
        classified in the upstream's dialect (`call.dialect`) and written in the client's."""
        assert self.dialect is not None
        reading = Reading(
            source,
            call.dialect if call else self.dialect,
            call.stream() if call else None,
            strip_usage=call.strip_usage if call else False,
        )
        batches = reading.batches
        try:
            async for blocks in batches:
                for n, block in enumerate(blocks):
                    cls = classify_block(reading.dialect, block)
                    self._inspect(log, cls.payload)
                    self._note_terminal(reading.dialect, cls)
                    decision = reading.withholder.feed(block, cls)
                    if decision.action is Action.RELEASE:
                        self.x.first_output_at = datetime.now(UTC)
                        first = reading.output(decision.write)
                        done = source.ends_at_terminal and cls.visibility in TERMINAL
                        return Stream(self._relay_rest(c, log, reading, first, blocks[n + 1 :], done))
                    if decision.action is Action.PRE_VISIBLE_FAILURE:
                        await batches.aclose()
                        await source.aclose(complete=True)
                        # A websocket `error` event names the HTTP status it stands for; classify by it.
                        status = decision.error.status if decision.error and decision.error.status else 200
                        return self.failure(
                            Observation(
                                status=status if status >= 400 else 200,
                                body=cls.payload if isinstance(cls.payload, dict) else None,
                                transport=TransportEvent.STREAM_ERROR_EVENT,
                                has_provenance=c.provenance is not None,
                                errors=provider(c.adapter).errors,
                            ),
                            tuple(reading.output(reading.withholder.withheld())),
                        )
        except TransportFailure as exc:
            await source.aclose(complete=False)
            event = exc.event if exc.event is TransportEvent.READ_TIMEOUT else TransportEvent.STREAM_TRUNCATED
            return self.failure(Observation(status=200, transport=event))
        except asyncio.CancelledError:
            await settle(source.aclose(complete=False))
            raise
        await source.aclose(complete=False)
        return self.failure(Observation(status=200, transport=TransportEvent.STREAM_TRUNCATED))

    def _relay_batch(
        self, c: Candidate, log: AttemptLog, batch: list[Block], reading: "Reading", *, ends_at_terminal: bool
    ) -> tuple[list[bytes], bool]:
        """The client output for a batch of post-release blocks, and whether the response ended."""
        assert self.dialect is not None
        out: list[bytes] = []
        for block in batch:
            cls = classify_block(reading.dialect, block)
            self._inspect(log, cls.payload)
            self._note_terminal(reading.dialect, cls)
            decision = reading.withholder.feed(block, cls)
            if decision.action is Action.POST_VISIBLE_FAILURE:
                error = decision.error
                # Never retried, but classified like any failed attempt (SPEC §5.6): an upstream that
                # keeps failing mid-stream cools like one that fails before output.
                status = error.status if error and error.status else 200
                failed = self.failure(
                    Observation(
                        status=status if status >= 400 else 200,
                        body=cls.payload if isinstance(cls.payload, dict) else None,
                        transport=TransportEvent.STREAM_ERROR_EVENT,
                        has_provenance=c.provenance is not None,
                        errors=provider(c.adapter).errors,
                    )
                )
                fields = sanitized(
                    CanonicalError(error.type, error.code, error.param) if error else CanonicalError(),
                    failed.failure,
                )
                out.append(
                    self.dispatch.error_event(
                        self.dialect,
                        type=fields.type or "upstream_error",
                        code=fields.code,
                        param=fields.param,
                        message=POST_VISIBLE_MESSAGE,
                        status=error.status if error else None,
                    )
                )
                log.status, log.failure_class = AttemptStatus.FAILED, str(failed.failure)
                log.error_code = fields.code or ""
                self.failed_after_output = failed.failure
                self.x.outcome = self.x.outcome or Outcome.UPSTREAM_ERROR_AFTER_OUTPUT
            else:
                out.extend(reading.output(decision.write))
            if ends_at_terminal and cls.visibility in TERMINAL:
                return out, True
        return out, False

    async def _relay_rest(
        self,
        c: Candidate,
        log: AttemptLog,
        reading: "Reading",
        first: list[bytes],
        pending: list[Block],
        done: bool,
    ) -> AsyncIterator[bytes]:
        outcome, status = Outcome.OK, 200
        log.status, log.dispatch_state = AttemptStatus.SUCCEEDED, DispatchState.COMPLETED
        started = time.monotonic()
        source, batches = reading.source, reading.batches
        ends = source.ends_at_terminal
        ended = False  # the exchange is settled (and handed to the ledger): touch it no more
        stopping = False

        async def interrupt() -> None:
            nonlocal stopping
            stopping = True
            await source.aclose(complete=False)

        release = shutdown.register(interrupt)
        try:
            out = first
            if pending and not done:
                more, done = self._relay_batch(c, log, pending, reading, ends_at_terminal=ends)
                out = [*out, *more]
            while True:
                if done:
                    # A websocket response is over at its terminal event: settle it before the client
                    # sees that event, so a continuation sent at once finds its affinity (and a reader
                    # of the ledger its row).
                    ended = True
                    log.elapsed_ms += int((time.monotonic() - started) * 1000)
                    await settle(
                        self._end_stream(c, log, source, batches, True, self.x.outcome or outcome, status)
                    )
                for part in self.dispatch.pack(out):
                    yield part
                if done:
                    return
                try:
                    # After the first visible event the deadline no longer applies (§6.0): the stream
                    # ends when the upstream stays silent for GATEWAY_STREAM_IDLE_S.
                    async with asyncio.timeout(settings.GATEWAY_STREAM_IDLE_S):
                        batch = await anext(batches)
                except TimeoutError:
                    raise TransportFailure(TransportEvent.READ_TIMEOUT) from None
                except StopAsyncIteration:
                    if not self.terminal_seen:
                        # Closed without its terminal event: never a success (§7.1).
                        raise TransportFailure(TransportEvent.STREAM_TRUNCATED) from None
                    tail = reading.finish()
                    if tail:
                        yield tail
                    break
                out, done = self._relay_batch(c, log, batch, reading, ends_at_terminal=ends)
        except (asyncio.CancelledError, GeneratorExit):
            # GeneratorExit: the client stopped reading before the end (it went away while a write
            # was pending); nobody is left to answer, as with a cancel.
            if not ended:
                log.status, log.failure_class = AttemptStatus.CANCELLED, FailureClass.CANCELLED
                log.dispatch_state = DispatchState.UNKNOWN
                outcome, status = Outcome.CANCELLED, 499
            raise
        except TransportFailure:
            log.status, log.failure_class, log.dispatch_state = (
                AttemptStatus.FAILED,
                FailureClass.INTERRUPTED,
                DispatchState.UNKNOWN,
            )
            outcome = Outcome.GATEWAY_SHUTTING_DOWN if stopping else Outcome.UPSTREAM_INTERRUPTED
            yield self.dispatch.error_event(
                self.dialect,
                type="service_unavailable" if stopping else "upstream_error",
                code=outcome,
                param=None,
                message=STOPPING_MESSAGE if stopping else INTERRUPTED_MESSAGE,
                status=None,
            )
        finally:
            release()
            if not ended:
                log.elapsed_ms += int((time.monotonic() - started) * 1000)
                await settle(
                    self._end_stream(c, log, source, batches, False, self.x.outcome or outcome, status)
                )

    async def _end_stream(
        self,
        c: Candidate,
        log: AttemptLog,
        source: EventSource,
        batches: AsyncGenerator[list[Block], None],
        done: bool,
        outcome: str,
        status: int,
    ) -> None:
        # `done` is set only by a terminal event: a websocket at a response boundary stays usable.
        await batches.aclose()
        await source.aclose(complete=done)
        if log.status == AttemptStatus.SUCCEEDED:
            log.cost_micros = self._cost(c, log)
            await self._record_success(c)
        elif self.failed_after_output is not None:
            self._record_failure(c, self.failed_after_output, self.probe)  # `_finish` awaits it
        elif self.probe is not None:  # a verdict-free end (upstream_interrupted) frees the probe (§7.1)
            await self._write_state(partial(services.circuit_release_probe, key=self.probe))
        await self._finish(outcome, status)

    def _note_terminal(self, dialect: Dialect, cls) -> None:
        """Whether the stream reached its end: a terminal event, or (Chat, whose `[DONE]` some
        compatible servers omit) a chunk carrying the finish reason."""
        if cls.visibility in TERMINAL or (
            dialect is Dialect.CHAT and payloads.finish_reason(cls.payload) is not None
        ):
            self.terminal_seen = True

    def _note_response_id(self, payload: object) -> None:
        if self.memory.response_ids and self.response_id is None:
            self.response_id = payloads.response_id(payload)

    def _inspect(self, log: AttemptLog, payload: object) -> None:
        """What a stream event tells the ledger: usage, the response id, a refusal. Never content."""
        if payload is None:
            return
        self._note_response_id(payload)
        # Streams report usage in parts (Anthropic: input in message_start, output in message_delta):
        # a later event updates what it names and keeps the rest.
        prompt, completion = payloads.usage(payload)
        if prompt is not None:
            log.input_tokens = prompt
        if completion is not None:
            log.output_tokens = completion
        if (
            classify(Observation(finish_reason=payloads.finish_reason(payload)))
            is FailureClass.SAFETY_REFUSAL
        ):
            log.failure_class = str(FailureClass.SAFETY_REFUSAL)
            self.x.outcome = Outcome.TERMINAL_REFUSAL

    def _cost(self, c: Candidate, log: AttemptLog) -> int | None:
        if log.input_tokens is None or log.output_tokens is None:
            return None
        return cost_micros(c.price, input_tokens=log.input_tokens, output_tokens=log.output_tokens)

    async def end_passthrough(self, c: Candidate, log: AttemptLog, *, outcome: str) -> None:
        """A relayed body that is no event stream (a file's content) ended: "ok" when it was read to
        its end, "upstream_interrupted" when the upstream cut it, "cancelled" when the client left."""
        if outcome == Outcome.OK:
            log.status, log.dispatch_state = AttemptStatus.SUCCEEDED, DispatchState.COMPLETED
            await self._record_success(c)
            await self._finish(Outcome.OK, 200)
            return
        log.status = AttemptStatus.CANCELLED if outcome == Outcome.CANCELLED else AttemptStatus.FAILED
        log.dispatch_state = DispatchState.UNKNOWN
        log.failure_class = (
            FailureClass.CANCELLED if outcome == Outcome.CANCELLED else FailureClass.INTERRUPTED
        )
        if self.probe is not None:  # a verdict-free end frees the probe slot (SPEC §7.1)
            await self._write_state(partial(services.circuit_release_probe, key=self.probe))
        await self._finish(outcome, 499 if outcome == Outcome.CANCELLED else 200)

    async def _succeed(self, c: Candidate, log: AttemptLog, result: Final | Stream) -> Final | Stream:
        if isinstance(result, Stream):
            return result
        log.status, log.dispatch_state = AttemptStatus.SUCCEEDED, DispatchState.COMPLETED
        log.cost_micros = self._cost(c, log)
        await self._record_success(c)
        await self._finish(self.x.outcome or Outcome.OK, result.status)
        return result

    async def _final_failure(self, last: Failure | None) -> Final:
        if last is None and self.untranslatable is not None:
            # Nothing was sent: the last candidate could not be sent this request in its API.
            await self._finish("invalid_request", 400)
            final = self.dispatch.error_final(
                400,
                message=UNTRANSLATABLE_MESSAGE.format(self.untranslatable),
                type="invalid_request",
                code="invalid_request",
                param=self.untranslatable,
            )
            return replace(final, should_retry=False)
        if last is None and self.path == COUNT_TOKENS:
            # No Anthropic-shaped account could count them: the gateway's own estimate, labelled as
            # such, rather than a 503 that stops a coding agent before every turn (SPEC §4).
            await self._finish(Outcome.OK, 200)
            body = json.dumps({"input_tokens": estimate_input_tokens(self.body)}).encode()
            return Final(200, body, headers=(("x-gateway-token-count", "estimated"),))
        if last is None and self.budget_unreachable:
            # Nothing was sent because the budget could not be reserved: the database, not the budget.
            await self._finish("gateway_unavailable", 503)
            final = self.dispatch.error_final(
                503,
                message=TYPED_ERRORS["gateway_unavailable"][1],
                type="gateway_unavailable",
                code="gateway_unavailable",
                param=None,
            )
            return replace(final, should_retry=True)
        if last is None:
            reason = self.excluded or self.plan.exclusion_reason or IneligibleReason.CIRCUIT_OPEN
            await self._finish("no_eligible_backend", 503)
            final = self.dispatch.error_final(
                503,
                message=self._no_eligible_message(reason),
                type="service_unavailable",
                code="no_eligible_backend",
                param=str(reason),
            )
            return replace(final, should_retry=should_retry("no_eligible_backend", str(reason)))
        action = self.disposition(last)
        if action is Disposition.DISPATCH_UNKNOWN:
            await self._finish("upstream_dispatch_unknown", 504)
            final = self.dispatch.error_final(
                504,
                message=TYPED_ERRORS["upstream_dispatch_unknown"][1],
                type="upstream_error",
                code="upstream_dispatch_unknown",
                param=None,
            )
            return replace(final, should_retry=False)
        if last.withheld and self.dialect is not None:
            # A stream that failed before any output: the withheld lifecycle once, then the failure.
            error = self.dispatch.error_event(
                self.dialect,
                type=last.error_type or "upstream_error",
                code=last.code,
                param=last.param,
                message=self._failure_message(last),
                status=last.status if last.status and last.status >= 400 else None,
            )
            await self._finish(last.code or str(last.failure), 200)
            return self.dispatch.events_final([*last.withheld, error])
        status = last.status if last.status and last.status >= 400 else 502
        await self._finish(last.code or str(last.failure), status)
        final = self.dispatch.error_final(
            status,
            message=self._failure_message(last),
            type=last.error_type or "upstream_error",
            code=last.code,
            param=last.param,
        )
        # An identical retry may succeed only after a rate limit or a server-side failure (SPEC §4).
        retry = not last.final and (status == 429 or status >= 500)
        return replace(final, should_retry=retry, retry_after=last.retry_after if status == 429 else None)

    @property
    def _anthropic_client(self) -> bool:
        return self.path.startswith("/messages")

    def _too_long(self, window: int | None) -> str | None:
        """Anthropic's documented wording for a context overflow, with both integers when known."""
        tokens = self.requirements.estimated_tokens
        if window is not None and tokens > window:
            return f"prompt is too long: {tokens} tokens > {window} maximum"
        return None

    def _no_eligible_message(self, reason: IneligibleReason) -> str:
        message = f"no eligible backend: {reason}"
        if reason is IneligibleReason.CONTEXT_WINDOW:
            windows = [
                v.candidate.context_window
                for v in self.plan.ineligible
                if IneligibleReason.CONTEXT_WINDOW in v.reasons and v.candidate.context_window is not None
            ]
            too_long = self._too_long(max(windows)) if windows else None
            if too_long is not None and self._anthropic_client:
                message = f"{message} ({too_long})"
        return message

    def _failure_message(self, last: Failure) -> str:
        """The gateway's own words for a relayed failure (SPEC §4): never the provider's text, but what
        happened, in the wording the client's API documents where agents react to it."""
        if last.final and last.code in TYPED_ERRORS:
            return TYPED_ERRORS[last.code][1]
        if last.failure is FailureClass.CONTEXT_OVERFLOW:
            window = self.last_candidate.context_window if self.last_candidate else None
            if self._anthropic_client:
                return self._too_long(window) or "prompt is too long for the model's context window"
            tokens = self.requirements.estimated_tokens
            if window is not None and tokens > window:
                return (
                    f"This model's maximum context length is {window} tokens. "
                    f"However, your messages resulted in {tokens} tokens."
                )
            return "This model's maximum context length was exceeded by the request."
        if last.failure is FailureClass.RATE_LIMITED:
            return "The upstream rate limit was reached; retry after the indicated time."
        if last.failure is FailureClass.QUOTA:
            return "The upstream account's quota is exhausted."
        if last.failure is FailureClass.UNAVAILABLE:
            return "The upstream is unavailable."
        if last.failure in (FailureClass.MODEL_UNAVAILABLE, FailureClass.MODEL_NOT_FOUND_CROSS):
            return "The upstream does not serve this model."
        return "The upstream rejected the request."


class Dispatch(Protocol):
    """A transport: how one attempt reaches its upstream, and how the gateway's output is framed for
    the client. `HttpDispatch` (plain JSON and SSE) is the default; `proxy.ws_relay.WebsocketDispatch`
    is the Responses websocket."""

    async def attempt(
        self, relay: Relay, c: Candidate, log: AttemptLog, call: UpstreamCall
    ) -> Failure | Final | Stream:
        """Send `call` to `c`: the Failure to classify, or the answer (a Final, or a Stream once
        output is visible, usually via `relay.read_events`)."""
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


class HttpDispatch:
    """Plain HTTP and SSE over the shared httpx client (`proxy.upstream`). `api`: the client's API, whose
    envelope, error types and error events the gateway's own errors take."""

    def __init__(self, *, api: ClientApi = chat.API) -> None:
        self.api = api

    async def attempt(
        self, relay: Relay, c: Candidate, log: AttemptLog, call: UpstreamCall
    ) -> Failure | Final | Stream:
        wire = call.wire
        try:
            response = await upstream.open_stream(
                "POST",
                call.url,
                headers=call.headers,
                json=call.payload,
                read_timeout_s=relay.read_timeout_s(),
                sigv4=wire.sigv4 if wire is not None else None,
            )
        except TransportFailure as failure:
            return relay.failure(Observation(transport=failure.event))
        log.upstream_status = response.status_code
        if response.status_code != 200 or relay.dialect is None:
            try:
                raw = await upstream.read_body(response)
            except TransportFailure as failure:
                return relay.failure(Observation(status=response.status_code, transport=failure.event))
            except upstream.ResponseTooLarge:
                return relay.unrelayable(response.status_code, "upstream_response_too_large")
            retry_after = upstream.retry_after_s(response.headers.get("retry-after"))
            status = response.status_code
            if wire is not None:
                status, raw = wire.answer(status, response.headers, raw)
            return relay.plain(c, log, call, status, raw, retry_after=retry_after)
        return await relay.read_events(c, log, framing.source(response, wire, SSESource(response)), call)

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
