"""A ledger row the database refuses (issue 45 finding 2). Threat (SECURITY.md, Key holder): one
request's out-of-range number (an upstream's usage past the integer column, a negative one) made
PostgreSQL's COPY of its batch fail with psycopg's own error: the whole batch was dropped (11 answered,
0 rows), every other key's budget hold stayed held, a negative cost refunded spend, and the metrics
counter raised, losing the request's log line.

The numbers an upstream reports are clamped where they are read (`proxy.wire.payloads`), so the bad row is
forced here: the real writer (`proxy.ledger.recorder.LedgerWriter`) on the test database, a batch large enough
to go by COPY on PostgreSQL."""

from __future__ import annotations

import json
import logging

import pytest
from django.db import connection

from pools.models import BudgetHold, GatewayKey
from proxy.ledger import recorder as ledger
from proxy.ledger.exchange import AttemptLog
from proxy.ledger.models import Attempt, RequestRecord
from proxy.ledger.services import SANITIZED
from tests.factories import AssignmentFactory, GatewayKeyFactory, finished_exchange, reserve

pytestmark = [pytest.mark.attack, pytest.mark.django_db(transaction=True)]
HELD = 100
COST = 10

BAD_ROWS = {
    # A negative count breaks the columns' check on both databases; a negative cost would refund spend.
    "negative": {"output_tokens": -5000, "cost_micros": -5000},
    # Past PostgreSQL's integer (SQLite's integers are 64-bit).
    "out_of_range": {"input_tokens": 2**40},
}


@pytest.mark.parametrize("bad", list(BAD_ROWS))
def test_one_bad_row_costs_its_batch_nothing_and_is_recorded_sanitized(bad, caplog):
    if bad == "out_of_range" and connection.vendor != "postgresql":
        pytest.skip("SQLite stores 2**40 in an integer column")
    account = AssignmentFactory()
    alice, bob = GatewayKeyFactory(budget_micros=10_000), GatewayKeyFactory(budget_micros=10_000)
    exchanges = []
    for n in range(11):
        x = reserve(finished_exchange(), (alice if n < 6 else bob).pk, HELD)
        x.attempts = [
            AttemptLog(
                1, account.pk, "gpt-5", "http", "succeeded", "completed",
                upstream_status=200, elapsed_ms=12, input_tokens=5, output_tokens=5, cost_micros=COST,
            )
        ]  # fmt: skip
        exchanges.append(x)
    victim = exchanges[0]  # alice's
    for name, value in BAD_ROWS[bad].items():
        setattr(victim.attempts[0], name, value)

    writer = ledger.LedgerWriter()
    with caplog.at_level(logging.INFO, logger="gateway"):
        for x in exchanges:
            writer.submit(x)
        assert writer.flush(timeout=20)
        ledger.observe(victim)  # the metrics and the log line of the bad request

    stored = set(RequestRecord.objects.values_list("request_id", flat=True))
    assert stored == {x.request_id for x in exchanges}  # nothing dropped
    good = Attempt.objects.exclude(request__request_id=victim.request_id)
    assert good.count() == 10 and {(a.input_tokens, a.cost_micros, a.error_code) for a in good} == {
        (5, COST, "")
    }
    (flagged,) = Attempt.objects.filter(request__request_id=victim.request_id)
    assert flagged.error_code == SANITIZED
    assert (flagged.input_tokens, flagged.output_tokens, flagged.cost_micros) == (None, None, None)
    assert RequestRecord.objects.get(request_id=victim.request_id).outcome == victim.outcome

    assert not BudgetHold.objects.exists()  # every key's holds released
    spent = dict(GatewayKey.objects.values_list("pk", "spent_micros"))
    reserved = set(GatewayKey.objects.values_list("reserved_micros", flat=True))
    # The bad request is charged what it held (its cost is unknown now), never refunded.
    assert (spent[alice.pk], spent[bob.pk], reserved) == (5 * COST + HELD, 5 * COST, {0})

    lines = [json.loads(r.getMessage()) for r in caplog.records if r.getMessage().startswith("{")]
    assert victim.request_id in {line["request_id"] for line in lines}  # the counter did not lose it
    assert "could not be counted" not in caplog.text
    assert str(BAD_ROWS[bad].popitem()[1]) not in caplog.text  # logged without the offending number
