"""The official openai SDK, pointed at the gateway, through a failover (SPEC §1, §4): the first
assignment rejects with model_not_found, the second serves, and the SDK parses every answer."""

import openai
import pytest

from devkit.behaviours import model_not_found, serve
from tests.gateway_fixtures import GATEWAY_KEY
from tests.proxy.fixtures_e2e import assert_hits

SERVED = "served by b"


@pytest.fixture
def failover(two_assignments):
    a, b, _ = two_assignments
    a.script("gpt-5", model_not_found())
    b.script("gpt-5", serve(SERVED))
    return a, b


@pytest.fixture
def client(gateway):
    # No SDK retries: every upstream hit must come from the gateway's own plan.
    with openai.OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, max_retries=0, timeout=15) as sdk:
        yield sdk


def test_sdk_chat_completion_through_a_failover(client, failover):
    a, b = failover
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-5", messages=[{"role": "user", "content": "hi"}]
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == SERVED
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.completion_tokens == 3
    assert (raw.headers["x-gateway-attempts"], raw.headers["x-gateway-served-model"]) == ("2", "gpt-5")
    assert_hits((a, 1), (b, 1))


def test_sdk_streamed_chat_through_a_failover(client, failover):
    a, b = failover
    stream = client.chat.completions.create(
        model="gpt-5", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == SERVED
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.role) == 1
    assert_hits((a, 1), (b, 1))


def test_sdk_streamed_responses_through_a_failover(client, failover):
    a, b = failover
    events = list(client.responses.create(model="gpt-5", input="hi", stream=True))
    types = [e.type for e in events]
    assert types.count("response.created") == 1
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == SERVED
    (completed,) = [e for e in events if e.type == "response.completed"]
    assert completed.response.output_text == SERVED
    assert completed.response.status == "completed"
    assert_hits((a, 1), (b, 1))


def test_sdk_plain_responses_through_a_failover(client, failover):
    a, b = failover
    response = client.responses.create(model="gpt-5", input="hi")
    assert response.output_text == SERVED
    assert response.usage is not None and response.usage.output_tokens == 3
    assert_hits((a, 1), (b, 1))
