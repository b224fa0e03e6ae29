"""Anthropic Messages ingress and model-level fallback over real sockets (issue #6, SPEC §4, §5.1, §5.2,
§5.6): the official anthropic and openai SDKs (and httpx) -> the gateway under uvicorn -> fake
upstreams on loopback speaking Anthropic Messages and OpenAI Chat Completions.
"""

import json
from dataclasses import dataclass

import anthropic
import httpx
import openai
import pytest

from catalog.models import CatalogEntry, Provenance
from devkit.behaviours import (
    error,
    fail_after_visible,
    fail_before_visible,
    model_not_found,
    overloaded_before_visible,
)
from devkit.upstream import FakeUpstream
from pools.models import Adapter, Assignment, GatewaySettings, ModelFallback, Pool
from proxy.unserved import UNTRANSLATABLE_MESSAGE
from routing.models import Circuit
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory
from tests.gateway_fixtures import GATEWAY_KEY, UPSTREAM_KEY, UPSTREAM_KEY_ENV
from tests.proxy.fixtures_e2e import (
    TIMEOUT,
    attempt_statuses,
    attempts_of,
    post,
    record_of,
    sse_events,
)
from tests.proxy.test_metrics import value
from tests.proxy.test_translate import ANTHROPIC_ADVERSARIAL, CHAT_ADVERSARIAL, FORGED, INSTRUCTION

OPUS = ("claude-opus-4-1", "claude-opus-4-8", "claude-sonnet-4-6-bedrock")
TOOL_READY = {
    "tools": "true",
    "write_tools": "true",
    "role_separation": "true",
    "tool_representation": "native",
}
HELLO = [{"role": "user", "content": "hi"}]


@dataclass
class Setup:
    pool: Pool
    fakes: dict[str, FakeUpstream]
    accounts: dict[str, Assignment]

    def add(
        self, factory, name: str, adapter: str, models: tuple[str, ...], tier: int = 0, **fields
    ) -> FakeUpstream:
        fake = factory(name, models=models)
        account = AssignmentFactory(
            pool=self.pool,
            name=name,
            adapter=adapter,
            base_url=fake.base_url,
            tier=tier,
            api_key_env=UPSTREAM_KEY_ENV,
            **fields,
        )
        for model in models:
            CatalogEntryFactory(assignment=account, model=model, provenance=Provenance.CONFIGURED)
        self.fakes[name], self.accounts[name] = fake, account
        return fake


@pytest.fixture
def setup(transactional_db, monkeypatch):
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    GatewaySettings.objects.update_or_create(pk=1, defaults={"backoff_base_ms": 0})
    pool = PoolFactory(name="main")
    GatewayKeyFactory(name="e2e", raw_key=GATEWAY_KEY, pools=[pool])
    return Setup(pool, {}, {})


@pytest.fixture
def claude(setup, fake_upstream_factory) -> FakeUpstream:
    """One Anthropic account configured for two Opus versions and a Bedrock-style name."""
    return setup.add(fake_upstream_factory, "acct-claude", Adapter.ANTHROPIC, OPUS)


def sdk(gateway: str, key: str = GATEWAY_KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway, api_key=key, max_retries=0, timeout=15)


def messages(gateway: str, body: dict, **kwargs) -> httpx.Response:
    return post(gateway, "/v1/messages", {"max_tokens": 64, "messages": HELLO, **body}, **kwargs)


