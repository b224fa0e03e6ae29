"""The ledger in admin (issue 20 points 2 and 6): the request list's columns and filters, a request's
attempts as a timeline, and /admin/spend/; each scoped so that an operator of pool A never sees
pool B's keys, records, models or spend."""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from pools.models import Assignment, GatewayKey, Pool
from proxy.console.requests import LedgerPaginator, timeline
from proxy.console.spend import DAYS, spend_report
from proxy.ledger.exchange import AttemptLog, Exchange
from proxy.ledger.models import Attempt, RequestRecord
from proxy.ledger.services import request_records_write
from tests.admin.conftest import make_user
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory

pytestmark = pytest.mark.django_db

LIST = "/admin/proxy/requestrecord/"
SPEND = "/admin/spend/"
OPERATOR_PERMS = ("view_requestrecord", "view_attempt", "view_assignment")


@dataclass
class Ledger:
    now: datetime
    pool_a: Pool
    pool_b: Pool
    acct_a: Assignment
    acct_b: Assignment
    key_a: GatewayKey
    key_b: GatewayKey


def _record(request_id, key, started, *attempts, outcome="ok", took_ms=None, model="gpt-5", served=None):
    """A request as the ledger writer records it (`request_records_write`: its record, its attempts and
    the spend page's daily totals, in one transaction)."""
    exchange = Exchange(
        request_id=request_id,
        key_id=key.pk if key is not None else None,
        route="/v1/chat/completions",
        transport="http",
        requested_model=model,
        served_model=served if served is not None else model,
        outcome=outcome,
        started_at=started,
        finished_at=None if took_ms is None else started + timedelta(milliseconds=took_ms),
        attempts=[
            AttemptLog(
                ordinal=ordinal,
                route_class="http",
                model=attempt.pop("model", model),
                assignment_id=attempt.pop("assignment").pk,
                **attempt,
            )
            for ordinal, attempt in enumerate(attempts, start=1)
        ],
    )
    request_records_write(exchanges=[exchange])
    return RequestRecord.objects.get(request_id=request_id)


def _ok(assignment, cost, **extra):
    return {
        "assignment": assignment,
        "status": "succeeded",
        "dispatch_state": "completed",
        "upstream_status": 200,
        "elapsed_ms": 300,
        "input_tokens": 10,
        "output_tokens": 5,
        "cost_micros": cost,
        **extra,
    }


def build_ledger(now: datetime, *, days: int = 3, per_day: int = 1) -> Ledger:
    pool_a, pool_b = PoolFactory(name="pool-a"), PoolFactory(name="pool-b")
    acct_a = AssignmentFactory(pool=pool_a, name="acct-a")
    acct_b = AssignmentFactory(pool=pool_b, name="acct-b-secret")
    key_a = GatewayKeyFactory(name="team-a-key", pools=[pool_a])
    key_b = GatewayKeyFactory(name="team-b-key", pools=[pool_b])
    for day in range(days):
        started = now - timedelta(days=day)
        for n in range(per_day):
            _record(
                f"req-a-{day}-{n}",
                key_a,
                started,
                {
                    "assignment": acct_a,
                    "status": "retryable_failed",
                    "failure_class": "upstream_unavailable",
                    "dispatch_state": "rejected",
                    "upstream_status": 503,
                    "elapsed_ms": 100,
                },
                _ok(acct_a, 1_000),
                took_ms=450,
            )
            _record(
                f"req-b-{day}-{n}",
                key_b,
                started,
                _ok(acct_b, 7_000, model="b-only-model"),
                model="b-only-model",
                took_ms=12_000,
            )
    return Ledger(now, pool_a, pool_b, acct_a, acct_b, key_a, key_b)


@pytest.fixture
def ledger():
    return build_ledger(timezone.now())


@pytest.fixture
def operator_a(client, ledger):
    user = make_user("op-a", perms=OPERATOR_PERMS, pools=(ledger.pool_a,))
    client.force_login(user)
    return client


# -- the request list --------------------------------------------------------------------------------


