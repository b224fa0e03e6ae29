"""The ledger writer: records finished exchanges off the client's critical path (SPEC §7.3).

`record` is every ingress's `on_finish`: the metrics, the ledger and one log line per request.
A request hands its Exchange to `submit` and returns at once; one writer thread per process saves
them in batches, each batch in one transaction. `flush` waits until everything submitted so far is
saved (or spooled to local disk, `proxy.ledger.spool`, while the database is unreachable); it runs at
interpreter exit (daphne and uvicorn both exit normally on SIGTERM after their graceful shutdown),
so a graceful stop loses no record. A killed process (SIGKILL, OOM) cannot flush: every record is
appended to the process's journal (`proxy.ledger.spool.Journal`) as it is submitted, and a later writer
(another worker, the restarted server, any process on that spool directory) replays what a dead
process's journal still holds.

The writer lingers up to LINGER_S after the first record of a batch for more to arrive, asleep (a
record submitted meanwhile does not wake it; a flush or a full batch does). A batch costs about as
much for one record as for ten: on PostgreSQL about 1.1 ms of the writer's CPU (holding the GIL) and
1.1 ms of the database backend's, then about 0.13 ms of each per record (bench/profile.md). Lingering
0.1 s holds that fixed cost to ten batches a second at any load, where 20 ms let it be fifty: at
c=16 about 0.3 ms of CPU per request (gateway and database) less. The ledger is that much later,
never lost (the journal holds each record meanwhile); a budget hold is settled that much later.
`flush` cuts the linger short.
"""

import asyncio
import atexit
import collections
import json
import logging
import queue
import threading
import time
from datetime import UTC, datetime, timedelta

from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connection,
    transaction,
)

from proxy.ledger import tracing
from proxy.ledger.exchange import AttemptLog, Exchange
from proxy.ledger.metrics import observe_exchange
from proxy.ledger.spool import Journal, Spool
from routing.policy import latency
from routing.policy.errors import ErrorCode
from routing.policy.vocabulary import AttemptStatus
from runtime import db

log = logging.getLogger("gateway")

BATCH = 200
LINGER_S = 0.1  # how long a batch may wait for company: the ledger is this much later, never lost
RETRIES = 3  # about 0.15 s of backoff, then the batch goes to the spool
REPLAY_EVERY_S = 1.0  # how often a writer with spooled records tries the database again
PRUNE_EVERY_S = 60.0


_FLUSH = object()  # a marker in the queue: save what is taken now, without lingering


