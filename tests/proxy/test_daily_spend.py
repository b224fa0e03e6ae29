"""The spend page's daily totals (issue 49): kept by the ledger writer in each batch's transaction, read
by /admin/spend/ instead of the attempts. The page must show exactly what the stored attempts add up to
(the computation it replaced, done here over the raw rows), for a superuser and for a pool operator,
however the ledger was written: in several batches, concurrently by several writers (PostgreSQL),
replayed from a spool, or stored before the totals existed (the migration's backfill)."""

import threading
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib import admin
from django.db import connection, connections
from django.db.migrations.executor import MigrationExecutor

from pools.selectors import pools_visible_to
from proxy.console.spend import DAYS, NO_KEY, spend_report
from proxy.ledger.exchange import AttemptLog, Exchange
from proxy.ledger.models import MAX_TOTAL, Attempt, DailySpend, RequestRecord, cost_is_unknown
from proxy.ledger.services import request_records_write
from tests.admin.conftest import make_user
from tests.factories import AssignmentFactory, GatewayKeyFactory, PoolFactory

NOW = datetime(2026, 12, 5, 10, 30, tzinfo=UTC)

requires_postgres = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="needs real concurrent transactions (PostgreSQL)"
)


def _attempt(ordinal, assignment, status="succeeded", cost=None, model="gpt-5", **usage):
    return AttemptLog(
        ordinal=ordinal,
        assignment_id=assignment.pk,
        model=model,
        route_class="http",
        status=status,
        dispatch_state="completed" if status != "ineligible" else "not_sent",
        cost_micros=cost,
        **usage,
    )


def _exchange(request_id, key, started, *attempts):
    return Exchange(
        request_id=request_id,
        key_id=key.pk if key is not None else None,
        route="/v1/chat/completions",
        transport="http",
        requested_model="gpt-5",
        started_at=started,
        outcome="ok",
        attempts=list(attempts),
    )


def _raw_figures(now, records, pools=None):
    """What the spend page showed before the totals: every stored dispatched attempt of `records` (and of
    `pools`) in the window, by UTC day of its request's start, key name and model, from the raw rows."""
    days = [(now - timedelta(days=DAYS - 1 - i)).date() for i in range(DAYS)]
    attempts = Attempt.objects.filter(request__in=records).exclude(status="ineligible")
    if pools is not None:
        attempts = attempts.filter(assignment__pool__in=pools)
    by = {
        "key": defaultdict(lambda: [[0] * DAYS, 0, 0, 0, 0]),
        "model": defaultdict(lambda: [[0] * DAYS, 0, 0, 0, 0]),
    }
    for a in attempts.select_related("request__key"):
        day = a.request.started_at.astimezone(UTC).date()
        if day not in days:
            continue
        key = a.request.key.name if a.request.key is not None else NO_KEY
        for what, name in (("key", key), ("model", a.model)):
            cell = by[what][name]
            cell[0][days.index(day)] += a.cost_micros or 0
            cell[1] += 1
            cell[2] += cost_is_unknown(a)
            cell[3] += a.input_tokens or 0
            cell[4] += a.cached_read_tokens or 0
    return {what: {name: (tuple(c[0]), *c[1:]) for name, c in cells.items()} for what, cells in by.items()}


def _shown(report):
    return {
        what: {s.name: (s.by_day, s.attempts, s.unpriced, s.input_tokens, s.cached_read_tokens) for s in rows}
        for what, rows in (("key", report.by_key.all_rows), ("model", report.by_model.all_rows))
    }


def _ledger():
    """Two pools; a key of each and one of both; records over several days, written in three batches
    (their cells shared between batches), with every kind of attempt the page counts or leaves out."""
    pool_a, pool_b = PoolFactory(name="pool-a"), PoolFactory(name="pool-b")
    acct_a, acct_b = AssignmentFactory(pool=pool_a), AssignmentFactory(pool=pool_b)
    gone = AssignmentFactory(pool=pool_a)  # deleted after its attempts were recorded
    key_a = GatewayKeyFactory(name="key-a", pools=[pool_a])
    key_b = GatewayKeyFactory(name="key-b", pools=[pool_b])
    both = GatewayKeyFactory(name="key-both", pools=[pool_a, pool_b])
    deleted_key = GatewayKeyFactory(name="key-deleted", pools=[pool_a])
    batches = []
    for batch in range(3):
        exchanges = []
        for day in (0, 1, 4, DAYS - 1, DAYS):  # DAYS: just outside the window
            started = NOW - timedelta(days=day, hours=batch)
            tag = f"{batch}-{day}"
            exchanges += [
                _exchange(f"a-{tag}", key_a, started, _attempt(1, acct_a, cost=1_000 + day, input_tokens=10)),
                _exchange(
                    f"cross-{tag}",
                    both,
                    started,
                    _attempt(1, acct_b, status="ineligible"),
                    _attempt(2, acct_b, status="retryable_failed", input_tokens=7),  # usage, no price
                    _attempt(3, acct_b, status="retryable_failed"),  # nothing to charge
                    _attempt(4, acct_a, cost=300, input_tokens=40, cached_read_tokens=30, model="claude-x"),
                ),
                _exchange(f"b-{tag}", key_b, started, _attempt(1, acct_b, cost=7_000, model="b-only")),
                _exchange(f"unpriced-{tag}", key_a, started, _attempt(1, acct_a)),  # answered, no price
                _exchange(f"nokey-{tag}", None, started, _attempt(1, acct_a, cost=5)),
                _exchange(f"deleted-{tag}", deleted_key, started, _attempt(1, acct_a, cost=11)),
                _exchange(f"gone-{tag}", key_a, started, _attempt(1, gone, cost=13)),
            ]
        batches.append(exchanges)
    batches[1].append(_exchange("future", key_a, NOW + timedelta(days=1), _attempt(1, acct_a, cost=99)))
    for exchanges in batches:
        request_records_write(exchanges=exchanges)
    deleted_key.delete()
    gone.delete()
    return pool_a, pool_b


