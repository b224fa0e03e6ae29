"""Faults the multi-node soak found (issue 21), each reproduced here on its own, small and fast:
the soak (tests/reliability/test_soak_multinode.py) shows the invariant, these show the cause."""

import threading
import time
import uuid
from datetime import UTC, datetime

import psycopg
import pytest
from django.db import connection, connections

from pools.models import GatewayKey
from proxy.relay import Exchange
from proxy.services import request_records_write
from tests.factories import GatewayKeyFactory

pytestmark = pytest.mark.django_db(transaction=True)

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="row locks across connections are PostgreSQL's"
)


def _exchange(key_id: int, reserved: int) -> Exchange:
    now = datetime.now(UTC)
    return Exchange(
        request_id=uuid.uuid4().hex,
        key_id=key_id,
        route="/v1/chat/completions",
        transport="http",
        requested_model="gpt-5",
        started_at=now,
        outcome="ok",
        status_code=200,
        finished_at=now,
        reserved_micros=reserved,
    )


def _other_connection(*, autocommit: bool = False) -> psycopg.Connection:
    db = connection.settings_dict
    return psycopg.connect(
        host=db["HOST"],
        port=db["PORT"] or 5432,
        user=db["USER"],
        password=db["PASSWORD"],
        dbname=db["NAME"],
        autocommit=autocommit,
    )


def _wait_for_a_lock_wait(probe: psycopg.Connection, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        waiting = probe.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        ).fetchone()
        if waiting and waiting[0]:
            return
        time.sleep(0.02)
    raise AssertionError("the ledger batch never waited for the row lock")


@postgres_only
def test_two_nodes_settling_the_same_keys_never_deadlock():
    """Fault 3 ("deadlock detected"): a ledger batch settles one UPDATE per key, in one transaction.
    In the order the batch met them, node 1 could lock key B then wait for A while node 2 held A and
    wanted B. Keys are settled in id order, so every transaction takes the rows in the same order.

    Here the other node's transaction holds A; this node's batch (B's record first) must wait for A
    holding nothing, so the other node can go on to update B and commit."""
    a, b = GatewayKeyFactory(budget_micros=1_000), GatewayKeyFactory(budget_micros=1_000)
    assert a.pk < b.pk
    GatewayKey.objects.update(reserved_micros=10)
    failures: list[BaseException] = []

    def ledger_batch() -> None:
        try:
            request_records_write(exchanges=[_exchange(b.pk, 10), _exchange(a.pk, 10)])
        except BaseException as exc:
            failures.append(exc)
        finally:
            connections.close_all()

    table = GatewayKey._meta.db_table
    with _other_connection() as other, _other_connection(autocommit=True) as probe:
        other.execute(f"UPDATE {table} SET spent_micros = spent_micros + 1 WHERE id = %s", [a.pk])
        batch = threading.Thread(target=ledger_batch)
        batch.start()
        _wait_for_a_lock_wait(probe)
        try:
            other.execute(f"UPDATE {table} SET spent_micros = spent_micros + 1 WHERE id = %s", [b.pk])
            other.commit()
        finally:
            batch.join(timeout=30)
    assert not failures, failures
    assert list(GatewayKey.objects.order_by("pk").values_list("reserved_micros", "spent_micros")) == [
        (0, 1),
        (0, 1),
    ]
