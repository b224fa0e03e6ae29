"""The attempt loop (SPEC §5.6, §6.1, §6.2): dispatch the plan's candidates in order, classify each
failure, and hand the request on only while the client has seen nothing.

One Exchange per client request (per `response.create` on a websocket). `run` returns a Final (a
complete answer or typed failure, for plain HTTP and for streams that ended before any visible
output) or a Stream (the first visible output is ready; the rest is relayed as it arrives, never
retried).

The transport is a seam (`proxy.transport.Dispatch`): `open` sends one attempt and reports a
Failure, a plain Answer, an EventSource or a Body, and never calls back into the loop. An
upstream's events go through `proxy.output.AttemptStream` whatever the transport, so "visible",
"pre-visible failure" and "never retry after output" mean the same on SSE and on a websocket.
Routing-state writes go through `proxy.outcomes.HealthWrites`; a success on a healthy candidate
writes nothing.
"""

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial

from django.db import DatabaseError

from pools.credentials import credential_of
from pools.selectors import budget_refusal
from pools.services import (
    key_budget_give_back,
    key_budget_release,
    key_budget_release_statement,
    key_budget_reserve,
    key_budget_reserve_statement,
)
from proxy.ledger import recorder as ledger
from proxy.ledger.exchange import (
    AttemptLog,
    Exchange,
    Failure,
    Final,
    Lease,
    Memory,
    Stream,
    new_response_id,
    settle,
)
from proxy.ledger.services import charge_micros
from proxy.outcomes import HealthWrites, Remembered, db_wait_s, probe_circuit
from proxy.output import AttemptStream, attempt_cost, plain_answer, relay_body
from proxy.transport import Answer, Body, Dispatch
from proxy.unserved import Unserved, exclusion, unserved_answer
from proxy.wire.providers.base import NO_HEADERS, RESPONSES, UpstreamCall
from proxy.wire.providers.registry import upstream_call
from proxy.wire.sse import Dialect
from proxy.wire.translations.translate import RequestTranslationError
from routing import services
from routing.policy import breaker
from routing.policy.breaker import BreakerSettings
from routing.policy.eligibility import evaluate
from routing.policy.failures import DispatchState, Disposition, FailureClass, Observation, TransportEvent
from routing.policy.headroom import Headroom
from routing.policy.plan import Plan, next_candidate
from routing.policy.route import RoutingView
from routing.policy.types import Candidate, Health, IneligibleReason, Requirements, RouteClass
from routing.policy.vocabulary import AttemptStatus, Outcome
from routing.services import CircuitKey, Seen
from runtime import db, loopdb

logger = logging.getLogger("gateway")