@pytest.mark.django_db
def test_the_spend_page_shows_what_the_stored_attempts_add_up_to_for_a_superuser_and_an_operator():
    pool_a, pool_b = _ledger()
    everything = _raw_figures(NOW, RequestRecord.objects.all())
    assert _shown(spend_report(now=NOW)) == everything
    assert everything["key"][NO_KEY][1] == 2 * 3 * 4  # the key-less and the deleted key's, 4 days x 3 batches
    records_admin = admin.site._registry[RequestRecord]
    for pools in ((pool_a,), (pool_b,), (pool_a, pool_b)):
        operator = make_user(f"op-{len(pools)}-{pools[0].name}", perms=("view_requestrecord",), pools=pools)
        visible = pools_visible_to(operator)
        scoped = records_admin.scope(RequestRecord.objects.all(), operator)
        assert _shown(spend_report(now=NOW, pools=visible)) == _raw_figures(NOW, scoped, visible)
    report = spend_report(now=NOW)
    assert report.total_micros == sum(report.daily_totals) and report.daily_totals[-1] > 0  # today's too


@pytest.mark.django_db
def test_a_replayed_batch_adds_nothing_to_the_totals():
    acct, key = AssignmentFactory(), GatewayKeyFactory()
    first = [_exchange("r-1", key, NOW, _attempt(1, acct, cost=500))]
    request_records_write(exchanges=first)
    request_records_write(
        exchanges=[*first, _exchange("r-2", key, NOW, _attempt(1, acct, cost=20))], idempotent=True
    )
    assert DailySpend.objects.get().cost_micros == 520 and DailySpend.objects.get().attempts == 2


@pytest.mark.django_db
def test_a_total_stays_at_its_largest_figure_and_never_costs_a_batch_its_records():
    acct, key = AssignmentFactory(), None  # no key: its own spend is not this test's
    huge = MAX_TOTAL - 10
    request_records_write(exchanges=[_exchange("h-1", key, NOW, _attempt(1, acct, cost=huge))])
    request_records_write(
        exchanges=[
            _exchange("h-2", key, NOW, _attempt(1, acct, cost=huge)),
            _exchange("h-3", key, NOW, _attempt(1, acct, cost=huge)),
        ]
    )
    assert RequestRecord.objects.count() == 3
    assert DailySpend.objects.get().cost_micros == MAX_TOTAL


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_add_up():
    """Two nodes' writers adding to the same cells at once (in opposite orders): every attempt counted
    once, none lost to a lost update, no deadlock."""
    accounts = [AssignmentFactory() for _ in range(3)]
    keys = [GatewayKeyFactory() for _ in range(3)]
    batches, rounds = 2, 15
    start = threading.Barrier(batches)
    errors = []

    def writer(node: int) -> None:
        try:
            start.wait()
            for n in range(rounds):
                exchanges = [
                    _exchange(f"n{node}-{n}-{k.pk}-{a.pk}", k, NOW, _attempt(1, a, cost=3, input_tokens=2))
                    for k in keys
                    for a in accounts
                ]
                request_records_write(exchanges=exchanges if node else exchanges[::-1])
        except Exception as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer, args=(node,)) for node in range(batches)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert DailySpend.objects.count() == len(keys) * len(accounts)
    for total in DailySpend.objects.all():
        assert (total.attempts, total.cost_micros, total.input_tokens) == (
            batches * rounds,
            3 * batches * rounds,
            2 * batches * rounds,
        )


@pytest.mark.django_db(transaction=True)
def test_the_migration_backfills_the_totals_from_the_stored_ledger():
    """A ledger stored before the totals existed (the table dropped with them, as migrating back does)
    reads the same once the migration has run."""
    _ledger()
    executor = MigrationExecutor(connection)
    executor.migrate([("proxy", "0005_attempt_cached_tokens")])
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert DailySpend.objects.exists()
    assert _shown(spend_report(now=NOW)) == _raw_figures(NOW, RequestRecord.objects.all())
