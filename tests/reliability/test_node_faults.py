"""Faults the multi-node soak found (issue 21), each reproduced here on its own, small and fast:
the soak (tests/reliability/test_soak_multinode.py) shows the invariant, these show the cause."""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from django.db import connection, connections

from pools.models import BudgetHold, GatewayKey
from proxy.ledger import recorder as ledger
from proxy.ledger.exchange import Exchange
from proxy.ledger.models import RequestRecord
from proxy.ledger.services import request_records_write
from tests.factories import GatewayKeyFactory, finished_exchange, reserve
from tests.proxy.fixtures_e2e import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="row locks across connections are PostgreSQL's"
)


ROOT = Path(__file__).resolve().parents[2]


def _exchange(key_id: int | None = None) -> Exchange:
    return finished_exchange(key_id)


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


@contextlib.contextmanager
def _waiting_on(lock: str, params: list, work: Callable[[], None]) -> Iterator[psycopg.Connection]:
    """Another connection runs `lock` (a statement that takes a row lock) and `work` runs in a thread
    until it waits for that lock: the connection holding it, to commit or roll back. The thread is
    joined at the end."""
    with _other_connection() as other, _other_connection(autocommit=True) as probe:
        other.execute(lock, params)
        thread = threading.Thread(target=work)
        thread.start()
        _wait_for_a_lock_wait(probe)
        try:
            yield other
        finally:
            thread.join(timeout=30)


@postgres_only
def test_two_nodes_settling_the_same_keys_never_deadlock():
    """Fault 3 ("deadlock detected"): a ledger batch settles its keys in one transaction. In the order
    the batch met them, node 1 could lock key B then wait for A while node 2 held A and wanted B. The
    batch locks its keys' rows in id order before it settles them, so every transaction takes the rows
    in the same order.

    Here the other node's transaction holds A; this node's batch (B's record first) must wait for A
    holding nothing, so the other node can go on to update B and commit."""
    a, b = GatewayKeyFactory(budget_micros=1_000), GatewayKeyFactory(budget_micros=1_000)
    assert a.pk < b.pk
    failures: list[BaseException] = []

    def ledger_batch() -> None:
        try:
            request_records_write(exchanges=[reserve(_exchange(), b.pk, 10), reserve(_exchange(), a.pk, 10)])
        except BaseException as exc:
            failures.append(exc)
        finally:
            connections.close_all()

    table = GatewayKey._meta.db_table
    spend = f"UPDATE {table} SET spent_micros = spent_micros + 1 WHERE id = %s"
    with _waiting_on(spend, [a.pk], ledger_batch) as other:
        other.execute(spend, [b.pk])
        other.commit()
    assert not failures, failures
    assert list(GatewayKey.objects.order_by("pk").values_list("reserved_micros", "spent_micros")) == [
        (0, 1),
        (0, 1),
    ]


def _database_url() -> str:
    """The test database, for a child process."""
    db = connection.settings_dict
    if connection.vendor == "postgresql":
        return f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
    return f"sqlite:///{db['NAME']}"


# A node's ledger writer with a record still in memory: it lingers for company that never comes.
NODE = """
import sys, time, django
django.setup()
from proxy.ledger import recorder as ledger
from tests.reliability.test_node_faults import _exchange
ledger.LINGER_S = 3600
exchange = _exchange()
exchange.request_id = sys.argv[1]
ledger.writer.submit(exchange)
print("submitted", flush=True)
time.sleep(3600)
"""