class LedgerWriter:
    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Exchange, int | None] | object] = queue.Queue()
        self._hurry = threading.Event()  # ends the writer's linger at once (a flush, a full batch)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._next_prune = 0.0  # monotonic time of the next affinity prune (see `_prune`)
        self.spool = Spool()
        self.journal = Journal(self.spool)
        self.spool_pending = False  # records wait in the spool (checked when the thread starts)

    def submit(self, exchange: Exchange) -> None:
        self._ensure_thread()
        self._queue.put((exchange, self.journal.add(exchange)))
        if self._queue.qsize() + 1 >= BATCH:  # with the record a lingering writer already holds
            self._hurry.set()

    def held(self, exchange: Exchange, *, lasting: bool = False) -> None:
        """The request is about to reserve part of its key's budget: journaled first, so that a
        reservation its process dies with (committed or not yet) is settled by the writer that
        replays the journal. `lasting`: a reservation granted late whose give-back failed, which the
        request's record may have missed: settled from the journal once this process is gone."""
        self.journal.hold(exchange, lasting=lasting)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every exchange submitted before this call is saved (or `timeout` passes), and
        observe (count and log) every one still waiting for that."""
        observations.drain()
        with self._queue.all_tasks_done:
            if self._queue.unfinished_tasks == 0:
                return True
        self._queue.put(_FLUSH)
        self._hurry.set()  # ends a lingering batch at once
        with self._queue.all_tasks_done:
            return self._queue.all_tasks_done.wait_for(lambda: self._queue.unfinished_tasks == 0, timeout)

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="ledger-writer", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        from proxy.ledger.services import request_records_write

        self.spool_pending = self.spool.pending()  # left by this process or by one that is gone
        while True:
            try:
                # While records wait in the spool, wake up now and then to replay them.
                taken = [self._queue.get(timeout=REPLAY_EVERY_S if self.spool_pending else None)]
            except queue.Empty:
                self._replay()
                continue
            if taken[0] is not _FLUSH and self._queue.qsize() + 1 < BATCH:
                # What arrives meanwhile waits in the queue: the thread is not woken for each record
                # (a wake-up and a GIL hand-off per request), only by a flush or a full batch. A full
                # batch already waiting (left from a burst the last batch did not take) is taken at once.
                self._hurry.wait(LINGER_S)
            self._hurry.clear()
            while len(taken) < BATCH and taken[-1] is not _FLUSH:
                try:
                    taken.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self.journal.rotate()  # what arrives from now on goes to a segment of its own
            entries: list[tuple[Exchange, int | None]] = [x for x in taken if isinstance(x, tuple)]
            batch = [exchange for exchange, _ in entries]
            try:
                reached = self._save(batch, request_records_write) if batch else False
                if reached:
                    self._fold_latencies(batch)
                if reached and self.spool_pending:  # the database is back: empty the spool
                    self._replay()
                self._prune()
            except Exception:
                log.exception("ledger: %d request records could not be saved", len(batch))
            finally:
                for exchange, segment in entries:
                    self.journal.saved(exchange.request_id, segment)  # saved, spooled, or given up on
                if self._queue.empty():
                    close_old_connections()  # an idle writer holds no connection past CONN_MAX_AGE
                for _ in taken:
                    self._queue.task_done()

    @staticmethod
    def _fold_latencies(batch: list[Exchange]) -> None:
        """The batch's succeeded attempts' times to first byte, folded into each (assignment, model)'s
        moving average (SPEC §5.4, `routing.policy.latency`): one statement for the batch, after its records
        are saved, none when no attempt has a sample. A request pays nothing for it, and every node's
        router reads the same average. A failure here costs the batch's samples, never its records.
        A spooled batch's samples are not folded when it is replayed: they are old news by then."""
        from routing.services import headrooms_record, latencies_record

        served = [
            a
            for x in batch
            for a in x.attempts
            # A route's model only: an account-wide attempt (the Files API, model "") is no model's latency.
            if a.ttfb_ms is not None and a.status == AttemptStatus.SUCCEEDED and a.model
        ]
        if not served:
            return
        samples = [(a.assignment_id, a.model[:200], a.ttfb_ms, a.placed) for a in served]
        # The latest headroom each pair reported in the batch (a later answer knows better), kept beside its
        # latency: the draw scales the account's share by it until its limit resets (SPEC §5.4).
        headrooms = {
            (a.assignment_id, a.model[:200]): (a.headroom_left, a.headroom_until)
            for a in served
            if a.headroom_left is not None and a.headroom_until is not None
        }
        try:
            latencies_record(folds=latency.folds(samples), now=datetime.now(UTC))
            headrooms_record(latest=headrooms)
        except DatabaseError:
            log.exception("ledger: %d latency samples could not be saved", len(samples))

    def _prune(self) -> None:
        """Expired affinities are deleted here, off every request's path: at most one bounded batch
        per PRUNE_EVERY_S on a node that is writing its ledger anyway (SPEC §7.2). A quiet node
        prunes nothing; `manage.py prune_affinities` empties any backlog. At the same pace the
        writer looks for journals and spools that processes gone since it started left behind."""
        now = time.monotonic()
        if now < self._next_prune:
            return
        self._next_prune = now + PRUNE_EVERY_S
        try:
            self.spool_pending = self.spool_pending or self.spool.pending()
        except OSError:
            log.exception("ledger: the spool directory could not be read")
        from routing.services import affinity_prune

        try:
            affinity_prune(now=datetime.now(UTC))
        except DatabaseError:
            log.exception("ledger: expired affinities could not be pruned")

    def _save(self, batch: list[Exchange], write) -> bool:
        """A transient failure (a lock, a restart) is retried briefly with backoff; a database that
        stays unreachable gets the batch spooled to local disk (`proxy.ledger.spool`), replayed once it is
        back. A batch that the database refuses for its data is saved record by record, so one bad
        record cannot take the others with it; a record refused alone is recorded sanitized
        (`_save_refused`). Nothing of a refused record's content is logged."""
        for attempt in range(RETRIES):
            try:
                db.reuse()  # the connection aged, and checked only when it may be broken
                write(exchanges=batch)
                return True
            except (OperationalError, InterfaceError):
                connection.close()
                if attempt == RETRIES - 1:
                    self._spool(batch)
                    return False
                time.sleep(min(0.05 * 2**attempt, 2.0))
            except (DatabaseError, ValueError):
                if len(batch) == 1:
                    try:
                        self._save_refused(batch[0], write)
                    except (OperationalError, InterfaceError):  # settled when its replay is refused
                        connection.close()
                        self._spool(batch)
                        return False
                    return True
                for one in batch:
                    self._save([one], write)
                return True
        return False

    def _save_refused(self, exchange: Exchange, write) -> None:
        """A record the database refused for its data (a number out of its column's range) is
        recorded sanitized (`proxy.ledger.services.sanitized`: its numbers nulled, its attempts flagged), its
        hold released and its reservation charged with it. Refused even so, the record is lost but its
        hold is still settled (`_settle_refused`). A database that is away is the caller's."""
        from proxy.ledger.services import sanitized

        log.warning(
            "ledger: request record %s refused by the database, recorded with its numbers nulled",
            exchange.request_id,
        )
        try:
            write(exchanges=[sanitized(exchange)])
        except (OperationalError, InterfaceError):
            raise
        except (DatabaseError, ValueError):
            log.exception("ledger: a request record was refused by the database")
            self._settle_refused([exchange])

    @staticmethod
    def _settle_refused(batch: list[Exchange]) -> None:
        """The record is lost, but what its request held of a budget is still released (and what it
        cost still charged): a refused record must not shrink its key's budget for good. A database
        that is away (OperationalError, InterfaceError) is the caller's: the record is kept in the
        spool, and its replay, refused again, settles it then."""
        from proxy.ledger.services import exchanges_settle

        try:
            with transaction.atomic():
                exchanges_settle(exchanges=batch)
        except (OperationalError, InterfaceError):
            raise
        except DatabaseError:
            log.exception("ledger: a refused record's budget reservation could not be settled")

    def _spool(self, batch: list[Exchange]) -> None:
        try:
            self.spool.append(batch)
        except OSError:
            log.exception("ledger: %d request records could not be saved or spooled", len(batch))
            return
        self.spool_pending = True
        log.warning("ledger: database unreachable, %d request records spooled to disk", len(batch))

    def _replay(self) -> None:
        """Replay the spool (idempotent by request id); on a database still away, try again later."""
        from proxy.ledger.services import request_records_write

        def idempotent(*, exchanges: list[Exchange]) -> None:
            request_records_write(exchanges=exchanges, idempotent=True)

        def write(batch: list[Exchange]) -> None:
            try:
                idempotent(exchanges=batch)
            except (OperationalError, InterfaceError):
                raise
            except (DatabaseError, ValueError):
                if len(batch) == 1:
                    self._save_refused(batch[0], idempotent)
                    return
                for one in batch:
                    write([one])

        try:
            close_old_connections()
            replayed = self.spool.replay(write)
        except (OperationalError, InterfaceError):
            connection.close()
            return
        except OSError:
            log.exception("ledger: the spool could not be read")
            return
        self.spool_pending = self.spool.pending()
        if replayed:
            log.warning("ledger: %d spooled request records replayed", replayed)


