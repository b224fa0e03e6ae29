"""The ledger's tables carry the indexes a query uses and no other: each one is paid for by every
request's insert (issue 17)."""

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from proxy.ledger.models import Attempt, RequestRecord

pytestmark = pytest.mark.django_db


def _record(request_id: str) -> RequestRecord:
    return RequestRecord.objects.create(
        request_id=request_id,
        route="/v1/chat/completions",
        transport="http",
        outcome="ok",
        started_at=timezone.now(),
    )


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's catalog")
def test_the_ledger_tables_have_no_index_that_only_inserts_use():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tablename, indexdef FROM pg_indexes WHERE tablename = ANY(%s)",
            [[RequestRecord._meta.db_table, Attempt._meta.db_table]],
        )
        found = cursor.fetchall()
    columns = sorted((table, definition.split(" USING btree ")[1]) for table, definition in found)
    assert columns == [
        ("proxy_attempt", "(assignment_id)"),
        ("proxy_attempt", "(id)"),
        ("proxy_attempt", "(request_id, ordinal)"),
        ("proxy_requestrecord", "(id)"),
        ("proxy_requestrecord", "(key_id)"),
        ("proxy_requestrecord", "(operation_id)"),
        ("proxy_requestrecord", "(request_id)"),
        ("proxy_requestrecord", "(started_at)"),
    ]


def test_a_request_id_is_stored_once():
    _record("req-once")
    with pytest.raises(IntegrityError), transaction.atomic():
        _record("req-once")
    assert RequestRecord.objects.filter(request_id="req-once").count() == 1


def test_an_attempt_ordinal_is_stored_once_per_request():
    record = _record("req-ordinal")
    fields = {"model": "gpt-x", "route_class": "http", "status": "succeeded", "dispatch_state": "completed"}
    Attempt.objects.create(request=record, ordinal=1, **fields)
    with pytest.raises(IntegrityError), transaction.atomic():
        Attempt.objects.create(request=record, ordinal=1, **fields)
    Attempt.objects.create(request=_record("req-other"), ordinal=1, **fields)
    assert Attempt.objects.count() == 2
