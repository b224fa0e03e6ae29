"""The provider conformance suite (issue 48 point 5): one set of end-to-end cases every provider adapter
passes, each against its fake (devkit/) over real sockets, driven by the openai and anthropic SDKs, with a
plain OpenAI-shaped account behind it (tier 1) that only serves when the provider's account hands the
request over. A new provider is done when it passes the set: add a row to `PROVIDERS`.

Rows: every adapter, Azure twice (its `/openai/v1` surface, and the resource endpoint whose Chat goes to a
deployment with an api-version), Bedrock twice (a model Converse serves, and a Claude model whose Messages
clients go to InvokeModel) and Vertex twice (a Gemini model, a Claude model).
Cases: a plain and a streamed Chat answer, a Messages client and a Responses client (plain and SSE), each with
its system prompt where the upstream's API keeps it (every row serves Responses, natively or translated); a
two-step tool conversation with two parallel calls a step, from the Chat, Messages and Responses clients,
plain and streamed; an image; usage with cached input and reasoning tokens (in the client's usage and
the ledger); a 429, a 5xx and a rejected credential that fail over before any output; a content filter that
is terminal; a Chat field the target cannot take refused before dispatch (taken elsewhere, or a typed 400
naming it), or relayed as sent where the target's wire is Chat's own."""

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import pytest

from catalog.models import Provenance
from devkit import bedrock, gemini
from devkit.azure import AzureFake
from devkit.bedrock import BedrockFake
from devkit.behaviours import Behaviour, rate_limited, refusal, serve, unavailable
from devkit.gemini import GeminiFake
from devkit.upstream import FakeUpstream
from devkit.vertex import VertexFake
from pools.models import Adapter, Assignment, GatewaySettings
from proxy.ledger.models import Attempt, RequestRecord
from proxy.ledger.recorder import writer
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory
from tests.gateway_fixtures import GATEWAY_KEY
from tests.providers.chat_steps import chat_step
from tests.proxy.fixtures_e2e import wait_for

KEY = "conformance-upstream-key"
ENV = "GATEWAY_UPSTREAM_CONFORMANCE"
TURN = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
# A 1x1 PNG.
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


@dataclass(frozen=True)
class Provider:
    adapter: str
    model: str
    start: Callable[[str], Any]  # a started fake serving the model
    base_url: Callable[[Any], str]
    credential: Callable[[Any], str]  # the account's credential
    wrong: Callable[[Any], str]  # a credential the upstream refuses
    rate_limited: Callable[[], Behaviour]
    unavailable: Callable[[], Behaviour]
    # A Chat field the target's API cannot take (None: its wire is Chat's own, which takes every field).
    refused: dict[str, Any] | None = None


def _openai_wire(adapter: str, fake: Callable[[str], Any] | None = None) -> Provider:
    return Provider(
        adapter,
        "conformance-model",
        fake or (lambda model: FakeUpstream("p", (model,), require_key=KEY).start()),
        lambda f: f.base_url,
        lambda f: KEY,
        lambda f: "not-the-key",
        rate_limited,
        unavailable,
    )


def _bedrock(model: str) -> Provider:
    return Provider(
        Adapter.BEDROCK,
        model,
        lambda model: BedrockFake("p", (model,)).start(),
        lambda f: f.endpoint,
        lambda f: f"{f.access_key}:{f.secret_key}",
        lambda f: f"{f.access_key}:not-the-secret",
        bedrock.throttled,
        bedrock.service_unavailable,
        {"logit_bias": {"1": 5}},
    )


def _vertex(model: str) -> Provider:
    def another_key(fake: VertexFake) -> str:  # a key the account does not hold: its grant is refused
        return json.dumps({**json.loads(fake.key_file()), "private_key_id": "0" * 40})

    return Provider(
        Adapter.VERTEX,
        model,
        lambda model: VertexFake("p", (model,)).start(),
        lambda f: f"{f.endpoint}/v1",
        lambda f: f.key_file(),
        another_key,
        gemini.resource_exhausted,
        gemini.unavailable,
        {"logit_bias": {"1": 5}},
    )


