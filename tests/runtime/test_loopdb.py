"""The request path's read on the event loop (runtime.loopdb) and what it relies on: Django's PostgreSQL
connection parameters (its adapters, so rows are typed as a Django cursor's), psycopg_pool's `configure`
callback, and a bound that holds even when the database host goes silent."""

import asyncio
import contextlib
import socket
import time

import psycopg
import pytest
from django.db import DatabaseError, connection, connections

from runtime import loopdb
from runtime.db import DatabaseTimeout

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite has no asynchronous driver"),
]


@pytest.fixture(autouse=True)
async def _closed_pool():
    """Each test's loop gets its own pool; none is left open for the test database's drop."""
    yield
    await loopdb.close()


@pytest.fixture
def kept(monkeypatch):
    """Connections kept as production keeps them (the suite runs with CONN_MAX_AGE 0)."""
    monkeypatch.setitem(connections["default"].settings_dict, "CONN_MAX_AGE", 300)


@pytest.mark.parametrize("max_age", [0, 300])
async def test_with_conn_max_age_zero_every_read_has_a_connection_of_its_own(monkeypatch, max_age):
    monkeypatch.setitem(connections["default"].settings_dict, "CONN_MAX_AGE", max_age)
    pids = [await backend_pid() for _ in range(6)]
    if max_age == 0:
        assert len(set(pids)) == 6
    else:  # the pool's few connections, each used again
        assert len(set(pids)) <= 2, pids
    assert (asyncio.get_running_loop() in loopdb._pools) is (max_age != 0)


async def test_a_kept_connection_reads_with_one_cursor_and_each_read_gets_its_own_rows(kept):
    """The cursor a connection keeps (ReadConnection: building one per read was a fifth of a read's
    CPU) is the same for every read, and never hands a read the rows of the one before."""
    pool = loopdb._pool()
    await pool.open()
    await pool.wait()  # its one connection ready: no read waits, so the pool does not grow
    await loopdb.fetch_within(5, "SELECT 1", [])
    conn = await pool.getconn()  # the pool's one connection, which that read used
    await pool.putconn(conn)
    assert pool.get_stats()["pool_size"] == 1
    reader = conn._reader
    assert reader is not None
    for value in ("a", "b", "c"):
        assert await loopdb.fetch_within(5, "SELECT %s::text, pg_backend_pid()", [value]) == [
            (value, conn.info.backend_pid)
        ]
    assert conn._reader is reader
    with pytest.raises(DatabaseError):
        await loopdb.fetch_within(5, "SELECT 1/0", [])
    assert await loopdb.fetch_within(5, "SELECT %s::text", ["after"]) == [("after",)]


async def test_the_connection_returned_last_serves_the_next_read(kept):
    """After two reads at once, reads one at a time all go to the connection returned last (warm), not
    in turns to each (psycopg_pool's own order), and the other waits unused for the pool to close it."""
    pool = loopdb._pool()
    await pool.open()
    # Its first connection ready: a getconn that waited for it would make the pool grow, and a
    # connection that arrived after the two below would be the one returned last.
    await pool.wait()
    first = await pool.getconn(timeout=5)
    second = await pool.getconn(timeout=5)
    assert first.info.backend_pid != second.info.backend_pid
    await pool.putconn(first)
    await pool.putconn(second)
    pids = []
    for _ in range(4):
        await _both_back(pool)  # a read's task hands its connection back just after its answer
        pids.append(await backend_pid())
    assert pids == [second.info.backend_pid] * 4, (pids, first.info.backend_pid)
    assert pool.get_stats()["pool_available"] == 2


async def _both_back(pool) -> None:
    for _ in range(500):
        if pool.get_stats()["pool_available"] == 2:
            return
        await asyncio.sleep(0.01)


def on_django_cursor(sql: str, params: list) -> list[tuple]:
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()
    finally:
        connection.close()  # none left open for the test database's drop


async def test_rows_come_back_typed_as_a_django_cursors():
    sql = (
        "SELECT %s::timestamptz, '{\"a\": [1, 2]}'::jsonb, 7::bigint, true, 'text'::varchar, "
        "current_setting('TimeZone')"
    )
    params = ["2026-12-02 10:00:00+05"]
    on_loop = await loopdb.fetch_within(5, sql, params)
    by_django = await asyncio.to_thread(on_django_cursor, sql, params)
    assert on_loop == by_django
    moment, _, _, _, _, zone = on_loop[0]
    assert moment.utcoffset().total_seconds() == 0 and moment.hour == 5  # in Django's time zone, UTC
    assert zone == "UTC"


