"""`manage.py prune_ledger` (issue 20): retention of the ledger and of expired affinities."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from pools.models import GatewayKey
from proxy.console.spend import DAYS, spend_report
from proxy.ledger.exchange import AttemptLog
from proxy.ledger.models import Attempt, DailySpend, RequestRecord
from proxy.ledger.services import request_records_write
from routing.models import Affinity, AffinityKind
from tests.factories import AssignmentFactory, GatewayKeyFactory, finished_exchange

pytestmark = pytest.mark.django_db


def _record(request_id: str, started_at, assignment) -> RequestRecord:
    record = RequestRecord.objects.create(
        request_id=request_id,
        route="/v1/chat/completions",
        transport="http",
        outcome="ok",
        started_at=started_at,
    )
    Attempt.objects.create(
        request=record,
        ordinal=1,
        assignment=assignment,
        model="gpt-x",
        route_class="http",
        status="succeeded",
        dispatch_state="completed",
    )
    return record


def _prune(*args: str) -> str:
    out = StringIO()
    call_command("prune_ledger", *args, stdout=out)
    return out.getvalue()


def test_records_older_than_the_retention_go_with_their_attempts_and_newer_ones_stay():
    assignment = AssignmentFactory()
    now = timezone.now()
    _record("old", now - timedelta(days=30, minutes=5), assignment)
    _record("recent", now - timedelta(days=29, hours=23), assignment)
    _record("today", now, assignment)

    out = _prune()

    assert set(RequestRecord.objects.values_list("request_id", flat=True)) == {"recent", "today"}
    assert Attempt.objects.count() == 2
    assert "deleted 1 request records" in out


@override_settings(GATEWAY_LEDGER_RETENTION_DAYS=7)
def test_the_retention_comes_from_the_setting_and_days_overrides_it():
    assignment = AssignmentFactory()
    now = timezone.now()
    _record("eight-days", now - timedelta(days=8), assignment)
    _record("three-days", now - timedelta(days=3), assignment)

    _prune("--days", "10")
    assert RequestRecord.objects.count() == 2

    _prune()
    assert list(RequestRecord.objects.values_list("request_id", flat=True)) == ["three-days"]


def test_small_batches_delete_everything_due():
    assignment = AssignmentFactory()
    old = timezone.now() - timedelta(days=40)
    for n in range(7):
        _record(f"r{n}", old + timedelta(seconds=n), assignment)

    out = _prune("--batch", "3")

    assert RequestRecord.objects.count() == 0
    assert Attempt.objects.count() == 0
    assert "deleted 7 request records" in out


def test_expired_affinities_go_and_live_ones_stay():
    key = GatewayKeyFactory()
    assignment = AssignmentFactory()
    now = timezone.now()
    for name, expires in (("gone", now - timedelta(seconds=1)), ("kept", now + timedelta(hours=1))):
        Affinity.objects.create(
            gateway_key=key, kind=AffinityKind.RESPONSE, key=name, assignment=assignment, expires_at=expires
        )

    out = _prune()

    assert list(Affinity.objects.values_list("key", flat=True)) == ["kept"]
    assert "1 expired affinities" in out


def test_pruning_history_never_gives_spend_back():
    key = GatewayKeyFactory(spent_micros=1234)
    record = _record("old", timezone.now() - timedelta(days=90), AssignmentFactory())
    RequestRecord.objects.filter(pk=record.pk).update(key=key)

    _prune()

    assert RequestRecord.objects.count() == 0
    assert GatewayKey.objects.get(pk=key.pk).spent_micros == 1234


@pytest.mark.parametrize("args", [("--days", "0"), ("--days", "-3"), ("--batch", "0")])
def test_bad_arguments_are_refused_and_delete_nothing(args):
    _record("old", timezone.now() - timedelta(days=90), AssignmentFactory())

    with pytest.raises(CommandError):
        _prune(*args)

    assert RequestRecord.objects.count() == 1


def test_spend_history_outlives_the_records_until_the_spend_page_no_longer_shows_its_day():
    """The daily spend totals are kept when their records are pruned (the spend page still shows what
    they cost), and deleted once their day is older than the page's first day."""
    assignment = AssignmentFactory()
    now = timezone.now()
    exchanges = []
    for name, age in (("shown", timedelta(days=DAYS - 1)), ("older", timedelta(days=DAYS + 1))):
        exchange = finished_exchange(request_id=name, started_at=now - age)
        exchange.attempts = [_cost(assignment, 250)]
        exchanges.append(exchange)
    request_records_write(exchanges=exchanges)

    out = _prune("--days", "1")

    assert RequestRecord.objects.count() == 0
    assert list(DailySpend.objects.values_list("day", "cost_micros")) == [
        ((now - timedelta(days=DAYS - 1)).date(), 250)
    ]
    assert spend_report(now=now).total_micros == 250
    assert "deleted 1 daily spend totals" in out


def _cost(assignment, micros):
    return AttemptLog(
        ordinal=1,
        assignment_id=assignment.pk,
        model="gpt-x",
        route_class="http",
        status="succeeded",
        dispatch_state="completed",
        cost_micros=micros,
    )
