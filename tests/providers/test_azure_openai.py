"""Azure OpenAI accounts (`azure_openai`) behind the gateway, against the Azure fake (devkit.azure), driven
by the openai SDK over real sockets: deployment URLs with api-version and the `api-key` header, failover
across providers before any output, Azure's rejections classified (SPEC §5.6), usage and cost, streams."""

import anthropic
import openai
import pytest

from catalog.models import CatalogEntry, Provenance
from devkit.azure import AzureFake, prompt_filtered
from devkit.behaviours import error, rate_limited, serve
from pools.models import Adapter, Assignment, GatewaySettings
from proxy.ledger.models import Attempt, RequestRecord
from proxy.ledger.recorder import writer
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory
from tests.gateway_fixtures import GATEWAY_KEY
from tests.proxy.fixtures_e2e import wait_for

AZURE_KEY = "azure-upstream-key-0000"
TURN = [{"role": "user", "content": "hi"}]


@pytest.fixture
def azure_then_openai(transactional_db, fake_upstream_factory, monkeypatch):
    """Pool `main`: an Azure resource (tier 0, deployment `gpt-4o`) then an OpenAI account (tier 1)."""
    monkeypatch.setenv("GATEWAY_UPSTREAM_AZURE", AZURE_KEY)
    GatewaySettings.objects.update_or_create(pk=1, defaults={"backoff_base_ms": 0})
    azure = AzureFake("azure", ("gpt-4o",), require_key=AZURE_KEY).start()
    openai_fake = fake_upstream_factory("openai", models=("gpt-4o",))
    pool = PoolFactory(name="main")
    rows = []
    for tier, (name, adapter, base_url, env) in enumerate(
        (
            ("azure", Adapter.AZURE_OPENAI, azure.endpoint, "GATEWAY_UPSTREAM_AZURE"),
            ("openai", Adapter.OPENAI, openai_fake.base_url, ""),
        )
    ):
        row = AssignmentFactory(
            pool=pool, name=name, adapter=adapter, base_url=base_url, tier=tier, api_key_env=env
        )
        CatalogEntryFactory(
            assignment=row,
            model="gpt-4o",
            provenance=Provenance.CONFIGURED,
            input_per_mtok_micros=2_500_000,
            output_per_mtok_micros=10_000_000,
        )
        rows.append(row)
    GatewayKeyFactory(name="e2e", raw_key=GATEWAY_KEY, pools=[pool])
    yield azure, openai_fake, rows
    azure.stop()


def _client(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, max_retries=0)


def _record() -> RequestRecord:
    writer.flush()
    return RequestRecord.objects.get()


def test_a_chat_turn_goes_to_the_deployment_with_the_azure_key_and_is_charged(gateway, azure_then_openai):
    azure, openai_fake, _ = azure_then_openai
    azure.script("gpt-4o", serve("from azure", input_tokens=1000, output_tokens=100))
    answer = _client(gateway).chat.completions.create(model="gpt-4o", messages=TURN)
    assert answer.choices[0].message.content == "from azure"
    hit = azure.hits[-1]
    assert hit.path == "/openai/deployments/gpt-4o/chat/completions"
    assert hit.headers["api-key"] == AZURE_KEY and "authorization" not in hit.headers
    assert openai_fake.hits == []
    attempt = Attempt.objects.get(request=_record())
    assert (attempt.input_tokens, attempt.output_tokens) == (1000, 100)
    assert attempt.cost_micros == 2_500 + 1_000  # 1000 x 2.5 $/Mtok + 100 x 10 $/Mtok


