"""What one request's attempts write of routing state (SPEC §5.4, §7.1, §7.2): circuit and demotion
transitions after a failure or a success, probe slots freed, and the affinities a success records.

Headroom (SPEC §5.4): an attempt whose answer reported less than its assignment's `headroom_floor` of a
rate limit left (`routing.policy.headroom`) demotes (assignment, model) until that limit resets, whether the
attempt succeeded or failed; a success that reports ample headroom resolves a demotion as any success
does, and one still under the floor keeps it (extended to the new reset) instead. With the pool features
off (`GATEWAY_POOL_FEATURES`) no headroom demotion is written.

Writes go through the routing services, one trip to the database each. A success on a healthy
candidate with ample headroom writes nothing. Failure writes start at once and run while the request is
handed on; `written()` waits for them, so one request's writes stay in order and are all done before the
exchange is finished (what a later request or a reader of the response sees is unchanged). When the
database refuses a write, the request goes on and the loss is logged (no content).
"""

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial

from django.conf import settings
from django.db import DatabaseError

from proxy.ledger.exchange import Memory
from routing import services
from routing.models import AffinityKind
from routing.policy import breaker, preference
from routing.policy.breaker import BreakerSettings, CircuitSnapshot
from routing.policy.failures import FailureClass, circuit_reason, demotion_reason, proves_credential
from routing.policy.headroom import Headroom
from routing.policy.route import RoutingView
from routing.policy.types import Candidate, CircuitReason, Health, RouteClass
from routing.services import CircuitKey, Seen
from runtime import db

logger = logging.getLogger("gateway")

RESPONSE_AFFINITY_TTL = timedelta(days=30)  # as long as the providers keep stored responses
SESSION_AFFINITY_TTL = timedelta(hours=1)
# Uploaded files stay until deleted (OpenAI keeps them indefinitely); a year bounds a forgotten one.
FILE_AFFINITY_TTL = timedelta(days=365)
DB_WAIT_FLOOR_S = 0.5  # a request's shortest wait for a database write (see db_wait_s)
# The share of the shortest cooldown for which a request trusts the circuits it read (see
# HealthWrites.current): the rest allows for a failure write committing after its cooldown started.
TRUSTED_SHARE = 0.5


def probe_circuit(
    view: RoutingView, route_class: RouteClass, c: Candidate
) -> tuple[CircuitKey, CircuitSnapshot | None]:
    """The circuit that governs `c`'s health (its own, or its assignment-wide credential circuit
    while that is not closed) as this request read it: where a probe lease is taken and freed."""
    pool_id = view.targets[c.assignment_id].pool_id
    snapshot, wide = breaker.governing(view.circuits.get(c.key), view.wide.get(c.assignment_id))
    if wide:
        return CircuitKey.wide(pool_id, c.assignment_id), snapshot
    return CircuitKey(pool_id, c.assignment_id, c.model, route_class), snapshot


def db_wait_s(deadline: float) -> float:
    """How long a request waits for one database write: what is left of its deadline (a stalled
    database must not hold it past it), at least DB_WAIT_FLOOR_S (a stream past its deadline still
    gets its final writes, e.g. the response id a next turn needs)."""
    return max(deadline - time.monotonic(), DB_WAIT_FLOOR_S)


async def write_state(deadline: float, write, *args) -> None:
    """Health and affinity writes, in one trip to the database. They inform later requests; when the
    database refuses one, or has not answered by the deadline, this request goes on and the loss is
    logged (no content)."""
    try:
        await db.write_within(db_wait_s(deadline), partial(write, *args))
    except db.DatabaseTimeout:
        # The designed give-up (the request does not wait past its deadline): a line, no traceback.
        logger.warning("routing state could not be saved: the database did not answer in time")
    except DatabaseError:
        logger.exception("routing state could not be saved")