writer = LedgerWriter()
atexit.register(writer.flush)


async def record(exchange: Exchange) -> None:
    """Hands the finished exchange to the ledger writer: journaled now, saved off the critical path.
    Its observation (the metrics, the trace, the log line) waits in `observations` for the next batch,
    at most OBSERVE_EVERY_S. The journal stays before the answer: an answered request always has a
    record that outlives the process."""
    exchange.finished_at = exchange.finished_at or datetime.now(UTC)
    writer.submit(exchange)
    observations.add(exchange)


# How long a finished request may wait to be counted in the metrics and logged. Observed one by one,
# right after each answer, the metrics and the log line cost a request about 0.08 ms more of the
# gateway's CPU at c=16 than observed twenty at a time (bench/profile.md): run back to back, their
# code and data stay in the processor's caches.
OBSERVE_EVERY_S = 0.02


class Observations:
    """Finished exchanges waiting for `observe`, in arrival order. The event loop observes what waits
    OBSERVE_EVERY_S after the first of a batch arrived; `drain` observes it at once from any thread (a
    scrape, so that it finds every request this process answered counted; the ledger's flush, so that a
    graceful stop logs every request). A process killed meanwhile loses those lines and counts, never
    its records (the journal holds them)."""

    def __init__(self) -> None:
        self._waiting: collections.deque[Exchange] = collections.deque()  # appends and pops: thread-safe
        self._timed_on: asyncio.AbstractEventLoop | None = None  # the loop whose timer will drain them

    def add(self, exchange: Exchange) -> None:
        """Queue `exchange` (on the running event loop)."""
        self._waiting.append(exchange)
        loop = asyncio.get_running_loop()
        if self._timed_on is not loop:  # none pending, or on another loop (one that may be closed)
            self._timed_on = loop
            loop.call_later(OBSERVE_EVERY_S, self._due)

    def _due(self) -> None:
        self._timed_on = None
        self.drain()

    def drain(self) -> None:
        """Observe everything waiting now. One observation that fails (a bug) is logged and the others
        are made: a scrape or a stop is not failed by it."""
        waiting = self._waiting
        while waiting:
            try:
                exchange = waiting.popleft()
            except IndexError:  # another thread took the last one
                return
            try:
                observe(exchange)
            except Exception:
                log.exception("ledger: a finished request could not be counted or logged")


