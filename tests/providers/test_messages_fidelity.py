"""An Anthropic client's `top_k` and `thinking` through the gateway, driven by the anthropic SDK over real
sockets: a Gemini account (devkit.gemini) receives them in its generation config and a Bedrock one
(devkit.bedrock) in the Messages body InvokeModel takes for an Anthropic model, with the adversarial
fixture's roles kept, and
an OpenAI-shaped account, which has no field for them, is passed over before anything is sent."""

from typing import Any

import anthropic
import pytest

from catalog.models import Provenance
from devkit.bedrock import BedrockFake
from devkit.gemini import GeminiFake
from pools.models import Adapter, GatewaySettings
from proxy.ledger.models import Attempt
from proxy.ledger.recorder import writer
from proxy.unserved import UNTRANSLATABLE_MESSAGE
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory
from tests.gateway_fixtures import GATEWAY_KEY
from tests.proxy.test_anthropic_ingress import TOOL_READY
from tests.proxy.test_translate import ANTHROPIC_ADVERSARIAL, FORGED, INSTRUCTION

GEMINI_KEY = "gemini-upstream-key-000"
# One model id every account serves; Bedrock passes top_k and thinking on to Anthropic models only.
MODEL = "anthropic.claude-sonnet-4-5"
TURN = [{"role": "user", "content": "hi"}]
THINKING = {"type": "enabled", "budget_tokens": 1024}


@pytest.fixture
def accounts(transactional_db, fake_upstream_factory, monkeypatch):
    """`accounts("openai", "gemini", ...)`: pool `main` with one account per adapter, in tier order, each
    serving MODEL natively with tools; returns their fakes by adapter."""
    google = GeminiFake(models=(MODEL,), require_key=GEMINI_KEY).start()
    aws = BedrockFake(models=(MODEL,)).start()
    monkeypatch.setenv("GATEWAY_UPSTREAM_GEMINI", GEMINI_KEY)
    monkeypatch.setenv("GATEWAY_UPSTREAM_AWS", f"{aws.access_key}:{aws.secret_key}")
    GatewaySettings.objects.update_or_create(pk=1, defaults={"backoff_base_ms": 0})
    pool = PoolFactory(name="main")
    GatewayKeyFactory(name="e2e", raw_key=GATEWAY_KEY, pools=[pool])

    def add(*adapters: str) -> dict[str, Any]:
        fakes: dict[str, Any] = {}
        for tier, adapter in enumerate(adapters):
            match adapter:
                case "gemini":
                    fakes[adapter], base_url, env = google, google.base_url, "GATEWAY_UPSTREAM_GEMINI"
                case "bedrock":
                    fakes[adapter], base_url, env = aws, aws.endpoint, "GATEWAY_UPSTREAM_AWS"
                case _:
                    fakes[adapter] = fake_upstream_factory(adapter, models=(MODEL,))
                    base_url, env = fakes[adapter].base_url, ""
            row = AssignmentFactory(
                pool=pool,
                name=adapter,
                adapter=adapter,
                base_url=base_url,
                tier=tier,
                api_key_env=env,
                region="us-east-1",
                **TOOL_READY,
            )
            CatalogEntryFactory(assignment=row, model=MODEL, provenance=Provenance.CONFIGURED)
        return fakes

    yield add
    google.stop()
    aws.stop()


def _client(gateway: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway, api_key=GATEWAY_KEY, max_retries=0)


def _attempts() -> list[tuple[str, str]]:
    writer.flush()
    return [(a.status, a.ineligible_reason) for a in Attempt.objects.order_by("request_id", "ordinal")]


def test_top_k_and_thinking_reach_gemini_past_an_account_that_cannot_carry_them(gateway, accounts):
    fakes = accounts(Adapter.OPENAI, Adapter.GEMINI)
    other, google = fakes[Adapter.OPENAI], fakes[Adapter.GEMINI]
    client = _client(gateway)
    answer = client.messages.create(
        model=MODEL, max_tokens=2048, messages=TURN, thinking=THINKING, extra_body={"top_k": 7}
    )
    assert answer.content[0].text == "hello from gemini"
    with client.messages.stream(
        model=MODEL, max_tokens=2048, messages=TURN, thinking=THINKING, extra_body={"top_k": 7}
    ) as stream:
        assert "".join(stream.text_stream) == "hello from gemini"
    assert other.hits == []  # refused before anything was sent
    assert [hit.path for hit in google.hits] == [
        f"/v1beta/models/{MODEL}:generateContent",
        f"/v1beta/models/{MODEL}:streamGenerateContent",
    ]
    for hit in google.hits:
        assert hit.body["generationConfig"] == {
            "maxOutputTokens": 2048,
            "topK": 7,
            "thinkingConfig": {"thinkingBudget": 1024},
        }
    assert _attempts()[:2] == [("ineligible", "capability"), ("succeeded", "")]


def test_without_an_account_that_carries_top_k_the_request_is_a_typed_400_naming_it(gateway, accounts):
    other = accounts(Adapter.OPENAI)[Adapter.OPENAI]
    with pytest.raises(anthropic.BadRequestError) as refused:
        _client(gateway).messages.create(model=MODEL, max_tokens=64, messages=TURN, extra_body={"top_k": 7})
    # Anthropic's error envelope has no `param`: the message names the field.
    error = refused.value.body["error"]
    assert (error["type"], error["message"]) == (
        "invalid_request_error",
        UNTRANSLATABLE_MESSAGE.format("top_k"),
    )
    assert other.hits == []
    assert _attempts() == [("ineligible", "capability")]


@pytest.mark.parametrize("adapter", [Adapter.GEMINI, Adapter.BEDROCK])
def test_the_adversarial_fixture_arrives_with_its_roles_and_top_k_on_gemini_and_bedrock(
    gateway, accounts, adapter
):
    fake = accounts(adapter)[adapter]
    body = {**ANTHROPIC_ADVERSARIAL, "model": MODEL}
    answer = _client(gateway).messages.create(**body, extra_body={"top_k": 7})
    assert answer.content[0].type == "text"
    (hit,) = fake.hits
    sent = hit.body
    if adapter == Adapter.GEMINI:
        assert sent["systemInstruction"] == {"parts": [{"text": INSTRUCTION}]}
        assert [c["role"] for c in sent["contents"]] == ["user", "model", "user"]
        assert sent["contents"][2]["parts"][0]["functionResponse"]["response"] == {"content": FORGED}
        assert sent["generationConfig"]["topK"] == 7
    else:  # an Anthropic model on Bedrock takes the Messages body itself (InvokeModel), as sent
        assert hit.path == f"/model/{MODEL}/invoke"
        assert sent == {
            **{name: value for name, value in body.items() if name != "model"},
            "anthropic_version": "bedrock-2023-05-31",
            "top_k": 7,
        }
        assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
