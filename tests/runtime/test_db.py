"""The request path's database executor (runtime.db) and what it relies on: Django keeps one connection
per thread, aged by `close_old_connections` as CONN_MAX_AGE says; reads and writes run on pools of their
own, in the caller's context."""

import asyncio
import contextvars
import threading
import time

import pytest
from django.db import connection, connections

from runtime import db

pytestmark = pytest.mark.django_db(transaction=True)


def where() -> tuple[str, object]:
    """The calling thread's name and its driver connection."""
    connection.ensure_connection()
    return threading.current_thread().name, connection.connection


async def on_every_read_thread(fn):
    """`fn` run once on each of the read pool's threads (all busy at once, so each takes one)."""
    threads = db._executor._max_workers
    barrier = threading.Barrier(threads, timeout=10)

    def call():
        barrier.wait()
        return fn()

    return await asyncio.gather(*(db.run(call) for _ in range(threads)))


async def close_on_every_read_thread() -> None:
    await on_every_read_thread(lambda: connection.close())


@pytest.fixture
async def fresh_connections():
    """Connections opened under the test's CONN_MAX_AGE, and none left open for the database's drop."""
    await close_on_every_read_thread()
    yield
    await close_on_every_read_thread()


REQUEST = contextvars.ContextVar("request", default="none")


async def test_a_call_sees_its_callers_context_variables():
    REQUEST.set("r1")
    assert await db.run(REQUEST.get) == "r1"
    assert await db.write(REQUEST.get) == "r1"


async def test_reads_and_writes_run_on_threads_of_their_own():
    read, _ = await db.run(where)
    write, _ = await db.write(where)
    assert read.startswith("gateway-db_")
    assert write.startswith("gateway-db-write_")


@pytest.mark.usefixtures("fresh_connections")
async def test_a_thread_keeps_its_connection_between_calls_while_conn_max_age_allows(monkeypatch):
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", 300)
    calls = [await db.run(where) for _ in range(12)]  # (the connections are kept alive here)
    by_thread: dict[str, set[int]] = {}
    for thread, raw in calls:
        by_thread.setdefault(thread, set()).add(id(raw))
    assert all(len(raws) == 1 for raws in by_thread.values()), by_thread


def closed(raw) -> bool:
    """Whether a driver connection (sqlite3 or psycopg) was closed."""
    try:
        raw.cursor().close()
    except Exception:
        return True
    return False


@pytest.mark.usefixtures("fresh_connections")
async def test_a_connection_is_closed_after_each_call_when_conn_max_age_is_zero(monkeypatch):
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", 0)

    _, raw = await db.run(where)
    assert closed(raw)


postgres_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="a server-side connection")


@postgres_only
@pytest.mark.usefixtures("fresh_connections")
async def test_a_kept_connection_is_not_health_checked_before_every_call(monkeypatch):
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", 300)
    checks: list[str] = []
    wrapper = type(connections["default"])
    is_usable = wrapper.is_usable

    def counted(self) -> bool:
        checks.append(threading.current_thread().name)
        return is_usable(self)

    monkeypatch.setattr(wrapper, "is_usable", counted)
    for _ in range(12):
        await db.run(backend_pid)
    assert checks == []


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def terminate(pids: list[int]) -> None:
    """The server ends these backends (as a restart does) and they are gone."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [pids])
            for _ in range(100):
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids])
                if cursor.fetchone()[0] == 0:
                    return
                time.sleep(0.05)
        raise AssertionError("the backends did not end")
    finally:
        connection.close()  # a write thread's: none left open for the test database's drop


@postgres_only
@pytest.mark.usefixtures("fresh_connections")
async def test_a_connection_the_server_ended_while_idle_is_replaced_before_the_next_call(monkeypatch):
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", 300)
    before = await on_every_read_thread(backend_pid)
    await db.write(terminate, before)

    after = await on_every_read_thread(backend_pid)  # no OperationalError: each thread reconnected
    assert set(after).isdisjoint(before)


def test_readable_takes_a_descriptor_past_1023():
    """A gateway holding hundreds of websockets gives its database connections high descriptors;
    `select.select` refuses any past 1023 (ValueError), so the check before a call must not use it."""
    import os
    import resource
    import socket

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 2000:
        pytest.fail(f"this test needs an open-file hard limit above 2000 (it is {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    here, there = socket.socketpair()
    high = os.dup2(here.fileno(), 2000)
    try:
        assert db.readable(high) is False
        there.send(b"x")
        assert db.readable(high) is True
    finally:
        os.close(high)
        here.close()
        there.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
