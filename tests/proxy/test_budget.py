"""Budgets: reservations gate dispatch; known costs are spent atomically; unknown prices never count."""

import httpx

from catalog.models import CatalogEntry
from pools.models import GatewayKey
from proxy.ledger import writer
from proxy.models import Attempt
from tests.proxy.conftest import GATEWAY_KEY

AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
CHAT = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}


def _price(input_micros, output_micros):
    CatalogEntry.objects.update(input_per_mtok_micros=input_micros, output_per_mtok_micros=output_micros)


def test_a_served_request_spends_its_known_cost(gateway, two_assignments):
    _price(1_000_000, 2_000_000)  # 1 and 2 micros per token
    GatewayKey.objects.update(budget_micros=1_000_000)
    response = httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=10)
    assert response.status_code == 200
    writer.flush()
    attempt = Attempt.objects.get(status="succeeded")
    assert attempt.cost_micros == attempt.input_tokens * 1 + attempt.output_tokens * 2
    assert GatewayKey.objects.get().spent_micros == attempt.cost_micros


def test_an_unknown_price_with_a_budget_is_ineligible(gateway, two_assignments):
    a, b, _ = two_assignments
    GatewayKey.objects.update(budget_micros=1_000_000)  # prices stay unknown
    response = httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=10)
    assert response.status_code == 503
    assert (response.json()["error"]["code"], response.json()["error"]["param"]) == (
        "no_eligible_backend",
        "price_unknown",
    )
    assert a.hits == [] and b.hits == []


def test_an_exhausted_budget_is_ineligible_and_without_a_budget_unknown_cost_is_null(
    gateway, two_assignments
):
    a, b, _ = two_assignments
    _price(1_000_000, 1_000_000)
    GatewayKey.objects.update(budget_micros=5, spent_micros=0)  # reservation: prompt estimate + 10 > 5
    response = httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=10)
    assert (response.status_code, response.json()["error"]["param"]) == (503, "budget")
    assert a.hits == [] and b.hits == []

    GatewayKey.objects.update(budget_micros=None)
    _price(None, None)
    assert (
        httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=10).status_code == 200
    )
    writer.flush()
    assert Attempt.objects.get(status="succeeded").cost_micros is None
    assert GatewayKey.objects.get().spent_micros == 0