async def test_timestamps_are_read_by_psycopgs_compiled_loader_in_utc(kept):
    """Django's timestamptz loader is Python (2 us a value, the request's statement reads one or two per
    account and model that served); in UTC the loop's connections read with psycopg's own, compiled, and
    get what Django's would (`test_rows_come_back_typed_as_a_django_cursors`)."""
    from django.db.backends.postgresql.psycopg_any import BaseTzLoader

    await loopdb.fetch_within(5, "SELECT 1", [])
    pool = loopdb._pool()
    conn = await pool.getconn()
    try:
        oid = conn.adapters.types["timestamptz"].oid
        loader = conn.adapters.get_loader(oid, psycopg.pq.Format.TEXT)
    finally:
        await pool.putconn(conn)
    assert not issubclass(loader, BaseTzLoader)
    assert loader.__module__ != "psycopg.types.datetime"  # the compiled one (psycopg[binary])


async def test_a_connection_in_another_time_zone_is_set_to_djangos(monkeypatch):
    options = connections["default"].settings_dict["OPTIONS"]
    monkeypatch.setitem(options, "options", "-c TimeZone=Asia/Kolkata")
    sql = "SELECT current_setting('TimeZone'), %s::timestamptz"
    [(zone, moment)] = await loopdb.fetch_within(5, sql, ["2026-12-02 10:00:00+00"])
    assert zone == "UTC" and moment.hour == 10


async def backend_pid() -> int:
    [(pid,)] = await loopdb.fetch_within(5, "SELECT pg_backend_pid()", [])
    return pid