def test_the_request_list_shows_key_pool_model_outcome_attempts_and_latency(admin_client, ledger):
    html = admin_client.get(LIST).content.decode()
    for header in (
        "Key",
        "Pool",
        "Model",
        "Outcome",
        "Attempts",
        "Latency",
        "Started",
        "Tokens, cost",
    ):
        assert header in html, header
    row = html[html.index("req-a-0-0") :]
    row = row[: row.index("</tr>")]
    assert "team-a-key" in row and "pool-a" in row and "gpt-5" in row and "sk-gw" not in row
    assert 'class="field-attempts_sent">2</td>' in row  # two attempts sent (a handoff)
    assert "450 ms" in row
    b_row = html[html.index("req-b-0-0") :]
    assert "12.0 s" in b_row[: b_row.index("</tr>")]


def test_a_fallback_reads_requested_to_served(admin_client, ledger):
    _record(
        "req-fallback", ledger.key_a, ledger.now, _ok(ledger.acct_a, 5), model="claude-opus-5", served="gpt-5"
    )
    html = admin_client.get(LIST, {"q": "req-fallback"}).content.decode()
    assert "claude-opus-5 → gpt-5" in html


def test_the_list_runs_the_same_queries_whatever_the_number_of_rows_and_attempts(
    admin_client, django_assert_num_queries
):
    now = timezone.now()
    build_ledger(now, days=1, per_day=1)
    admin_client.get(LIST)  # warm the session and content types
    with CaptureQueriesContext(connection) as small:
        admin_client.get(LIST)
    ledger = Ledger(
        now,
        *Pool.objects.order_by("name"),
        *Assignment.objects.order_by("name"),
        *GatewayKey.objects.order_by("name"),
    )
    for n in range(60):  # 60 more requests, 120 more attempts, one more key
        _record(f"req-many-{n}", ledger.key_a, now, _ok(ledger.acct_a, 1), _ok(ledger.acct_a, 1))
    with django_assert_num_queries(len(small.captured_queries)):
        response = admin_client.get(LIST)
    assert response.content.decode().count("req-many-") >= 60


def test_the_list_never_reads_the_whole_ledger_to_count_or_to_offer_choices(
    admin_client, ledger, monkeypatch
):
    """At ten million records a count or a SELECT DISTINCT over the table was most of the page (issue 49,
    bench/results.md): the list counts at most COUNT_CAP + 1 rows and says so beyond, and its filters'
    choices come from the configuration and the vocabularies."""
    monkeypatch.setattr(LedgerPaginator, "COUNT_CAP", 3)
    CatalogEntryFactory(assignment=ledger.acct_b, model="b-only-model")
    admin_client.get(LIST)
    with CaptureQueriesContext(connection) as queries:
        html = admin_client.get(LIST).content.decode()
    assert "more than 3 request records" in html
    ledger_reads = [q["sql"] for q in queries.captured_queries if '"proxy_requestrecord"' in q["sql"]]
    assert ledger_reads
    for sql in ledger_reads:
        assert "DISTINCT" not in sql, sql
        assert not sql.startswith("SELECT COUNT(*)") or "LIMIT 4" in sql, sql
    assert ">b-only-model<" in html  # a model filter's choice, from the catalog of the admin's pools


@pytest.mark.parametrize(
    ("query", "expected", "absent"),
    [
        ({"pool": "A"}, "req-a-0-0", "req-b-0-0"),
        ({"key__id__exact": "KA"}, "req-a-1-0", "req-b-1-0"),
        ({"served_model": "b-only-model"}, "req-b-0-0", "req-a-0-0"),
        ({"attempts": "2"}, "req-a-2-0", "req-b-2-0"),
        ({"attempts": "1"}, "req-b-2-0", "req-a-2-0"),
        ({"latency": "lt1s"}, "req-a-0-0", "req-b-0-0"),
        ({"latency": "10-60s"}, "req-b-0-0", "req-a-0-0"),
        ({"outcome": "ok"}, "req-a-0-0", "req-none"),
    ],
)
def test_each_filter_selects_its_requests(admin_client, ledger, query, expected, absent):
    values = {"A": str(ledger.pool_a.pk), "KA": str(ledger.key_a.pk)}
    params = {k: values.get(v, v) for k, v in query.items()}
    response = admin_client.get(LIST, params)
    assert response.status_code == 200
    html = response.content.decode()
    assert expected in html and absent not in html


