"""The per-account and per-key metrics after real requests through a real server (issue 47 point 5):
which account's circuit is open, the upstream latency and time to first token by pool, assignment and
model, the requests a key's own limit or budget refused, and what is left of each budget; and, from a
fresh production server process, that no label value a scrape carries comes from what a client sent.

The counters are process-wide (the in-process `gateway` shares them with earlier tests): those are read
as the difference a test's requests made. The database gauges are read from the test's own rows."""

from datetime import UTC, datetime

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from catalog.models import CatalogEntry
from devkit.behaviours import rate_limited, serve, unavailable
from pools.models import GatewayKey, GatewaySettings, Pool
from pools.selectors import budget_left
from routing.models import Circuit
from tests.gateway_fixtures import GATEWAY_KEY
from tests.ops.exported import VOCABULARIES, samples
from tests.proxy.fixtures_e2e import AUTH, CHAT, ledger_settled, wait_for

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
WHERE_A = {"pool": "main", "assignment": "acct-a", "model": "gpt-5"}
WHERE_B = {"pool": "main", "assignment": "acct-b", "model": "gpt-5"}
CANARY = "canary-7f3a9e"  # in everything a client can choose below


def scrape(gateway: str) -> Samples:
    ledger_settled()  # every request answered so far is counted (and its budget settled)
    body = httpx.get(f"{gateway}/metrics", timeout=15).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def chat(gateway: str, body: dict | None = None, **headers: str) -> httpx.Response:
    return httpx.post(f"{gateway}/v1/chat/completions", json=body or CHAT, headers=AUTH | headers, timeout=15)


def stream(gateway: str) -> httpx.Response:
    response = chat(gateway, {**CHAT, "stream": True})
    assert response.status_code == 200
    assert "[DONE]" in response.text
    return response


def test_an_account_s_open_circuits_latency_and_time_to_first_token_name_it(gateway, two_assignments):
    a, b, _ = two_assignments
    GatewaySettings.objects.filter(pk=1).update(failure_threshold=1)
    a.script("gpt-5", unavailable())  # acct-a answers 503: its gpt-5 circuit opens (threshold 1)
    b.script("gpt-5", serve("from b"))
    before = scrape(gateway)
    assert chat(gateway).status_code == 200  # a's 503 handed on to b; a's http circuit opens
    stream(gateway)  # the same over SSE, a route class of its own: a is tried, fails, b serves
    a.require_key = "sk-the-key-this-account-has-now"  # then acct-a's credential is revoked (401)
    Circuit.objects.filter(assignment__name="acct-a").delete()  # (an operator's reset_circuit)
    assert chat(gateway).status_code == 200
    after = scrape(gateway)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert {labels: n for (name, labels), n in after.items() if name == "gateway_open_circuits"} == {
        frozenset(
            {**WHERE_A, "model": "*", "route_class": "assignment", "reason": "credential_rejected"}.items()
        ): 1,
    }
    assert delta("gateway_upstream_latency_seconds_count", **WHERE_A, route_class="http") == 2
    assert delta("gateway_upstream_latency_seconds_count", **WHERE_B, route_class="http") == 2
    assert delta("gateway_upstream_latency_seconds_count", **WHERE_B, route_class="sse") == 1
    assert delta("gateway_upstream_latency_seconds_count", **WHERE_A, route_class="sse") == 1
    # Only the account whose output the client saw has a time to first token.
    assert delta("gateway_upstream_time_to_first_token_seconds_count", **WHERE_B) == 1
    assert delta("gateway_upstream_time_to_first_token_seconds_count", **WHERE_A) == 0
    assert delta("gateway_upstream_attempts_total", **WHERE_A, status="retryable_failed") == 3
    ok = {"route": "/v1/chat/completions", "outcome": "ok", "status_class": "2xx"}
    assert delta("gateway_requests_total", **ok, transport="http") == 2
    assert delta("gateway_requests_total", **ok, transport="sse") == 1


def test_an_open_model_circuit_is_named_by_its_account_model_and_route_class(gateway, two_assignments):
    a, _, _ = two_assignments
    GatewaySettings.objects.filter(pk=1).update(failure_threshold=1)
    a.script("gpt-5", unavailable())
    stream(gateway)
    circuits = wait_for(
        lambda: {k: v for k, v in scrape(gateway).items() if k[0] == "gateway_open_circuits"},
        what="an open circuit on /metrics",
    )
    assert circuits == {
        (
            "gateway_open_circuits",
            frozenset({**WHERE_A, "route_class": "sse", "reason": "upstream_unavailable"}.items()),
        ): 1
    }


def test_a_key_s_own_limit_counts_as_throttled_by_name_and_limit(gateway, two_assignments, minute_clock):
    GatewayKey.objects.filter(name="e2e").update(limit_rpm=1)
    labels = {"key": "e2e", "limit": "rpm"}
    before = value(scrape(gateway), "gateway_key_throttled_total", **labels)
    assert chat(gateway).status_code == 200
    refused = chat(gateway)
    assert (refused.status_code, refused.json()["error"]["param"]) == (429, "rpm")
    after = scrape(gateway)
    assert value(after, "gateway_key_throttled_total", **labels) - before == 1
    # The refusal is a 4xx of the gateway's own, not a 5xx.
    refusal = {"route": "/v1/chat/completions", "transport": "http", "outcome": "rate_limit_exceeded"}
    assert value(after, "gateway_requests_total", **refusal, status_class="4xx") >= 1


