"""Ledger writes (SPEC §7.3)."""

from django.db import transaction

from proxy.models import Attempt, RequestRecord
from proxy.relay import Exchange


@transaction.atomic
def request_record_write(*, exchange: Exchange) -> RequestRecord:
    x = exchange
    record = RequestRecord.objects.create(
        request_id=x.request_id,
        key_id=x.key_id,
        route=x.route,
        transport=x.transport,
        requested_model=x.requested_model[:200],
        served_model=x.served_model,
        outcome=x.outcome,
        status_code=x.status_code,
        retry_count=x.retry_count,
        started_at=x.started_at,
        finished_at=x.finished_at,
    )
    Attempt.objects.bulk_create(
        Attempt(
            request=record,
            ordinal=a.ordinal,
            assignment_id=a.assignment_id,
            model=a.model,
            route_class=a.route_class,
            status=a.status,
            failure_class=a.failure_class,
            ineligible_reason=a.ineligible_reason,
            dispatch_state=a.dispatch_state,
            upstream_status=a.upstream_status,
            error_code=a.error_code[:100],
            elapsed_ms=a.elapsed_ms,
            input_tokens=a.input_tokens,
            output_tokens=a.output_tokens,
            cost_micros=a.cost_micros,
        )
        for a in x.attempts
    )
    return record