def test_an_operator_of_pool_a_never_sees_pool_bs_records_keys_pools_or_models(operator_a, ledger):
    html = operator_a.get(LIST).content.decode()
    assert "req-a-0-0" in html
    for secret in ("req-b-", "team-b-key", "pool-b", "b-only-model", "acct-b-secret"):
        assert secret not in html, secret
    # Asking for pool B by id through the filter shows nothing of it either.
    html = operator_a.get(LIST, {"pool": str(ledger.pool_b.pk)}).content.decode()
    assert "req-b-" not in html and "req-a-" not in html
    record_b = RequestRecord.objects.get(request_id="req-b-0-0")
    response = operator_a.get(reverse("admin:proxy_requestrecord_change", args=[record_b.pk]))
    assert response.status_code in (302, 404)


def _crossing(ledger) -> RequestRecord:
    """A request of a key that reaches both pools: handed on from pool B's account to pool A's."""
    both = GatewayKeyFactory(name="shared-key", pools=[ledger.pool_a, ledger.pool_b])
    failed_on_b = {**_ok(ledger.acct_b, 7_000), "status": "retryable_failed", "failure_class": "rate_limited"}
    crossing = _record("req-cross", both, ledger.now, failed_on_b, _ok(ledger.acct_a, 1_000), took_ms=900)
    _record("req-shared-b-only", both, ledger.now, _ok(ledger.acct_b, 7_000), took_ms=300)
    return crossing


def test_an_operator_sees_every_request_that_reached_their_pools_and_only_their_attempts(operator_a, ledger):
    """Issue 47 point 7: a pool operator's panel counted the requests of keys that reach other pools too,
    their list did not. The list now holds every request with an attempt on one of their assignments;
    of it they see their own attempts only (pool, tokens, cost), the key by name, nothing of pool B."""
    crossing = _crossing(ledger)
    html = operator_a.get(LIST).content.decode()
    assert "req-cross" in html and "req-shared-b-only" not in html
    row = html[html.index('title="req-cross"') :]
    row = row[: row.index("</tr>")]
    assert "shared-key" in row and "pool-a" in row
    assert "10 in, 5 out" in row and "$0.001<" in row  # pool A's attempt, not pool B's $0.007 nor both
    for secret in ("pool-b", "acct-b-secret", "$0.008", "$0.007", "sk-gw"):
        assert secret not in row, secret
    # Its page: pool A's attempt alone, the key by name without its prefix.
    page = operator_a.get(reverse("admin:proxy_requestrecord_change", args=[crossing.pk])).content.decode()
    assert page.count('class="timeline-attempt"') == 1 and "acct-a" in page
    for secret in ("acct-b-secret", "rate limited", "sk-gw", "pool-b"):
        assert secret not in page, secret
    assert "shared-key" in page
    # The spend page counts what pool A's attempt cost, not pool B's.
    spend = operator_a.get(SPEND).content.decode()
    assert 'data-total-micros="4000"' in spend  # 3 x $0.001 of team-a-key and the crossing $0.001
    # As many requests as the Upstreams panel counts for the operator's pools in its window.
    usage = operator_a.get(reverse("admin:upstreams")).context["panel"].usage
    today = RequestRecord.objects.filter(started_at__gt=ledger.now - timedelta(minutes=5))
    listed = {r.request_id for r in today if f'title="{r.request_id}"' in html}
    assert listed == {"req-a-0-0", "req-cross"}
    assert sum(row.requests for row in usage) == len(listed)


def test_a_superuser_sees_a_crossing_requests_attempts_tokens_and_cost_in_full(admin_client, ledger):
    _crossing(ledger)
    html = admin_client.get(LIST, {"q": "req-cross"}).content.decode()
    row = html[html.index('title="req-cross"') :]
    row = row[: row.index("</tr>")]
    assert "pool-a, pool-b" in row and "20 in, 10 out" in row and "$0.008<" in row


def test_a_request_id_is_shortened_in_the_list_and_whole_in_its_title_and_text(admin_client, ledger):
    long_id = "0123456789abcdef0123456789abcdef"
    _record(long_id, ledger.key_a, ledger.now, _ok(ledger.acct_a, None))
    html = admin_client.get(LIST, {"q": long_id}).content.decode()
    assert f'<span class="shortened request-id" title="{long_id}">{long_id}</span>' in html
    assert ">unknown<" in html  # answered at an unknown price: not $0


# -- a request's page: its attempts as a timeline ----------------------------------------------------


