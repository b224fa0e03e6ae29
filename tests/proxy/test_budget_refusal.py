"""A budget refusal (SPEC §7.4 as changed 2026-12-05) is the key's condition, not an outage: a 429
`insufficient_quota`/`budget_exceeded` the SDKs do not retry, naming spent, allowed and the reset; and a
finished request holds only its cost, so sequential requests spend the budget to its last reservation."""

import json
from datetime import UTC, datetime

import anthropic
import httpx
import openai
import pytest

from catalog.models import CatalogEntry
from devkit.behaviours import serve
from pools.models import GatewayKey
from proxy.ledger.models import RequestRecord
from proxy.ledger.recorder import writer
from routing.policy.budget import period_end
from tests.gateway_fixtures import GATEWAY_KEY

AUTH = {"authorization": f"Bearer {GATEWAY_KEY}", "content-type": "application/json"}
BODY = json.dumps({"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
RESERVATION = len(BODY) // 4 + 1  # 1 micro per token: the prompt estimate plus max_tokens
COST = 6  # each answer: 4 input + 2 output tokens, about a quarter of the reservation


@pytest.fixture
def priced(two_assignments):
    a, b, _ = two_assignments
    CatalogEntry.objects.update(input_per_mtok_micros=1_000_000, output_per_mtok_micros=1_000_000)
    for fake in (a, b):
        fake.script("gpt-5", serve("one two", input_tokens=4, output_tokens=2))
    return a, b


def _send(gateway: str) -> httpx.Response:
    return httpx.post(f"{gateway}/v1/chat/completions", content=BODY, headers=AUTH, timeout=10)


def test_sequential_requests_spend_the_budget_to_its_last_reservation(gateway, priced):
    """The ledger settles in batches a tenth of a second apart; a request that held its whole
    reservation until then refused the next ones at about half the budget (the issue: 829 of 2000)."""
    budget = 20 * RESERVATION  # one reservation is 5 % of it
    GatewayKey.objects.update(budget_micros=budget)
    served = 0
    while (response := _send(gateway)).status_code == 200:
        served += 1
        key = GatewayKey.objects.get()
        assert key.spent_micros + key.reserved_micros == served * COST  # settled or held: only the cost
    assert response.status_code == 429, response.text
    assert served * COST + RESERVATION > budget  # refused only when the next reservation did not fit
    assert served * COST >= 0.95 * budget
    writer.flush()
    key = GatewayKey.objects.get()
    assert (key.spent_micros, key.reserved_micros) == (served * COST, 0)


def test_a_budget_refusal_is_a_429_naming_spent_allowed_and_reset(gateway, priced):
    a, b = priced
    now = datetime.now(UTC)
    GatewayKey.objects.update(
        budget_micros=5_000_000, spent_micros=4_999_990, budget_period="month", period_start=now
    )
    response = _send(gateway)
    assert response.status_code == 429
    assert response.headers["x-should-retry"] == "false"
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("insufficient_quota", "budget_exceeded")
    reset = period_end("month", now).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert error["message"] == (
        "This key's budget cannot cover this request: "
        f"$4.99999 spent of $5.00 this month; it resets at {reset}."
    )
    assert a.hits == [] and b.hits == []


def test_the_sdks_do_not_retry_a_budget_refusal(gateway, priced):
    a, b = priced
    GatewayKey.objects.update(budget_micros=1, spent_micros=1)  # a lifetime budget, spent
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, max_retries=2, timeout=10)
    with pytest.raises(openai.RateLimitError) as raised:
        client.chat.completions.create(**json.loads(BODY))
    assert raised.value.code == "budget_exceeded"
    assert "$0.000001 spent of $0.000001 (a lifetime budget: it never resets)" in raised.value.message

    claude = anthropic.Anthropic(base_url=gateway, api_key=GATEWAY_KEY, max_retries=2, timeout=10)
    with pytest.raises(anthropic.RateLimitError) as refused:
        claude.messages.create(model="gpt-5", max_tokens=1, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.body["error"]["type"] == "rate_limit_error"
    assert "budget cannot cover" in refused.value.body["error"]["message"]
    assert a.hits == [] and b.hits == []
    writer.flush()
    assert RequestRecord.objects.count() == 2  # neither SDK retried it (x-should-retry: false)