PROVIDERS = {
    "openai": _openai_wire(Adapter.OPENAI),
    "anthropic": Provider(
        Adapter.ANTHROPIC,
        "conformance-model",
        lambda model: FakeUpstream("p", (model,), require_key=KEY).start(),
        lambda f: f.base_url,
        lambda f: KEY,
        lambda f: "not-the-key",
        rate_limited,
        unavailable,
        {"logit_bias": {"1": 5}},
    ),
    "openai_compatible": _openai_wire(Adapter.OPENAI_COMPATIBLE),
    "azure_openai": _openai_wire(
        Adapter.AZURE_OPENAI, lambda model: AzureFake("p", (model,), require_key=KEY).start()
    ),
    # The resource endpoint: Chat to the deployment with api-version 2024-10-21, which has no later fields.
    "azure_deployment": Provider(
        Adapter.AZURE_OPENAI,
        "conformance-model",
        lambda model: AzureFake("p", (model,), require_key=KEY).start(),
        lambda f: f.endpoint,
        lambda f: KEY,
        lambda f: "not-the-key",
        rate_limited,
        unavailable,
        {"reasoning_effort": "low"},
    ),
    "gemini": Provider(
        Adapter.GEMINI,
        "conformance-model",
        lambda model: GeminiFake("p", (model,), require_key=KEY).start(),
        lambda f: f.base_url,
        lambda f: KEY,
        lambda f: "not-the-key",
        gemini.resource_exhausted,
        gemini.unavailable,
        {"logit_bias": {"1": 5}},
    ),
    "bedrock_converse": _bedrock("conformance-model"),
    "bedrock_invoke": _bedrock("anthropic.conformance-v1:0"),
    "vertex_gemini": _vertex("gemini-conformance"),
    "vertex_claude": _vertex("claude-conformance@20260101"),
}


@dataclass
class Account:
    spec: Provider
    fake: Any
    backup: FakeUpstream

    @property
    def model(self) -> str:
        return self.spec.model

    def sent(self) -> dict[str, Any]:
        """The body of the provider's last API request (not a token exchange)."""
        return [hit for hit in self.fake.hits if hit.body is not None][-1].body


@pytest.fixture(params=list(PROVIDERS))
def account(request, transactional_db, monkeypatch):
    """Pool `main`: the provider's account first, a backup OpenAI-shaped account second, both serving the
    row's model, able to take tools, images and untrusted content."""
    spec = PROVIDERS[request.param]
    fake = spec.start(spec.model)
    backup = FakeUpstream("backup", (spec.model,)).start()
    monkeypatch.setenv(ENV, spec.credential(fake))
    GatewaySettings.objects.update_or_create(pk=1, defaults={"backoff_base_ms": 0})
    pool = PoolFactory(name="main")
    for tier, (name, adapter, base_url, env) in enumerate(
        (
            ("provider", spec.adapter, spec.base_url(fake), ENV),
            ("backup", Adapter.OPENAI, backup.base_url, ""),
        )
    ):
        row = AssignmentFactory(
            pool=pool,
            name=name,
            adapter=adapter,
            base_url=base_url,
            tier=tier,
            api_key_env=env,
            region="us-east5" if spec.adapter == Adapter.VERTEX else "us-east-1",
            tools="true",
            role_separation="true",
            tool_representation="native",
            vision="true",
        )
        CatalogEntryFactory(assignment=row, model=spec.model, provenance=Provenance.CONFIGURED)
    GatewayKeyFactory(name="e2e", raw_key=GATEWAY_KEY, pools=[pool])
    yield Account(spec, fake, backup)
    fake.stop()
    backup.stop()


def _openai(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, max_retries=0)


def _anthropic(gateway: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway, api_key=GATEWAY_KEY, max_retries=0)