def test_a_record_still_in_a_killed_nodes_memory_is_replayed_from_its_journal():
    """Fault 1 (records_sigkill): a node answered, its record waited in the writer's batch, and a
    SIGKILL took it. The record was journaled as it was submitted; the next writer replays it."""
    request_id = uuid.uuid4().hex
    env = {**os.environ, "DATABASE_URL": _database_url(), "DJANGO_SETTINGS_MODULE": "gatewaysite.settings"}
    node = subprocess.Popen(
        [sys.executable, "-c", NODE, request_id], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert node.stdout is not None and node.stdout.readline().strip() == "submitted"
        time.sleep(0.2)  # the writer thread has taken it and lingers
    finally:
        node.send_signal(signal.SIGKILL)
        node.wait(timeout=10)
    assert not RequestRecord.objects.filter(request_id=request_id).exists()  # it was in memory only

    writer = ledger.LedgerWriter()  # the restarted node's, or a surviving worker's
    writer.submit(_exchange())
    assert writer.flush(timeout=10)
    assert RequestRecord.objects.filter(request_id=request_id).count() == 1
    assert not writer.spool.pending()  # the dead node's journal is gone once replayed


# A node with a request in flight: it has reserved part of its key's budget (and journaled the hold).
NODE_IN_FLIGHT = """
import sys, time, django
django.setup()
from proxy.ledger import recorder as ledger
from tests.factories import reserve
from tests.reliability.test_node_faults import _exchange
exchange = _exchange(int(sys.argv[2]))
exchange.request_id = sys.argv[1]
ledger.writer.held(exchange)  # as the relay does, before it reserves
reserve(exchange, int(sys.argv[2]), int(sys.argv[3]))
print("held", flush=True)
time.sleep(3600)
"""


def test_a_reservation_its_node_died_with_is_settled_as_its_cost_once():
    """Fault 2 (budget_reservations): a request held part of its key's budget and its node was killed
    before the ledger could settle it, so the budget shrank for good. The hold was journaled; the
    next writer records the request as `gateway_lost` and keeps the reservation as its cost (SPEC
    §7.4: usage never arrived), once however often the journal is replayed."""
    key = GatewayKeyFactory(budget_micros=1_000)
    request_id = uuid.uuid4().hex
    env = {**os.environ, "DATABASE_URL": _database_url(), "DJANGO_SETTINGS_MODULE": "gatewaysite.settings"}
    node = subprocess.Popen(
        [sys.executable, "-c", NODE_IN_FLIGHT, request_id, str(key.pk), "25"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert node.stdout is not None and node.stdout.readline().strip() == "held"
    finally:
        node.send_signal(signal.SIGKILL)
        node.wait(timeout=10)
    key.refresh_from_db()
    assert (key.reserved_micros, key.spent_micros) == (25, 0)  # held, and no one left to settle it

    for _ in range(2):  # the restarted node's writer, then another one: settled once
        writer = ledger.LedgerWriter()
        writer.submit(_exchange())
        assert writer.flush(timeout=10)
    key.refresh_from_db()
    assert (key.reserved_micros, key.spent_micros) == (0, 25)
    lost = RequestRecord.objects.get(request_id=request_id)
    assert (lost.outcome, lost.key_id, lost.status_code) == ("gateway_lost", key.pk, None)


@postgres_only
def test_a_reservation_its_node_was_killed_waiting_for_is_settled_when_it_commits(
    two_assignments, gateway_nodes
):
    """Window 1 of budget_reservations: a node was killed while its request's reservation was on its
    way (here the UPDATE waits for the key's row, which another transaction holds). PostgreSQL runs a
    statement to its end for a client that is gone: once the row is free the UPDATE commits, and the
    reservation is held for no one. The hold is journaled before the UPDATE is sent, so the next
    writer records the request `gateway_lost` and settles what the database holds for it, as its
    cost (SPEC §7.4). Journaled after the UPDATE's answer, nothing told anyone of it."""
    from tests.proxy.fixtures_e2e import AUTH
    from tests.proxy.test_budget import BODY, RESERVATION, _price

    a, b, _ = two_assignments
    _price(1_000_000, 1_000_000)
    GatewayKey.objects.update(budget_micros=1_000_000)
    key = GatewayKey.objects.get()
    (node,) = gateway_nodes.start(1)

    def client() -> None:
        headers = {**AUTH, "content-type": "application/json"}
        with contextlib.suppress(httpx.TransportError):  # its node dies under it
            httpx.post(f"{node}/v1/chat/completions", content=BODY, headers=headers, timeout=30)

    table = GatewayKey._meta.db_table
    with _waiting_on(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE", [key.pk], client) as other:
        (process,) = gateway_nodes.procs
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        other.rollback()  # the row is free: the dead node's UPDATE commits now
    wait_for(lambda: GatewayKey.objects.get().reserved_micros == RESERVATION, what="the orphaned reservation")
    assert a.hits == [] and b.hits == []  # nothing was dispatched

    writer = ledger.LedgerWriter()  # the restarted node's, or another node's on that spool
    writer.submit(_exchange())
    assert writer.flush(timeout=10)
    key.refresh_from_db()
    assert (key.reserved_micros, key.spent_micros) == (0, RESERVATION)
    assert not BudgetHold.objects.exists()
    assert list(RequestRecord.objects.filter(key_id=key.pk).values_list("outcome", flat=True)) == [
        "gateway_lost"
    ]
