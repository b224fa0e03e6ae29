"""The request path's way into the database.

Django's ASGI handler gives every request a fresh thread for thread-sensitive sync code, and with
it a fresh database connection: a thread start, a connect and a teardown per request, which cost
more than all of the gateway's own work. The proxy instead runs its database calls on a small
long-lived pool whose threads keep their connections (CONN_MAX_AGE, with health checks), and ages
them out the way Django's request signals would.

Reads and writes have a pool each. A write can wait on a lock (SQLite has one writer at a time; a
PostgreSQL row may be locked); in a shared pool, a few writes stuck behind a long lock would hold
every thread, and the reads of every other request (authentication, the routing view) would queue
behind them and time out. With a pool of their own, a held write lock delays only the writes.

Django's native psycopg pool in place of the threads' own connections was measured with make bench
(A/B, three runs; bench/profile.md) and not shown faster: the threads keep theirs.

A kept connection is checked before a call only when it may be broken (`reuse`): Django's health check
(CONN_HEALTH_CHECKS) would run `SELECT 1` before every call's first statement, a round trip per call
that cost about as much as the request's read itself (bench/profile.md).

A call hops to its pool with the event loop's `run_in_executor`, in a copy of the caller's context
(its context variables), as asgiref's `sync_to_async(thread_sensitive=False, executor=)` ran it before,
without that wrapper's per-call objects, context restore and thread-local bookkeeping: 7-14 us less
CPU per call at c=16 (bench/profile.md).

Relied on (tests/runtime/test_db.py): Django's one connection per thread, aged by
`close_old_connections` as CONN_MAX_AGE says.
"""

import asyncio
import contextvars
import functools
import logging
import select
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from django.db import DatabaseError, close_old_connections, connections

log = logging.getLogger("gateway")

P = ParamSpec("P")
T = TypeVar("T")

_executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gateway-db")
_write_executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gateway-db-write")


def reuse() -> None:
    """Before a call: the calling thread's connections aged out as CONN_MAX_AGE says (Django's
    `close_old_connections`), and the health check kept for a connection that may be broken.
    Django checks after a call that raised a database error (and closes the connection if it fails);
    a PostgreSQL connection the server ended while it sat idle (a restart, a terminated backend) has
    its socket readable: the server sent its FATAL notice and closed it. Without either, the last call
    just used the connection and nothing has arrived since, so the `SELECT 1` is skipped. A host gone
    silent is found by the first statement's TCP user timeout, as by the check's."""
    close_old_connections()
    for conn in connections.all(initialized_only=True):
        raw = conn.connection
        if raw is None or conn.health_check_done or conn.vendor != "postgresql" or raw.closed:
            continue
        conn.health_check_done = not readable(raw.fileno())


def readable(fd: int) -> bool:
    """Whether a socket has something to read now (poll: `select` refuses a descriptor past 1023, and a
    gateway holding many websockets has such descriptors)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _call(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    reuse()
    try:
        return fn(*args, **kwargs)
    finally:
        close_old_connections()  # closes at once when CONN_MAX_AGE is 0


def _submit(
    executor: ThreadPoolExecutor, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
) -> asyncio.Future[T]:
    call = functools.partial(contextvars.copy_context().run, _call, fn, *args, **kwargs)
    return asyncio.get_running_loop().run_in_executor(executor, call)


async def _on(executor: ThreadPoolExecutor, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    return await _submit(executor, fn, *args, **kwargs)


async def run(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """A read (or anything that takes no write lock) on the read pool."""
    return await _on(_executor, fn, *args, **kwargs)


async def write(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """A write on the write pool: however long it waits for a lock, no read waits behind it."""
    return await _on(_write_executor, fn, *args, **kwargs)


class DatabaseTimeout(DatabaseError):
    """The database did not answer in time (a silent peer: no TCP-level timeout fires on it)."""


async def run_within(timeout_s: float, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`run`, answering DatabaseTimeout after `timeout_s`. The blocked thread finishes on its own
    once the database answers or its connection breaks; the request does not wait for it."""
    try:
        # The pool's future itself, not a coroutine awaiting it: wait_for would wrap that in a task
        # of its own (about 30 us of CPU a request).
        return await asyncio.wait_for(_submit(_executor, fn, *args, **kwargs), timeout_s)
    except TimeoutError:
        raise DatabaseTimeout from None


def undo_late(undo: Callable[[T], object], result: T) -> None:
    """`undo(result)` for a write its caller stopped waiting for (`write_within`, runtime.loopdb's): nobody
    waits for it, so a failure is logged."""
    try:
        undo(result)
    except DatabaseError:
        log.exception("a late write could not be undone")


async def write_within(
    timeout_s: float, fn: Callable[[], T], *, undo: Callable[[T], object] | None = None
) -> T:
    """`write`, answering DatabaseTimeout after `timeout_s` (a request's deadline bounds its waits on
    a stalled database). The write still finishes on its own thread once the database answers; if
    the request had stopped waiting by then (its deadline passed, or it was cancelled: its client
    left), `undo(result)` runs there too, so what the write took for the request (a budget
    reservation, a probe lease) is given back instead of held for good. (A request cancelled just
    as its write finished never took the result: a budget reservation is then settled by the request's
    record, a probe lease runs out.)"""
    lock = threading.Lock()
    state = {"done": False, "abandoned": False}
    box: list[T] = []

    def call() -> T:
        result = fn()
        with lock:
            state["done"] = True
            box.append(result)
            abandoned = state["abandoned"]
        if abandoned and undo is not None:
            undo_late(undo, result)
        return result

    task = asyncio.ensure_future(write(call))
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # a late failure is not "unretrieved"
    try:
        return await asyncio.wait_for(asyncio.shield(task), timeout_s)
    except (TimeoutError, asyncio.CancelledError) as stopped:
        with lock:
            if state["done"] and isinstance(stopped, TimeoutError):
                return box[0]
            state["abandoned"] = True
        if isinstance(stopped, TimeoutError):
            raise DatabaseTimeout from None
        raise
