"""The request path's read before dispatch, on the event loop itself.

runtime.db's threads cost the event loop more than their CPU: each read thread takes the GIL to hand
its rows back, and the loop, which gives the GIL up at every system call it makes (a log line, the
ledger's journal, a random id), waits for a read thread to give it back (bench/profile.md: at c=50
against a 50 ms upstream, a fifth of the loop's time was spent waiting for the GIL, and requests that
had their answer waited with it). On PostgreSQL the one statement every request runs
(routing.request_state) is sent on an asynchronous psycopg connection instead, and
its rows are turned into the routing state on the loop: no thread, no hand-off. So is the one write a
request with a budget makes before dispatch, its reservation (`write_within`), on a pool of its own.

SQLite has no asynchronous driver, and needs none: the database is a local file, and in WAL mode (the
gateway's settings) a read never waits for the writer. There the statement runs on the loop itself, on
a connection of the loop's own (`_sqlite`), made as Django makes its own and told never to wait for a
lock: the rare read that would (a WAL being recovered, a database not in WAL mode) is handed to
runtime.db's threads (NoConnection), whose connections wait it out. The thread's hand-back cost more
than the statement: at c=50 against a 50 ms upstream a read's rows waited 3-6 ms (median) for the loop
to take them, and the gateway served 70 % of the direct calls' rate against 93 % on the loop
(bench/profile.md).

The connections are psycopg_pool's `AsyncConnectionPool` (`ReadPool`: the connection returned last is
handed out first), one for reads and one for writes per event loop (a server runs one loop; tests run
several), opened on first use
with the parameters Django's own connections use (its adapters, so rows come back typed exactly as a
Django cursor's, and its server-side binding with the same prepare threshold), autocommit as Django's,
in Django's time zone, each kept for CONN_MAX_AGE (with 0, no pool: a new connection for every read,
closed after it). A pool's connection is handed out without a round trip: `_hung_up` discards one whose
socket is readable (the server sent its FATAL notice and closed it: a restart, a terminated backend), as
runtime.db.reuse does for the threads' connections; a host gone silent is found by the statement's TCP
user timeout and by `fetch_within`'s bound. A pool is closed with its loop (`close`: a server's lifespan
shutdown, a test server's exit).

`fetch_within` runs the statement in a task of its own and stops waiting for it at its bound: a
cancelled psycopg statement waits up to ten seconds for the server to confirm the cancel, a wait no
request may inherit. The statement finishes (or breaks) on its own and its connection goes back to
the pool or is discarded.

Relied on (tests/runtime/test_loopdb.py): Django's PostgreSQL `get_connection_params` (connection
keywords plus a sync `cursor_factory`, dropped here, and an adapters `context`, kept); psycopg_pool's
`configure` callback, and that it drops a connection returned closed or broken and connects another;
its private `_get_ready_connection`, which ReadPool overrides (a psycopg_pool that renames it makes the
order psycopg_pool's again, and the test of the order fails). Django's SQLite `get_connection_params` and
`get_new_connection` (a connection typed and set up as its own) and `SQLiteCursorWrapper` (its
placeholders converted); Python's `sqlite_errorcode` on a lock's OperationalError.
"""

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC
from functools import partial
from typing import TypeVar

import psycopg
from django.db import DatabaseError
from django.db.backends.sqlite3.base import SQLiteCursorWrapper
from psycopg.types.datetime import TimestamptzLoader
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from runtime import db, rawsql
from runtime.db import DatabaseTimeout, readable

MAX_CONNECTIONS = 8  # per process: at most this many reads in flight; more wait for a connection
MAX_WRITE_CONNECTIONS = 4  # and writes (as runtime.db's write threads): a budgeted key's reservations
FOR_GOOD_S = 365 * 24 * 3600.0  # CONN_MAX_AGE None: a connection is kept as long as it works
# How long a read waits for a pooled connection: a free one is back within a statement's time (well
# under a millisecond), a new one within a connect's; longer, and the database is likely gone.
CONNECTION_WAIT_S = 0.25

_pools: dict[asyncio.AbstractEventLoop, "ReadPool"] = {}
_write_pools: dict[asyncio.AbstractEventLoop, "ReadPool"] = {}
T = TypeVar("T")


def _max_age() -> int | None:
    """CONN_MAX_AGE: seconds a connection is kept, 0 for a new one every use, None for good."""
    return rawsql.backend().settings_dict["CONN_MAX_AGE"]


def _params() -> dict:
    """Django's connection keywords, for an asynchronous connection."""
    params = rawsql.backend().get_connection_params()
    params.pop("cursor_factory", None)  # Django's sync cursor class; the async default binds server-side
    return {**params, "autocommit": True}


