"""`routing_explain` shows each input of the draw (SPEC §5.4): every eligible account's chance of going
first (before the shortlist is cut), its headroom while its limit has not reset, and the cache
affinity that moves a session's account first."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from pools.models import GatewaySettings
from routing.models import Affinity, AffinityKind, Latency
from routing.policy.latency import Fold
from routing.services import latencies_record
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def pool_of_four():
    first = AssignmentFactory(name="acct-a")
    rows = [first] + [AssignmentFactory(name=f"acct-{x}", pool=first.pool) for x in "bcd"]
    for row in rows:
        CatalogEntryFactory(assignment=row, model="gpt-5")
    key = GatewayKeyFactory(name="pool", raw_key="sk-gw-explain-pool-0000", pools=[first.pool])
    GatewaySettings.objects.update_or_create(pk=1, defaults={"max_attempts": 2})
    return rows, key


def _explain(**options) -> str:
    out = StringIO()
    call_command("routing_explain", key="pool", model="gpt-5", stdout=out, **options)
    return out.getvalue()


def test_every_eligible_account_shows_its_chance_of_going_first_beyond_the_shortlist_too(pool_of_four):
    text = _explain()
    for name in "abcd":  # four equal accounts, a shortlist of two: a quarter each, not a half
        assert f"  acct-{name} / gpt-5: weight 1, latency unknown (no answer yet), first 25%\n" in text


def test_the_headroom_an_account_reported_scales_its_chance_until_its_limit_resets(pool_of_four):
    (a, *_), _ = pool_of_four
    latencies_record(folds=[Fold(a.pk, "gpt-5", 100.0, 1)], now=timezone.now())
    Latency.objects.filter(assignment=a).update(
        headroom_left=0.25, headroom_until=timezone.now() + timedelta(minutes=1), load=0
    )
    text = _explain()
    # 0.25 against 1 + 1 + 1: a eighth of a half... exactly 0.25 / 3.25.
    assert "  acct-a / gpt-5: weight 1, headroom 25% left, latency 100 ms, first 8%\n" in text
    assert "  acct-b / gpt-5: weight 1, latency unknown (no answer yet), first 31%\n" in text
    Latency.objects.filter(assignment=a).update(headroom_until=timezone.now() - timedelta(seconds=1))
    assert "  acct-a / gpt-5: weight 1, latency 100 ms, first 25%\n" in _explain()


def test_a_sessions_account_is_named_as_the_cache_affinity(pool_of_four):
    (_, _, c, _), key = pool_of_four
    Affinity.objects.create(
        gateway_key=key,
        kind=AffinityKind.SESSION,
        key="conversation-1",
        assignment=c,
        model="gpt-5",
        expires_at=timezone.now() + timedelta(hours=1),
    )
    text = _explain(session="conversation-1")
    assert "cache affinity: the session's last account goes first while it is healthy: acct-c\n" in text
    assert "cache affinity" not in _explain()


def test_an_account_that_served_more_lately_loses_the_second_choice(pool_of_four):
    (a, b, *_), _ = pool_of_four
    latencies_record(folds=[Fold(a.pk, "gpt-5", 100.0, 8), Fold(b.pk, "gpt-5", 100.0, 2)], now=timezone.now())
    text = _explain()
    # Each drawn with 1/4, four draws, the least loaded wins: a only when all four are a (1/256), b when
    # none is c or d and not all are a (1/16 - 1/256), c and d share the rest (a tie goes to the first).
    assert "  acct-a / gpt-5: weight 1, latency 100 ms, load 8.0, first 0%\n" in text
    assert "  acct-b / gpt-5: weight 1, latency 100 ms, load 2.0, first 6%\n" in text
    assert "  acct-c / gpt-5: weight 1, latency unknown (no answer yet), first 47%\n" in text
