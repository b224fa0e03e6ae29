"""Ledger writes (SPEC §7.3)."""

from datetime import UTC, datetime

from django.db import transaction

from pools.services import key_budget_settle
from proxy.exchange import AttemptLog, Exchange
from proxy.models import Attempt, RequestRecord
from routing.vocabulary import Outcome


@transaction.atomic
def request_records_write(*, exchanges: list[Exchange], idempotent: bool = False) -> None:
    """One transaction for a batch: the records, all their attempts in one INSERT, and what each key
    spent (known costs only: an unknown price is never counted as zero, nor as anything).
    `idempotent` (a spool replay): records whose request id is already stored are skipped, with their
    attempts and their spend, so a record is never written or charged twice."""
    if idempotent:
        ids = [x.request_id for x in exchanges]
        stored = set(RequestRecord.objects.filter(request_id__in=ids).values_list("request_id", flat=True))
        exchanges = [x for x in exchanges if x.request_id not in stored]
        if not exchanges:
            return
    records = RequestRecord.objects.bulk_create([_record(x) for x in exchanges])
    Attempt.objects.bulk_create(
        _attempt(record, x, a) for record, x in zip(records, exchanges, strict=True) for a in x.attempts
    )
    exchanges_settle(exchanges=exchanges)


def exchanges_settle(*, exchanges: list[Exchange]) -> None:
    """One UPDATE per key: release what its requests held, add what they cost (SPEC §7.4). Also run
    alone for a record the database refused, so a refused record never leaks its reservation.
    The keys are updated in id order: two nodes' batches over the same keys then lock their rows in
    the same order and cannot deadlock (in batch order, one node held B and waited for A while the
    other held A and waited for B; PostgreSQL then aborted one, or a reservation queued behind them)."""
    settle: dict[tuple[int, str], list[int]] = {}
    for x in exchanges:
        charged = charge_micros(x)
        if x.key_id is not None and (charged or x.reserved_micros):
            totals = settle.setdefault((x.key_id, x.budget_period), [0, 0])
            totals[0] += x.reserved_micros
            totals[1] += charged
    now = datetime.now(UTC)
    for (key_id, period), (released, charged) in sorted(settle.items()):
        key_budget_settle(key_id=key_id, released=released, charged=charged, period=period, now=now)


def charge_micros(x: Exchange) -> int:
    """What a request costs its key: the known cost of every attempt (a failed one too, when its
    upstream reported usage); an attempt that may have run upstream without reporting usage costs
    what was reserved for it, never nothing; so does a request its node died with (`gateway_lost`).
    An unknown price is never counted as zero (no budget: nothing was reserved, and only known costs
    count)."""
    known = sum(a.cost_micros for a in x.attempts if a.cost_micros)
    unreported = x.outcome == Outcome.GATEWAY_LOST or any(
        a.cost_micros is None and a.dispatch_state in ("completed", "unknown") for a in x.attempts
    )
    return max(known, x.reserved_micros) if unreported else known


def _record(x: Exchange) -> RequestRecord:
    return RequestRecord(
        request_id=x.request_id,
        operation_id=(x.operation_id or x.request_id)[:64],
        key_id=x.key_id,
        route=x.route[:64],
        transport=x.transport,
        requested_model=x.requested_model[:200],
        served_model=x.served_model[:200],
        # Sanitized upstream, bounded again here: no field's value can cost a ledger row.
        outcome=x.outcome[:64],
        status_code=x.status_code,
        retry_count=x.retry_count,
        started_at=x.started_at,
        finished_at=x.finished_at,
    )


def _attempt(record: RequestRecord, x: Exchange, a: AttemptLog) -> Attempt:
    return Attempt(
        request=record,
        ordinal=a.ordinal,
        assignment_id=a.assignment_id,
        model=a.model[:200],
        route_class=a.route_class,
        status=a.status,
        failure_class=a.failure_class[:30],
        ineligible_reason=a.ineligible_reason[:30],
        dispatch_state=a.dispatch_state,
        upstream_status=a.upstream_status,
        error_code=a.error_code[:64],
        config_version=x.config_version,
        elapsed_ms=a.elapsed_ms,
        input_tokens=a.input_tokens,
        output_tokens=a.output_tokens,
        cost_micros=a.cost_micros,
    )


PRUNE_BATCH = 1000


@transaction.atomic
def request_records_prune(*, before: datetime, limit: int = PRUNE_BATCH) -> int:
    """Delete up to `limit` request records started before `before`, with their attempts; returns how
    many records. Bounded so that no statement holds the ledger tables for long while the writer keeps
    inserting; `manage.py prune_ledger` calls it until nothing is left. Spend already counted on the
    keys is not touched: a budget does not grow back when its history is pruned."""
    due = RequestRecord.objects.filter(started_at__lt=before).order_by("started_at")
    old = list(due.values_list("pk", flat=True)[:limit])
    if not old:
        return 0
    Attempt.objects.filter(request_id__in=old).delete()
    deleted, _ = RequestRecord.objects.filter(pk__in=old).delete()
    return deleted