def test_a_streamed_turn_is_relayed_and_its_usage_read(gateway, azure_then_openai):
    azure, _, _ = azure_then_openai
    stream = _client(gateway).chat.completions.create(model="gpt-4o", messages=TURN, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hello from azure"
    assert all(c.usage is None for c in chunks)  # the usage the gateway asked for is not relayed
    assert azure.hits[-1].body["stream_options"] == {"include_usage": True}
    # The SDK stops reading at [DONE]: the ledger hand-off may still be running.
    attempt = wait_for(lambda: (writer.flush(), Attempt.objects.first())[1], what="the attempt")
    assert attempt.output_tokens == 3


@pytest.mark.parametrize("rejection", ["rate_limited", "deployment_not_found"])
def test_an_azure_rejection_another_account_can_fix_fails_over_to_openai(
    gateway, azure_then_openai, rejection
):
    azure, _, _ = azure_then_openai
    if rejection == "rate_limited":
        azure.script("gpt-4o", rate_limited(retry_after="7"))
    else:
        azure.models = ()  # this resource has no deployment of the model
    answer = _client(gateway).chat.completions.with_raw_response.create(model="gpt-4o", messages=TURN)
    assert answer.parse().choices[0].message.content == "hello from openai"
    assert answer.headers["x-gateway-attempts"] == "2"
    first = Attempt.objects.filter(request=_record()).order_by("ordinal").first()
    expected = {"rate_limited": "rate_limited", "deployment_not_found": "model_unavailable"}[rejection]
    assert (first.status, first.failure_class) == ("retryable_failed", expected)


def test_a_prompt_blocked_by_azures_content_filter_is_a_terminal_refusal(gateway, azure_then_openai):
    azure, openai_fake, _ = azure_then_openai
    azure.script("gpt-4o", prompt_filtered())
    with pytest.raises(openai.BadRequestError) as refused:
        _client(gateway).chat.completions.create(model="gpt-4o", messages=TURN)
    assert refused.value.code == "content_filter"
    assert "content management policy" not in str(refused.value.body)  # Azure's words stay upstream
    assert openai_fake.hits == []  # a safety refusal is never failed over
    attempt = Attempt.objects.get(request=_record())
    assert attempt.failure_class == "safety_refusal"


def test_embeddings_go_to_the_deployment(gateway, azure_then_openai):
    azure, _, _ = azure_then_openai
    vectors = _client(gateway).embeddings.create(model="gpt-4o", input=["a", "b"]).data
    assert len(vectors) == 2
    assert azure.hits[-1].path == "/openai/deployments/gpt-4o/embeddings"


def test_responses_go_to_the_v1_surface_of_the_resource(gateway, azure_then_openai):
    azure, _, _ = azure_then_openai
    assert _client(gateway).responses.create(model="gpt-4o", input="hi").output_text == "hello from azure"
    assert azure.hits[-1].path == "/openai/v1/responses"


@pytest.mark.parametrize("surface", ["endpoint", "v1"])
def test_catalog_discovery_lists_the_resources_deployments_with_the_azure_key(azure_then_openai, surface):
    """On either surface the model a request names is a deployment: the deployments are the catalog, and
    one still being created is not listed."""
    from catalog.models import CatalogEntry
    from catalog.services import catalog_sync

    azure, _, (row, _) = azure_then_openai
    azure.models = ("gpt-4o", "gpt-4.1")
    azure.pending = ("o3",)
    row.discovery = True
    row.base_url = azure.endpoint if surface == "endpoint" else azure.base_url
    row.save(update_fields=["discovery", "base_url"])
    assert catalog_sync(assignment="azure").results[0].ok
    assert azure.hits[-1].path == "/openai/deployments" and azure.hits[-1].headers["api-key"] == AZURE_KEY
    provenance = dict(CatalogEntry.objects.filter(assignment=row).values_list("model", "provenance"))
    assert provenance == {"gpt-4o": "configured", "gpt-4.1": "observed"}


def test_an_entra_token_credential_is_sent_as_a_bearer_on_calls_and_on_the_listing(
    gateway, azure_then_openai, monkeypatch
):
    from catalog.services import catalog_sync

    azure, openai_fake, (row, _) = azure_then_openai
    azure.require_key = "eyJ0eXAiOiJKV1QiLCJhbGciOi-entra"
    monkeypatch.setenv("GATEWAY_UPSTREAM_AZURE", f"Bearer {azure.require_key}")
    answer = _client(gateway).chat.completions.create(model="gpt-4o", messages=TURN)
    assert answer.choices[0].message.content == "hello from azure"
    row.discovery = True
    row.save(update_fields=["discovery"])
    assert catalog_sync(assignment="azure").results[0].ok
    for hit in azure.hits:
        assert hit.headers["authorization"] == f"Bearer {azure.require_key}" and "api-key" not in hit.headers
    assert openai_fake.hits == []


# What the deployment surface's api-version (2024-10-21) does not take: a later field, the later
# `developer` role, a user part other than text and images (proxy.wire.providers.azure_openai).
UNVERSIONED = {
    "reasoning_effort": ({"reasoning_effort": "low"}, TURN),
    "store": ({"store": True}, TURN),
    "metadata": ({"metadata": {"team": "a"}}, TURN),
    "prediction": ({"prediction": {"type": "content", "content": "x"}}, TURN),
    "modalities": ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}, TURN),
    "messages[0].role": ({}, [{"role": "developer", "content": "brief"}, *TURN]),
    "messages[0].content[0].type": (
        {},
        [
            {
                "role": "user",
                "content": [{"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}],
            }
        ],
    ),
}


@pytest.mark.parametrize("param", list(UNVERSIONED))
def test_what_the_api_version_does_not_take_goes_to_an_account_that_takes_it(
    gateway, azure_then_openai, param
):
    azure, _, _ = azure_then_openai
    extra, messages = UNVERSIONED[param]
    answer = _client(gateway).chat.completions.create(model="gpt-4o", messages=messages, **extra)
    assert answer.choices[0].message.content == "hello from openai"
    assert azure.hits == []  # refused before dispatch
    first = Attempt.objects.filter(request=_record()).order_by("ordinal").first()
    assert (first.status, first.ineligible_reason) == ("ineligible", "capability")


def test_what_no_account_takes_is_a_typed_400_naming_it(gateway, azure_then_openai):
    azure, _, _ = azure_then_openai
    Assignment.objects.filter(name="openai").delete()
    with pytest.raises(openai.BadRequestError) as refused:
        _client(gateway).chat.completions.create(model="gpt-4o", messages=TURN, reasoning_effort="low")
    assert refused.value.body["param"] == "reasoning_effort"
    assert azure.hits == []


def test_a_request_the_api_version_takes_is_sent_unchanged(gateway, azure_then_openai):
    azure, openai_fake, _ = azure_then_openai
    Assignment.objects.filter(name="azure").update(
        tools="true", role_separation="true", tool_representation="native"
    )
    sent = {
        "messages": [{"role": "system", "content": "brief"}, *TURN],
        "max_completion_tokens": 50,
        "parallel_tool_calls": False,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "a", "schema": {"type": "object"}, "strict": True},
        },
        "seed": 7,
        "user": "u-1",
    }
    answer = _client(gateway).chat.completions.create(model="gpt-4o", **sent)
    assert answer.choices[0].message.content == "hello from azure"
    assert azure.hits[-1].body == {"model": "gpt-4o", **sent}
    assert openai_fake.hits == []