def test_an_upstream_429_relayed_is_not_the_key_s_throttling(gateway, two_assignments):
    a, b, _ = two_assignments
    a.script("gpt-5", rate_limited("1"))
    b.script("gpt-5", rate_limited("1"))
    before = scrape(gateway)
    relayed = chat(gateway)
    assert (relayed.status_code, relayed.json()["error"]["code"]) == (429, "rate_limit_exceeded")
    after = scrape(gateway)
    throttled = [(name, labels) for name, labels in after if name == "gateway_key_throttled_total"]
    assert [labels for name, labels in throttled if after[(name, labels)] != before.get((name, labels))] == []


def test_budget_remaining_and_a_budget_refusal_by_key(gateway, two_assignments):
    CatalogEntry.objects.update(input_per_mtok_micros=1_000_000, output_per_mtok_micros=2_000_000)
    GatewayKey.objects.filter(name="e2e").update(budget_micros=5_000_000, budget_period="month")
    labels = {"key": "e2e", "period": "month"}
    assert value(scrape(gateway), "gateway_key_budget_remaining_usd", **labels) == 5.0
    assert chat(gateway).status_code == 200
    samples = scrape(gateway)
    key = GatewayKey.objects.get(name="e2e")
    assert key.spent_micros > 0 and key.reserved_micros == 0
    assert value(samples, "gateway_key_budget_usd", **labels) == 5.0
    left = value(samples, "gateway_key_budget_remaining_usd", **labels)
    assert left == budget_left(key, datetime.now(UTC)) / 1_000_000
    assert left == (5_000_000 - key.spent_micros) / 1_000_000

    # Next, less is left than the next request's reservation: it is refused, counted as `budget`.
    GatewayKey.objects.filter(name="e2e").update(budget_micros=key.spent_micros + 1)
    throttled = {"key": "e2e", "limit": "budget"}
    before = value(samples, "gateway_key_throttled_total", **throttled)
    refused = chat(gateway, {**CHAT, "max_tokens": 1000})
    assert (refused.status_code, refused.json()["error"]["code"]) == (429, "budget_exceeded")
    after = scrape(gateway)
    assert value(after, "gateway_key_throttled_total", **throttled) - before == 1
    assert value(after, "gateway_key_budget_remaining_usd", **labels) == 0.000001
    # A disabled key's budget is nobody's concern: its series goes.
    GatewayKey.objects.filter(name="e2e").update(enabled=False)
    assert not [k for k in scrape(gateway) if k[0] == "gateway_key_budget_usd" and ("key", "e2e") in k[1]]


@pytest.fixture
def node_process(gateway_nodes, two_assignments):
    """One gateway served as production serves it (`python -m gatewaysite.server`), in a process of its
    own: its registry holds only what this test's requests counted."""
    (node,) = gateway_nodes.start(1)
    return node


def test_no_label_value_comes_from_what_a_client_sent(node_process, two_assignments):
    a, _, _ = two_assignments
    GatewayKey.objects.filter(name="e2e").update(budget_micros=50_000_000, limit_rpm=1000)
    a.require_key = "sk-the-key-this-account-has-now"  # a failure, a handoff and an open circuit
    canary_headers = {"x-gateway-session": CANARY, "x-gateway-operation-id": CANARY, "user-agent": CANARY}
    node = node_process
    # A model no configuration names: refused, and counted without it.
    unknown = chat(node, {**CHAT, "model": f"gpt-{CANARY}"}, **canary_headers)
    assert unknown.status_code == 404
    # A model of the gpt family newer than any configured one: served by gpt-5 (family fallback).
    family = chat(node, {**CHAT, "model": "gpt-73519", "user": CANARY}, **canary_headers)
    assert (family.status_code, family.json()["model"]) == (200, "gpt-5")
    assert (
        chat(node, {**CHAT, "stream": True, "metadata": {"k": CANARY}}, **canary_headers).status_code == 200
    )
    bad = httpx.post(f"{node}/v1/{CANARY}", json=CHAT, headers=AUTH, timeout=15)
    assert bad.status_code == 404

    body = httpx.get(f"{node}/metrics", timeout=15).text
    assert CANARY not in body and "73519" not in body
    configured = {
        "pool": set(Pool.objects.values_list("name", flat=True)),
        "assignment": {"acct-a", "acct-b"},
        "model": set(CatalogEntry.objects.values_list("model", flat=True)) | {"*"},
        "key": set(GatewayKey.objects.values_list("name", flat=True)),
    }
    exported = samples()
    seen: dict[str, set[str]] = {}
    for family_ in text_string_to_metric_families(body):
        for sample in family_.samples:
            if sample.name.endswith("_created"):
                continue
            assert set(sample.labels) == exported[sample.name], sample.name
            for label, given in sample.labels.items():
                seen.setdefault(label, set()).add(given)
    for label, given in seen.items():
        if label in configured:
            assert given <= configured[label], label
        elif label in VOCABULARIES:
            assert given <= VOCABULARIES[label], label
        else:
            assert label == "le", label
    # The requests above reached every per-account and per-key metric.
    assert {"pool", "assignment", "model", "key"} <= set(seen)
    assert seen["model"] >= {"gpt-5", "*"}  # a failed gpt-5 attempt, and acct-a's open circuit
    assert GATEWAY_KEY not in body
