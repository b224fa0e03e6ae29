"""/metrics (SPEC §10): exchanges observed through `observe_exchange`, read back by scraping the view.

The registry is process-global, so every test reads a sample before and after and asserts the delta.
"""

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from proxy.ledger import metrics
from proxy.ledger.exchange import AttemptLog, Exchange
from proxy.ledger.metrics import observe_exchange
from routing.models import Circuit, CircuitState
from tests.factories import AssignmentFactory, GatewayKeyFactory, PoolFactory

pytestmark = pytest.mark.django_db

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
CANARY_MODEL = "client-chosen-model-canary-7f3a"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200
    samples: Samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def attempt(ordinal: int, status: str, failure_class: str = "", elapsed_ms: int = 0, **kw) -> AttemptLog:
    fields = {"assignment_id": ordinal, "model": "gpt-5", "route_class": "http", "pool": "main"}
    fields |= {"assignment": "acct-x"} | kw
    return AttemptLog(
        ordinal=ordinal, status=status, failure_class=failure_class, elapsed_ms=elapsed_ms, **fields
    )


def exchange(*attempts: AttemptLog, **kw) -> Exchange:
    fields = {
        "request_id": "r1",
        "key_id": 1,
        "route": "/v1/chat/completions",
        "transport": "http",
        "requested_model": "gpt-5",
        "started_at": T0,
        "finished_at": T0 + timedelta(milliseconds=1500),
        "served_model": "gpt-5",
        "outcome": "ok",
        "status_code": 200,
    } | kw
    return Exchange(attempts=list(attempts), **fields)


def test_a_failover_counts_the_request_each_attempt_the_handoff_and_the_latencies(client):
    before = scrape(client)
    observe_exchange(
        exchange(
            attempt(1, "ineligible", route_class="sse"),
            attempt(2, "retryable_failed", "rate_limited", 200, route_class="sse"),
            attempt(3, "succeeded", "", 3000, route_class="sse"),
            transport="sse",
            retry_count=1,
        )
    )
    after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    ok = {"route": "/v1/chat/completions", "transport": "sse", "outcome": "ok", "status_class": "2xx"}
    assert delta("gateway_requests_total", **ok) == 1
    assert delta("gateway_attempts_total", route_class="sse", status="ineligible", failure_class="none") == 1
    assert (
        delta(
            "gateway_attempts_total",
            route_class="sse",
            status="retryable_failed",
            failure_class="rate_limited",
        )
        == 1
    )
    assert delta("gateway_attempts_total", route_class="sse", status="succeeded", failure_class="none") == 1
    assert delta("gateway_handoffs_total", failure_class="rate_limited") == 1
    assert delta("gateway_handoffs_total", failure_class="none") == 0
    # The ineligible candidate was never dispatched: two latencies, 0.2 s and 3 s.
    where = {"pool": "main", "assignment": "acct-x", "model": "gpt-5", "route_class": "sse"}
    assert delta("gateway_upstream_latency_seconds_count", **where) == 2
    assert delta("gateway_upstream_latency_seconds_sum", **where) == pytest.approx(3.2)
    assert delta("gateway_upstream_latency_seconds_bucket", **where, le="0.25") == 1
    assert delta("gateway_upstream_latency_seconds_bucket", **where, le="5.0") == 2
    labels = {"route": "/v1/chat/completions", "transport": "sse"}
    assert delta("gateway_request_duration_seconds_count", **labels) == 1
    assert delta("gateway_request_duration_seconds_sum", **labels) == pytest.approx(1.5)
    assert delta("gateway_fallbacks_total", reason="model_not_found") == 0


def test_a_request_served_by_a_cross_model_candidate_counts_a_model_not_found_fallback(client):
    before = value(scrape(client), "gateway_fallbacks_total", reason="model_not_found")
    observe_exchange(
        exchange(
            attempt(1, "retryable_failed", "model_not_found_cross", 40),
            attempt(2, "succeeded", "", 900, model="gpt-4.1"),
            served_model="gpt-4.1",
            model_fallback=True,
        )
    )
    observe_exchange(exchange(attempt(1, "succeeded", "", 900)))
    assert value(scrape(client), "gateway_fallbacks_total", reason="model_not_found") - before == 1