def test_a_requests_page_draws_one_bar_per_attempt_scaled_and_in_words(admin_client, ledger):
    record = RequestRecord.objects.get(request_id="req-a-0-0")
    html = admin_client.get(reverse("admin:proxy_requestrecord_change", args=[record.pk])).content.decode()
    assert html.count('class="timeline-attempt"') == 2
    # 100 ms then 300 ms: the first bar is a quarter of the axis, the second starts where it ends.
    assert 'class="timeline-bar status-retryable_failed" style="margin-left: 0.00%; width: 25.00%"' in html
    assert 'class="timeline-bar status-succeeded" style="margin-left: 25.00%; width: 75.00%"' in html
    assert "Failed, handed on to the next candidate</strong>: upstream unavailable" in html
    assert "Sent, refused before any work; upstream answered HTTP 503." in html
    assert "Sent, answer received; upstream answered HTTP 200." in html
    assert (
        "1#1" not in html and "retryable_failed</" not in html and "<table" not in html.split("timeline")[-1]
    )


def test_a_requests_page_shows_each_attempts_cached_input(admin_client, ledger):
    """Cached reads and writes are parts of the input (SPEC §7.3), shown where the provider reported
    them; an attempt without them reads as before."""
    cached = _ok(ledger.acct_a, 60, input_tokens=130, cached_read_tokens=100, cached_write_tokens=20)
    record = _record("req-cached", ledger.key_a, ledger.now, _ok(ledger.acct_a, 15), cached)
    html = admin_client.get(reverse("admin:proxy_requestrecord_change", args=[record.pk])).content.decode()
    assert "130 in (100 cached read, 20 cached write), 5 out; cost $0.00006." in html
    assert "10 in, 5 out; cost $0.000015." in html
    read_only = _ok(ledger.acct_a, 55, input_tokens=130, cached_read_tokens=100)
    [bar] = timeline([Attempt(ordinal=1, **{k: v for k, v in read_only.items() if k != "assignment"})])
    assert bar.tokens_text == "130 in (100 cached read), 5 out"


def test_the_timeline_gives_an_ineligible_candidate_a_sliver_and_its_reason_in_words():
    pool = PoolFactory()
    acct = AssignmentFactory(pool=pool, name="acct-x")
    record = _record(
        "req-x",
        None,
        timezone.now(),
        {
            "assignment": acct,
            "status": "ineligible",
            "ineligible_reason": "price_unknown",
            "dispatch_state": "not_sent",
        },
        _ok(acct, None, elapsed_ms=0),
    )
    bars = timeline(record.attempts.all())
    assert [b.cause_text for b in bars] == ["not eligible: price unknown", ""]
    assert [b.width_pct for b in bars] == [0.0, 0.0]  # no time at all: CSS gives each a visible sliver
    assert (
        bars[0].status_text == "Not eligible, not sent" and bars[1].dispatch_text == "sent, answer received"
    )


# -- /admin/spend/ -----------------------------------------------------------------------------------


def test_spend_adds_known_costs_per_key_and_model_per_utc_day_and_counts_unpriced_apart(ledger):
    _record("req-unpriced", ledger.key_a, ledger.now, _ok(ledger.acct_a, None))  # unknown price
    _record("req-too-old", ledger.key_a, ledger.now - timedelta(days=DAYS), _ok(ledger.acct_a, 10**9))
    report = spend_report(now=ledger.now)
    assert len(report.days) == DAYS and report.days[-1] == ledger.now.astimezone(UTC).date()
    keys = {s.name: s for s in report.by_key.all_rows}
    assert keys["team-b-key"].total_micros == 3 * 7_000  # three days, most expensive first
    assert report.by_key.all_rows[0].name == "team-b-key"
    assert keys["team-a-key"].total_micros == 3 * 1_000  # the too-old request is outside the window
    # The success at an unknown price; not the 3 handoffs, which reported no usage: nothing to charge.
    assert keys["team-a-key"].unpriced == 1
    assert keys["team-a-key"].by_day[-1] == 1_000 and keys["team-a-key"].by_day[-4] == 0
    models = {s.name: s.total_micros for s in report.by_model.all_rows}
    assert models == {"b-only-model": 21_000, "gpt-5": 3_000}
    assert report.total_micros == 24_000 == sum(report.daily_totals)
    assert report.unpriced == 1


