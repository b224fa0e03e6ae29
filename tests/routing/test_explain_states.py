"""`routing_explain` gives the reason and the time of every state it prints (issue 47 point 6): a
cooling circuit (its reason, open until T), a half-open one whose probe another request holds (until
T), an open credential circuit (every model of the account), a demotion (its reason, until T)."""

import re
from datetime import UTC, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from routing.models import Circuit, Demotion
from routing.policy.types import ASSIGNMENT_WIDE
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def accounts():
    first = AssignmentFactory(name="acct-a")
    rows = {"a": first} | {x: AssignmentFactory(name=f"acct-{x}", pool=first.pool) for x in "bcde"}
    for row in rows.values():
        CatalogEntryFactory(assignment=row, model="gpt-5")
    GatewayKeyFactory(name="states", raw_key="sk-gw-explain-states-0000", pools=[first.pool])
    return rows


def _explain() -> str:
    out = StringIO()
    call_command("routing_explain", key="states", model="gpt-5", stdout=out)
    return out.getvalue()


def _at(minutes: int):
    moment = (timezone.now() + timedelta(minutes=minutes)).replace(microsecond=0)
    return moment, f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def _line(text: str, name: str) -> str:
    (line,) = [line for line in text.splitlines() if f" {name} / gpt-5 [" in line]
    return line


def test_every_state_in_the_plan_has_its_reason_and_its_time(accounts):
    pool = accounts["a"].pool
    open_until, open_text = _at(2)
    lease_until, lease_text = _at(1)
    wide_until, wide_text = _at(5)
    demoted_until, demoted_text = _at(10)
    http = {"pool": pool, "model": "gpt-5", "route_class": "http"}
    Circuit.objects.create(
        assignment=accounts["a"], state="open", reason="upstream_unavailable", open_until=open_until, **http
    )
    Circuit.objects.create(
        assignment=accounts["b"],
        state="half_open",
        reason="timeout",
        open_until=open_until - timedelta(minutes=5),
        probes_in_flight=1,
        probe_lease_expires_at=lease_until,
        **http,
    )
    Circuit.objects.create(
        pool=pool,
        assignment=accounts["c"],
        model=ASSIGNMENT_WIDE,
        route_class=ASSIGNMENT_WIDE,
        state="open",
        reason="credential_rejected",
        open_until=wide_until,
    )
    Demotion.objects.create(
        assignment=accounts["d"], model="gpt-5", reason="rate_limited", until=demoted_until
    )
    Circuit.objects.create(assignment=accounts["e"], consecutive_failures=2, reason="timeout", **http)

    text = _explain()
    relative = r" \(in \d+ s\)"
    assert re.search(
        rf"acct-a / gpt-5 \[tier 0, cooling\]: circuit open \(upstream unavailable\) "
        rf"until {open_text}{relative}$",
        _line(text, "acct-a"),
    )
    assert re.search(
        rf"acct-b / gpt-5 \[tier 0, cooling\]: circuit half-open \(timeout\): its probe is held by another "
        rf"request until {lease_text}{relative}$",
        _line(text, "acct-b"),
    )
    assert re.search(
        rf"acct-c / gpt-5 \[tier 0, cooling\]: credential circuit \(every model and route class\) open "
        rf"\(credential rejected\) until {wide_text}{relative}$",
        _line(text, "acct-c"),
    )
    assert re.search(
        rf"acct-d / gpt-5 \[tier 0, healthy, demoted\]: demoted \(rate limited\) "
        rf"until {demoted_text}{relative}$",
        _line(text, "acct-d"),
    )
    assert _line(text, "acct-e").endswith(
        "[tier 0, failing]: circuit closed, 2 consecutive failures (timeout)"
    )


def test_a_circuit_past_its_cooldown_says_since_when_it_admits_a_probe(accounts):
    """The request that would take its probe lease (`held`) is shown the plan that tries it."""
    pool = accounts["a"].pool
    Circuit.objects.create(
        pool=pool,
        assignment=accounts["a"],
        model="gpt-5",
        route_class="http",
        state="open",
        reason="upstream_unavailable",
        open_until=timezone.now() - timedelta(seconds=30),
    )
    line = _line(_explain(), "acct-a")
    assert re.search(
        r"\[tier 0, held\]: circuit open \(upstream unavailable\), its cooldown over since "
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(\d+ s ago\): admits one probe$",
        line,
    )


def test_a_healthy_candidate_has_nothing_to_explain(accounts):
    assert _line(_explain(), "acct-a").endswith("[tier 0, healthy]")