def observe(exchange: Exchange) -> None:
    """Counts the exchange in the metrics, traces it and logs its lines (`request_line`, and one
    `failed_attempt_line` per failed attempt), never content (the server's own access line is off,
    gatewaysite.server). The lines first: a count or trace that fails (a bug) does not lose them."""
    log.info(request_line(exchange))
    for attempt in exchange.attempts:
        if attempt.status in FAILED:
            log.warning(failed_attempt_line(exchange, attempt))
    observe_exchange(exchange)
    tracing.record(exchange)


FAILED = frozenset({AttemptStatus.RETRYABLE_FAILED, AttemptStatus.FAILED})


class Fields(dict):
    """A log message made of fields: JSON, whatever formats it."""

    def __str__(self) -> str:
        return json.dumps(self, default=str)


def request_line(exchange: Exchange) -> Fields:
    """One request as an on-call reads it: when, whose key, which model asked and served, through which
    pools and assignments (each attempt's fate and failure class), tokens, cost, duration and the limit
    that refused it. Ids, names and counts only: no key, credential, prompt, completion or message."""
    assert exchange.finished_at is not None
    attempts = exchange.attempts
    # One pass over the attempts (a request's line is built on the loop for every request).
    pools: set[str] = set()
    assignments = []
    input_tokens = output_tokens = cached_read = cost = None
    for a in attempts:
        if a.pool:
            pools.add(a.pool)
        assignments.append(
            {
                "assignment": a.assignment,
                "model": a.model,
                "status": a.status,
                "failure_class": a.failure_class or a.ineligible_reason or None,
            }
        )
        input_tokens = _plus(input_tokens, a.input_tokens, MAX_COUNT)
        output_tokens = _plus(output_tokens, a.output_tokens, MAX_COUNT)
        cached_read = _plus(cached_read, a.cached_read_tokens, MAX_COUNT)
        cost = _plus(cost, a.cost_micros, MAX_COST)
    return Fields(
        event="request",
        time=exchange.finished_at.isoformat(timespec="milliseconds"),
        request_id=exchange.request_id,
        key=exchange.key_name,
        route=exchange.route,
        transport=exchange.transport,
        requested_model=exchange.requested_model,
        served_model=exchange.served_model,
        pools=sorted(pools),
        outcome=exchange.outcome,
        status=exchange.status_code,
        limit=exchange.limit or ("budget" if exchange.outcome == ErrorCode.BUDGET_EXCEEDED else None),
        attempts=exchange.attempts_made,
        retries=exchange.retry_count,
        assignments=assignments,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_read_tokens=cached_read,
        cost_usd=None if cost is None else cost / 1_000_000,
        duration_ms=round((exchange.finished_at - exchange.started_at).total_seconds() * 1000, 1),
    )


def failed_attempt_line(exchange: Exchange, attempt: AttemptLog) -> Fields:
    """A failed attempt, sanitized: its class, the upstream's status and canonical code (SPEC §4), never
    the upstream's message. An account that rejects its credential is a 401 here."""
    began = exchange.started_at + timedelta(milliseconds=attempt.offset_ms)
    return Fields(
        event="attempt_failed",
        time=began.isoformat(timespec="milliseconds"),
        request_id=exchange.request_id,
        key=exchange.key_name,
        ordinal=attempt.ordinal,
        pool=attempt.pool,
        assignment=attempt.assignment,
        model=attempt.model,
        status=attempt.status,
        failure_class=attempt.failure_class,
        upstream_status=attempt.upstream_status,
        error_code=attempt.error_code or None,
        dispatch_state=attempt.dispatch_state,
        elapsed_ms=attempt.elapsed_ms,
    )


# The ledger's columns' range (a PostgreSQL integer, a bigint for a cost): an upstream's count outside it
# (negative, or absurd) is no count, and the log does not print it (tests/security/test_attack_ledger.py).
MAX_COUNT, MAX_COST = 2**31 - 1, 2**63 - 1


def _plus(total: int | None, count: int | None, most: int) -> int | None:
    """`total` with `count` added when it is a count in the column's range (else as it was); None until
    one is."""
    if count is None or not 0 <= count <= most:
        return total
    return count if total is None else total + count


observations = Observations()