def scrape_fallbacks(gateway: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{gateway}/metrics", timeout=TIMEOUT).text
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return value(samples, "gateway_fallbacks_total", reason="model_not_found")


# -- §5.1: an unrouted model, resolved before authorization ---------------------------------------------


def test_an_unrouted_model_is_served_by_its_family_fallback_through_the_anthropic_sdk(gateway, claude):
    raw = sdk(gateway).messages.with_raw_response.create(model="claude-opus-5", max_tokens=64, messages=HELLO)
    message = raw.parse()
    assert message.content[0].text == "hello from acct-claude"
    assert raw.headers["x-gateway-served-model"] == "claude-opus-4-8"  # the highest version below 5
    assert raw.headers["x-gateway-model-fallback"] == "claude-opus-4-8"
    assert [(h.path, h.model) for h in claude.hits] == [("/v1/messages", "claude-opus-4-8")]
    assert claude.hits[0].headers["x-api-key"] == UPSTREAM_KEY  # the account's credential, not the client's
    assert claude.hits[0].headers["anthropic-version"]
    record = record_of(raw.http_response)
    assert (record.requested_model, record.served_model, record.route) == (
        "claude-opus-5",
        "claude-opus-4-8",
        "/v1/messages",
    )


def test_a_streamed_answer_through_the_sdk_keeps_the_anthropic_event_sequence(gateway, claude):
    with sdk(gateway).messages.stream(model="claude-opus-5", max_tokens=64, messages=HELLO) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "hello from acct-claude"
    assert final.stop_reason == "end_turn"
    assert claude.hit_count(model="claude-opus-4-8") == 1


def test_an_explicit_mapping_wins_over_the_family(gateway, setup, claude):
    ModelFallback.objects.create(requested="claude-opus-5", served="claude-opus-4-1")
    raw = sdk(gateway).messages.with_raw_response.create(model="claude-opus-5", max_tokens=64, messages=HELLO)
    assert raw.headers["x-gateway-served-model"] == "claude-opus-4-1"
    assert [h.model for h in claude.hits] == ["claude-opus-4-1"]


def test_with_the_family_turned_off_an_unrouted_model_is_a_typed_anthropic_404(gateway, claude):
    GatewaySettings.objects.filter(pk=1).update(model_fallback_family=False)
    with pytest.raises(anthropic.NotFoundError) as raised:
        sdk(gateway).messages.create(model="claude-opus-5", max_tokens=64, messages=HELLO)
    assert raised.value.body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": raised.value.body["error"]["message"]},
    }
    assert claude.hits == []


def test_a_name_without_a_version_tail_is_never_a_family_candidate(gateway, claude):
    response = messages(gateway, {"model": "claude-sonnet-5"})
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"
    assert claude.hits == []


def test_count_tokens_resolves_the_model_the_same_way(gateway, claude):
    client = sdk(gateway)
    raw = client.messages.with_raw_response.count_tokens(model="claude-opus-5", messages=HELLO)
    assert raw.parse().input_tokens == 10
    assert raw.headers["x-gateway-served-model"] == "claude-opus-4-8"
    assert [(h.path, h.model) for h in claude.hits] == [("/v1/messages/count_tokens", "claude-opus-4-8")]


def test_a_key_allowed_only_the_unconfigured_requested_model_is_denied_never_downgraded(
    gateway, setup, claude
):
    narrow = "sk-gw-only-opus-5-0123456789"
    GatewayKeyFactory(name="narrow", raw_key=narrow, pools=[setup.pool], allowed_models=["claude-opus-5"])
    with pytest.raises(anthropic.PermissionDeniedError) as raised:
        sdk(gateway, narrow).messages.create(model="claude-opus-5", max_tokens=64, messages=HELLO)
    assert raised.value.status_code == 403
    assert raised.value.body["error"]["type"] == "permission_error"
    with pytest.raises(anthropic.PermissionDeniedError):
        sdk(gateway, narrow).messages.count_tokens(model="claude-opus-5", messages=HELLO)
    assert claude.hits == []


def test_models_never_lists_fallback_keys(gateway, claude):
    ModelFallback.objects.create(requested="claude-opus-5", served="claude-opus-4-8")
    listed = httpx.get(f"{gateway}/v1/models", headers={"x-api-key": GATEWAY_KEY}, timeout=TIMEOUT).json()[
        "data"
    ]
    assert sorted(m["id"] for m in listed) == sorted(OPUS)


# -- §5.2, §5.6: a configured model rejected upstream, handed to another model --------------------------

