"""The suite's teardown of a transactional test (tests/db_flush.py) and what it relies on: pytest-django
runs the test as a Django TransactionTestCase, which empties the database through `_fixture_teardown`;
what it leaves is what Django's flush leaves. Two of these tests come in pairs, in file order: the
first leaves the database as a test may, the second is the next test and sees what it starts from."""

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.contrib.contenttypes.models import ContentType
from django.contrib.sessions.models import Session
from django.db import connection
from django.test import TransactionTestCase
from django.utils import timezone

from pools.models import GatewaySettings
from tests import db_flush
from tests.factories import CatalogEntryFactory, GatewayKeyFactory

pytestmark = pytest.mark.django_db(transaction=True)

# What `write_everywhere` writes into, and the trigger's counter it moves (ConfigVersion).
WRITTEN = {
    "auth_group",
    "auth_user",
    "auth_user_groups",
    "auth_user_user_permissions",
    "catalog_catalogentry",
    "django_session",
    "pools_assignment",
    "pools_configversion",
    "pools_gatewaykey",
    "pools_gatewaykey_pools",
    "pools_gatewaysettings",
    "pools_pool",
}


def write_everywhere() -> None:
    """Rows as tests leave them: the configuration (moving the version), a key on a pool (a many-to-many),
    an admin user with a group and a permission, a session."""
    entry = CatalogEntryFactory()
    GatewayKeyFactory(pools=[entry.assignment.pool])
    GatewaySettings.objects.update_or_create(pk=1, defaults={"backoff_base_ms": 0})
    user = User.objects.create_user("operator")
    user.groups.add(Group.objects.create(name="operators"))
    user.user_permissions.add(Permission.objects.get(codename="view_pool"))
    Session.objects.create(session_key="k" * 32, session_data="", expire_date=timezone.now())


def tables_with_rows() -> set[str]:
    with connection.cursor() as cursor:
        tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
        return set(db_flush.tables_with_rows(cursor, connection, tables))


def database() -> dict[str, object]:
    """Every table's rows; content types and permissions by their natural keys (a flush re-creates them
    under new ids)."""
    state: dict[str, object] = {}
    with connection.cursor() as cursor:
        for table in connection.introspection.django_table_names(only_existing=True, include_views=False):
            if table not in db_flush.KEPT:
                cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
                state[table] = sorted(map(repr, cursor.fetchall()))
    state["content types"] = sorted(ContentType.objects.values_list("app_label", "model"))
    state["permissions"] = sorted(
        Permission.objects.values_list("content_type__app_label", "content_type__model", "codename", "name")
    )
    return state


def test_the_database_emptied_is_the_one_djangos_flush_leaves():
    write_everywhere()
    assert tables_with_rows() >= WRITTEN
    db_flush.empty(connection)
    emptied = database()

    write_everywhere()
    db_flush.djangos_fixture_teardown(TransactionTestCase(methodName="__init__"))
    flushed = database()
    if connection.vendor == "sqlite":  # DELETEs in any order: the counter is written back when it came first
        flushed["pools_configversion"] = []
    assert flushed == emptied


def test_a_transactional_test_leaves_rows_in_many_tables():
    write_everywhere()
    assert tables_with_rows() >= WRITTEN


def test_the_next_one_starts_from_the_tables_emptied_by_delete():
    assert set(db_flush.last_emptied) == WRITTEN  # by this suite's teardown, not Django's
    assert tables_with_rows() == set(db_flush.KEPT)


def test_a_transactional_test_may_remove_content_types_and_permissions():
    ContentType.objects.get_for_model(Session).delete()  # and its permissions with it
    Permission.objects.filter(codename="view_pool").delete()


def test_the_next_one_finds_them_again():
    assert ContentType.objects.filter(app_label="sessions", model="session").exists()
    assert Permission.objects.filter(codename__in=["view_pool", "view_session"]).count() == 2
