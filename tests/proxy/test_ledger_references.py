"""The ledger's references to a key, an assignment and a record are not database constraints
(proxy/0004): a key or an assignment deleted while its requests were in flight no longer fails their
records' batch at commit, and an operator still reads such a record in admin."""

import pytest

from proxy.ledger.exchange import AttemptLog, Exchange
from proxy.ledger.models import Attempt, RequestRecord
from proxy.ledger.services import request_records_write
from tests.factories import AssignmentFactory, GatewayKeyFactory, PoolFactory, finished_exchange

# Committed for real: a deferred constraint is only checked when its transaction commits.
pytestmark = pytest.mark.django_db(transaction=True)


def _served_by(key_id: int, assignment_id: int) -> Exchange:
    attempt = AttemptLog(
        ordinal=1,
        assignment_id=assignment_id,
        model="gpt-5",
        route_class="http",
        status="succeeded",
        dispatch_state="completed",
        upstream_status=200,
    )
    return finished_exchange(key_id, served_model="gpt-5", attempts=[attempt])


def _deleted_meanwhile() -> Exchange:
    """A request answered by a key and an assignment that are both deleted before its record is saved."""
    pool = PoolFactory(name="pool-gone")
    assignment = AssignmentFactory(pool=pool, name="acct-gone")
    key = GatewayKeyFactory(name="key-gone", pools=[pool])
    exchange = _served_by(key.pk, assignment.pk)
    key.delete()
    assignment.delete()
    return exchange


def test_a_record_outlives_its_key_and_assignment_deleted_while_it_was_in_flight():
    exchange = _deleted_meanwhile()
    request_records_write(exchanges=[exchange])  # committed: nothing refuses it
    record = RequestRecord.objects.get(request_id=exchange.request_id)
    assert record.key_id == exchange.key_id
    attempt = Attempt.objects.get(request=record)
    assert attempt.assignment_id == exchange.attempts[0].assignment_id
    assert attempt.status == "succeeded"


def test_deleting_a_key_through_django_still_empties_its_records_references():
    pool = PoolFactory(name="pool-kept")
    assignment = AssignmentFactory(pool=pool, name="acct-kept")
    key = GatewayKeyFactory(name="key-deleted-later", pools=[pool])
    exchange = _served_by(key.pk, assignment.pk)
    request_records_write(exchanges=[exchange])
    key.delete()
    assignment.delete()
    record = RequestRecord.objects.get(request_id=exchange.request_id)
    assert record.key_id is None
    assert Attempt.objects.get(request=record).assignment_id is None


def test_admin_shows_a_record_whose_key_and_assignment_are_gone(admin_client):
    exchange = _deleted_meanwhile()
    request_records_write(exchanges=[exchange])
    record = RequestRecord.objects.get(request_id=exchange.request_id)

    listing = admin_client.get("/admin/proxy/requestrecord/")
    assert listing.status_code == 200
    assert exchange.request_id in listing.content.decode()

    page = admin_client.get(f"/admin/proxy/requestrecord/{record.pk}/change/")
    assert page.status_code == 200
    assert "(deleted assignment)" in page.content.decode()

    attempts = admin_client.get("/admin/proxy/attempt/")
    assert attempts.status_code == 200