BEDROCK_VALIDATION = {
    "__type": "com.amazonaws.bedrock#ValidationException",
    "message": "The provided model identifier is invalid.",
}


@pytest.mark.parametrize(
    "rejection",
    [model_not_found(), error(400, BEDROCK_VALIDATION)],
    ids=["anthropic-not-found-error", "bedrock-validation-exception"],
)
@pytest.mark.parametrize("stream", [False, True])
def test_a_model_rejected_upstream_is_handed_to_its_fallback_model(gateway, claude, rejection, stream):
    ModelFallback.objects.create(requested="claude-opus-4-8", served="claude-opus-4-1")
    claude.script("claude-opus-4-8", rejection)
    before = scrape_fallbacks(gateway)
    response = messages(gateway, {"model": "claude-opus-4-8", "stream": stream})
    assert response.status_code == 200
    if stream:
        kinds = [e.type for e in sse_events(response.text)]
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        assert kinds.count("message_start") == 1
    else:
        assert response.json()["content"][0]["text"] == "hello from acct-claude"
    assert response.headers["x-gateway-model-fallback"] == "claude-opus-4-1"
    assert response.headers["x-gateway-served-model"] == "claude-opus-4-1"
    assert [h.model for h in claude.hits] == ["claude-opus-4-8", "claude-opus-4-1"]
    record = record_of(response)
    assert attempt_statuses(record) == ["retryable_failed", "succeeded"]
    assert (record.served_model, record.retry_count) == ("claude-opus-4-1", 1)
    assert scrape_fallbacks(gateway) - before == 1


def test_a_cross_model_rejection_skips_the_same_models_other_candidates(
    gateway, setup, claude, fake_upstream_factory
):
    twin = setup.add(fake_upstream_factory, "acct-twin", Adapter.ANTHROPIC, ("claude-opus-4-8",), tier=1)
    ModelFallback.objects.create(requested="claude-opus-4-8", served="claude-opus-4-1")
    claude.script("claude-opus-4-8", model_not_found())
    response = messages(gateway, {"model": "claude-opus-4-8"})
    assert response.status_code == 200
    assert response.headers["x-gateway-served-model"] == "claude-opus-4-1"
    assert twin.hits == []  # the rejection was about the model: not retried on the same model


@pytest.mark.parametrize(
    ("provenance", "served_by_twin"),
    [(Provenance.OBSERVED, True), (Provenance.CONFIGURED, False), (Provenance.PRESERVED, False)],
)
def test_an_account_that_lost_an_observed_model_hands_it_to_a_sibling_of_the_same_model(
    gateway, setup, fake_upstream_factory, provenance, served_by_twin
):
    """Anthropic's 404 not_found_error for a model this account's own discovery listed (provenance
    `observed`): the account lost it, so a sibling serving the same model is tried first (SPEC §5.6,
    2026-12-05). Configured or preserved says nothing about what the account serves today: the bare
    404 of the old rule, which never tries the same model again."""
    GatewaySettings.objects.filter(pk=1).update(model_fallback_family=False)
    lost = setup.add(fake_upstream_factory, "acct-lost", Adapter.ANTHROPIC, ("claude-opus-4-8",), tier=0)
    twin = setup.add(fake_upstream_factory, "acct-twin", Adapter.ANTHROPIC, ("claude-opus-4-8",), tier=1)
    CatalogEntry.objects.update(provenance=provenance)  # as sync_catalog records what discovery listed
    lost.script("claude-opus-4-8", model_not_found())
    response = messages(gateway, {"model": "claude-opus-4-8"})
    assert [h.model for h in lost.hits] == ["claude-opus-4-8"]
    record = record_of(response)
    if served_by_twin:
        assert response.status_code == 200
        assert response.json()["content"][0]["text"] == "hello from acct-twin"
        assert [h.model for h in twin.hits] == ["claude-opus-4-8"]
        assert attempt_statuses(record) == ["retryable_failed", "succeeded"]
        assert attempts_of(record)[0].failure_class == "model_unavailable"
        circuit = Circuit.objects.get()
        assert (circuit.assignment_id, circuit.reason) == (
            setup.accounts["acct-lost"].pk,
            "upstream_model_unavailable",
        )
    else:
        assert response.status_code == 404
        assert response.json()["error"]["type"] == "not_found_error"
        assert twin.hits == []
        assert attempt_statuses(record) == ["failed"]
        assert attempts_of(record)[0].failure_class == "model_not_found_cross"


