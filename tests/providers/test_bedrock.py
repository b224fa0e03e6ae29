"""Amazon Bedrock accounts (`bedrock`) behind the gateway, against the Bedrock fake (devkit.bedrock, which
checks every SigV4 signature with botocore's signer), driven by the openai and anthropic SDKs over real
sockets: Converse and ConverseStream (AWS event-stream frames decoded by botocore), failover across
providers before any output, Bedrock's exceptions classified (SPEC §5.6), usage and cost."""

import anthropic
import openai
import pytest

from catalog.models import CatalogEntry, Provenance
from catalog.services import catalog_sync
from devkit import bedrock
from devkit.bedrock import BedrockFake
from devkit.behaviours import fail_after_visible, refusal, serve
from pools.models import Adapter, Assignment, GatewaySettings
from proxy.ledger.models import Attempt, RequestRecord
from proxy.ledger.recorder import writer
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory
from tests.gateway_fixtures import GATEWAY_KEY
from tests.proxy.fixtures_e2e import wait_for

MODEL = "anthropic.claude-sonnet-4-5-v1:0"
TURN = [{"role": "user", "content": "hi"}]


@pytest.fixture
def bedrock_then_openai(transactional_db, fake_upstream_factory, monkeypatch):
    """Pool `main`: a Bedrock account in us-east-1 (tier 0), then an OpenAI-shaped account (tier 1)."""
    aws = BedrockFake(models=(MODEL,)).start()
    monkeypatch.setenv("GATEWAY_UPSTREAM_AWS", f"{aws.access_key}:{aws.secret_key}")
    GatewaySettings.objects.update_or_create(pk=1, defaults={"backoff_base_ms": 0})
    other = fake_upstream_factory("openai", models=(MODEL,))
    pool = PoolFactory(name="main")
    for tier, (name, adapter, base_url, env) in enumerate(
        (
            ("bedrock", Adapter.BEDROCK, aws.endpoint, "GATEWAY_UPSTREAM_AWS"),
            ("openai", Adapter.OPENAI, other.base_url, ""),
        )
    ):
        row = AssignmentFactory(
            pool=pool,
            name=name,
            adapter=adapter,
            base_url=base_url,
            tier=tier,
            api_key_env=env,
            region="us-east-1",
        )
        CatalogEntryFactory(
            assignment=row,
            model=MODEL,
            provenance=Provenance.CONFIGURED,
            input_per_mtok_micros=3_000_000,
            output_per_mtok_micros=15_000_000,
        )
    GatewayKeyFactory(name="e2e", raw_key=GATEWAY_KEY, pools=[pool])
    yield aws, other
    aws.stop()


def _openai(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, max_retries=0)


def _attempts() -> list[Attempt]:
    writer.flush()
    return list(Attempt.objects.order_by("request_id", "ordinal"))


def test_a_signed_converse_call_serves_a_chat_turn_and_is_charged(gateway, bedrock_then_openai):
    aws, other = bedrock_then_openai
    aws.script(MODEL, serve("from bedrock", input_tokens=1000, output_tokens=100))
    answer = _openai(gateway).chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": "brief"}, *TURN], max_tokens=50
    )
    assert answer.choices[0].message.content == "from bedrock"
    hit = aws.hits[-1]
    assert hit.path == f"/model/{MODEL}/converse"
    assert hit.headers["authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={aws.access_key}/")
    assert hit.body == {
        "messages": [{"role": "user", "content": [{"text": "hi"}]}],
        "system": [{"text": "brief"}],
        "inferenceConfig": {"maxTokens": 50},
    }
    assert other.hits == []
    (attempt,) = _attempts()
    assert (attempt.input_tokens, attempt.output_tokens, attempt.cost_micros) == (1000, 100, 3000 + 1500)


