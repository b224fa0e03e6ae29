"""Hand-written SQL for the read every proxied request makes (the key and the health), the two
writes every failover makes (the circuit's compare-and-swap, the demotion upsert: routing.services)
and the ledger's inserts of each batch (proxy.services).

The ORM costs about 0.4 ms of Python per query here against 0.03 ms for the same statement through
a cursor, and these run on every request or every hand-off; everything else uses the ORM. Statements are
built from the models' table and column names, run on SQLite and PostgreSQL alike, and their values
are normalised here (SQLite returns datetimes and JSON as text and booleans as integers). The one
exception: a large ledger batch goes to PostgreSQL as one array per column (`fetch_arrays`).

Relied on (tests/runtime/test_rawsql.py): what each backend's cursor returns for these columns, and
`connection.ops.adapt_datetimefield_value` comparing as the ORM's parameters do; (tests/proxy/
test_ledger_writer.py) psycopg's array dumper for each type's array oid, registered on the connection,
sending an array with that type whatever its values.
"""

import functools
import json
import weakref
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from django.db import connection
from django.utils.dateparse import parse_datetime
from psycopg import pq


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


def as_param(value: datetime) -> object:
    """A datetime as the backend stores it (SQLite compares naive UTC text)."""
    return connection.ops.adapt_datetimefield_value(value)


def as_json(value: object) -> object:
    return json.loads(value) if isinstance(value, str | bytes) else value


def fetch_arrays(sql: str, columns: Iterable[Sequence[object]], types: Sequence[str]) -> list[tuple]:
    """PostgreSQL: run `sql` with each of `columns` as one array parameter of its SQL type (`types`,
    e.g. "bigint" for `bigint[]`); the rows it returns, if any.

    psycopg dumps a plain list by looking over its elements on every execute (the type of each, the
    largest int), in Python (about a fifth of the array's dump: 25 against 19 us for one element, 691
    against 555 us for 200), and sends an int column as int2[], int4[] or int8[] by its values and a
    column of NULLs as unknown: a statement is prepared once per combination of those. A list subclass
    registered with the dumper of its array type skips the look and always goes with the same type."""
    connection.ensure_connection()
    raw = connection.connection
    registered = _registered.setdefault(raw, set())
    for name in set(types) - registered:
        adapters = raw.adapters
        adapters.register_dumper(
            _array(name), adapters.get_dumper_by_oid(adapters.types[name].array_oid, pq.Format.TEXT)
        )
        registered.add(name)
    with connection.cursor() as cursor:
        cursor.execute(sql, [_array(name)(c) for name, c in zip(types, columns, strict=True)])
        return cursor.fetchall() if cursor.description else []


# The connections (psycopg's) whose adapters know each array type: registered on the connection, as a
# cursor's adapters are a copy of its connection's taken when the cursor opens.
_registered: weakref.WeakKeyDictionary[object, set[str]] = weakref.WeakKeyDictionary()


@functools.cache
def _array(name: str) -> type[list]:
    """The list subclass psycopg dumps as an array of the SQL type `name`."""
    return type(f"{name}[]", (list,), {})
