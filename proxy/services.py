"""Ledger writes (SPEC §7.3)."""

from datetime import datetime

from django.db import transaction
from django.db.models import F

from pools.models import GatewayKey
from proxy.models import Attempt, RequestRecord
from proxy.relay import AttemptLog, Exchange


@transaction.atomic
def request_records_write(*, exchanges: list[Exchange]) -> None:
    """One transaction for a batch: the records, all their attempts in one INSERT, and what each key
    spent (known costs only: an unknown price is never counted as zero, nor as anything)."""
    records = RequestRecord.objects.bulk_create([_record(x) for x in exchanges])
    Attempt.objects.bulk_create(
        _attempt(record, x, a) for record, x in zip(records, exchanges, strict=True) for a in x.attempts
    )
    spent: dict[int, int] = {}
    for x in exchanges:
        cost = sum(a.cost_micros for a in x.attempts if a.cost_micros)
        if x.key_id is not None and cost:
            spent[x.key_id] = spent.get(x.key_id, 0) + cost
    for key_id, cost in spent.items():
        # An UPDATE with F() adds atomically, whatever other nodes are adding at the same moment.
        GatewayKey.objects.filter(pk=key_id).update(spent_micros=F("spent_micros") + cost)


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
