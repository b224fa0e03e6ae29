"""OpenAI-compatible servers (`openai_compatible`) behind the gateway, against the OpenAI fake, driven by
the openai SDK over real sockets: what such servers lack is never sent there (native Responses: a
Responses client is translated to Chat; `stream_options`, tools where the assignment declares none),
and a stream without usage is recorded as unknown, not free."""

import openai
import pytest

from catalog.models import Provenance
from devkit.behaviours import serve
from pools.models import Adapter, Assignment, GatewaySettings
from proxy.ledger.models import Attempt
from proxy.ledger.recorder import writer
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory
from tests.gateway_fixtures import GATEWAY_KEY
from tests.proxy.fixtures_e2e import wait_for

OTHER_KEY = "sk-gw-vllm-only-key-000000000"
TURN = [{"role": "user", "content": "hi"}]
NATIVE_TOOLS = {"tools": "true", "role_separation": "true", "tool_representation": "native"}


@pytest.fixture
def compatible_then_openai(transactional_db, fake_upstream_factory):
    """Pool `main`: a vLLM-like server (tier 0, no tools declared) then an OpenAI account (tier 1)."""
    GatewaySettings.objects.update_or_create(pk=1, defaults={"backoff_base_ms": 0})
    vllm = fake_upstream_factory("vllm", models=("llama-4",))
    other = fake_upstream_factory("openai", models=("llama-4",))
    pool = PoolFactory(name="main")
    accounts = (
        ("vllm", Adapter.OPENAI_COMPATIBLE, vllm, {"tools": "false"}),
        ("openai", Adapter.OPENAI, other, NATIVE_TOOLS),
    )
    for tier, (name, adapter, fake, capabilities) in enumerate(accounts):
        row = AssignmentFactory(
            pool=pool, name=name, adapter=adapter, base_url=fake.base_url, tier=tier, **capabilities
        )
        CatalogEntryFactory(
            assignment=row,
            model="llama-4",
            provenance=Provenance.CONFIGURED,
            input_per_mtok_micros=100_000,
            output_per_mtok_micros=100_000,
        )
    GatewayKeyFactory(name="e2e", raw_key=GATEWAY_KEY, pools=[pool])
    return vllm, other


def _client(gateway: str, key: str = GATEWAY_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key=key, max_retries=0)


def test_a_chat_turn_is_served_as_sent(gateway, compatible_then_openai):
    vllm, other = compatible_then_openai
    answer = _client(gateway).chat.completions.create(model="llama-4", messages=TURN)
    assert answer.choices[0].message.content == "hello from vllm"
    assert vllm.hits[-1].path == "/v1/chat/completions" and other.hits == []


def test_a_stream_is_sent_without_stream_options_and_its_unknown_usage_stays_unknown(
    gateway, compatible_then_openai
):
    vllm, _ = compatible_then_openai
    chunks = list(_client(gateway).chat.completions.create(model="llama-4", messages=TURN, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hello from vllm"
    assert "stream_options" not in vllm.hits[-1].body
    # The SDK stops reading at [DONE]: the ledger hand-off may still be running.
    attempt = wait_for(lambda: (writer.flush(), Attempt.objects.first())[1], what="the attempt")
    assert (attempt.output_tokens, attempt.cost_micros) == (None, None)  # unknown, never zero


def test_a_server_declared_to_take_stream_options_is_asked_for_usage_and_charged(
    gateway, compatible_then_openai
):
    vllm, _ = compatible_then_openai
    Assignment.objects.filter(name="vllm").update(stream_options="true")
    chunks = list(_client(gateway).chat.completions.create(model="llama-4", messages=TURN, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hello from vllm"
    assert all(c.usage is None for c in chunks)  # the usage the gateway asked for is not relayed
    assert vllm.hits[-1].body["stream_options"] == {"include_usage": True}
    attempt = wait_for(lambda: (writer.flush(), Attempt.objects.first())[1], what="the attempt")
    assert attempt.output_tokens == 3 and attempt.cost_micros is not None


def test_a_responses_stream_over_chat_asks_a_declared_server_for_usage(gateway, compatible_then_openai):
    vllm, _ = compatible_then_openai
    Assignment.objects.filter(name="vllm").update(stream_options="true")
    events = list(_client(gateway).responses.create(model="llama-4", input="hi", stream=True))
    assert events[-1].type == "response.completed"
    assert vllm.hits[-1].path == "/v1/chat/completions"
    assert vllm.hits[-1].body["stream_options"] == {"include_usage": True}


def test_a_server_declared_without_stream_options_never_gets_the_field(gateway, compatible_then_openai):
    vllm, _ = compatible_then_openai
    Assignment.objects.filter(name="vllm").update(stream_options="false")
    stream = _client(gateway).chat.completions.create(
        model="llama-4", messages=TURN, stream=True, stream_options={"include_usage": True}
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "hello from vllm"
    assert "stream_options" not in vllm.hits[-1].body
    assert vllm.hits[-1].body["stream"] is True


def test_responses_reach_a_compatible_server_only_as_chat(gateway, compatible_then_openai):
    vllm, other = compatible_then_openai
    assert _client(gateway).responses.create(model="llama-4", input="hi").output_text == "hello from vllm"
    assert [hit.path for hit in vllm.hits] == ["/v1/chat/completions"] and other.hits == []
    # The compact route has no Chat form: a compatible server alone cannot serve it.
    alone = PoolFactory(name="vllm-only")
    Assignment.objects.filter(name="vllm").update(pool=alone)
    GatewayKeyFactory(name="vllm-only", raw_key=OTHER_KEY, pools=[alone])
    with pytest.raises(openai.APIStatusError) as refused:
        _client(gateway, OTHER_KEY).responses.compact(model="llama-4", input="hi")
    assert (refused.value.status_code, refused.value.code, refused.value.param) == (
        503,
        "no_eligible_backend",
        "capability",
    )
    assert len(vllm.hits) == 1


def test_a_turn_with_tools_skips_a_server_declared_without_them(gateway, compatible_then_openai):
    vllm, _ = compatible_then_openai
    tools = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
    answer = _client(gateway).chat.completions.create(model="llama-4", messages=TURN, tools=tools)
    assert answer.choices[0].message.content == "hello from openai"
    assert vllm.hits == []


def test_embeddings_are_served(gateway, compatible_then_openai):
    vllm, _ = compatible_then_openai
    vllm.script("llama-4", serve(input_tokens=4))
    assert len(_client(gateway).embeddings.create(model="llama-4", input="x").data) == 1
    assert vllm.hits[-1].path == "/v1/embeddings"