def _text(value: object) -> str:
    """A string, or the text of a list of parts (`text` parts, Gemini's `parts`)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return _text(value.get("parts"))
    return (
        "".join(str(p.get("text", "")) for p in value if isinstance(p, dict))
        if isinstance(value, list)
        else ""
    )


def system_prompt(body: dict[str, Any]) -> str:
    """The system prompt where the upstream's API keeps it: Gemini's `systemInstruction`, Messages' and
    Converse's `system`, Responses' `instructions`, Chat's system message."""
    if "instructions" in body:
        return _text(body["instructions"])
    if "systemInstruction" in body:
        return _text(body["systemInstruction"])
    if "system" in body:
        return _text(body["system"])
    first = body["messages"][0]
    return _text(first["content"]) if first["role"] == "system" else ""


def _attempts() -> list[Attempt]:
    writer.flush()
    return list(Attempt.objects.order_by("request_id", "ordinal"))


# -- answers --------------------------------------------------------------------------------------------


def test_a_plain_chat_answer_with_its_system_prompt(gateway, account):
    answer = _openai(gateway).chat.completions.create(model=account.model, messages=TURN)
    assert answer.choices[0].message.content == "hello from p"
    assert answer.usage.prompt_tokens > 0 and answer.usage.completion_tokens > 0
    assert system_prompt(account.sent()) == "be brief"
    assert account.backup.hits == []


def test_a_streamed_chat_answer_with_its_system_prompt(gateway, account):
    chunks = list(_openai(gateway).chat.completions.create(model=account.model, messages=TURN, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hello from p"
    assert system_prompt(account.sent()) == "be brief"
    assert account.backup.hits == []


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
def test_a_messages_client_with_its_system_prompt(gateway, account, stream):
    client = _anthropic(gateway)
    turn = {"model": account.model, "max_tokens": 20, "system": "be brief", "messages": TURN[1:]}
    if stream:
        with client.messages.stream(**turn) as events:
            assert "".join(events.text_stream) == "hello from p"
    else:
        assert client.messages.create(**turn).content[0].text == "hello from p"
    assert system_prompt(account.sent()) == "be brief"
    assert account.backup.hits == []


def test_a_responses_client_plain_and_streamed_with_its_instructions(gateway, account):
    client = _openai(gateway)
    answer = client.responses.create(model=account.model, instructions="be brief", input="hi")
    assert answer.output_text == "hello from p"
    assert answer.usage.input_tokens > 0 and answer.usage.output_tokens > 0
    assert system_prompt(account.sent()) == "be brief"
    events = list(
        client.responses.create(model=account.model, instructions="be brief", input="hi", stream=True)
    )
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "hello from p"
    assert events[-1].type == "response.completed"
    assert system_prompt(account.sent()) == "be brief"
    assert account.backup.hits == []


def test_an_image_reaches_the_model(gateway, account):
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, image]}]
    answer = _openai(gateway).chat.completions.create(model=account.model, messages=messages)
    assert answer.choices[0].message.content == "hello from p"
    assert PNG in json.dumps(account.sent())  # in the provider's own image part, its bytes unchanged
    assert account.backup.hits == []


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
def test_usage_counts_cached_input_and_reasoning(gateway, account, stream):
    """100 input tokens of which 60 read from the cache, 40 output of which 15 reasoning: each API reports
    them its own way, the client and the ledger see the same counts."""
    account.fake.script(
        account.model,
        serve("done", input_tokens=100, output_tokens=40, cached_read_tokens=60, reasoning_tokens=15),
    )
    client = _openai(gateway)
    if stream:
        chunks = list(
            client.chat.completions.create(
                model=account.model, messages=TURN, stream=True, stream_options={"include_usage": True}
            )
        )
        usage = chunks[-1].usage
    else:
        usage = client.chat.completions.create(model=account.model, messages=TURN).usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (100, 40)
    assert usage.prompt_tokens_details.cached_tokens == 60
    attempt = wait_for(lambda: _attempts(), what="the attempt")[0]
    assert (attempt.input_tokens, attempt.cached_read_tokens, attempt.output_tokens) == (100, 60, 40)