@dataclass(frozen=True, slots=True)
class Remembered:
    """What a success records of affinities (SPEC §7.2): the request's `Memory`, and the ids its
    answer carried."""

    owner: int | None  # the request's key: every affinity has its key
    memory: Memory
    response_id: str | None
    file_id: str | None

    def __bool__(self) -> bool:
        memory = self.memory
        return bool(
            (memory.response_ids and self.response_id)
            or memory.session
            or (memory.file_upload and self.file_id)
            or memory.file_deleted
        )

    def record(self, c: Candidate) -> None:
        now = datetime.now(UTC)
        owner, memory = self.owner, self.memory
        assert owner is not None  # an authenticated request: every affinity has its key (SPEC §7.2)
        if memory.response_ids and self.response_id:
            services.affinity_record(
                gateway_key_id=owner,
                kind=AffinityKind.RESPONSE,
                key=self.response_id,
                assignment_id=c.assignment_id,
                ttl=RESPONSE_AFFINITY_TTL,
                now=now,
            )
        if memory.file_upload and self.file_id:
            services.affinity_record(
                gateway_key_id=owner,
                kind=AffinityKind.FILE,
                key=self.file_id,
                assignment_id=c.assignment_id,
                ttl=FILE_AFFINITY_TTL,
                now=now,
            )
        if memory.file_deleted:
            services.affinity_forget(gateway_key_id=owner, kind=AffinityKind.FILE, key=memory.file_deleted)
        if memory.session and memory.session_seen != (c.assignment_id, c.model):
            services.affinity_record(
                gateway_key_id=owner,
                kind=AffinityKind.SESSION,
                key=memory.session,
                assignment_id=c.assignment_id,
                model=c.model,
                ttl=SESSION_AFFINITY_TTL,
                now=now,
            )