async def _configure(conn: psycopg.AsyncConnection) -> None:
    """A new connection as Django configures its own: its time zone (the adapters read timestamps in
    it) and its role."""
    django = rawsql.backend()
    zone = django.timezone_name
    if zone and conn.info.parameter_status("TimeZone") != zone:
        await conn.execute("SELECT set_config('TimeZone', %s, false)", [zone])
    if zone == "UTC" and django.timezone is UTC:
        # Django's timestamptz loader is a Python subclass of psycopg's (to give its zone), so psycopg's
        # C loader goes unused: 2 us a value against 0.13, and the request's statement reads one or two
        # per latency row, one row per account and model that served. In UTC both give the same values.
        conn.adapters.register_loader("timestamptz", TimestamptzLoader)
    role = django.settings_dict["OPTIONS"].get("assume_role")
    if role:
        await conn.execute("SELECT set_config('role', %s, false)", [role])


class NoConnection(Exception):
    """The pool had no connection to give within CONNECTION_WAIT_S: the database cannot be reached
    (the pool reconnects in the background meanwhile), or every connection is busy. The caller reads
    on runtime.db's threads instead, which connect on their own, and fail at once on a database that
    refuses connections."""


class ReadConnection(psycopg.AsyncConnection):
    """A connection of the loop's pools that keeps one cursor for its statements: `execute` on the
    connection builds a cursor (and its adapters' transformer) every time, about a fifth of a read's CPU
    on the loop."""

    _reader: psycopg.AsyncCursor | None = None

    def _cursor(self) -> psycopg.AsyncCursor:
        cursor = self._reader
        if cursor is None or cursor.closed:
            cursor = self._reader = self.cursor()
        return cursor

    async def rows(self, sql: str, params: Sequence[object]) -> list[tuple]:
        cursor = self._cursor()
        await cursor.execute(sql, params)
        return await cursor.fetchall()

    async def count(self, sql: str, params: Sequence[object]) -> int:
        """The rows a statement that writes changed."""
        cursor = self._cursor()
        await cursor.execute(sql, params)
        return cursor.rowcount


class ReadPool(AsyncConnectionPool[ReadConnection]):
    """psycopg_pool's pool, handing out the connection returned last where psycopg_pool hands out the
    one returned first. After a burst has opened all eight, a steady load that needs one or two reads at
    a time then goes to the same one or two backends, whose caches and prepared statement are warm,
    instead of taking turns on all eight: at c=1, 0.146-0.173 against 0.176-0.215 ms of PostgreSQL CPU
    a request (bench/profile.md). The connections left unused sit at the far end, where the pool's own
    shrinking takes its idle ones from (max_idle)."""

    async def _get_ready_connection(self, timeout: float | None) -> ReadConnection | None:
        ready = self._pool
        if not ready or (timeout is not None and timeout <= 0.0):
            return await super()._get_ready_connection(timeout)  # its waiting and its timeout rules
        conn = ready.pop()
        self._nconns_min = min(self._nconns_min, len(ready))  # as psycopg_pool counts idle connections
        return conn


def _hung_up(conn: psycopg.AsyncConnection) -> bool:
    """Whether a pooled connection is closed, or its server has written to it unasked (its FATAL notice
    before it hung up). Checked here, not by the pool's `check` callback: after a failed check the pool
    waits a second before it tries another connection."""
    return conn.closed or readable(conn.fileno())


async def _connection(pool: ReadPool) -> ReadConnection:
    """A working connection from the pool within CONNECTION_WAIT_S, else NoConnection."""
    deadline = time.monotonic() + CONNECTION_WAIT_S
    while True:
        try:
            conn = await pool.getconn(timeout=max(deadline - time.monotonic(), 0.001))
        except PoolTimeout:
            raise NoConnection from None
        if not _hung_up(conn):
            return conn
        await conn.close()
        await pool.putconn(conn)  # a closed connection is dropped, and the pool connects another


def _pool(*, writes: bool = False) -> ReadPool:
    """The running loop's read pool, or its write pool: a write can wait for a row lock, and in a shared
    pool writes stuck behind one would leave the reads no connection (as runtime.db's pools)."""
    loop = asyncio.get_running_loop()
    pools = _write_pools if writes else _pools
    pool = pools.get(loop)
    if pool is None:
        for stale in [other for other in pools if other.is_closed()]:
            del pools[stale]  # its loop is gone: its connections close as the pool is collected
        max_age = _max_age()
        pool = pools[loop] = ReadPool(
            kwargs=_params(),
            min_size=1,
            max_size=MAX_WRITE_CONNECTIONS if writes else MAX_CONNECTIONS,
            max_lifetime=float(max_age) if max_age else FOR_GOOD_S,
            open=False,
            configure=_configure,
            name="gateway-request-write" if writes else "gateway-request-read",
            connection_class=ReadConnection,
        )
    return pool