def terminate(pids: set[int]) -> None:
    """The server ends these backends (as a restart does), and they are gone."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [list(pids)])
            for _ in range(100):
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [list(pids)])
                if cursor.fetchone()[0] == 0:
                    return
                time.sleep(0.05)
        raise AssertionError("the backends did not end")
    finally:
        connection.close()


@pytest.mark.usefixtures("kept")
async def test_a_connection_the_server_ended_while_idle_is_replaced_without_an_error():
    before = {await backend_pid() for _ in range(4)}  # every connection the pool holds
    await asyncio.to_thread(terminate, before)

    after = await backend_pid()  # no DatabaseError: each dead connection was dropped before use
    assert after not in before


async def test_work_given_to_do_meanwhile_runs_while_the_statement_is_on_the_server(kept):
    """`meanwhile` (the request path drafts its decision there) runs once the statement has been sent on
    a pooled connection, not before: the server is already running it, and its rows come after."""
    pool = loopdb._pool()
    await pool.open()
    await pool.wait()
    seen: list[object] = []

    def meanwhile() -> None:
        # The loop is blocked here: a sync look is fine, and it is the only way to see the statement
        # running (the loop cannot send anything meanwhile). The server may take a moment to pick the
        # statement up on a busy machine: looked at for up to 0.2 s, within the statement's 0.3 s.
        running = 0
        with psycopg.connect(**loopdb._params()) as other:  # autocommit: a fresh snapshot each look
            for _ in range(20):
                [(running,)] = other.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE %s",
                    ["%pg_sleep(0.3), 'meanwhile-marker'%"],
                ).fetchall()
                if running:
                    break
                time.sleep(0.01)
        seen.append(running)

    rows = await loopdb.fetch_within(5, "SELECT pg_sleep(0.3), 'meanwhile-marker'", [], meanwhile)
    seen.append(rows[0][1])
    assert seen == [1, "meanwhile-marker"]


async def test_a_statement_the_database_refuses_is_a_django_database_error():
    with pytest.raises(DatabaseError):
        await loopdb.fetch_within(5, "SELECT no_such_column FROM no_such_table", [])
    assert await backend_pid() > 0  # and the pool still serves


@contextlib.asynccontextmanager
async def silent_proxy(port: int):
    """A TCP relay to the database on a port of its own; `freeze()` stops relaying in both directions
    with every socket left open: a host gone silent."""
    frozen = asyncio.Event()
    relays: list[asyncio.Task] = []
    writers: list[asyncio.StreamWriter] = []

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await reader.read(65536):
                if frozen.is_set():
                    await asyncio.Event().wait()  # hold it, forever
                writer.write(data)
                await writer.drain()

    async def relay(client_reader, client_writer) -> None:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", port)
        writers.extend((client_writer, server_writer))
        relays.append(asyncio.ensure_future(pump(client_reader, server_writer)))
        relays.append(asyncio.ensure_future(pump(server_reader, client_writer)))

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], frozen.set
    finally:
        server.close()
        for task in relays:
            task.cancel()
        for writer in writers:  # the statement left waiting sees its connection end
            writer.close()
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("max_age", [0, 300])
async def test_the_bound_holds_when_the_database_host_goes_silent(monkeypatch, max_age):
    monkeypatch.setitem(connections["default"].settings_dict, "CONN_MAX_AGE", max_age)
    settings = connections["default"].settings_dict
    async with silent_proxy(int(settings["PORT"] or 5432)) as (port, freeze):
        monkeypatch.setitem(settings, "HOST", "127.0.0.1")
        monkeypatch.setitem(settings, "PORT", str(port))
        assert await backend_pid() > 0  # through the relay
        freeze()
        started = time.monotonic()
        with pytest.raises(DatabaseTimeout):
            await loopdb.fetch_within(0.3, "SELECT 1", [])
        # Its own bound, not psycopg's: a cancelled statement would wait for the server to confirm
        # the cancel (up to 5 s, twice), and the host is silent.
        assert time.monotonic() - started < 2


@pytest.mark.usefixtures("kept")
async def test_a_pool_that_cannot_connect_says_so_at_once_instead_of_waiting_out_the_bound(monkeypatch):
    with socket.socket() as s:  # a port nobody listens on: the database refuses connections
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setitem(connections["default"].settings_dict, "PORT", str(port))
    started = time.monotonic()
    with pytest.raises(loopdb.NoConnection):
        await loopdb.fetch_within(5, "SELECT 1", [])
    # Within the connection wait, not the read's 5 s: the threads then fail it at once (or serve it).
    assert time.monotonic() - started < loopdb.CONNECTION_WAIT_S + 1


@pytest.mark.usefixtures("kept")
async def test_close_ends_the_loops_connections():
    pid = await backend_pid()
    await loopdb.close()

    def alive() -> int:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
                return cursor.fetchone()[0]
        finally:
            connection.close()

    for _ in range(100):
        if await asyncio.to_thread(alive) == 0:
            break
        await asyncio.sleep(0.05)
    assert await asyncio.to_thread(alive) == 0
    assert asyncio.get_running_loop() not in loopdb._pools


def test_django_connection_parameters_are_what_the_pool_is_built_from():
    params = connections["default"].get_connection_params()
    assert isinstance(params.get("context"), psycopg.adapt.AdaptersMap)  # Django's adapters, kept
    assert "cursor_factory" in params  # Django's sync cursor class, dropped for the async connection
    assert params["dbname"] == connections["default"].settings_dict["NAME"]


async def test_a_write_runs_on_a_pool_of_its_own_and_answers_the_rows_it_changed(kept):
    """A write can wait for a row lock: on the read pool, writes stuck behind one would leave the reads
    no connection. Its own pool is at most MAX_WRITE_CONNECTIONS."""
    await loopdb.fetch_within(5, "SELECT 1", [])
    await loopdb.write_within(5, "CREATE TEMP TABLE IF NOT EXISTS t (v int)", [])
    assert await loopdb.write_within(5, "INSERT INTO t SELECT generate_series(1, %s)", [3]) == 3
    loop = asyncio.get_running_loop()
    reads, writes = loopdb._pools[loop], loopdb._write_pools[loop]
    assert reads is not writes
    assert writes.max_size == loopdb.MAX_WRITE_CONNECTIONS
    read_pids = {await backend_pid() for _ in range(3)}
    assert not read_pids & set(await _write_backends())
    with pytest.raises(DatabaseError):
        await loopdb.write_within(5, "INSERT INTO no_such_table VALUES (1)", [])
    await loopdb.close()
    assert loop not in loopdb._write_pools


async def _write_backends() -> list[int]:
    pool = loopdb._write_pools[asyncio.get_running_loop()]
    conn = await pool.getconn()
    try:
        return [conn.info.backend_pid]
    finally:
        await pool.putconn(conn)


async def test_a_write_the_caller_stops_waiting_for_finishes_and_is_undone(kept):
    """The statement is left to finish (a cancelled statement waits for the server's word), and what it
    changed is handed to `undo` on a write thread."""
    undone: list[int] = []
    with pytest.raises(DatabaseTimeout):
        await loopdb.write_within(
            0.05, "SELECT pg_sleep(0.3) FROM generate_series(1, 2)", [], undo=undone.append
        )
    for _ in range(100):
        if undone:
            break
        await asyncio.sleep(0.02)
    assert undone == [2]