def test_the_fallback_series_is_exported_at_zero_before_any_fallback():
    # A fresh process: in this one other tests have already counted fallbacks.
    code = (
        "import django; django.setup(); from proxy.ledger.metrics import FALLBACKS; "
        "print([(s.name, s.labels, s.value) for f in FALLBACKS.collect() for s in f.samples])"
    )
    env = os.environ | {"DJANGO_SETTINGS_MODULE": "gatewaysite.settings"}
    env.setdefault("DJANGO_SECRET_KEY", "test-only-secret-key-not-for-deployment")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "('gateway_fallbacks_total', {'reason': 'model_not_found'}, 0.0)" in out.stdout


def test_a_provider_error_code_outcome_is_counted_under_its_failure_class(client):
    labels = {"route": "/v1/responses", "transport": "http", "status_class": "4xx"}
    before = scrape(client)
    observe_exchange(
        exchange(
            attempt(1, "failed", "quota", 50, error_code="provider-says-anything-9c1e"),
            route="/v1/responses",
            outcome="provider-says-anything-9c1e",
            status_code=429,
        )
    )
    after = scrape(client)
    assert (
        value(after, "gateway_requests_total", outcome="quota", **labels)
        - value(before, "gateway_requests_total", outcome="quota", **labels)
        == 1
    )
    assert not [key for key in after if any("provider-says" in v for _, v in key[1])]


def test_out_of_set_label_values_fold_into_other(client):
    before = scrape(client)
    observe_exchange(
        exchange(
            attempt(1, "weird-status", "weird-class", 10, route_class="carrier-pigeon"),
            route="/v1/whatever/" + CANARY_MODEL,
            transport="telepathy",
            outcome="",
        )
    )
    after = scrape(client)
    other = {"route": "other", "transport": "other", "outcome": "other", "status_class": "2xx"}
    assert (
        value(after, "gateway_requests_total", **other) - value(before, "gateway_requests_total", **other)
        == 1
    )
    labels = {"route_class": "other", "status": "other", "failure_class": "other"}
    assert (
        value(after, "gateway_attempts_total", **labels) - value(before, "gateway_attempts_total", **labels)
        == 1
    )


def test_no_label_carries_the_requested_model(client):
    observe_exchange(
        exchange(
            attempt(1, "succeeded", "", 10),
            requested_model=CANARY_MODEL,
            model_fallback=True,
        )
    )
    observe_exchange(exchange(requested_model=CANARY_MODEL, outcome="model_not_found", status_code=404))
    body = client.get("/metrics").content.decode()
    assert "gateway_requests_total" in body
    assert CANARY_MODEL not in body


def _circuit(state: str, route_class: str, reason: str, n: int, assignment=None, model: str = "") -> Circuit:
    assignment = assignment or AssignmentFactory(name=f"acct-{n}", pool=PoolFactory(name="team-a"))
    open_until = datetime.now(UTC) + timedelta(minutes=5) if state != CircuitState.CLOSED else None
    return Circuit.objects.create(
        pool=assignment.pool,
        assignment=assignment,
        model=model or f"model-{n}",
        route_class=route_class,
        state=state,
        reason=reason,
        open_until=open_until,
    )


def circuits(samples: Samples) -> dict[tuple[str, ...], float]:
    """gateway_open_circuits as {(pool, assignment, model, route_class, reason): value}."""
    names = ("pool", "assignment", "model", "route_class", "reason")
    return {
        tuple(dict(labels)[n] for n in names): v
        for (name, labels), v in samples.items()
        if name == "gateway_open_circuits"
    }


def test_open_circuits_name_their_pool_assignment_model_and_reason_from_the_shared_rows(client):
    acct = AssignmentFactory(name="acct-1", pool=PoolFactory(name="team-a"))
    _circuit(CircuitState.OPEN, "sse", "timeout", 1, assignment=acct, model="gpt-5")
    _circuit(CircuitState.OPEN, "http", "timeout", 1, assignment=acct, model="gpt-5")
    _circuit(CircuitState.HALF_OPEN, "http", "upstream_unavailable", 3)
    _circuit(CircuitState.CLOSED, "http", "upstream_unavailable", 4)
    _circuit(CircuitState.CLOSED, "websocket", "", 5)
    _circuit(CircuitState.OPEN, "*", "credential_rejected", 6, model="*")
    assert circuits(scrape(client)) == {
        ("team-a", "acct-1", "gpt-5", "http", "timeout"): 1,
        ("team-a", "acct-1", "gpt-5", "sse", "timeout"): 1,
        ("team-a", "acct-3", "model-3", "http", "upstream_unavailable"): 1,
        # An assignment-wide circuit covers every route class and model.
        ("team-a", "acct-6", "*", "assignment", "credential_rejected"): 1,
    }