def test_a_streamed_turn_is_decoded_from_event_stream_frames(gateway, bedrock_then_openai):
    aws, _ = bedrock_then_openai
    chunks = list(_openai(gateway).chat.completions.create(model=MODEL, messages=TURN, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hello from bedrock"
    assert aws.hits[-1].path == f"/model/{MODEL}/converse-stream"
    assert wait_for(_attempts, what="the attempt")[0].output_tokens == 3


def _anthropic(gateway: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway, api_key=GATEWAY_KEY, max_retries=0)


def test_an_anthropic_client_on_an_anthropic_model_is_served_by_invoke_model_with_every_field(
    gateway, bedrock_then_openai
):
    aws, other = bedrock_then_openai
    aws.script(MODEL, serve("from claude on bedrock", input_tokens=1000, output_tokens=100))
    answer = _anthropic(gateway).messages.create(
        model=MODEL,
        max_tokens=2048,
        messages=TURN,
        extra_body={"top_k": 5, "thinking": {"type": "enabled", "budget_tokens": 1024}},
        extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"},
    )
    assert answer.content[0].text == "from claude on bedrock"
    hit = aws.hits[-1]
    assert hit.path == f"/model/{MODEL}/invoke" and other.hits == []
    assert hit.body == {
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 2048,
        "messages": TURN,
        "top_k": 5,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "anthropic_beta": ["interleaved-thinking-2025-05-14"],
    }
    (attempt,) = _attempts()
    assert (attempt.input_tokens, attempt.output_tokens) == (1000, 100)
    assert attempt.cost_micros == 3_000 + 1_500  # 1000 x 3 $/Mtok + 100 x 15 $/Mtok


def test_an_anthropic_stream_comes_from_the_invoke_stream_chunks(gateway, bedrock_then_openai):
    aws, _ = bedrock_then_openai
    with _anthropic(gateway).messages.stream(model=MODEL, max_tokens=20, messages=TURN) as stream:
        assert "".join(stream.text_stream) == "hello from bedrock"
        assert stream.get_final_message().usage.output_tokens == 3
    assert aws.hits[-1].path == f"/model/{MODEL}/invoke-with-response-stream"
    attempt = wait_for(lambda: next(iter(_attempts()), None), what="the attempt")
    assert attempt.output_tokens == 3


@pytest.mark.parametrize("stream", [False, True])
def test_an_invoke_rejection_another_account_can_fix_fails_over(gateway, bedrock_then_openai, stream):
    aws, _ = bedrock_then_openai
    aws.script(MODEL, bedrock.throttled())
    client = _anthropic(gateway)
    if stream:
        with client.messages.stream(model=MODEL, max_tokens=20, messages=TURN) as events:
            assert "".join(events.text_stream) == "hello from openai"
    else:
        assert client.messages.create(model=MODEL, max_tokens=20, messages=TURN).content[0].text == (
            "hello from openai"
        )
    first = wait_for(_attempts, what="the attempts")[0]
    assert (first.status, first.failure_class) == ("retryable_failed", "rate_limited")


def test_an_invoke_stream_exception_after_output_ends_it_never_retried(gateway, bedrock_then_openai):
    aws, other = bedrock_then_openai
    aws.script(MODEL, fail_after_visible())
    with (
        pytest.raises(anthropic.APIStatusError),
        _anthropic(gateway).messages.stream(model=MODEL, max_tokens=20, messages=TURN) as stream,
    ):
        list(stream.text_stream)
    assert other.hits == []


def test_an_anthropic_client_on_another_model_goes_through_converse(gateway, bedrock_then_openai):
    aws, _ = bedrock_then_openai
    llama = "meta.llama3-70b-instruct-v1:0"
    aws.models = (MODEL, llama)
    CatalogEntryFactory(
        assignment=Assignment.objects.get(name="bedrock"), model=llama, provenance=Provenance.CONFIGURED
    )
    answer = _anthropic(gateway).messages.create(model=llama, max_tokens=20, messages=TURN)
    assert answer.content[0].text == "hello from bedrock"
    assert aws.hits[-1].path == f"/model/{llama}/converse"


@pytest.mark.parametrize(
    ("rejection", "failure"),
    [
        (bedrock.throttled(), "rate_limited"),
        (bedrock.service_unavailable(), "unavailable"),
        (bedrock.access_denied(), "credential_rejected"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_a_bedrock_exception_another_account_can_fix_fails_over(
    gateway, bedrock_then_openai, rejection, failure, stream
):
    aws, _other = bedrock_then_openai
    aws.script(MODEL, rejection)
    response = _openai(gateway).chat.completions.with_raw_response.create(
        model=MODEL, messages=TURN, stream=stream
    )
    assert response.headers["x-gateway-attempts"] == "2"
    # A streamed answer's ledger hand-off may still be running when the SDK is done.
    first = wait_for(_attempts, what="the attempts")[0]
    assert (first.status, first.failure_class) == ("retryable_failed", failure)


def test_a_validation_exception_is_not_retried_on_the_same_model(gateway, bedrock_then_openai):
    aws, other = bedrock_then_openai
    aws.script(MODEL, bedrock.validation())
    with pytest.raises(openai.BadRequestError) as refused:
        _openai(gateway).chat.completions.create(model=MODEL, messages=TURN)
    assert refused.value.type == "ValidationException"
    assert other.hits == []  # only a candidate of another model could take it (SPEC §5.6)


def test_a_wrong_secret_is_a_credential_failure(gateway, bedrock_then_openai, monkeypatch):
    aws, _ = bedrock_then_openai
    monkeypatch.setenv("GATEWAY_UPSTREAM_AWS", f"{aws.access_key}:not-the-secret")
    assert _openai(gateway).chat.completions.create(model=MODEL, messages=TURN).choices[
        0
    ].message.content == ("hello from openai")
    assert _attempts()[0].failure_class == "credential_rejected"


def test_a_content_filtered_answer_is_a_terminal_refusal(gateway, bedrock_then_openai):
    aws, other = bedrock_then_openai
    aws.script(MODEL, refusal())
    answer = _openai(gateway).chat.completions.create(model=MODEL, messages=TURN)
    assert answer.choices[0].finish_reason == "content_filter"
    assert other.hits == []
    writer.flush()
    assert RequestRecord.objects.get().outcome == "terminal_refusal"


def test_an_exception_frame_after_output_is_relayed_never_retried(gateway, bedrock_then_openai):
    aws, other = bedrock_then_openai
    aws.script(MODEL, fail_after_visible())
    with pytest.raises(openai.APIError):
        list(_openai(gateway).chat.completions.create(model=MODEL, messages=TURN, stream=True))
    assert other.hits == []


def test_catalog_discovery_lists_the_foundation_models_converse_serves_signed(bedrock_then_openai):
    """ListFoundationModels, SigV4-signed (the fake checks it): on-demand text models only."""
    aws, _ = bedrock_then_openai
    aws.models = (MODEL, "meta.llama3-70b-instruct-v1:0")
    aws.listed = {
        "amazon.titan-embed-text-v2:0": {"outputModalities": ["EMBEDDING"]},
        "anthropic.claude-opus-4-1-v1:0": {"inferenceTypesSupported": ["INFERENCE_PROFILE"]},
    }
    Assignment.objects.filter(name="bedrock").update(discovery=True)
    assert catalog_sync(assignment="bedrock").results[0].ok
    assert aws.hits[0].path == "/foundation-models"
    assert "/us-east-1/bedrock/aws4_request" in aws.hits[0].headers["authorization"]
    found = dict(CatalogEntry.objects.filter(assignment__name="bedrock").values_list("model", "provenance"))
    assert found == {MODEL: "configured", "meta.llama3-70b-instruct-v1:0": "observed"}


PROFILE = "us.anthropic.claude-sonnet-4-5-v1:0"


def test_catalog_discovery_lists_inference_profiles_by_the_name_a_call_gives_them(bedrock_then_openai):
    """ListInferenceProfiles, signed, page after page, both types: a system profile by its id, an
    application profile by its ARN."""
    aws, _ = bedrock_then_openai
    aws.profiles = {PROFILE: (MODEL,), "eu.meta.llama3-70b-instruct-v1:0": ("meta.llama3-70b-instruct-v1:0",)}
    aws.application_profiles = {"team-a7x": (MODEL,)}
    Assignment.objects.filter(name="bedrock").update(discovery=True)
    assert catalog_sync(assignment="bedrock").results[0].ok
    listed = [(hit.path, hit.headers["authorization"][:16]) for hit in aws.hits]
    assert (
        listed
        == [("/foundation-models", "AWS4-HMAC-SHA256")] + [("/inference-profiles", "AWS4-HMAC-SHA256")] * 2
    )
    found = dict(CatalogEntry.objects.filter(assignment__name="bedrock").values_list("model", "provenance"))
    assert found == {
        MODEL: "configured",
        PROFILE: "observed",
        "eu.meta.llama3-70b-instruct-v1:0": "observed",
        aws.profile_arn("team-a7x"): "observed",
    }


def test_inference_profile_pages_are_followed_and_only_active_profiles_kept():
    from proxy.wire.providers.bedrock import PROVIDER

    summary = {"inferenceProfileId": PROFILE, "inferenceProfileArn": "arn:x", "type": "SYSTEM_DEFINED"}
    page = PROVIDER.model_page(
        {
            "inferenceProfileSummaries": [{**summary, "status": "ACTIVE"}, {**summary, "status": "DELETING"}],
            "nextToken": "n2",
        }
    )
    assert (page.ids, page.next_query) == ([PROFILE], {"nextToken": "n2"})
    with pytest.raises(ValueError):
        PROVIDER.model_page({"inferenceProfileSummaries": [{"status": "ACTIVE"}]})


@pytest.mark.parametrize("named", ["id", "system arn", "application arn"])
@pytest.mark.parametrize("client", ["chat", "messages"])
def test_an_inference_profile_is_a_model_on_converse_and_invoke_model(
    gateway, bedrock_then_openai, named, client
):
    """A cross-region profile's id or ARN, or an application profile's ARN, is sent as the model id
    (percent-encoded in the path, signed as sent); a Messages client on a Claude profile's id or ARN gets
    InvokeModel."""
    aws, other = bedrock_then_openai
    aws.profiles = {PROFILE: (MODEL,)}
    aws.application_profiles = {"team-a7x": (MODEL,)}
    model = {
        "id": PROFILE,
        "system arn": aws.profile_arn(PROFILE),
        "application arn": aws.profile_arn("team-a7x"),
    }
    model = model[named]
    row = Assignment.objects.get(name="bedrock")
    CatalogEntryFactory(assignment=row, model=model, provenance=Provenance.OBSERVED)
    if client == "chat":
        text = _openai(gateway).chat.completions.create(model=model, messages=TURN).choices[0].message.content
    else:
        answer = anthropic.Anthropic(base_url=gateway, api_key=GATEWAY_KEY, max_retries=0).messages.create(
            model=model, max_tokens=20, messages=TURN
        )
        text = answer.content[0].text
    assert text == "hello from bedrock"
    assert aws.hits[-1].model == model
    # An application profile's ARN does not say its model is Claude's: Converse serves it whatever it is.
    operation = "invoke" if client == "messages" and named != "application arn" else "converse"
    assert aws.hits[-1].path == f"/model/{model}/{operation}"
    assert other.hits == []


@pytest.mark.parametrize("named", ["id", "system arn", "application arn"])
@pytest.mark.parametrize("client", ["chat", "messages"])
def test_an_inference_profile_streams_on_converse_stream_and_invoke_stream(
    gateway, bedrock_then_openai, named, client
):
    """Streamed, a profile is named in the stream operation's URL as in the plain one's, and the client gets
    the whole answer decoded from the event-stream frames."""
    aws, other = bedrock_then_openai
    aws.profiles = {PROFILE: (MODEL,)}
    aws.application_profiles = {"team-a7x": (MODEL,)}
    model = {
        "id": PROFILE,
        "system arn": aws.profile_arn(PROFILE),
        "application arn": aws.profile_arn("team-a7x"),
    }
    model = model[named]
    CatalogEntryFactory(
        assignment=Assignment.objects.get(name="bedrock"), model=model, provenance=Provenance.OBSERVED
    )
    if client == "chat":
        chunks = _openai(gateway).chat.completions.create(model=model, messages=TURN, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        with _anthropic(gateway).messages.stream(model=model, max_tokens=20, messages=TURN) as stream:
            text = "".join(stream.text_stream)
    assert text == "hello from bedrock"
    operation = (
        "invoke-with-response-stream"
        if client == "messages" and named != "application arn"
        else "converse-stream"
    )
    assert aws.hits[-1].path == f"/model/{model}/{operation}"
    assert aws.hits[-1].model == model
    assert other.hits == []


def test_a_discovery_refused_for_its_signature_keeps_what_was_discovered(bedrock_then_openai, monkeypatch):
    aws, _ = bedrock_then_openai
    aws.models = (MODEL, "meta.llama3-70b-instruct-v1:0")
    Assignment.objects.filter(name="bedrock").update(discovery=True)
    assert catalog_sync(assignment="bedrock").results[0].ok
    monkeypatch.setenv("GATEWAY_UPSTREAM_AWS", f"{aws.access_key}:not-the-secret")
    (failed,) = catalog_sync(assignment="bedrock").results
    assert (failed.ok, failed.reason, failed.preserved) == (False, "HTTP 403", 1)
    found = dict(CatalogEntry.objects.filter(assignment__name="bedrock").values_list("model", "provenance"))
    assert found == {MODEL: "configured", "meta.llama3-70b-instruct-v1:0": "preserved"}


@pytest.mark.parametrize(("field", "value"), [("temperature", 1.5), ("top_p", 1.2), ("temperature", -0.1)])
def test_a_parameter_outside_converse_ranges_goes_to_an_account_that_takes_it(
    gateway, bedrock_then_openai, field, value
):
    aws, _ = bedrock_then_openai
    answer = _openai(gateway).chat.completions.create(model=MODEL, messages=TURN, **{field: value})
    assert answer.choices[0].message.content == "hello from openai"
    assert aws.hits == []  # refused before dispatch, never taken for "the model is not here"
    first = _attempts()[0]
    assert (first.status, first.ineligible_reason) == ("ineligible", "capability")


def test_a_parameter_no_account_can_take_is_a_typed_400_naming_it(gateway, bedrock_then_openai):
    aws, _ = bedrock_then_openai
    Assignment.objects.filter(name="openai").delete()
    with pytest.raises(openai.BadRequestError) as refused:
        _openai(gateway).chat.completions.create(model=MODEL, messages=TURN, temperature=1.5)
    assert refused.value.body["param"] == "temperature"
    assert aws.hits == []
    # Within the range, the same request is served: the refusal was the range, not the field.
    served = _openai(gateway).chat.completions.create(model=MODEL, messages=TURN, temperature=1)
    assert aws.hits[-1].body["inferenceConfig"]["temperature"] == 1
    assert served.choices[0].message.content
