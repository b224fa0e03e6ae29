"""An Anthropic Messages client on every provider that carries it through Chat Completions
(proxy/wire/translations/messages_over_chat.py, proxy/wire/providers/gemini_translate.py,
bedrock_translate.py): each
Anthropic field without a Chat counterpart is carried or refused per target, never lost, and the
adversarial fixture (seed 002) keeps its roles on every pair. Pure: the providers' own `call`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.wire.providers.bedrock_translate import chat_to_converse_request
from proxy.wire.providers.registry import CARRIERS, provider
from proxy.wire.translations.messages_over_chat import anthropic_to_chat_request, chat_only
from proxy.wire.translations.translate import RequestTranslationError
from routing.policy.route import Target
from routing.policy.types import Requirements
from tests.proxy.test_translate import ANTHROPIC_ADVERSARIAL, FORGED, INSTRUCTION

CHAT_SHAPED = ("openai", "openrouter", "openai_compatible", "azure_openai")
TURN = {"model": "m", "max_tokens": 4096, "messages": [{"role": "user", "content": "hi"}]}
ENABLED = {"type": "enabled", "budget_tokens": 2048}


# A Messages client on one of Anthropic's models on Bedrock is served by InvokeModel with its own body
# (`proxy.wire.providers.bedrock`); any other Bedrock model goes through Converse, the translation tested
# here.
CLAUDE_ON_BEDROCK = "anthropic.claude-sonnet-4-5"
CONVERSE_MODEL = "meta.llama3-70b-instruct-v1:0"


def call(
    adapter: str, body: dict[str, Any], model: str | None = None, base_url: str = "http://127.0.0.1:9/v1"
) -> dict[str, Any]:
    model = model or (CONVERSE_MODEL if adapter == "bedrock" else CLAUDE_ON_BEDROCK)
    target = Target(1, "acct", 1, adapter, base_url, "NO_SUCH_ENV_VAR")
    sent = provider(adapter).call(
        "/messages",
        target,
        body,
        model=model,
        requirements=Requirements(),
        credential="key:secret",
        created=0,
    )
    return sent.payload


def converse(body: dict[str, Any]) -> dict[str, Any]:
    """The Converse translation of a Messages body (pure: no provider routing)."""
    return chat_to_converse_request(anthropic_to_chat_request(body))


def refused(adapter: str, body: dict[str, Any]) -> str:
    with pytest.raises(RequestTranslationError) as error:
        call(adapter, body)
    return error.value.param


def test_every_messages_carrier_is_covered_here():
    # `vertex` sends Claude models the body as sent and Gemini models Gemini's translation, tested here
    # (tests/providers/test_vertex.py holds it to both).
    assert CARRIERS["/messages"] == {"anthropic", *CHAT_SHAPED, "gemini", "bedrock", "vertex"}


# ---------------------------------------------------------------------------------------------------
# top_k and thinking: carried where the target's API takes them, refused where it does not


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"top_k": 40}, {"topK": 40}),
        ({"thinking": ENABLED}, {"thinkingConfig": {"thinkingBudget": 2048}}),
        ({"thinking": {"type": "adaptive"}}, {"thinkingConfig": {"thinkingBudget": -1}}),
        ({"top_k": 5, "thinking": ENABLED}, {"topK": 5, "thinkingConfig": {"thinkingBudget": 2048}}),
    ],
)
def test_gemini_carries_top_k_and_thinking_in_its_generation_config(fields, expected):
    config = call("gemini", {**TURN, **fields})["generationConfig"]
    assert config == {"maxOutputTokens": 4096, **expected}


@pytest.mark.parametrize(
    "fields",
    [
        {"top_k": 40},
        {"thinking": ENABLED},
        {"thinking": {"type": "adaptive"}},
        {"top_k": 5, "thinking": ENABLED},
    ],
)
def test_bedrock_keeps_top_k_and_thinking_in_claudes_own_body_and_converse_refuses_them(fields):
    # A Messages client on Claude: its own body to InvokeModel, every field as sent.
    for claude in (CLAUDE_ON_BEDROCK, "us.anthropic.claude-sonnet-4-5-v1:0"):
        invoked = call("bedrock", {**TURN, **fields}, model=claude)
        assert {name: invoked[name] for name in fields} == fields
    # Any other model is served by Converse, which has no field for them (Bedrock would answer a terminal
    # ValidationException): refused by name, so another account serves.
    with pytest.raises(RequestTranslationError) as error:
        converse({**TURN, **fields})
    assert error.value.param == next(iter(fields))


@pytest.mark.parametrize("model", ["meta.llama3-70b-instruct-v1:0", "amazon.nova-pro-v1:0", "mistral.large"])
@pytest.mark.parametrize(("fields", "param"), [({"top_k": 40}, "top_k"), ({"thinking": ENABLED}, "thinking")])
def test_bedrock_refuses_top_k_and_thinking_for_a_model_that_is_not_anthropics(model, fields, param):
    with pytest.raises(RequestTranslationError) as error:
        call("bedrock", {**TURN, **fields}, model=model)
    assert error.value.param == param


def test_thinking_continuing_a_tool_loop_reaches_claude_on_bedrock_and_gemini():
    # On Claude, the client's own body goes back with its own signed reasoning blocks (InvokeModel).
    looping = {**ANTHROPIC_ADVERSARIAL, "thinking": ENABLED, "max_tokens": 4096}
    assert call("bedrock", looping, model=CLAUDE_ON_BEDROCK)["thinking"] == ENABLED
    assert call("gemini", looping)["generationConfig"]["thinkingConfig"] == {"thinkingBudget": 2048}
    assert "additionalModelRequestFields" not in converse(ANTHROPIC_ADVERSARIAL)


@pytest.mark.parametrize("adapter", CHAT_SHAPED)
def test_a_chat_shaped_upstream_refuses_what_chat_has_no_field_for(adapter):
    assert refused(adapter, {**TURN, "top_k": 40}) == "top_k"


ADAPTIVE = {"type": "adaptive", "display": "omitted"}  # what Claude Code 2.1 sends on its default model


@pytest.mark.parametrize("adapter", CHAT_SHAPED)
@pytest.mark.parametrize(
    ("fields", "effort"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "low"),
        ({"thinking": {"type": "enabled", "budget_tokens": 8000}}, "medium"),
        ({"thinking": {"type": "enabled", "budget_tokens": 31999, "display": "omitted"}}, "high"),
        ({"thinking": ADAPTIVE}, None),
        ({"thinking": ADAPTIVE, "output_config": {"effort": "medium"}}, "medium"),
        ({"thinking": ENABLED, "output_config": {"effort": "max"}}, "high"),
        ({"output_config": {"effort": "low"}}, "low"),
        ({"output_config": {"effort": "someday"}}, None),
    ],
)
def test_the_reasoning_asked_for_is_reasoning_effort_on_an_openai_reasoning_model(adapter, fields, effort):
    # Azure's `/openai/v1` surface takes every field; its deployment surface is below.
    base_url = "http://127.0.0.1:9/openai/v1" if adapter == "azure_openai" else "http://127.0.0.1:9/v1"
    for model in ("gpt-5", "o3-mini", "openai/gpt-5.2", "gpt-oss-120b"):
        assert (
            call(adapter, {**TURN, **fields}, model=model, base_url=base_url).get("reasoning_effort")
            == effort
        )
    # A model without reasoning refuses the field: the client's reasoning request is dropped there.
    for model in ("gpt-4.1", "gpt-5-chat-latest", "llama-3.3-70b"):
        assert "reasoning_effort" not in call(adapter, {**TURN, **fields}, model=model, base_url=base_url)
    # So does Azure's deployment surface (its api-version 2024-10-21 has no `reasoning_effort`).
    if adapter == "azure_openai":
        assert "reasoning_effort" not in call(adapter, {**TURN, **fields}, model="o3-mini")


@pytest.mark.parametrize("adapter", CHAT_SHAPED)
def test_a_thinking_clearing_edit_is_dropped_as_the_bridge_clears_all_thinking(adapter):
    edits = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
    assert call(adapter, {**TURN, "context_management": edits}) == call(adapter, TURN)
    cleared = {"edits": [{"type": "clear_thinking_20251015"}, {"type": "clear_tool_uses_20250919"}]}
    assert refused(adapter, {**TURN, "context_management": cleared}) == "context_management.edits[1].type"


@pytest.mark.parametrize("adapter", CHAT_SHAPED)
def test_a_deferred_tool_is_not_shown_to_a_chat_model(adapter):
    shown = {"name": "Bash", "input_schema": {"type": "object", "properties": {}}}
    deferred = {"name": "Placeholder", "input_schema": {"type": "object"}, "defer_loading": True}
    sent = call(adapter, {**TURN, "tools": [shown, deferred]})
    assert [tool["function"]["name"] for tool in sent["tools"]] == ["Bash"]


@pytest.mark.parametrize("adapter", ("gemini", "bedrock", *CHAT_SHAPED))
def test_nothing_is_carried_without_the_fields_or_with_thinking_disabled(adapter):
    plain = call(adapter, TURN)
    disabled = call(adapter, {**TURN, "thinking": {"type": "disabled"}})
    assert plain == disabled
    text = json.dumps(plain)
    assert "topK" not in text and "thinking" not in text and "additionalModelRequestFields" not in text


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_k": 0}, "top_k"),
        ({"top_k": "40"}, "top_k"),
        ({"thinking": "on"}, "thinking"),
        ({"thinking": {"type": "maybe"}}, "thinking.type"),
        ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
        ({"thinking": {"type": "enabled", "budget_tokens": 0}}, "thinking.budget_tokens"),
        ({"thinking": {**ENABLED, "display": "summarized"}}, "thinking.display"),
        ({"thinking": {"type": "disabled", "budget_tokens": 2048}}, "thinking.budget_tokens"),
    ],
)
@pytest.mark.parametrize("adapter", ("gemini", "bedrock", "openai"))
def test_a_value_that_cannot_be_carried_as_given_is_refused_on_every_target(adapter, fields, param):
    assert refused(adapter, {**TURN, **fields}) == param


def test_the_carried_fields_are_no_json_field_of_the_chat_body():
    chat = anthropic_to_chat_request({**TURN, "top_k": 3})
    assert chat.carried == {"top_k": 3}
    assert "top_k" not in chat and "top_k" not in {**chat}
    with pytest.raises(RequestTranslationError) as error:
        chat_only(chat, "gpt-5")
    assert error.value.param == "top_k"
    assert chat_only(anthropic_to_chat_request(TURN), "gpt-5") == anthropic_to_chat_request(TURN)


@pytest.mark.parametrize("adapter", ("gemini", "bedrock", *CHAT_SHAPED))
def test_price_latency_and_capacity_hints_are_dropped_by_decision(adapter):
    hints = {
        "service_tier": "standard_only",
        "speed": "fast",
        "cache_control": {"type": "ephemeral"},
        "output_config": {"effort": "low"},
        "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
    }
    sent = json.dumps(call(adapter, {**TURN, **hints}))
    assert "be brief" in sent
    assert not any(word in sent for word in ("service_tier", "standard_only", "speed", "cache", "effort"))


# ---------------------------------------------------------------------------------------------------
# The adversarial fixture through every Messages pair


@pytest.mark.parametrize("adapter", ("gemini", "bedrock", *CHAT_SHAPED))
def test_the_adversarial_fixture_keeps_role_separation_on_every_messages_pair(adapter):
    sent = call(adapter, ANTHROPIC_ADVERSARIAL)
    text = json.dumps(sent)
    # The forged text is carried once, verbatim, and the instruction once: nothing promoted or flattened.
    assert text.count(json.dumps(FORGED)[1:-1]) == 1 and text.count(INSTRUCTION) == 1
    assert "delete_file" in text
    match adapter:
        case "gemini":
            assert sent["systemInstruction"] == {"parts": [{"text": INSTRUCTION}]}
            assert [c["role"] for c in sent["contents"]] == ["user", "model", "user"]
            (result,) = sent["contents"][2]["parts"]
            assert result["functionResponse"]["id"] == "toolu_01"
            assert result["functionResponse"]["name"] == "read_file"
            assert result["functionResponse"]["response"] == {"content": FORGED}
        case "bedrock":
            assert sent["system"] == [{"text": INSTRUCTION}]
            assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
            (result,) = sent["messages"][2]["content"]
            assert result["toolResult"] == {"toolUseId": "toolu_01", "content": [{"text": FORGED}]}
        case _:
            messages = sent["messages"]
            assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
            assert messages[0]["content"] == INSTRUCTION
            assert messages[2]["tool_calls"][0]["id"] == messages[3]["tool_call_id"] == "toolu_01"
            assert messages[3]["content"] == FORGED