@pytest.mark.parametrize("open_circuits", [1, 20])
def test_a_scrape_runs_two_queries_however_many_circuits_are_open_or_keys_budgeted(
    client, django_assert_num_queries, open_circuits
):
    for n in range(open_circuits):
        _circuit(CircuitState.OPEN, "http", "upstream_unavailable", n)
        GatewayKeyFactory(name=f"budgeted-{n}", budget_micros=5_000_000)
    with django_assert_num_queries(2):
        samples = scrape(client)
    assert len(circuits(samples)) == open_circuits
    assert len([name for name, _ in samples if name == "gateway_key_budget_remaining_usd"]) == open_circuits


def test_a_scrape_still_serves_the_counters_when_the_database_fails(client, monkeypatch):
    from django.db import OperationalError

    def broken() -> list:
        raise OperationalError("database is gone")

    monkeypatch.setattr(metrics, "open_circuit_counts", broken)
    observe_exchange(exchange(attempt(1, "succeeded", "", 10)))
    samples = scrape(client)
    assert value(
        samples,
        "gateway_requests_total",
        route="/v1/chat/completions",
        transport="http",
        outcome="ok",
        status_class="2xx",
    )
    assert not [name for name, _ in samples if name == "gateway_open_circuits"]


def test_metrics_is_get_only_in_the_prometheus_text_format(client):
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["content-type"] == CONTENT_TYPE_LATEST
    assert client.post("/metrics").status_code == 405


def test_a_resolution_time_substitution_counts_its_reason():
    from datetime import UTC, datetime

    from prometheus_client.parser import text_string_to_metric_families

    from proxy.ledger.exchange import Exchange
    from proxy.ledger.metrics import REGISTRY, observe_exchange

    def family_count():
        from prometheus_client import generate_latest

        for family in text_string_to_metric_families(generate_latest(REGISTRY).decode()):
            if family.name == "gateway_fallbacks":
                return sum(s.value for s in family.samples if s.labels.get("reason") == "family")
        return 0

    before = family_count()
    now = datetime.now(UTC)
    observe_exchange(
        Exchange(
            request_id="r",
            key_id=None,
            route="/v1/messages",
            transport="http",
            requested_model="claude-opus-5",
            started_at=now,
            finished_at=now,
            fallback_reason="family",
        )
    )
    assert family_count() == before + 1


def test_an_upstream_code_the_ledger_records_keeps_its_name(client):
    # A relayed 429 is recorded as `rate_limit_exceeded`: /metrics says the same, not `rate_limited`.
    labels = {"route": "/v1/chat/completions", "transport": "http", "status_class": "4xx"}
    before = scrape(client)
    observe_exchange(
        exchange(
            attempt(1, "failed", "rate_limited", 40, error_code="rate_limit_exceeded"),
            outcome="rate_limit_exceeded",
            status_code=429,
        )
    )
    after = scrape(client)
    for outcome, delta in (("rate_limit_exceeded", 1), ("rate_limited", 0)):
        assert (
            value(after, "gateway_requests_total", outcome=outcome, **labels)
            - value(before, "gateway_requests_total", outcome=outcome, **labels)
            == delta
        )