class HealthWrites:
    """One request's routing-state writes, in the order its attempts ended."""

    def __init__(
        self,
        *,
        view: RoutingView,
        route_class: RouteClass,
        breaker_settings: BreakerSettings,
        demotion_seconds: int,
        deadline: float,
    ) -> None:
        self.view = view
        self.route_class = route_class
        self.breaker_settings = breaker_settings
        self.demotion_seconds = demotion_seconds
        self.deadline = deadline  # the request's: it bounds each wait on the database (db_wait_s)
        # The failure writes still running (see `failure`), in submission order.
        self.pending: asyncio.Future[None] | None = None

    async def release_probe(self, key: CircuitKey) -> None:
        """A verdict-free end (SPEC §7.1): the probe slot is free for the next request."""
        await write_state(self.deadline, partial(services.circuit_release_probe, key=key))

    def headroom_demotion(self, c: Candidate, headroom: Headroom | None) -> services.Demote | None:
        """The demotion `c`'s answer asks for by its rate-limit headers: None while headroom is ample."""
        if headroom is None or not settings.GATEWAY_POOL_FEATURES:
            return None
        until = headroom.demote_until(self.view.targets[c.assignment_id].headroom_floor)
        if until is None:
            return None
        return services.Demote(c.assignment_id, c.model, CircuitReason.HEADROOM, until)

    def circuit_key(self, c: Candidate) -> CircuitKey:
        pool_id = self.view.targets[c.assignment_id].pool_id
        return CircuitKey(pool_id, c.assignment_id, c.model, self.route_class)

    async def current(
        self, c: Candidate, later: Sequence[Candidate], *, read_by: datetime
    ) -> Candidate | None:
        """`c` as it stands now, or None when it is not to be tried now (the view was read by
        `read_by`). A circuit this request read closed can have opened, cooled down and gone half-open
        (another request's probe in flight) only after a cooldown, counted from when the failure that
        opened it was computed: that can be before the view was read, when the failure's write
        committed after it (a row lock, a busy database). So a view is trusted as read only while
        younger than half the shortest cooldown (TRUSTED_SHARE: the failure write may lag that much
        behind its computation); an older one (the request waited on a stalled database, or on slow
        attempts) is read again for the candidate about to be dispatched, which then goes after
        every closed one (SPEC §5.4, §7.1: only the lease holder tries a half-open assignment first)."""
        settings = self.breaker_settings
        if c.health is Health.COOLING:
            # Open with its cooldown running when the view was read, and reached last: once the
            # cooldown is over, a dispatch to it is a probe, taken with the lease like any other.
            snapshot, _ = breaker.governing(
                self.view.circuits.get(c.key), self.view.wide.get(c.assignment_id)
            )
            cooled = breaker.health(snapshot, settings, datetime.now(UTC)) is Health.PROBE
            return replace(c, health=Health.PROBE) if cooled else c
        if c.health not in (Health.HEALTHY, Health.FAILING):
            return c
        shortest = timedelta(seconds=min(settings.cooldown_seconds, settings.max_cooldown_seconds))
        if datetime.now(UTC) - read_by < shortest * TRUSTED_SHARE:
            return c
        key = self.circuit_key(c)
        try:
            snapshot = await db.run_within(db_wait_s(self.deadline), services.circuit_governing, key=key)
        except DatabaseError:
            return c  # no fresher health to be had: the view's
        now = replace(c, health=breaker.health(snapshot, settings, datetime.now(UTC)))
        if now.health is Health.BLOCKED:
            return None  # open for the model's withdrawal: not dispatched at all
        if preference.group(now) == preference.group(c) or not any(preference.group(o) < 3 for o in later):
            return now
        return None

    async def written(self) -> None:
        """Wait for the failure writes started so far (they log their own errors)."""
        if self.pending is not None:
            await asyncio.shield(self.pending)

    async def success(
        self,
        c: Candidate,
        *,
        probe: CircuitKey | None,
        remembered: Remembered,
        headroom: Headroom | None = None,
    ) -> None:
        await self.written()  # the failures before it first: one request's writes stay in order
        # A probe taken since the plan was read changed the row: then the CAS re-reads.
        probed = probe is not None
        seen = None if probed else Seen(self.view.circuits.get(c.key))
        wide = self.view.wide.get(c.assignment_id)
        writes = probed or (seen is not None and seen.snapshot is not None and not seen.snapshot.clean)
        wide_writes = wide is not None and not wide.clean
        low = self.headroom_demotion(c, headroom)
        if remembered or writes or wide_writes or c.demoted or low:
            await write_state(self.deadline, self._success, c, seen, remembered, writes, wide_writes, low)

    def _success(
        self,
        c: Candidate,
        seen: Seen | None,
        remembered: Remembered,
        writes: bool,
        wide_writes: bool,
        low: services.Demote | None,
    ) -> None:
        if remembered:
            remembered.record(c)
        key = self.circuit_key(c)
        if writes:
            services.circuit_record_success(key=key, seen=seen)
        if wide_writes:  # the credential works again: the assignment-wide circuit closes
            services.circuit_record_success(key=CircuitKey.wide(key.pool_id, c.assignment_id))
        if low is not None:  # served, yet nearly spent: it stays demoted (whatever for) until the reset
            services.demotion_record(low)
        elif c.demoted:
            services.demotion_resolve(assignment_id=c.assignment_id, model=c.model)

    def failure(
        self,
        c: Candidate,
        failure: FailureClass,
        probe: CircuitKey | None,
        retry_after: int | None = None,
        headroom: Headroom | None = None,
    ) -> None:
        """Starts the failure's circuit and demotion writes and returns at once: they run while the
        request is handed to the next candidate (they were about 2 ms of every failover, before the
        next dispatch). Each runs after the previous one, and `written` (awaited before any success
        write and before the exchange is finished, so before the client's answer ends) waits for
        them all."""
        low = self.headroom_demotion(c, headroom)
        if (
            circuit_reason(failure) is None
            and demotion_reason(failure) is None
            and probe is None
            and low is None
        ):
            return
        previous = self.pending

        async def write() -> None:
            if previous is not None:
                await asyncio.wait([previous])  # its order, not its outcome: it reports its own
            await write_state(self.deadline, self._failure, c, failure, probe, retry_after, low)

        # A task of its own: it completes even when this request is cancelled meanwhile.
        self.pending = asyncio.ensure_future(write())

    def _failure(
        self,
        c: Candidate,
        failure: FailureClass,
        probe: CircuitKey | None,
        retry_after: int | None,
        low: services.Demote | None,
    ) -> None:
        reason = circuit_reason(failure)
        demotion = demotion_reason(failure)
        now = datetime.now(UTC)
        key = self.circuit_key(c)
        seen: Seen | None = Seen(self.view.circuits.get(c.key))
        if reason is CircuitReason.CREDENTIAL_REJECTED:
            # The credential or account, not this model: one circuit for the whole assignment.
            key = CircuitKey.wide(key.pool_id, c.assignment_id)
            seen = Seen(self.view.wide.get(c.assignment_id))
        if probe is not None:
            seen = None  # the probe changed the row since it was read: the CAS reads it again
            if probe.is_wide and probe != key and proves_credential(failure):
                # The credential's probe got an answer only an accepted credential gets (the model is
                # missing, a 400, a 429): the credential circuit closes, and the failure counts where it
                # belongs. Freeing the slot instead let every next request probe the account again.
                services.circuit_record_success(key=probe)
            elif reason is None or probe != key:
                # A verdict-free end for the circuit whose probe was held (a 400, a 429, the client's
                # deadline; or a transient failure while probing the credential): free the slot.
                services.circuit_release_probe(key=probe)
        demote = None
        if demotion is not None:
            # 429/quota: until the upstream's retry-after (bounded) when it sent one.
            seconds = (
                retry_after if retry_after is not None and demotion is CircuitReason.RATE_LIMITED else None
            )
            until = now + timedelta(seconds=self.demotion_seconds if seconds is None else seconds)
            demote = services.Demote(c.assignment_id, c.model, demotion, until)
        if low is not None and (demote is None or low.until > demote.until):
            demote = low  # its headers say it is spent for longer than the failure's own demotion
        services.failure_record(
            key=key, reason=reason, settings=self.breaker_settings, now=now, seen=seen, demote=demote
        )