def test_a_pre_visible_not_found_error_in_a_stream_hands_off_across_models(gateway, claude):
    ModelFallback.objects.create(requested="claude-opus-4-8", served="claude-opus-4-1")
    claude.script("claude-opus-4-8", fail_before_visible())
    response = messages(gateway, {"model": "claude-opus-4-8", "stream": True})
    events = sse_events(response.text)
    assert [e.type for e in events].count("message_start") == 1
    assert (
        "".join(e.data["delta"]["text"] for e in events if e.type == "content_block_delta")
        == "hello from acct-claude"
    )
    assert events[0].data["message"]["model"] == "claude-opus-4-1"
    assert response.headers["x-gateway-model-fallback"] == "claude-opus-4-1"


def test_a_plain_400_is_returned_as_is_and_never_handed_off(gateway, claude):
    ModelFallback.objects.create(requested="claude-opus-4-8", served="claude-opus-4-1")
    canary = "max_tokens-provider-message-canary"
    claude.script(
        "claude-opus-4-8",
        error(400, {"type": "error", "error": {"type": "invalid_request_error", "message": canary}}),
    )
    response = messages(gateway, {"model": "claude-opus-4-8"})
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert canary not in response.text  # the provider's words never reach the client
    assert "x-gateway-model-fallback" not in response.headers
    assert claude.hit_count(model="claude-opus-4-1") == 0
    assert attempt_statuses(record_of(response)) == ["failed"]


def test_a_same_model_404_without_a_fallback_is_returned_as_is(gateway, claude):
    # Without the family, claude-opus-4-8 has no fallback (with it, claude-opus-4-1 would be one).
    GatewaySettings.objects.filter(pk=1).update(model_fallback_family=False)
    claude.script("claude-opus-4-8", model_not_found())
    response = messages(gateway, {"model": "claude-opus-4-8"})
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"
    assert [h.model for h in claude.hits] == ["claude-opus-4-8"]
    assert attempt_statuses(record_of(response)) == ["failed"]


def test_a_cross_model_hand_off_is_one_hop(gateway, claude):
    ModelFallback.objects.create(requested="claude-opus-4-8", served="claude-opus-4-1")
    claude.script("claude-opus-4-8", model_not_found())
    claude.script("claude-opus-4-1", model_not_found())
    response = messages(gateway, {"model": "claude-opus-4-8"})
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"
    assert [h.model for h in claude.hits] == ["claude-opus-4-8", "claude-opus-4-1"]
    assert attempt_statuses(record_of(response)) == ["retryable_failed", "failed"]


def test_a_cross_model_candidate_the_key_may_not_use_is_never_dispatched(gateway, setup, claude):
    narrow = "sk-gw-only-opus-4-8-0123456789"
    GatewayKeyFactory(name="narrow", raw_key=narrow, pools=[setup.pool], allowed_models=["claude-opus-4-8"])
    ModelFallback.objects.create(requested="claude-opus-4-8", served="claude-opus-4-1")
    claude.script("claude-opus-4-8", model_not_found())
    response = messages(gateway, {"model": "claude-opus-4-8"}, auth=False, headers={"x-api-key": narrow})
    assert response.status_code == 404
    assert claude.hit_count(model="claude-opus-4-1") == 0
    assert "x-gateway-model-fallback" not in response.headers


# -- SPEC §6.2 for Anthropic streams --------------------------------------------------------------------