def test_tokens_cost_and_attempts_are_counted_per_pool_assignment_and_model(client):
    where = {"pool": "team-a", "assignment": "acct-x", "model": "gpt-5"}
    before = scrape(client)
    observe_exchange(
        exchange(
            attempt(1, "ineligible", pool="team-a", assignment="acct-y", input_tokens=999),
            attempt(
                2,
                "retryable_failed",
                "rate_limited",
                30,
                pool="team-a",
                assignment="acct-z",
                input_tokens=None,
                cost_micros=None,
            ),
            attempt(
                3,
                "succeeded",
                "",
                900,
                pool="team-a",
                assignment="acct-x",
                input_tokens=120,
                output_tokens=30,
                cost_micros=4500,
            ),
        )
    )
    after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("gateway_tokens_total", **where, direction="input") == 120
    assert delta("gateway_tokens_total", **where, direction="output") == 30
    assert delta("gateway_cost_micros_total", **where) == 4500
    assert delta("gateway_upstream_attempts_total", **where, status="succeeded") == 1
    z = {**where, "assignment": "acct-z"}
    assert delta("gateway_upstream_attempts_total", **z, status="retryable_failed") == 1
    assert delta("gateway_cost_micros_total", **z) == 0  # an unknown price adds nothing
    # An ineligible candidate was never sent anything: no attempt, no tokens.
    y = {**where, "assignment": "acct-y"}
    assert delta("gateway_upstream_attempts_total", **y, status="ineligible") == 0
    assert delta("gateway_tokens_total", **y, direction="input") == 0


def test_time_to_first_token_is_observed_for_streams_only(client):
    labels = {"route": "/v1/chat/completions"}
    before = scrape(client)
    observe_exchange(
        exchange(
            attempt(1, "succeeded", "", 800),
            transport="sse",
            first_output_at=T0 + timedelta(milliseconds=300),
        )
    )
    observe_exchange(exchange(attempt(1, "succeeded", "", 800)))
    after = scrape(client)
    name = "gateway_time_to_first_token_seconds"
    assert (
        value(after, f"{name}_count", **labels, transport="sse")
        - value(before, f"{name}_count", **labels, transport="sse")
        == 1
    )
    assert value(after, f"{name}_sum", **labels, transport="sse") - value(
        before, f"{name}_sum", **labels, transport="sse"
    ) == pytest.approx(0.3)
    assert value(after, f"{name}_count", **labels, transport="http") == value(
        before, f"{name}_count", **labels, transport="http"
    )


def test_a_served_stream_is_labelled_by_its_pool_and_assignment_and_times_its_first_token(
    gateway, two_assignments
):
    import httpx

    from proxy.ledger import recorder as ledger
    from tests.gateway_fixtures import GATEWAY_KEY

    def live() -> Samples:
        body = httpx.get(f"{gateway}/metrics").text
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(body)
            for s in family.samples
        }

    where = {"pool": "main", "assignment": "acct-a", "model": "gpt-5"}
    ttft = {"route": "/v1/chat/completions", "transport": "sse"}
    before = live()
    response = httpx.post(
        f"{gateway}/v1/chat/completions",
        headers={"authorization": f"Bearer {GATEWAY_KEY}"},
        json={"model": "gpt-5", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 200
    ledger.writer.flush()
    after = live()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("gateway_upstream_attempts_total", **where, status="succeeded") == 1
    assert delta("gateway_tokens_total", **where, direction="input") > 0
    assert delta("gateway_tokens_total", **where, direction="output") > 0
    assert delta("gateway_time_to_first_token_seconds_count", **ttft) == 1


def test_budget_remaining_is_what_the_next_reservation_is_checked_against(client):
    """The budget less this period's spend and what requests in flight hold: a spend counted in an
    earlier period is no longer spent; a disabled key or one without a budget has no series."""
    now = datetime.now(UTC)
    this_month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    last_month = (this_month - timedelta(days=1)).replace(day=1)
    held = {"budget_micros": 10_000_000, "spent_micros": 4_000_000, "reserved_micros": 1_000_000}
    GatewayKeyFactory(name="current", budget_period="month", period_start=this_month, **held)
    GatewayKeyFactory(name="rolled-over", budget_period="month", period_start=last_month, **held)
    GatewayKeyFactory(name="lifetime", **held)
    GatewayKeyFactory(name="disabled", enabled=False, **held)
    GatewayKeyFactory(name="unbudgeted")
    samples = scrape(client)
    remaining = {
        dict(labels)["key"]: (dict(labels)["period"], v)
        for (name, labels), v in samples.items()
        if name == "gateway_key_budget_remaining_usd"
    }
    assert remaining == {
        "current": ("month", 5.0),
        "rolled-over": ("month", 9.0),
        "lifetime": ("lifetime", 5.0),
    }
    assert value(samples, "gateway_key_budget_usd", key="current", period="month") == 10.0