def test_spend_shows_each_key_and_models_cached_share_of_its_input(admin_client, ledger):
    cached = _ok(ledger.acct_a, 60, input_tokens=130, cached_read_tokens=100, cached_write_tokens=20)
    _record("req-cached", ledger.key_a, ledger.now, cached, model="claude-x")
    report = spend_report(now=ledger.now)
    models = {s.name: s for s in report.by_model.all_rows}
    assert (models["claude-x"].input_tokens, models["claude-x"].cached_read_tokens) == (130, 100)
    assert models["claude-x"].cached_text == "100 of 130 input tokens (76%)"
    assert (models["gpt-5"].input_tokens, models["gpt-5"].cached_read_tokens) == (30, 0)  # 3 days x 10
    keys = {s.name: s for s in report.by_key.all_rows}
    assert (keys["team-a-key"].input_tokens, keys["team-a-key"].cached_read_tokens) == (160, 100)
    html = admin_client.get(SPEND).content.decode()
    assert 'data-cached-read="100" data-input-tokens="130">100 of 130 input tokens (76%)</td>' in html
    assert 'data-cached-read="0" data-input-tokens="30">0 of 30 input tokens (0%)</td>' in html


def test_the_spend_chart_stacks_each_days_series_to_its_total(ledger):
    report = spend_report(now=ledger.now)
    rects = [
        r
        for r in report.by_key.chart.rects
        if r.label.startswith(ledger.now.astimezone(UTC).date().isoformat())
    ]
    assert {r.label.split(": ")[1] for r in rects} == {"team-b-key $0.007", "team-a-key $0.001"}
    heights = {r.label.split(": ")[1].split()[0]: r.height for r in rects}
    assert heights["team-b-key"] == pytest.approx(7 * heights["team-a-key"], rel=0.01)


def test_the_spend_page_is_linked_under_operations_and_shows_charts_with_text(admin_client, ledger):
    index = admin_client.get("/admin/").content.decode()
    assert f'href="{SPEND}"' in index
    html = admin_client.get(SPEND).content.decode()
    assert html.count('<svg class="spend-chart"') == 2 and 'role="img"' in html
    assert "Spend per day by key over the last 30 days, $0.024 in all" in html
    assert 'data-micros="21000">$0.021</td>' in html


def test_an_operator_of_pool_a_sees_only_pool_as_spend(operator_a, ledger):
    html = operator_a.get(SPEND).content.decode()
    assert "team-a-key" in html and 'data-total-micros="3000"' in html
    for secret in ("team-b-key", "b-only-model", "$0.021"):
        assert secret not in html, secret


def test_the_spend_page_needs_the_view_permission_on_request_records(client, ledger):
    user = make_user("no-ledger", perms=("view_assignment",), pools=(ledger.pool_a,))
    client.force_login(user)
    assert client.get(SPEND).status_code == 403
    assert f'href="{SPEND}"' not in client.get("/admin/").content.decode()
    client.logout()
    assert client.get(SPEND).status_code == 302  # the login page


def test_the_spend_page_is_read_only(admin_client, ledger):
    before = (RequestRecord.objects.count(), Attempt.objects.count())
    for method in ("post", "put", "delete"):
        assert getattr(admin_client, method)(SPEND).status_code == 405
    assert (RequestRecord.objects.count(), Attempt.objects.count()) == before
    assert "<form" not in admin_client.get(SPEND).content.decode().split('id="content-main"')[1]


def test_the_spend_page_runs_the_same_queries_whatever_the_data(
    client, django_assert_num_queries, django_user_model
):
    now = timezone.now()
    small = build_ledger(now, days=1, per_day=1)
    user = make_user("op-counted", perms=OPERATOR_PERMS, pools=(small.pool_a,))
    client.force_login(user)
    client.get(SPEND)  # warm caches that live for the process (content types)
    with CaptureQueriesContext(connection) as small_run:
        assert client.get(SPEND).status_code == 200
    for n in range(12):  # many more keys, models and days, in the operator's pool
        key = GatewayKeyFactory(name=f"more-{n}", pools=[small.pool_a])
        for day in range(DAYS):
            _record(
                f"req-more-{n}-{day}", key, now - timedelta(days=day), _ok(small.acct_a, 5, model=f"m-{n}")
            )
    with django_assert_num_queries(len(small_run.captured_queries)):
        assert client.get(SPEND).status_code == 200
