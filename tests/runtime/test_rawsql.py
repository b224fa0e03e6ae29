"""runtime.rawsql's contract with the database backends: what a cursor returns for a datetime, a JSON
and a boolean column, normalised by rawsql, is what the ORM reads, and a datetime parameter adapted by
rawsql compares as the ORM's does (on the backend the suite runs on: SQLite returns text and integers,
PostgreSQL typed values)."""

from datetime import UTC, datetime, timedelta

import pytest

from pools.models import GatewayKey
from runtime import rawsql
from tests.factories import GatewayKeyFactory

pytestmark = pytest.mark.django_db

AT = datetime(2026, 12, 1, 15, 30, 45, 123456, tzinfo=UTC)


def column(field: str) -> str:
    return GatewayKey._meta.get_field(field).column


def read_by_hand(key: GatewayKey, *fields: str) -> tuple:
    sql = f"SELECT {', '.join(column(f) for f in fields)} FROM {GatewayKey._meta.db_table} WHERE id = %s"
    return rawsql.fetch(sql, [key.pk])[0]


def test_datetimes_and_json_read_by_hand_are_the_orms():
    key = GatewayKeyFactory(period_start=AT, allowed_models=["gpt-5", "claude-*"], regions=[])
    period_start, allowed, regions = read_by_hand(key, "period_start", "allowed_models", "regions")
    orm = GatewayKey.objects.get(pk=key.pk)
    assert rawsql.as_datetime(period_start) == orm.period_start == AT
    assert rawsql.as_json(allowed) == orm.allowed_models == ["gpt-5", "claude-*"]
    assert rawsql.as_json(regions) == orm.regions == []


def test_a_datetime_computed_by_sql_reads_as_the_orms():
    """An expression's value has no declared type: SQLite's cursor gives it back as text."""
    key = GatewayKeyFactory(period_start=AT)
    sql = f"SELECT MAX({column('period_start')}) FROM {GatewayKey._meta.db_table} WHERE id = %s"
    assert rawsql.as_datetime(rawsql.fetch(sql, [key.pk])[0][0]) == AT


def test_a_boolean_read_by_hand_is_truthy_as_the_orms():
    on, off = GatewayKeyFactory(enabled=True), GatewayKeyFactory(enabled=False)
    assert [bool(read_by_hand(k, "enabled")[0]) for k in (on, off)] == [True, False]


@pytest.mark.parametrize("offset", [timedelta(microseconds=-1), timedelta(0), timedelta(microseconds=1)])
def test_an_adapted_datetime_parameter_compares_as_the_orms(offset):
    key = GatewayKeyFactory(period_start=AT)
    sql = f"SELECT id FROM {GatewayKey._meta.db_table} WHERE id = %s AND {column('period_start')} > %s"
    by_hand = bool(rawsql.fetch(sql, [key.pk, rawsql.as_param(AT + offset)]))
    assert by_hand == GatewayKey.objects.filter(pk=key.pk, period_start__gt=AT + offset).exists()


def test_a_null_datetime_stays_none():
    assert rawsql.as_datetime(None) is None