def test_an_anthropic_stream_fails_over_before_its_first_delta(gateway, setup, claude, fake_upstream_factory):
    backup = setup.add(fake_upstream_factory, "acct-backup", Adapter.ANTHROPIC, ("claude-opus-4-8",), tier=1)
    claude.script("claude-opus-4-8", overloaded_before_visible())
    with sdk(gateway).messages.stream(model="claude-opus-4-8", max_tokens=64, messages=HELLO) as stream:
        text = "".join(stream.text_stream)
        headers = stream.response.headers
    assert text == "hello from acct-backup"
    assert (claude.hit_count(), backup.hit_count()) == (1, 1)
    assert headers["x-gateway-attempts"] == "2"
    raw = messages(gateway, {"model": "claude-opus-4-8", "stream": True})
    kinds = [e.type for e in sse_events(raw.text)]
    # message_start and ping of the failed attempt were withheld: the client sees one message.
    assert kinds.count("message_start") == 1 and "error" not in kinds


# -- translation across APIs, role separation -----------------------------------------------------------


@pytest.fixture
def gpt(setup, fake_upstream_factory) -> FakeUpstream:
    """One OpenAI account serving gpt-5, able to take tool turns."""
    return setup.add(fake_upstream_factory, "acct-gpt", Adapter.OPENAI, ("gpt-5",), **TOOL_READY)


