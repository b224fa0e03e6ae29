"""The request path's read on the event loop on SQLite (runtime.loopdb `_sqlite_rows`): the statement
runs on the loop's own connection, its rows typed as a Django cursor's, never waiting for a lock (the
threads take such a read), a refused statement a Django DatabaseError."""

import asyncio
import sqlite3
import threading
from datetime import UTC, datetime

import pytest
from django.db import DatabaseError, connection

from pools.models import Assignment
from routing.policy.types import RouteClass
from routing.request_state import request_state_query
from runtime import db, loopdb, rawsql
from tests.factories import AssignmentFactory, GatewayKeyFactory, OpenCircuitFactory, PoolFactory

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "sqlite", reason="PostgreSQL's: tests/runtime/test_loopdb.py"),
]

RAW_KEY = "sk-gw-test-loop-sqlite-0123456789abcdef"


@pytest.fixture(autouse=True)
async def _closed():
    """Each test's loop gets its own connection, closed with the test."""
    yield
    await loopdb.close()


@pytest.fixture
def key_query():
    """The request path's statement for a key with a pool, two accounts and an open circuit: a health
    row and the key's, with datetimes, booleans and JSON among their columns."""
    pool = PoolFactory(name="main")
    a = AssignmentFactory(pool=pool, name="acct-a")
    AssignmentFactory(pool=pool, name="acct-b")
    OpenCircuitFactory(assignment=a)
    GatewayKeyFactory(raw_key=RAW_KEY, pools=[pool])
    return request_state_query(RAW_KEY, route_class=RouteClass.HTTP, now=datetime.now(UTC))


def on_django_cursor(sql: str, params: list) -> list[tuple]:
    try:
        return rawsql.fetch(sql, params)
    finally:
        connection.close()


async def test_rows_come_back_as_a_django_cursors(key_query):
    on_loop = await loopdb.fetch_within(5, key_query.sql, key_query.params)
    assert [row[0] for row in on_loop] == [0, 2]  # the circuit's row, the key's
    assert on_loop == await asyncio.to_thread(on_django_cursor, key_query.sql, key_query.params)


async def test_the_statement_runs_on_the_loop_and_the_connection_is_kept(key_query, monkeypatch):
    """Made once, on a thread (Django connects nowhere else); every read after it on the loop's thread."""
    places: list[str] = []
    rows = loopdb.SQLiteReadCursor.rows

    def where(cursor, sql, params):
        places.append(threading.current_thread().name)
        return rows(cursor, sql, params)

    monkeypatch.setattr(loopdb.SQLiteReadCursor, "rows", where)
    made = []
    run = db.run

    async def counted(fn, *args):
        made.append(fn.__name__)
        return await run(fn, *args)

    monkeypatch.setattr(db, "run", counted)
    for _ in range(3):
        await loopdb.fetch_within(5, key_query.sql, key_query.params)
    assert made == ["_sqlite_connect"]
    assert places == [threading.current_thread().name] * 3


async def test_each_read_sees_what_is_committed_when_it_runs(key_query):
    """Autocommit: no read holds a snapshot open past its statement."""
    before = await loopdb.fetch_within(5, key_query.sql, key_query.params)
    await asyncio.to_thread(_open_circuit, "acct-b")
    after = await loopdb.fetch_within(5, key_query.sql, key_query.params)
    assert len(after) == len(before) + 1


def _open_circuit(account: str) -> None:
    try:
        OpenCircuitFactory(assignment=Assignment.objects.get(name=account))
    finally:
        connection.close()


def _hold_write_lock(path: str, taken: threading.Event, release: threading.Event) -> None:
    """A writer that keeps every reader out: the rollback journal's EXCLUSIVE lock."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        taken.set()
        release.wait(5)
        conn.execute("ROLLBACK")
    finally:
        conn.close()


async def test_a_read_that_would_wait_for_a_lock_is_handed_to_the_threads(tmp_path, monkeypatch):
    """In WAL mode (the gateway's) a read never waits for the writer; in a database that is not, or one
    whose WAL is being recovered, it would: the loop's connection never waits (busy timeout 0), so the
    loop is never held; NoConnection sends the read to runtime.db's threads, which wait it out."""
    path = str(tmp_path / "rollback-journal.sqlite3")
    setup = sqlite3.connect(path)
    setup.execute("CREATE TABLE t (v INTEGER)")
    setup.execute("INSERT INTO t VALUES (7)")
    setup.commit()
    setup.close()
    django = rawsql.backend()
    other = type(django)({**django.settings_dict, "NAME": path, "OPTIONS": {"timeout": 30}}, alias="rollback")
    monkeypatch.setattr(rawsql, "backend", lambda: other)

    assert await loopdb.fetch_within(5, "SELECT v FROM t WHERE v = %s", [7]) == [(7,)]
    taken, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(path, taken, release))
    holder.start()
    try:
        assert taken.wait(5)
        with pytest.raises(loopdb.NoConnection):
            await loopdb.fetch_within(5, "SELECT v FROM t", [])
    finally:
        release.set()
        holder.join(10)
    assert await loopdb.fetch_within(5, "SELECT v FROM t", []) == [(7,)]  # the same connection, kept


async def test_a_statement_sqlite_refuses_is_a_django_database_error_and_the_next_read_reconnects(key_query):
    await loopdb.fetch_within(5, key_query.sql, key_query.params)
    first = loopdb._sqlite[asyncio.get_running_loop()]
    with pytest.raises(DatabaseError):
        await loopdb.fetch_within(5, "SELECT no_such_column FROM no_such_table", [])
    assert await loopdb.fetch_within(5, key_query.sql, key_query.params)
    assert loopdb._sqlite[asyncio.get_running_loop()] is not first


async def test_a_database_that_cannot_be_opened_sends_the_read_to_the_threads(tmp_path, monkeypatch):
    django = rawsql.backend()
    missing = str(tmp_path / "no-such-directory" / "gateway.sqlite3")
    other = type(django)({**django.settings_dict, "NAME": missing}, alias="missing")
    monkeypatch.setattr(rawsql, "backend", lambda: other)
    with pytest.raises(loopdb.NoConnection):
        await loopdb.fetch_within(5, "SELECT 1", [])
    assert asyncio.get_running_loop() not in loopdb._sqlite


async def test_close_ends_the_loops_connection(key_query):
    await loopdb.fetch_within(5, key_query.sql, key_query.params)
    cursor = loopdb._sqlite[asyncio.get_running_loop()]
    await loopdb.close()
    assert asyncio.get_running_loop() not in loopdb._sqlite
    with pytest.raises(sqlite3.ProgrammingError):  # a closed connection
        cursor.connection.execute("SELECT 1")


async def test_writes_are_left_to_the_threads():
    """SQLite has one writer at a time: a write on the loop would wait for the ledger writer's lock."""
    with pytest.raises(loopdb.NoConnection):
        await loopdb.write_within(5, "UPDATE pools_gatewaykey SET name = name", [])