def call_for(
    path: str,
    view: RoutingView,
    c: Candidate,
    body: dict,
    requirements: Requirements,
    client_headers: Mapping[str, str],
) -> UpstreamCall:
    """The request candidate `c` is sent for the client's `body` on `path` (without `/v1`);
    RequestTranslationError when the client's request cannot be expressed in the candidate's API."""
    target = view.targets[c.assignment_id]
    return upstream_call(
        path,
        target,
        body,
        model=c.model,
        requirements=requirements,
        credential=credential_of(target),
        created=int(time.time()),  # once per call: every chunk of a translated stream shares it
        # A translated Responses answer's id is the gateway's own; no other route's answer has one to
        # mint (an id costs a system call for its random bytes).
        response_id=new_response_id() if path.startswith(RESPONSES) else "",
        client_headers=client_headers,
    )


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
        client_deadline: bool,
        path: str,
        body: dict,
        route_class: RouteClass,
        dialect: Dialect | None,
        on_finish: Callable[[Exchange], Awaitable[None]],
        dispatch: Dispatch,
        single_attempt: bool = False,
        memory: Memory | None = None,
        client_headers: Mapping[str, str] = NO_HEADERS,
        lease: Lease | None = None,
        first_call: tuple[tuple[int, str], UpstreamCall] | None = None,
    ) -> None:
        self.exchange = exchange
        self.view = view
        self.plan = plan
        self.breaker_settings = breaker_settings
        self.backoff_base_ms = backoff_base_ms
        self.requirements = requirements
        self.deadline = deadline
        # The client set `deadline` (x-gateway-deadline-ms, shorter than the gateway's default): its cut
        # is the client's, neutral for health; else it is the gateway's own timeout (SPEC §5.6, §6.0).
        self.client_deadline = client_deadline
        self.path = path
        self.body = body
        self.route_class = route_class
        self.dialect = dialect
        self.on_finish = on_finish
        self.dispatch = dispatch
        self.single_attempt = single_attempt
        self.memory = memory or Memory()
        self.client_headers = client_headers
        # (candidate key, its call): the request the plan's first candidate is sent, built before the
        # relay (proxy.ingress.route_request, drafted while the request's read was on the wire).
        self.first_call = first_call
        self.health = HealthWrites(
            view=view,
            route_class=route_class,
            breaker_settings=breaker_settings,
            demotion_seconds=demotion_seconds,
            deadline=deadline,
        )
        self.untranslatable: str | None = None  # the param a translation refused (a candidate passed over)
        self.response_id: str | None = None
        self.file_id: str | None = None  # an upload's answer: the file the upstream created
        self.lease = lease  # taken before dispatch; freed at the end when its candidate was never tried
        self.probe: CircuitKey | None = None  # the circuit whose probe the current attempt holds
        self.excluded: IneligibleReason | None = None  # why the last candidate was passed over at its turn
        self.last_candidate: Candidate | None = None  # the candidate of the last failed attempt
        self.budget_unreachable = False  # a reservation could not reach the database
        self.headroom: Headroom | None = None  # what the current attempt's answer said of its rate limits

    # -- bookkeeping -------------------------------------------------------------------------

    def _log(self, candidate: Candidate, status: str, **fields) -> AttemptLog:
        log = AttemptLog(
            ordinal=len(self.exchange.attempts) + 1,
            assignment_id=candidate.assignment_id,
            model=candidate.model,
            route_class=str(self.route_class),
            status=status,
            assignment=candidate.assignment,
            pool=candidate.pool,
            adapter=candidate.adapter,
            offset_ms=max(int((datetime.now(UTC) - self.exchange.started_at).total_seconds() * 1000), 0),
            placed=self.memory.session is not None and self.memory.session_seen != candidate.key,
            **fields,
        )
        self.exchange.attempts.append(log)
        return log

    def _pass_over(self, c: Candidate, reason: IneligibleReason, untranslatable: str | None = None) -> None:
        self._log(c, AttemptStatus.INELIGIBLE, ineligible_reason=str(reason))
        self.excluded, self.untranslatable = reason, untranslatable

    async def _finish(self, outcome: str, status: int | None) -> None:
        if self.lease is not None:
            # The lease of a candidate this request never tried (an earlier one served it).
            lease, self.lease = self.lease, None
            await self.health.release_probe(lease.circuit)
        await self.health.written()
        self.exchange.outcome = outcome
        await self._hold_only_the_cost()
        self.exchange.status_code = status
        self.exchange.finished_at = datetime.now(UTC)
        await self.on_finish(self.exchange)

    async def _record_success(self, c: Candidate) -> None:
        remembered = Remembered(self.exchange.key_id, self.memory, self.response_id, self.file_id)
        await self.health.success(c, probe=self.probe, remembered=remembered, headroom=self.headroom)

    # -- the loop ----------------------------------------------------------------------------

    async def _admit(self, c: Candidate, later: Sequence[Candidate]) -> tuple[bool, CircuitKey | None]:
        """(dispatch?, the circuit whose probe it holds). Re-gates for the deadline spent so far (no
        attempt with less than `retry.min_attempt_ms` left), re-reads health the view may be too
        old for (`HealthWrites.current`) and takes a probe when one is admissible."""
        remaining_ms = max(int((self.deadline - time.monotonic()) * 1000), 0)
        verdict = evaluate(c, replace(self.requirements, deadline_remaining_ms=remaining_ms))
        if verdict.eligible and not await self._reserve(verdict.reservation_micros):
            verdict = replace(verdict, reasons=(IneligibleReason.BUDGET,))
        if not verdict.eligible:
            self._pass_over(c, verdict.reason)
            return False, None
        if (current := await self.health.current(c, later, read_by=self.exchange.started_at)) is None:
            self._pass_over(c, IneligibleReason.CIRCUIT_OPEN)
            return False, None
        c = current
        if c.health is Health.HELD and self.lease is not None and self.lease.candidate == c.key:
            lease, self.lease = self.lease, None  # taken before dispatch: this attempt uses it
            return True, lease.circuit
        if c.health is not Health.PROBE:
            return True, None
        key, snapshot = probe_circuit(self.view, self.route_class, c)
        try:
            won = await db.write_within(
                db_wait_s(self.deadline),
                partial(
                    services.circuit_take_probe,
                    key=key,
                    settings=self.breaker_settings,
                    now=datetime.now(UTC),
                    seen=Seen(snapshot),
                ),
                undo=lambda taken: taken and services.circuit_release_probe(key=key),
            )
        except DatabaseError:
            won = False  # as if another request had it: the database decides nothing (in time)
        if won:
            return True, key
        if breaker.blocked_health(snapshot.reason if snapshot else None) is Health.BLOCKED:
            self._pass_over(c, IneligibleReason.CIRCUIT_OPEN)
            return False, None
        return True, None

    async def _reserve(self, reservation: int | None) -> bool:
        """Hold the candidate's reservation on a key with a budget before dispatch (SPEC §7.4): one
        conditional UPDATE, only for what this request does not hold yet (a dearer later candidate
        tops it up). False: the budget cannot cover it, and the candidate is passed over."""
        exchange = self.exchange
        need = (reservation or 0) - exchange.reserved_micros
        if self.requirements.budget_remaining_micros is None or exchange.key_id is None or need <= 0:
            return True
        budget = {"key_id": exchange.key_id, "period": exchange.budget_period}
        request = {**budget, "request_id": exchange.request_id, "amount": need}
        # Journaled before the UPDATE is sent: a process that dies with it in flight (or with its
        # answer not yet heard) is settled from its journal, by what the database holds for the
        # request (pools.BudgetHold), whether or not the UPDATE committed.
        exchange.reserving = True
        ledger.writer.held(exchange)

        def give_back(taken: bool) -> None:
            """Granted after the request stopped waiting. If the database fails the give-back too,
            the request's record may be settled already: its hold is journaled for good, and the
            writer that replays this process's journal releases it."""
            if not taken:
                return
            try:
                key_budget_give_back(**request, now=datetime.now(UTC))
            except DatabaseError:
                ledger.writer.held(exchange, lasting=True)
                raise

        now = datetime.now(UTC)
        try:
            try:  # on the loop (PostgreSQL): no thread's hand-back to wait for
                changed = await loopdb.write_within(
                    db_wait_s(self.deadline),
                    *key_budget_reserve_statement(**request, now=now),
                    undo=lambda late: give_back(late == 1),
                )
                held = changed == 1
            except loopdb.NoConnection:  # SQLite, or no connection to give: on a thread
                held = await db.write_within(
                    db_wait_s(self.deadline), partial(key_budget_reserve, **request, now=now), undo=give_back
                )
        except DatabaseError as failed:  # no reservation, no dispatch
            if isinstance(failed, db.DatabaseTimeout):  # what it takes late is given back (undo)
                logger.warning("budget reservation: no answer from the database by the deadline")
            else:  # if it committed all the same, the request's ledger record settles its hold
                logger.exception("budget reservation failed")
            self.budget_unreachable = True
            return False
        if held:
            exchange.reserved_micros += need
        return held

    async def _hold_only_the_cost(self) -> None:
        """Before the client has the answer, shrink the request's budget hold to what it cost (SPEC
        §7.4): the key's next request, sent as soon as this one is answered, finds only this one's
        cost held, not its whole reservation waiting for the ledger's batch (which then moves what is
        held into the spend). An attempt that may have run upstream without reporting usage keeps all
        of it (`charge_micros`)."""
        exchange = self.exchange
        spare = exchange.reserved_micros - charge_micros(exchange, exchange.reserved_micros)
        if spare <= 0 or exchange.key_id is None:
            return
        release = {"key_id": exchange.key_id, "request_id": exchange.request_id, "amount": spare}
        try:
            try:  # on the loop (PostgreSQL), as the reservation
                await loopdb.write_within(db_wait_s(self.deadline), *key_budget_release_statement(**release))
            except loopdb.NoConnection:
                await db.write_within(db_wait_s(self.deadline), partial(key_budget_release, **release))
        except DatabaseError:  # the ledger's record settles the whole hold, as it always did
            logger.warning("budget: a finished request's spare reservation waits for its ledger record")
            return
        exchange.reserved_micros -= spare

    async def answered(self) -> None:
        """The gateway answered the request itself and sent nothing (a websocket prewarm on a bridged
        account, `proxy.ws_relay.prewarm`): it ends `ok` with no attempt, and what it held (a probe
        lease, a limits ticket) is given back."""
        await self._finish(Outcome.OK, 200)

    async def run(self) -> Final | Stream:
        try:
            return await self._run()
        except asyncio.CancelledError:
            # The client left (between attempts too: while a reservation, a probe lease or a backoff
            # was awaited): recorded as cancelled, and what it held of a budget settled with it.
            if self.exchange.finished_at is None:
                await settle(self._end_cancelled(self.probe))
            raise

    async def _run(self) -> Final | Stream:
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
            admitted, probe = await self._admit(c, order[index + 1 :])
            self.probe = probe
            if not admitted:
                index = self._after_passed_over(order, index)
                continue
            if handing_off is not None:
                # Only now has the request really been handed on (SPEC §5.6): a next candidate that
                # turned out ineligible at its turn leaves the failed attempt `failed`.
                handing_off.status = AttemptStatus.RETRYABLE_FAILED
                self.exchange.retry_count += 1
                handing_off = None
            started = time.monotonic()
            log = self._log(c, AttemptStatus.FAILED)
            try:
                # One wall-clock bound over connect, send and read (§6.0): the whole plain answer, or a
                # stream's first visible event. A dripping upstream is cut like a hanging one.
                async with asyncio.timeout(max(self.deadline - time.monotonic(), 0)):
                    result = await self._attempt(c, log, call)
            except TimeoutError:
                # The client's own deadline is neutral for the circuit; the gateway's default one is its
                # own timeout and cools a hung account (else, with the shipped defaults, never cooled).
                cut = TransportEvent.DEADLINE if self.client_deadline else TransportEvent.GATEWAY_DEADLINE
                result = Failure.observed(Observation(transport=cut))
            except asyncio.CancelledError:
                log.status, log.failure_class = AttemptStatus.CANCELLED, FailureClass.CANCELLED
                log.dispatch_state = DispatchState.UNKNOWN
                log.elapsed_ms = int((time.monotonic() - started) * 1000)
                raise
            log.elapsed_ms = int((time.monotonic() - started) * 1000)
            if not isinstance(result, Failure):
                self.exchange.served_model = c.model
                self.exchange.model_fallback = c.cross_model
                return await self._succeed(c, log, result)
            last, self.last_candidate = result, c
            log.cost_micros = attempt_cost(c, log)  # usage an upstream reported with its failure
            log.failure_class = str(result.failure)
            log.dispatch_state = str(result.dispatch)
            log.upstream_status = result.status
            log.error_code = result.code or ""
            self.health.failure(c, result.failure, probe, result.retry_after, self.headroom)
            nxt = None if self.single_attempt else next_candidate(order, index, result.disposition)
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
            for a in self.exchange.attempts
            if a.status == AttemptStatus.INELIGIBLE and a.ineligible_reason == circuit_open
        }
        primary = [c.key for c in self.plan.order if not c.cross_model]
        primary += [v.candidate.key for v in self.plan.ineligible if not v.candidate.cross_model]
        return bool(primary) and all(key in blocked for key in primary)

    def _upstream_call(self, c: Candidate) -> UpstreamCall | None:
        """The request `c` would be sent, or None when the client's request cannot be expressed in
        its API: the candidate is passed over as incapable, and nothing is sent."""
        built, self.first_call = self.first_call, None  # for the first candidate tried only
        if built is not None and built[0] == c.key:
            return built[1]
        try:
            return call_for(self.path, self.view, c, self.body, self.requirements, self.client_headers)
        except RequestTranslationError as refused:
            self._pass_over(c, IneligibleReason.CAPABILITY, refused.param)
            return None

    async def _end_cancelled(self, probe: CircuitKey | None) -> None:
        if probe is not None:
            await db.write(services.circuit_release_probe, key=probe)
        await self._finish(Outcome.CANCELLED, 499)

    async def _backoff(self) -> None:
        # Full jitter, inside the one deadline of the whole sequence.
        hops = self.exchange.attempts_made
        delay = random.uniform(0, self.backoff_base_ms / 1000 * (2 ** min(hops - 1, 6)))  # noqa: S311
        await asyncio.sleep(min(delay, max(self.deadline - time.monotonic(), 0)))

    # -- one attempt -------------------------------------------------------------------------

    async def _attempt(self, c: Candidate, log: AttemptLog, call: UpstreamCall) -> Failure | Final | Stream:
        sent = time.monotonic()
        self.headroom = None  # until this attempt's answer says
        opened = await self.dispatch.open(c, call, stream=self.dialect is not None)
        if isinstance(opened, Failure):
            return opened
        log.upstream_status = opened.status
        # Its time to first byte (routing.policy.latency): to its headers over HTTP, which an LLM upstream
        # sends
        # once a plain answer is generated (so its short body, read with them, adds next to nothing).
        log.ttfb_ms = int((time.monotonic() - sent) * 1000)
        if isinstance(opened, Answer):
            self._heard(log, opened.headroom)
            result, response_id = plain_answer(opened, call, candidate=c, log=log, exchange=self.exchange)
            if isinstance(result, Final):
                self.file_id = opened.file_id
                self.response_id = response_id if self.memory.response_ids else None
            return result
        if isinstance(opened, Body):
            return Stream(relay_body(opened, log, partial(self._end_output, c, log, None)))
        assert self.dialect is not None
        self._heard(log, opened.headroom)
        stream = AttemptStream(
            opened,
            call,
            candidate=c,
            log=log,
            exchange=self.exchange,
            client_dialect=self.dialect,
            framing=self.dispatch,
            response_ids=self.memory.response_ids,
            ended=lambda outcome, status: self._end_output(c, log, stream, outcome, status),
        )
        result = await stream.first_output()
        if opened.first_event_at is not None:  # a websocket's first byte is its first event
            log.ttfb_ms = int((opened.first_event_at - sent) * 1000)
        return result

    def _heard(self, log: AttemptLog, headroom: Headroom | None) -> None:
        """What the attempt's answer said of its rate limits: for its demotion (HealthWrites) and, on
        its log, for the ledger writer to keep beside the latency average (the draw's headroom)."""
        self.headroom = headroom
        if headroom is not None:
            least = headroom.least
            log.headroom_left, log.headroom_until = least.left, least.resets_at

    async def _end_output(
        self, c: Candidate, log: AttemptLog, stream: AttemptStream | None, outcome: str, status: int
    ) -> None:
        """A relayed stream or body ended; its attempt's log says how."""
        if stream is not None:
            self.response_id = stream.response_id  # the released attempt's: the one the client was given
        if log.status == AttemptStatus.SUCCEEDED:
            log.cost_micros = attempt_cost(c, log)
            await self._record_success(c)
        elif stream is not None and stream.failed_after_output is not None:
            # `_finish` awaits it
            self.health.failure(c, stream.failed_after_output, self.probe, headroom=self.headroom)
        elif self.probe is not None:  # a verdict-free end (upstream_interrupted, cancelled) frees it (§7.1)
            await self.health.release_probe(self.probe)
        await self._finish(outcome, status)

    async def _succeed(self, c: Candidate, log: AttemptLog, result: Final | Stream) -> Final | Stream:
        if isinstance(result, Stream):
            return result
        log.status, log.dispatch_state = AttemptStatus.SUCCEEDED, DispatchState.COMPLETED
        log.cost_micros = attempt_cost(c, log)
        await self._record_success(c)
        await self._finish(self.exchange.outcome or Outcome.OK, result.status)
        return result

    # -- the typed failure -------------------------------------------------------------------

    async def _final_failure(self, last: Failure | None) -> Final:
        unserved = Unserved(
            last=last,
            window=self.last_candidate.context_window if self.last_candidate else None,
            excluded=self.excluded,
            untranslatable=self.untranslatable,
            budget_unreachable=self.budget_unreachable,
        )
        if (
            last is None
            and exclusion(unserved, self.plan) is IneligibleReason.BUDGET
            and self.exchange.key_id
        ):
            try:
                refusal = await db.run(budget_refusal, self.exchange.key_id, datetime.now(UTC))
            except DatabaseError:  # the typed answer without its amounts
                refusal = None
            unserved = replace(unserved, budget_refusal=refusal)
        outcome, status, final = unserved_answer(
            unserved,
            plan=self.plan,
            path=self.path,
            body=self.body,
            tokens=self.requirements.estimated_tokens,
            dialect=self.dialect,
            framing=self.dispatch,
        )
        await self._finish(outcome, status)
        return final