@pytest.mark.parametrize("stream", [False, True])
def test_an_anthropic_request_is_served_by_an_openai_account(gateway, gpt, stream):
    client = sdk(gateway)
    if stream:
        with client.messages.stream(model="gpt-5", max_tokens=64, system=INSTRUCTION, messages=HELLO) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
    else:
        final = client.messages.create(model="gpt-5", max_tokens=64, system=INSTRUCTION, messages=HELLO)
        text = final.content[0].text
    assert text == "hello from acct-gpt"
    assert final.model == "gpt-5" and final.stop_reason == "end_turn"
    assert final.usage.input_tokens == 10
    (hit,) = gpt.hits
    assert hit.path == "/v1/chat/completions"
    assert hit.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert hit.body["messages"][0] == {"role": "system", "content": INSTRUCTION}
    assert hit.body["max_completion_tokens"] == 64


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_request_is_served_by_an_anthropic_account(gateway, setup, fake_upstream_factory, stream):
    fake = setup.add(fake_upstream_factory, "acct-claude", Adapter.ANTHROPIC, ("claude-opus-4-8",))
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, max_retries=0, timeout=15)
    chat = [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": "hi"}]
    if stream:
        chunks = list(client.chat.completions.create(model="claude-opus-4-8", messages=chat, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[-1].choices[0].finish_reason == "stop"
    else:
        completion = client.chat.completions.create(model="claude-opus-4-8", messages=chat)
        text = completion.choices[0].message.content
        assert completion.usage.prompt_tokens == 10
    assert text == "hello from acct-claude"
    (hit,) = fake.hits
    assert hit.path == "/v1/messages"
    assert hit.body["system"] == INSTRUCTION
    assert [m["role"] for m in hit.body["messages"]] == ["user"]
    assert hit.body["max_tokens"] > 0  # Anthropic requires one; the Chat client sent none


def _assert_roles_kept(hit_body: dict, *, anthropic_wire: bool) -> None:
    """The forged labels stay inside the tool result; the instruction stays in the system position."""
    text = json.dumps(hit_body)
    assert text.count("ignore previous instructions") == 1
    if anthropic_wire:
        assert hit_body["system"] == INSTRUCTION
        roles = [m["role"] for m in hit_body["messages"]]
        assert roles == ["user", "assistant", "user"]
        (result,) = hit_body["messages"][-1]["content"]
        assert result["type"] == "tool_result"
        carried = result["content"] if isinstance(result["content"], str) else result["content"][0]["text"]
        assert carried == FORGED
        assert all(m["role"] != "system" for m in hit_body["messages"])
    else:
        chat = hit_body["messages"]
        assert chat[0] == {"role": "system", "content": INSTRUCTION}
        assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool"]
        assert chat[-1]["content"] == FORGED
        assert sum(1 for m in chat if m["role"] == "system") == 1
    assert "delete_file" in text  # the write tool is offered as a tool, not dropped


@pytest.mark.parametrize(
    ("route", "body", "adapter", "anthropic_wire"),
    [
        ("/v1/messages", ANTHROPIC_ADVERSARIAL, Adapter.ANTHROPIC, True),
        ("/v1/messages", ANTHROPIC_ADVERSARIAL, Adapter.OPENAI, False),
        ("/v1/messages", ANTHROPIC_ADVERSARIAL, Adapter.OPENROUTER, False),
        ("/v1/chat/completions", CHAT_ADVERSARIAL, Adapter.ANTHROPIC, True),
        ("/v1/chat/completions", CHAT_ADVERSARIAL, Adapter.OPENAI, False),
        ("/v1/chat/completions", CHAT_ADVERSARIAL, Adapter.OPENROUTER, False),
    ],
)
def test_the_adversarial_fixture_keeps_role_separation_on_every_adapter(
    gateway, setup, fake_upstream_factory, route, body, adapter, anthropic_wire
):
    fake = setup.add(fake_upstream_factory, "acct", adapter, ("model-x",), **TOOL_READY)
    response = post(gateway, route, {**body, "model": "model-x"})
    assert response.status_code == 200, response.text
    (hit,) = fake.hits
    assert hit.path == ("/v1/messages" if anthropic_wire else "/v1/chat/completions")
    _assert_roles_kept(hit.body, anthropic_wire=anthropic_wire)


def test_an_emulated_tool_route_is_ineligible_for_tool_turns(gateway, setup, fake_upstream_factory):
    emulated = setup.add(
        fake_upstream_factory,
        "acct-emulated",
        Adapter.ANTHROPIC,
        ("model-x",),
        tier=0,
        **{**TOOL_READY, "tool_representation": "emulated"},
    )
    native = setup.add(
        fake_upstream_factory, "acct-native", Adapter.OPENAI, ("model-x",), tier=1, **TOOL_READY
    )
    response = post(gateway, "/v1/messages", {**ANTHROPIC_ADVERSARIAL, "model": "model-x"})
    assert response.status_code == 200
    assert (emulated.hit_count(), native.hit_count()) == (0, 1)
    attempts = attempts_of(record_of(response))
    assert [(a.status, a.ineligible_reason) for a in attempts] == [
        ("ineligible", "capability"),
        ("succeeded", ""),
    ]
    # A plain text turn may still use it.
    plain = messages(gateway, {"model": "model-x"})
    assert plain.status_code == 200 and emulated.hit_count() == 1


def test_routes_an_adapter_cannot_carry_exclude_it_as_capability(
    gateway, setup, fake_upstream_factory, claude
):
    # Compact has no Anthropic form: the only account is passed over, typed, nothing sent.
    response = post(gateway, "/v1/responses/compact", {"model": "claude-opus-4-8", "input": "hi"})
    assert response.status_code == 503
    assert (response.json()["error"]["code"], response.json()["error"]["param"]) == (
        "no_eligible_backend",
        "capability",
    )
    gpt = setup.add(fake_upstream_factory, "acct-gpt", Adapter.OPENAI, ("gpt-5",))
    counted = post(gateway, "/v1/messages/count_tokens", {"model": "gpt-5", "messages": HELLO})
    # count_tokens has no OpenAI form either; rather than a 503, the gateway answers its own estimate
    # (SPEC §4, tests/proxy/test_count_tokens.py), and still sends nothing.
    assert (counted.status_code, counted.headers["x-gateway-token-count"]) == (200, "estimated")
    assert claude.hits == [] and gpt.hits == []


def test_a_request_no_route_can_carry_is_a_typed_400_and_nothing_is_sent(gateway, gpt):
    # An assistant prefill: Anthropic continues it, Chat would answer after it. No faithful translation.
    prefill = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure,"}]
    response = messages(gateway, {"model": "gpt-5", "messages": prefill})
    assert response.status_code == 400
    body = response.json()
    assert body["error"]["type"] == "invalid_request_error"
    assert "messages[1].role" in body["error"]["message"]
    assert gpt.hits == []
    assert [(a.status, a.ineligible_reason) for a in attempts_of(record_of(response))] == [
        ("ineligible", "capability")
    ]


CACHE = {"type": "ephemeral"}


def test_a_block_key_no_route_can_carry_is_a_typed_400_naming_its_path(gateway, gpt, claude):
    # Claude Code's cache breakpoints on blocks and tools are hints: dropped, the request served.
    cached = [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": CACHE}]}]
    served = messages(gateway, {"model": "gpt-5", "messages": cached})
    assert served.status_code == 200
    (hit,) = gpt.hits
    assert hit.body["messages"] == [{"role": "user", "content": "hi"}]
    # A citation (of a document the Chat upstream was never given) cannot be carried: the path is named.
    citation = {"type": "char_location", "cited_text": "h", "document_index": 0, "start_char_index": 0}
    cited = [{"role": "user", "content": [{"type": "text", "text": "hi", "citations": [citation]}]}]
    refused = messages(gateway, {"model": "gpt-5", "messages": cited})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["type"], error["message"]) == (
        "invalid_request_error",
        UNTRANSLATABLE_MESSAGE.format("messages[0].content[0].citations"),
    )
    # The other direction: a Chat participant's `name` has no Anthropic field.
    named = [{"role": "user", "content": "hi", "name": "alice"}]
    response = post(gateway, "/v1/chat/completions", {"model": "claude-opus-4-8", "messages": named})
    assert response.status_code == 400
    assert (response.json()["error"]["code"], response.json()["error"]["param"]) == (
        "invalid_request",
        "messages[0].name",
    )
    assert len(gpt.hits) == 1 and claude.hits == []


def test_typed_errors_on_anthropic_routes_use_the_anthropic_envelope(gateway, claude):
    cases = [
        (
            {"x-api-key": "sk-gw-wrong-key-0123456789"},
            {"model": "claude-opus-4-8"},
            401,
            "authentication_error",
        ),
        ({"x-api-key": GATEWAY_KEY}, {"model": 7}, 400, "invalid_request_error"),
        ({"x-api-key": GATEWAY_KEY}, {"model": "no-such-model"}, 404, "not_found_error"),
    ]
    for headers, body, status, kind in cases:
        response = messages(gateway, body, auth=False, headers=headers)
        assert response.status_code == status
        assert response.json() == {
            "type": "error",
            "error": {"type": kind, "message": response.json()["error"]["message"]},
        }
    assert claude.hits == []


@pytest.mark.parametrize(
    ("adapter", "model"), [(Adapter.ANTHROPIC, "claude-opus-4-8"), (Adapter.OPENAI, "gpt-5")]
)
def test_a_failure_after_output_ends_the_anthropic_stream_with_a_typed_error_and_no_retry(
    gateway, setup, fake_upstream_factory, adapter, model
):
    first = setup.add(fake_upstream_factory, "acct-first", adapter, (model,), tier=0)
    second = setup.add(fake_upstream_factory, "acct-second", adapter, (model,), tier=1)
    first.script(model, fail_after_visible())
    response = messages(gateway, {"model": model, "stream": True})
    events = sse_events(response.text)
    assert events[0].type == "message_start"
    assert any(e.type == "content_block_delta" for e in events)
    last = events[-1]
    assert last.type == "error"
    # Anthropic's error event, with a type an Anthropic SDK knows, in the gateway's own words.
    assert set(last.data) == {"type", "error"} and last.data["error"]["type"] in {
        "overloaded_error",
        "api_error",
    }
    assert "Overloaded" not in response.text and "had an error" not in response.text
    assert second.hits == []
