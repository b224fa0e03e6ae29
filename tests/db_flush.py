"""How a transactional test's database is emptied for the next one: the same database as Django's
flush leaves, for a fraction of its cost. Registered for the whole suite by tests/conftest.py.

Django ends every transactional test (pytest-django's `transaction=True`, `transactional_db`,
`live_server`) with `flush`: one TRUNCATE of every table, then the post_migrate signal, which
re-creates every content type and permission. On PostgreSQL the TRUNCATE gives each of some 40 tables
and their indexes new files: measured 250 ms a test at load 2.7 (tests/providers), and the signal
70 ms more, for some 500 tests a run, where most tests wrote to a handful of tables.

Here a teardown DELETEs from the tables that have rows, in one transaction (Django's foreign keys are
deferred), and again until none has: a DELETE fires the configuration-version triggers
(pools/migrations/0004) that a TRUNCATE does not, and they write the counter row back. Content types
and permissions are left in place when they are exactly as Django's last flush left them; when a test
changed them, or the test asks for `available_apps` or `serialized_rollback`, Django's own flush runs.
Sequences are not reset, as Django's teardown does not reset them either.

Relied on (tests/test_db_flush.py): pytest-django runs a transactional test as a Django
TransactionTestCase, whose `_post_teardown` empties the database through `_fixture_teardown`
(with `_databases_names`); Django's flush leaves content types and permissions as the only rows, and
no other post_migrate receiver writes any.
"""

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.test import TransactionTestCase

# The tables the post_migrate signal fills; every other table is empty after a flush.
KEPT = (ContentType._meta.db_table, Permission._meta.db_table)

djangos_fixture_teardown = TransactionTestCase._fixture_teardown

# Per database alias: the kept tables' rows as Django's last flush left them.
_flushed: dict[str, list[list[tuple]]] = {}

# The tables the last teardown emptied, for its contract test.
last_emptied: list[str] = []


def kept_rows(connection: BaseDatabaseWrapper) -> list[list[tuple]]:
    with connection.cursor() as cursor:
        rows = []
        for table in KEPT:
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)} ORDER BY 1")
            rows.append(cursor.fetchall())
        return rows


def tables_with_rows(cursor, connection: BaseDatabaseWrapper, tables: list[str]) -> list[str]:
    """One round trip: which of `tables` hold a row."""
    quote = connection.ops.quote_name
    cursor.execute(
        " UNION ALL ".join(
            f"SELECT {i} WHERE EXISTS (SELECT 1 FROM {quote(table)})" for i, table in enumerate(tables)
        )
    )
    return [tables[i] for (i,) in cursor.fetchall()]


def empty(connection: BaseDatabaseWrapper) -> list[str]:
    """Every table but the kept ones emptied, in one transaction: the tables it emptied."""
    kept = {connection.introspection.identifier_converter(table) for table in KEPT}
    tables = sorted(  # in one order every run (pools_configversion before the tables its triggers watch)
        table
        for table in connection.introspection.django_table_names(only_existing=True, include_views=False)
        if table not in kept
    )
    emptied: list[str] = []
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        for _ in range(3):  # a trigger's write on the first round is deleted on the second
            full = tables_with_rows(cursor, connection, tables)
            if not full:
                return emptied
            for table in full:
                cursor.execute(f"DELETE FROM {connection.ops.quote_name(table)}")
            emptied += full
    raise RuntimeError(f"triggers keep writing into {full} while the test database is emptied")


def fixture_teardown(self: TransactionTestCase) -> None:
    """TransactionTestCase._fixture_teardown, by DELETE where it can (the module's docstring)."""
    aliases = self._databases_names(include_mirrors=False)
    # Django's flush runs post_migrate (and leaves kept rows a later test's may be compared with) unless:
    plain = self.available_apps is None and not self.serialized_rollback
    if plain and all(_flushed.get(alias) == kept_rows(connections[alias]) for alias in aliases):
        last_emptied[:] = [table for alias in aliases for table in empty(connections[alias])]
        return
    last_emptied.clear()
    djangos_fixture_teardown(self)
    for alias in aliases:
        if plain:
            _flushed[alias] = kept_rows(connections[alias])
        else:
            _flushed.pop(alias, None)


def pytest_configure(config) -> None:
    TransactionTestCase._fixture_teardown = fixture_teardown


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test databases, their kept rows remembered as `migrate` left them (its
    post_migrate signal, as a flush's); at the end, released for pytest-django to drop (`_release`)."""
    with django_db_blocker.unblock():
        for alias in connections:
            _flushed[alias] = kept_rows(connections[alias])
    yield
    with django_db_blocker.unblock():
        for alias in connections:
            _release(connections[alias])


def _release(conn: BaseDatabaseWrapper) -> None:
    """Before pytest-django drops a PostgreSQL test database: end the sessions other threads of this
    process still hold on it (runtime.db's and the ledger writers' threads keep a connection between
    uses by design), which would make the DROP fail after waiting, leaving the database behind."""
    if conn.vendor != "postgresql":
        return
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    conn.close()
