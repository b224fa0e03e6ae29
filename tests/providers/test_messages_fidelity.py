"""An Anthropic client's `top_k` and `thinking` through the gateway, driven by the anthropic SDK over real
sockets: a Gemini account (devkit.gemini) receives them in its generation config, and an OpenAI-shaped
account, which has no field for them, is passed over before anything is sent."""

import anthropic
import pytest

from catalog.models import Provenance
from devkit.gemini import GeminiFake
from pools.models import Adapter, GatewaySettings
from proxy.ledger import writer
from proxy.models import Attempt
from proxy.unserved import UNTRANSLATABLE_MESSAGE
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory
from tests.gateway_fixtures import GATEWAY_KEY

GEMINI_KEY = "gemini-upstream-key-000"
MODEL = "gemini-2.5-flash"
TURN = [{"role": "user", "content": "hi"}]
THINKING = {"type": "enabled", "budget_tokens": 1024}


@pytest.fixture
def accounts(transactional_db, fake_upstream_factory, monkeypatch):
    """Pool `main` with an OpenAI-shaped account (tier 0) for MODEL; `accounts(gemini=True)` adds a Gemini
    account (tier 1) for it."""
    monkeypatch.setenv("GATEWAY_UPSTREAM_GEMINI", GEMINI_KEY)
    GatewaySettings.objects.update_or_create(pk=1, defaults={"backoff_base_ms": 0})
    google = GeminiFake(require_key=GEMINI_KEY).start()
    pool = PoolFactory(name="main")
    GatewayKeyFactory(name="e2e", raw_key=GATEWAY_KEY, pools=[pool])

    def add(*, gemini: bool):
        other = fake_upstream_factory("openai", models=(MODEL,))
        rows = [("openai", Adapter.OPENAI, other.base_url, "")]
        if gemini:
            rows.append(("gemini", Adapter.GEMINI, google.base_url, "GATEWAY_UPSTREAM_GEMINI"))
        for tier, (name, adapter, base_url, env) in enumerate(rows):
            row = AssignmentFactory(
                pool=pool, name=name, adapter=adapter, base_url=base_url, tier=tier, api_key_env=env
            )
            CatalogEntryFactory(assignment=row, model=MODEL, provenance=Provenance.CONFIGURED)
        return other, google

    yield add
    google.stop()


def _client(gateway: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway, api_key=GATEWAY_KEY, max_retries=0)


def _attempts() -> list[tuple[str, str]]:
    writer.flush()
    return [(a.status, a.ineligible_reason) for a in Attempt.objects.order_by("request_id", "ordinal")]


def test_top_k_and_thinking_reach_gemini_past_an_account_that_cannot_carry_them(gateway, accounts):
    other, google = accounts(gemini=True)
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
    other, _ = accounts(gemini=False)
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
