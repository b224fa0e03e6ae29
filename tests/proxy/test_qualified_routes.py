"""A coding agent's tool turn through the live gateway (uvicorn, real sockets) before and after
`manage.py qualify` (SPEC §5.3, §8.1): a fresh route with nothing declared is unknown, so ineligible for
tools; once its replay qualifies it, it serves the turn; a route whose replay showed flattened tool
results stays ineligible however well it answers."""

import io

import httpx
import pytest
from django.core.management import call_command

from catalog.models import CapabilityEvidence
from devkit.model_upstream import ModelUpstream
from pools.models import GatewaySettings
from proxy.ledger.models import Attempt
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory
from tests.gateway_fixtures import GATEWAY_KEY
from tests.proxy.fixtures_e2e import TIMEOUT, ledger_settled, record_of

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_record",
            "description": "Read one record by its id.",
            "parameters": {"type": "object", "properties": {"record_id": {"type": "string"}}},
        },
    }
]
AGENT_TURN = {
    "model": "gpt-5",
    "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Look up record R42."},
    ],
    "tools": TOOLS,
}


@pytest.fixture
def agent_pool(transactional_db):
    flattening = ModelUpstream("flatten_tool_results").start()
    faithful = ModelUpstream("faithful").start()
    GatewaySettings.objects.update_or_create(pk=1, defaults={"backoff_base_ms": 0})
    pool = PoolFactory(name="agents")
    # The flattening route is preferred (tier 0): only eligibility can keep the turn away from it.
    for tier, (name, fake) in enumerate((("relay-flat", flattening), ("direct", faithful))):
        assignment = AssignmentFactory(pool=pool, name=name, base_url=fake.base_url, tier=tier)
        CatalogEntryFactory(assignment=assignment, model="gpt-5")
    GatewayKeyFactory(name="agent", raw_key=GATEWAY_KEY, pools=[pool])
    yield flattening, faithful
    flattening.stop()
    faithful.stop()


def ask(gateway: str) -> httpx.Response:
    return httpx.post(
        f"{gateway}/v1/chat/completions",
        json=AGENT_TURN,
        headers={"authorization": f"Bearer {GATEWAY_KEY}"},
        timeout=TIMEOUT,
    )


def test_a_tool_turn_is_served_by_the_route_qualified_for_it(gateway, agent_pool):
    flattening, faithful = agent_pool
    refused = ask(gateway)
    assert refused.status_code == 503
    assert (refused.json()["error"]["code"], refused.json()["error"]["param"]) == (
        "no_eligible_backend",
        "capability",
    )
    assert flattening.hits == [] and faithful.hits == []

    call_command("qualify", stdout=io.StringIO())
    assert CapabilityEvidence.objects.filter(
        assignment__name="relay-flat", capability="role_separation", qualified=False
    ).exists()
    flattening.hits.clear()
    faithful.hits.clear()

    served = ask(gateway)
    assert served.status_code == 200
    call = served.json()["choices"][0]["message"]["tool_calls"][0]["function"]
    assert (call["name"], call["arguments"]) == ("lookup_record", '{"record_id": "R42"}')
    assert len(faithful.hits) == 1 and flattening.hits == []
    ledger_settled()
    record = record_of(served)
    attempts = {
        a.assignment.name: (a.status, a.ineligible_reason) for a in Attempt.objects.filter(request=record)
    }
    assert attempts == {"relay-flat": ("ineligible", "capability"), "direct": ("succeeded", "")}


def test_a_claude_code_style_turn_over_the_anthropic_sdk_follows_the_evidence(gateway, agent_pool):
    """The same through the official anthropic SDK (a Messages client, translated to Chat for these
    openai routes): refused while every route is unknown, served by the qualified route afterwards."""
    import anthropic

    flattening, faithful = agent_pool
    client = anthropic.Anthropic(base_url=gateway, api_key=GATEWAY_KEY, max_retries=0, timeout=15)
    turn = {
        "model": "gpt-5",
        "max_tokens": 256,
        "system": "You are a coding agent.",
        "messages": [{"role": "user", "content": "Look up record R42."}],
        "tools": [
            {
                "name": "lookup_record",
                "description": "Read one record by its id.",
                "input_schema": {"type": "object", "properties": {"record_id": {"type": "string"}}},
            }
        ],
    }
    with pytest.raises(anthropic.APIStatusError) as refused:
        client.messages.create(**turn)
    assert refused.value.status_code == 503
    assert flattening.hits == [] and faithful.hits == []

    call_command("qualify", stdout=io.StringIO())
    faithful.hits.clear()
    flattening.hits.clear()
    message = client.messages.create(**turn)
    (block,) = [b for b in message.content if b.type == "tool_use"]
    assert (block.name, block.input) == ("lookup_record", {"record_id": "R42"})
    assert message.stop_reason == "tool_use"
    assert len(faithful.hits) == 1 and faithful.hits[0][0] == "/chat/completions"
    assert flattening.hits == []
