"""A database that stops answering holds no request past its deadline (issue 21, fault 4): the request
path's waits on it (the key check, the routing read, the probe lease, the budget reservation, the
state and affinity writes) are bounded by `x-gateway-deadline-ms`. What a write still takes for a
request after it stopped waiting (a reservation, a probe lease) is given back.

A stall is held here by another connection: on PostgreSQL a row or table lock, on SQLite the
database's write lock. The request path's reads go on (MVCC, WAL); its writes wait as they would on
a stalled server."""

import contextlib
import sqlite3
import time

import httpx
import psycopg
from django.db import connection

from pools.models import GatewayKey
from proxy.ledger import writer
from routing.models import Affinity
from tests.proxy.fixtures_e2e import RESPONSES, wait_for
from tests.proxy.test_budget import AUTH, BODY, _price

DEADLINE = {"x-gateway-deadline-ms": "1500"}


@contextlib.contextmanager
def _stalled(postgres_lock: str):
    """Another connection holds `postgres_lock` (one statement) on PostgreSQL, or SQLite's write lock,
    until the block ends."""
    db = connection.settings_dict
    if connection.vendor == "postgresql":
        with psycopg.connect(
            host=db["HOST"],
            port=db["PORT"] or 5432,
            user=db["USER"],
            password=db["PASSWORD"],
            dbname=db["NAME"],
        ) as other:
            other.execute(postgres_lock)
            yield
            other.rollback()
        return
    other = sqlite3.connect(db["NAME"], isolation_level=None, timeout=20)
    try:
        other.execute("BEGIN IMMEDIATE")
        yield
        other.execute("ROLLBACK")
    finally:
        other.close()


def _post(gateway: str, path: str, **kwargs) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = httpx.post(f"{gateway}{path}", headers={**AUTH, **DEADLINE}, timeout=8, **kwargs)
    return response, time.monotonic() - started


def test_a_reservation_the_database_does_not_grant_by_the_deadline_is_a_503_and_is_given_back(
    gateway, two_assignments
):
    a, b, _ = two_assignments
    _price(1_000_000, 1_000_000)
    GatewayKey.objects.update(budget_micros=1_000_000)
    key = GatewayKey.objects.get()
    table = GatewayKey._meta.db_table
    with _stalled(f"SELECT 1 FROM {table} WHERE id = {key.pk} FOR UPDATE"):
        response, waited = _post(gateway, "/v1/chat/completions", content=BODY)
    assert (response.status_code, response.json()["error"]["code"]) == (503, "gateway_unavailable")
    assert waited < 5, waited  # its 1.5 s deadline, not the 8 s the client would have waited
    assert a.hits == [] and b.hits == []
    # Once the database answers, the reservation it grants late is released at once.
    time.sleep(1.0)
    writer.flush()
    key.refresh_from_db()
    assert (key.reserved_micros, key.spent_micros) == (0, 0)


def test_a_responses_answer_does_not_wait_past_its_deadline_for_its_affinity_write(gateway, two_assignments):
    table = Affinity._meta.db_table
    with _stalled(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE"):
        response, waited = _post(gateway, "/v1/responses", json=RESPONSES)
    assert response.status_code == 200
    assert waited < 5, waited
    # The write was not abandoned: it lands once the database answers.
    response_id = response.json()["id"]
    wait_for(lambda: Affinity.objects.filter(key=response_id).first(), what="the late affinity")