# -- tools ----------------------------------------------------------------------------------------------

ASK = "read both files"
TOOLS = ("read_a", "read_b")
CHAT_TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in TOOLS]


def _tool_steps(account: Account) -> None:
    account.fake.tool_steps = 2  # two steps of two parallel calls, then the closing text


def _signatures_came_back(account: Account) -> bool:
    """A model that signs its steps (Gemini 3 on the Gemini API and on Vertex) was given each signature
    back unchanged, not Google's stand-in for a step another model took."""
    given = getattr(account.fake, "signatures", set())
    return all(signature in json.dumps(account.sent()) for signature in given)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
def test_a_chat_client_completes_a_two_step_tool_conversation(gateway, account, stream):
    _tool_steps(account)
    client = _openai(gateway)
    messages: list = [{"role": "user", "content": ASK}]
    ids = []
    for step in (1, 2):
        calls, _ = chat_step(client, account.model, messages, CHAT_TOOLS, stream)
        assert sorted(c["function"]["name"] for c in calls) == list(TOOLS)  # parallel calls
        assert all(json.loads(c["function"]["arguments"]) == {"step": step} for c in calls)
        ids += [c["id"] for c in calls]
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        messages += [
            {"role": "tool", "tool_call_id": c["id"], "content": f"result of step {step}"} for c in calls
        ]
    _, final = chat_step(client, account.model, messages, CHAT_TOOLS, stream)
    assert final == "done: result of step 2"
    assert len(set(ids)) == 4  # ids never repeat across the conversation
    assert _signatures_came_back(account)
    assert account.backup.hits == []


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
def test_a_messages_client_completes_a_two_step_tool_conversation(gateway, account, stream):
    _tool_steps(account)
    client = _anthropic(gateway)
    tools = [{"name": name, "input_schema": {"type": "object"}} for name in TOOLS]
    messages: list = [{"role": "user", "content": ASK}]
    ids = []

    def step():
        turn = {"model": account.model, "max_tokens": 64, "messages": messages, "tools": tools}
        if not stream:
            return client.messages.create(**turn)
        with client.messages.stream(**turn) as events:
            return events.get_final_message()

    for n in (1, 2):
        answer = step()
        uses = [b for b in answer.content if b.type == "tool_use"]
        assert sorted(b.name for b in uses) == list(TOOLS) and all(b.input == {"step": n} for b in uses)
        ids += [b.id for b in uses]
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in uses]})
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": f"result of step {n}"} for b in uses
        ]
        messages.append({"role": "user", "content": results})
    assert step().content[0].text == "done: result of step 2"
    assert len(set(ids)) == 4
    assert _signatures_came_back(account)
    assert account.backup.hits == []


RESPONSES_TOOLS = [{"type": "function", "name": name, "parameters": {"type": "object"}} for name in TOOLS]