async def _on_connection(
    use: Callable[[ReadConnection, str, Sequence[object]], Awaitable[T]],
    sql: str,
    params: Sequence[object],
    *,
    writes: bool = False,
) -> T:
    """`use(connection, sql, params)` on a connection of the loop's pool (a new one with CONN_MAX_AGE 0)."""
    if _max_age() == 0:  # a new connection for every use
        conn = await ReadConnection.connect(**_params())
        try:
            await _configure(conn)
            return await use(conn, sql, params)
        finally:
            await conn.close()
    pool = _pool(writes=writes)
    if pool.closed:  # new: opened by its first use (a pool that was closed is no longer in `_pools`)
        await pool.open()
    conn = await _connection(pool)
    try:
        return await use(conn, sql, params)
    finally:
        await pool.putconn(conn)  # back to the pool, or discarded if the statement broke it


async def _fetch(sql: str, params: Sequence[object]) -> list[tuple]:
    return await _on_connection(ReadConnection.rows, sql, params)


def _retrieve(task: asyncio.Task) -> None:
    # A statement the request stopped waiting for: its failure is nobody's to handle.
    if not task.cancelled():
        task.exception()


async def fetch_within(
    timeout_s: float,
    sql: str,
    params: Sequence[object],
    meanwhile: Callable[[], object] | None = None,
) -> list[tuple]:
    """The rows of one statement, or DatabaseTimeout after `timeout_s`, DatabaseError when the database
    refuses it or the connection breaks (as a Django cursor's failure), NoConnection when the pool has
    none to give.

    `meanwhile`: work for the loop while the statement is on its way: a callback queued right behind the
    statement's task, so it runs once the task has taken a pooled connection and sent the statement,
    before the rows can be read and before the caller resumes. It must not raise (the loop's exception
    handler would only log it).

    The caller waits on a future of its own that the statement's task or a timer settles, whichever
    comes first: what `wait_for(shield(task))` does, without its second future, its task-side
    callbacks and its cancellation bookkeeping (about 40,000 of the read's 280,000 interpreter
    instructions, bench/profile.md). A caller cancelled meanwhile leaves the statement running.

    On SQLite the statement runs on the loop before anything else does (`_sqlite_rows`): there is no
    wait for `meanwhile` to fill and it is not called, and no network for `timeout_s` to bound."""
    if rawsql.backend().vendor == "sqlite":
        return await _sqlite_rows(sql, params)
    loop = asyncio.get_running_loop()
    task = loop.create_task(_fetch(sql, params))
    task.add_done_callback(_retrieve)
    waiter = loop.create_future()

    def settle(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    task.add_done_callback(settle)
    timer = loop.call_later(timeout_s, settle)
    if meanwhile is not None:
        # Behind the task's first step (scheduled at its creation), before any row can be read: it has
        # run by the time anything (rows, timer, cancellation) resumes the caller.
        loop.call_soon(meanwhile)
    try:
        await waiter
    finally:
        timer.cancel()
        task.remove_done_callback(settle)
    if not task.done():
        raise DatabaseTimeout
    try:
        return task.result()
    except psycopg.Error as failed:  # the pool's own timeouts and refusals are psycopg errors too
        raise DatabaseError(type(failed).__name__) from failed


THREADS_MIN_S = 0.1  # the least a read handed to runtime.db's threads is given (`rows_within`)


async def rows_within(
    timeout_s: float,
    sql: str,
    params: Sequence[object],
    meanwhile: Callable[[], object] | None = None,
) -> list[tuple]:
    """`fetch_within`, and when the loop has no connection to give (NoConnection: the pool is empty,
    SQLite would wait for a lock) the same statement on runtime.db's threads, within what is left of
    `timeout_s` (THREADS_MIN_S at least): the one fallback of every read on the request path."""
    until = time.monotonic() + timeout_s
    try:
        return await fetch_within(timeout_s, sql, params, meanwhile)
    except NoConnection:
        left = max(until - time.monotonic(), THREADS_MIN_S)
        return await db.run_within(left, rawsql.fetch, sql, params)


_late: set[asyncio.Future] = set()  # undos under way (`write_within`), kept until they are done


def _undo_late(undo: Callable[[int], object], task: asyncio.Task) -> None:
    """A write the caller stopped waiting for is done: what it took is given back (`undo`), on a thread."""
    if task.cancelled() or task.exception() is not None:
        return
    later = asyncio.ensure_future(db.write(db.undo_late, undo, task.result()))
    _late.add(later)
    later.add_done_callback(_late.discard)


async def write_within(
    timeout_s: float, sql: str, params: Sequence[object], *, undo: Callable[[int], object] | None = None
) -> int:
    """The rows one statement that writes changed, run on the loop's write pool (PostgreSQL), in
    autocommit; DatabaseTimeout after `timeout_s`, DatabaseError when the database refuses it,
    NoConnection when the pool has none to give, or on SQLite (whose writes wait for its one writer's
    lock: runtime.db's write threads take them).

    As runtime.db.write_within: a caller that stops waiting (its bound passed, or it was cancelled) leaves
    the statement to finish on its own, and `undo(rows changed)` then runs on runtime.db's write threads,
    so what the write took for the caller (a budget reservation) is given back instead of held for good.
    A write's answer handed back by a thread waited for the loop as a read's did: at c=16 a key with a
    budget was served 780-910 requests a second with its reservation on a thread, the loop idle a
    quarter of the time, and 915-1000 with it here (bench/profile.md)."""
    if rawsql.backend().vendor != "postgresql":
        raise NoConnection
    task = asyncio.get_running_loop().create_task(
        _on_connection(ReadConnection.count, sql, params, writes=True)
    )
    task.add_done_callback(_retrieve)
    try:
        return await asyncio.wait_for(asyncio.shield(task), timeout_s)
    except (TimeoutError, asyncio.CancelledError) as stopped:
        if undo is not None and not task.done():  # one done by then: the caller's record settles it
            task.add_done_callback(partial(_undo_late, undo))
        if isinstance(stopped, TimeoutError):
            raise DatabaseTimeout from None
        raise
    except psycopg.Error as failed:  # the pool's own timeouts and refusals are psycopg errors too
        raise DatabaseError(type(failed).__name__) from failed


# -- SQLite ------------------------------------------------------------------------------------------


class SQLiteReadCursor(SQLiteCursorWrapper):
    """The loop's SQLite cursor: Django's own cursor class, so `%s` placeholders are converted as a
    Django cursor converts them."""

    def rows(self, sql: str, params: Sequence[object]) -> list[tuple]:
        self.execute(sql, params)
        return self.fetchall()


_sqlite: dict[asyncio.AbstractEventLoop, SQLiteReadCursor] = {}
# A lock the loop's connection would have waited for (SQLITE_BUSY; SQLITE_LOCKED in a shared cache).
_LOCKED = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _sqlite_connect() -> SQLiteReadCursor:
    """A cursor on a new connection made as Django makes its own (its parameters, functions and init
    commands: rows come back typed as a Django cursor's, and `%s` placeholders are Django's cursor's
    to convert), failing at once on a lock instead of waiting out the busy timeout. It only reads, and
    Python's sqlite3 opens no transaction for a SELECT: each read sees what is committed when it runs.
    Made on a runtime.db thread: Django refuses to connect on an event loop."""
    django = rawsql.backend()
    conn = django.get_new_connection(django.get_connection_params())
    conn.execute("PRAGMA busy_timeout = 0")
    return conn.cursor(factory=SQLiteReadCursor)


async def _sqlite_rows(sql: str, params: Sequence[object]) -> list[tuple]:
    """The statement's rows, read on the loop, on the loop's own connection (made on first use and
    kept until the loop closes). NoConnection when it would have waited for a lock or cannot be made;
    DatabaseError when SQLite refuses the statement, and the connection is made again for the next
    read."""
    loop = asyncio.get_running_loop()
    cursor = _sqlite.get(loop)
    if cursor is None:
        for stale in [other for other in _sqlite if other.is_closed()]:
            _sqlite.pop(stale).connection.close()
        try:
            made = await db.run(_sqlite_connect)
        except sqlite3.Error:
            raise NoConnection from None  # the threads' own connections fail as Django's errors
        cursor = _sqlite.setdefault(loop, made)  # another read may have made one meanwhile
        if cursor is not made:
            made.connection.close()
    try:
        return cursor.rows(sql, params)
    except sqlite3.Error as failed:
        if isinstance(failed, sqlite3.OperationalError) and failed.sqlite_errorcode & 0xFF in _LOCKED:
            raise NoConnection from None
        _sqlite.pop(loop, None)
        cursor.connection.close()
        raise DatabaseError(type(failed).__name__) from failed


async def close() -> None:
    """Close the running loop's pools and SQLite connection, if it has them (its loop is stopping)."""
    loop = asyncio.get_running_loop()
    cursor = _sqlite.pop(loop, None)
    if cursor is not None:
        cursor.connection.close()
    for pools in (_pools, _write_pools):
        pool = pools.pop(loop, None)
        if pool is not None:
            await pool.close()