def test_an_anthropic_clients_thinking_is_dropped_on_a_version_without_reasoning_effort(
    gateway, azure_then_openai
):
    azure, openai_fake, (row, _) = azure_then_openai
    CatalogEntry.objects.filter(assignment=row).update(model="o3")
    azure.models = ("o3",)
    answer = anthropic.Anthropic(base_url=gateway, api_key=GATEWAY_KEY, max_retries=0).messages.create(
        model="o3",
        max_tokens=5000,
        thinking={"type": "enabled", "budget_tokens": 2048},
        messages=TURN,
    )
    assert answer.content[0].text == "hello from azure"
    assert "reasoning_effort" not in azure.hits[-1].body
    assert openai_fake.hits == []


def test_an_azure_400_after_dispatch_is_the_clients_error_not_a_missing_model(gateway, azure_then_openai):
    """What the version takes is sent; Azure's own 400 for it (a value it refuses) is relayed in its words
    and never read as model_not_found: no other account is tried (SPEC §5.6)."""
    azure, openai_fake, _ = azure_then_openai
    refusal = {
        "message": "Invalid 'top_logprobs': integer above maximum value. Expected a value <= 20, but got "
        "25 instead.",
        "type": "invalid_request_error",
        "param": "top_logprobs",
        "code": "integer_above_max_value",
    }
    azure.script("gpt-4o", error(400, {"error": refusal}))
    with pytest.raises(openai.BadRequestError) as refused:
        _client(gateway).chat.completions.create(
            model="gpt-4o", messages=TURN, logprobs=True, top_logprobs=25
        )
    assert (refused.value.code, refused.value.param) == ("integer_above_max_value", "top_logprobs")
    assert openai_fake.hits == [] and len(azure.hits) == 1
    attempt = Attempt.objects.get(request=_record())
    assert attempt.failure_class == "client_error"