def _responses_step(client: openai.OpenAI, model: str, items: list, stream: bool) -> tuple[list[dict], str]:
    """One Responses step: its function calls (streamed: joined from the argument deltas) and its text."""
    if not stream:
        answer = client.responses.create(model=model, input=items, tools=RESPONSES_TOOLS)
        calls = [item.model_dump(include={"call_id", "name", "arguments"}) for item in answer.output]
        return [c for c in calls if c.get("call_id")], answer.output_text
    calls: dict[int, dict] = {}
    text, final = "", []
    for event in client.responses.create(model=model, input=items, tools=RESPONSES_TOOLS, stream=True):
        if event.type == "response.output_item.added" and event.item.type == "function_call":
            calls[event.output_index] = {
                "call_id": event.item.call_id,
                "name": event.item.name,
                "arguments": "",
            }
        elif event.type == "response.function_call_arguments.delta":
            calls[event.output_index]["arguments"] += event.delta
        elif event.type == "response.output_text.delta":
            text += event.delta
        elif event.type == "response.completed":
            final = [
                item.model_dump(include={"call_id", "name", "arguments"}) for item in event.response.output
            ]
    joined = [calls[n] for n in sorted(calls)]
    assert joined == [c for c in final if c.get("call_id")]  # the deltas make the calls the response holds
    return joined, text


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
def test_a_responses_client_completes_a_two_step_tool_conversation(gateway, account, stream):
    _tool_steps(account)
    client = _openai(gateway)
    items: list = [{"role": "user", "content": ASK}]
    ids = []
    for step in (1, 2):
        calls, _ = _responses_step(client, account.model, items, stream)
        assert sorted(c["name"] for c in calls) == list(TOOLS)  # parallel calls
        assert all(json.loads(c["arguments"]) == {"step": step} for c in calls)
        ids += [c["call_id"] for c in calls]
        items += [{"type": "function_call", **c} for c in calls]
        items += [
            {"type": "function_call_output", "call_id": c["call_id"], "output": f"result of step {step}"}
            for c in calls
        ]
    _, final = _responses_step(client, account.model, items, stream)
    assert final == "done: result of step 2"
    assert len(set(ids)) == 4
    assert _signatures_came_back(account)
    assert account.backup.hits == []


# -- failures -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rejection", "stream"),
    [("rate_limited", False), ("rate_limited", True), ("unavailable", False)],
    ids=["429-plain", "429-sse", "5xx-plain"],
)
def test_a_429_or_5xx_fails_over_before_any_output(gateway, account, stream, rejection):
    account.fake.script(account.model, getattr(account.spec, rejection)())
    response = _openai(gateway).chat.completions.with_raw_response.create(
        model=account.model, messages=TURN, stream=stream
    )
    assert response.headers["x-gateway-attempts"] == "2"
    first = wait_for(lambda: [a for a in _attempts() if a.ordinal == 1], what="the attempts")
    assert [(a.status, a.failure_class) for a in first] == [("retryable_failed", rejection)]


def test_a_rejected_credential_fails_over_and_opens_the_account_s_circuit(gateway, account, monkeypatch):
    monkeypatch.setenv(ENV, account.spec.wrong(account.fake))
    answer = _openai(gateway).chat.completions.create(model=account.model, messages=TURN)
    assert answer.choices[0].message.content == "hello from backup"
    assert [a.failure_class for a in _attempts()] == ["credential_rejected", ""]


def test_a_content_filter_is_terminal(gateway, account):
    account.fake.script(account.model, refusal())
    answer = _openai(gateway).chat.completions.create(model=account.model, messages=TURN)
    assert answer.choices[0].finish_reason == "content_filter"
    assert account.backup.hits == []
    writer.flush()
    assert RequestRecord.objects.get().outcome == "terminal_refusal"


def test_a_field_the_target_cannot_take_is_refused_before_dispatch(gateway, account):
    spec = account.spec
    if spec.refused is None:  # Chat's own wire: the field is the upstream's to judge, relayed as sent
        _openai(gateway).chat.completions.create(model=account.model, messages=TURN, logit_bias={"1": 5})
        assert account.sent()["logit_bias"] == {"1": 5}
        return
    (field,) = spec.refused
    answer = _openai(gateway).chat.completions.create(model=account.model, messages=TURN, **spec.refused)
    assert answer.choices[0].message.content == "hello from backup"  # an account that takes it
    assert account.fake.hits == []
    first = _attempts()[0]
    assert (first.status, first.ineligible_reason) == ("ineligible", "capability")
    Assignment.objects.filter(name="backup").delete()
    with pytest.raises(openai.BadRequestError) as refused:
        _openai(gateway).chat.completions.create(model=account.model, messages=TURN, **spec.refused)
    assert refused.value.body["param"] == field
    assert account.fake.hits == []
