"""Hand-written SQL for the read every proxied request makes (the key and the health), the two
writes every failover makes (the circuit's compare-and-swap, the demotion upsert: routing.services)
and the ledger's inserts of each batch (proxy.ledger.services).

The ORM costs about 0.4 ms of Python per query here against 0.03 ms for the same statement through
a cursor, and these run on every request or every hand-off; everything else uses the ORM. Statements are
built from the models' table and column names, run on SQLite and PostgreSQL alike, and their values
are normalised here (SQLite returns datetimes and JSON as text and booleans as integers). A large
ledger batch goes to PostgreSQL by COPY (proxy.ledger.services).

Relied on (tests/runtime/test_rawsql.py): what each backend's cursor returns for these columns, and
`connection.ops.adapt_datetimefield_value` comparing as the ORM's parameters do.
"""

import functools
from collections.abc import Sequence
from datetime import UTC, datetime

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.dateparse import parse_datetime

from runtime import fastjson


def fetch(sql: str, params: Sequence[object]) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


def nulls(count: int) -> str:
    return ", ".join(["NULL"] * count)


def as_datetime(value: object) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value if value is None or value.tzinfo else value.replace(tzinfo=UTC)
    parsed = parse_datetime(str(value))
    if parsed is None:
        raise ValueError("not a datetime")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)  # stored as UTC (USE_TZ)


@functools.cache
def backend() -> BaseDatabaseWrapper:
    """The default database's backend, for what depends on it alone (its vendor, how it adapts a
    value): one wrapper for the process, never connected. `django.db.connection` is one wrapper per
    thread and per asyncio context, so on the event loop every request built a new one (its backend
    loaded, its operations and features created) just to ask (bench/profile.md). It shares the
    configured settings (`connections.settings`), so the test runner's database name is seen too."""
    return connections.create_connection(DEFAULT_DB_ALIAS)


def as_param(value: datetime) -> object:
    """A datetime as the backend stores it (SQLite compares naive UTC text)."""
    return backend().ops.adapt_datetimefield_value(value)


def as_json(value: object) -> object:
    return fastjson.loads(value) if isinstance(value, str | bytes) else value
