"""The provider fakes speak the real wire formats: each provider's official client library, pointed at its
fake, reads what the fake answers (plain, streamed, rejected) as it reads the real service."""

import json

import anthropic
import boto3
import botocore.exceptions
import openai
import pytest
from botocore.config import Config
from google import genai
from google.auth import exceptions as google_auth_errors
from google.auth.transport.requests import Request as GoogleRequest
from google.genai import errors as genai_errors
from google.oauth2 import service_account

from devkit import bedrock, gemini
from devkit.azure import AzureFake, prompt_filtered
from devkit.bedrock import BedrockFake
from devkit.behaviours import fail_after_visible, refusal
from devkit.gemini import GeminiFake
from devkit.upstream import FakeUpstream
from devkit.vertex import ANTHROPIC_VERSION, VertexFake

API_VERSION = "2024-10-21"


@pytest.fixture
def azure():
    with AzureFake("azure", ("gpt-4o",), require_key="azure-key-000") as fake:
        yield fake


@pytest.fixture
def aws():
    with BedrockFake() as fake:
        yield fake


@pytest.fixture
def google():
    with GeminiFake(require_key="gemini-key-000") as fake:
        yield fake


def _azure_client(fake: AzureFake, key: str = "azure-key-000") -> openai.AzureOpenAI:
    return openai.AzureOpenAI(
        azure_endpoint=fake.endpoint, api_key=key, api_version=API_VERSION, max_retries=0
    )


def _bedrock_client(fake: BedrockFake, secret: str | None = None):
    return boto3.client(
        "bedrock-runtime",
        region_name=fake.region,
        endpoint_url=fake.endpoint,
        aws_access_key_id=fake.access_key,
        aws_secret_access_key=secret or fake.secret_key,
        config=Config(retries={"max_attempts": 1}),
    )


def _bedrock_control(fake: BedrockFake):
    """boto3's `bedrock` client (the control plane: ListFoundationModels)."""
    return boto3.client(
        "bedrock",
        region_name=fake.region,
        endpoint_url=fake.endpoint,
        aws_access_key_id=fake.access_key,
        aws_secret_access_key=fake.secret_key,
    )


def _gemini_models(fake: GeminiFake, key: str = "gemini-key-000"):
    # The Client closes its HTTP client when collected: it must outlive the call.
    _clients.append(genai.Client(api_key=key, http_options={"base_url": fake.endpoint}))
    return _clients[-1].models


_clients: list[genai.Client] = []


# -- Azure OpenAI ---------------------------------------------------------------------------------------


def test_azure_sdk_reads_a_deployment_answer_sent_with_api_key_and_api_version(azure):
    answer = _azure_client(azure).chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
    )
    assert answer.choices[0].message.content == "hello from azure"
    hit = azure.hits[-1]
    assert hit.path == "/openai/deployments/gpt-4o/chat/completions"
    assert hit.headers["api-key"] == "azure-key-000"


def test_azure_sdk_sends_an_entra_token_as_a_bearer_instead_of_the_key():
    with AzureFake("azure", ("gpt-4o",), require_key="entra-token-000") as fake:
        client = openai.AzureOpenAI(
            azure_endpoint=fake.endpoint,
            azure_ad_token="entra-token-000",
            api_version=API_VERSION,
            max_retries=0,
        )
        answer = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        assert answer.choices[0].message.content == "hello from azure"
        assert fake.hits[-1].headers["authorization"] == "Bearer entra-token-000"
        assert "api-key" not in fake.hits[-1].headers


def test_azure_sdk_streams_a_deployment_answer(azure):
    stream = _azure_client(azure).chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "hello from azure"


def test_azure_sdk_reads_embeddings_in_base64(azure):
    answer = _azure_client(azure).embeddings.create(model="gpt-4o", input=["a", "b"])
    assert [len(d.embedding) for d in answer.data] == [8, 8]
    assert azure.hits[-1].body["encoding_format"] == "base64"  # the SDK asks for base64 and decodes it


def test_azure_sdk_sees_a_wrong_key_unknown_deployment_and_content_filter(azure):
    with pytest.raises(openai.AuthenticationError):
        _azure_client(azure, key="wrong").chat.completions.create(model="gpt-4o", messages=[])
    with pytest.raises(openai.NotFoundError) as missing:
        _azure_client(azure).chat.completions.create(model="gpt-5", messages=[])
    assert missing.value.code == "DeploymentNotFound"
    azure.script("gpt-4o", prompt_filtered())
    with pytest.raises(openai.BadRequestError) as filtered:
        _azure_client(azure).chat.completions.create(model="gpt-4o", messages=[])
    assert filtered.value.code == "content_filter"
    azure.script("gpt-4o", refusal())
    answer = _azure_client(azure).chat.completions.create(model="gpt-4o", messages=[])
    assert answer.choices[0].finish_reason == "content_filter"


def test_azure_v1_surface_takes_the_model_in_the_body(azure):
    client = openai.OpenAI(base_url=azure.base_url, api_key="azure-key-000", max_retries=0)
    assert client.responses.create(model="gpt-4o", input="hi").output_text == "hello from azure"
    assert [m.id for m in client.models.list()] == ["gpt-4o"]


def test_azure_sdk_sees_what_each_api_version_takes_as_azure_answers_it(azure):
    """2024-10-21 answers a later field and the later `developer` role with Azure's 400s; a later version
    takes them."""
    turn = [{"role": "user", "content": "hi"}]
    ga = openai.AzureOpenAI(
        azure_endpoint=azure.endpoint, api_key="azure-key-000", api_version=API_VERSION, max_retries=0
    )
    with pytest.raises(openai.BadRequestError) as field:
        ga.chat.completions.create(model="gpt-4o", messages=turn, store=True)
    assert field.value.message.endswith("Unrecognized request argument supplied: store")
    developer = [{"role": "developer", "content": "brief"}, *turn]
    with pytest.raises(openai.BadRequestError) as role:
        ga.chat.completions.create(model="gpt-4o", messages=developer)
    assert (role.value.code, role.value.param) == ("invalid_value", "messages[0].role")
    assert ga.chat.completions.create(model="gpt-4o", messages=turn, max_completion_tokens=5).choices
    later = openai.AzureOpenAI(
        azure_endpoint=azure.endpoint,
        api_key="azure-key-000",
        api_version="2025-04-01-preview",
        max_retries=0,
    )
    assert later.chat.completions.create(model="gpt-4o", messages=developer, store=True).choices


def test_openai_sdk_reads_a_responses_tool_step_plain_and_streamed(fake_upstream: FakeUpstream):
    """With `tool_steps`, a Responses answer is parallel `function_call` items (streamed: each item, then its
    arguments in pieces), then the text after the tool results."""
    fake_upstream.tool_steps = 1
    client = openai.OpenAI(base_url=fake_upstream.base_url, api_key="k", max_retries=0)
    tools = [{"type": "function", "name": name, "parameters": {"type": "object"}} for name in ("a", "b")]
    answer = client.responses.create(model="gpt-5", input="go", tools=tools)
    with client.responses.stream(model="gpt-5", input="go", tools=tools) as events:
        streamed = events.get_final_response()
    for response in (answer, streamed):
        calls = [item for item in response.output if item.type == "function_call"]
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [("a", {"step": 1}), ("b", {"step": 1})]
    items = [
        {"role": "user", "content": "go"},
        *[
            {"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments}
            for c in calls
        ],
        *[{"type": "function_call_output", "call_id": c.call_id, "output": "42"} for c in calls],
    ]
    assert client.responses.create(model="gpt-5", input=items, tools=tools).output_text == "done: 42"


def test_azure_deployment_url_without_api_version_is_not_found(azure):
    client = openai.OpenAI(
        base_url=f"{azure.endpoint}/openai/deployments/gpt-4o", api_key="azure-key-000", max_retries=0
    )
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=[])


# -- Amazon Bedrock -------------------------------------------------------------------------------------

CLAUDE = "anthropic.claude-sonnet-4-5-v1:0"
TURN = [{"role": "user", "content": [{"text": "hi"}]}]


def test_boto3_reads_a_converse_answer_signed_with_sigv4(aws):
    answer = _bedrock_client(aws).converse(modelId=CLAUDE, messages=TURN)
    assert answer["output"]["message"]["content"] == [{"text": "hello from bedrock"}]
    assert answer["usage"] == {"inputTokens": 10, "outputTokens": 3, "totalTokens": 13}
    assert aws.hits[-1].headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKID")


def test_boto3_decodes_the_converse_stream_event_frames(aws):
    events = list(_bedrock_client(aws).converse_stream(modelId=CLAUDE, messages=TURN)["stream"])
    names = [next(iter(e)) for e in events]
    assert names == [
        "messageStart",
        *["contentBlockDelta"] * 3,
        "contentBlockStop",
        "messageStop",
        "metadata",
    ]
    text = "".join(e["contentBlockDelta"]["delta"]["text"] for e in events if "contentBlockDelta" in e)
    assert text == "hello from bedrock"
    assert events[-1]["metadata"]["usage"]["outputTokens"] == 3


def test_boto3_sees_an_exception_frame_inside_a_200_stream(aws):
    aws.script(CLAUDE, fail_after_visible())
    stream = _bedrock_client(aws).converse_stream(modelId=CLAUDE, messages=TURN)["stream"]
    with pytest.raises(botocore.exceptions.EventStreamError) as failed:
        list(stream)
    assert failed.value.response["Error"]["Code"] == "modelStreamErrorException"


@pytest.mark.parametrize(
    ("behaviour", "code", "status"),
    [
        (bedrock.throttled(), "ThrottlingException", 429),
        (bedrock.access_denied(), "AccessDeniedException", 403),
        (bedrock.service_unavailable(), "ServiceUnavailableException", 503),
        (bedrock.validation(), "ValidationException", 400),
    ],
)
def test_boto3_reads_each_bedrock_exception_by_name(aws, behaviour, code, status):
    aws.script(CLAUDE, behaviour)
    with pytest.raises(botocore.exceptions.ClientError) as failed:
        _bedrock_client(aws).converse(modelId=CLAUDE, messages=TURN)
    assert failed.value.response["Error"]["Code"] == code
    assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == status


def test_bedrock_fake_refuses_a_bad_signature_and_names_an_unknown_model_a_validation_error(aws):
    with pytest.raises(botocore.exceptions.ClientError) as unsigned:
        _bedrock_client(aws, secret="not-the-secret").converse(modelId=CLAUDE, messages=TURN)
    assert unsigned.value.response["Error"]["Code"] == "InvalidSignatureException"
    with pytest.raises(botocore.exceptions.ClientError) as unknown:
        _bedrock_client(aws).converse(modelId="meta.unknown-v1:0", messages=TURN)
    assert unknown.value.response["Error"]["Code"] == "ValidationException"


def test_boto3_lists_the_foundation_models(aws):
    client = _bedrock_control(aws)
    assert [m["modelId"] for m in client.list_foundation_models()["modelSummaries"]] == [CLAUDE]


ANTHROPIC_BODY = {
    "anthropic_version": "bedrock-2023-05-31",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "hi"}],
}


def test_boto3_invokes_an_anthropic_model_with_its_messages_body(aws):
    answer = _bedrock_client(aws).invoke_model(modelId=CLAUDE, body=json.dumps(ANTHROPIC_BODY))
    message = json.loads(answer["body"].read())
    assert (message["type"], message["content"], message["stop_reason"]) == (
        "message",
        [{"type": "text", "text": "hello from bedrock"}],
        "end_turn",
    )
    assert message["usage"] == {"input_tokens": 10, "output_tokens": 3}
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        _bedrock_client(aws).invoke_model(
            modelId=CLAUDE, body=json.dumps({**ANTHROPIC_BODY, "model": CLAUDE})
        )
    assert refused.value.response["Error"]["Code"] == "ValidationException"


def test_boto3_decodes_the_messages_events_inside_the_invoke_stream_chunks(aws):
    stream = _bedrock_client(aws).invoke_model_with_response_stream(
        modelId=CLAUDE, body=json.dumps(ANTHROPIC_BODY)
    )["body"]
    events = [json.loads(frame["chunk"]["bytes"]) for frame in stream]
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 3,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta") == (
        "hello from bedrock"
    )
    assert events[-1]["amazon-bedrock-invocationMetrics"]["outputTokenCount"] == 3
    aws.script(CLAUDE, fail_after_visible())
    broken = _bedrock_client(aws).invoke_model_with_response_stream(
        modelId=CLAUDE, body=json.dumps(ANTHROPIC_BODY)
    )
    with pytest.raises(botocore.exceptions.EventStreamError) as failed:
        list(broken["body"])
    assert failed.value.response["Error"]["Code"] == "modelStreamErrorException"


def test_bedrock_refusal_is_a_content_filtered_stop(aws):
    aws.script(CLAUDE, refusal())
    assert _bedrock_client(aws).converse(modelId=CLAUDE, messages=TURN)["stopReason"] == "content_filtered"


# -- Google Gemini --------------------------------------------------------------------------------------


def test_genai_reads_a_generate_content_answer_sent_with_the_api_key(google):
    answer = _gemini_models(google).generate_content(model="gemini-2.5-flash", contents="hi")
    assert answer.text == "hello from gemini"
    assert answer.usage_metadata.candidates_token_count == 3
    assert google.hits[-1].headers["x-goog-api-key"] == "gemini-key-000"
    assert google.hits[-1].path == "/v1/models/gemini-2.5-flash:generateContent"


def test_genai_reads_a_streamed_answer_over_sse(google):
    chunks = list(_gemini_models(google).generate_content_stream(model="gemini-2.5-flash", contents="hi"))
    assert "".join(c.text for c in chunks) == "hello from gemini"
    assert chunks[-1].candidates[0].finish_reason == "STOP"
    assert chunks[-1].usage_metadata.total_token_count == 13


def test_genai_sees_safety_blocks(google):
    google.script("gemini-2.5-flash", refusal())
    answer = _gemini_models(google).generate_content(model="gemini-2.5-flash", contents="hi")
    assert answer.candidates[0].finish_reason == "SAFETY"
    google.script("gemini-2.5-flash", gemini.prompt_blocked())
    blocked = _gemini_models(google).generate_content(model="gemini-2.5-flash", contents="hi")
    assert blocked.prompt_feedback.block_reason == "SAFETY"


def test_genai_reads_google_errors(google):
    google.script("gemini-2.5-flash", gemini.resource_exhausted())
    with pytest.raises(genai_errors.ClientError) as exhausted:
        _gemini_models(google).generate_content(model="gemini-2.5-flash", contents="hi")
    assert (exhausted.value.code, exhausted.value.status) == (429, "RESOURCE_EXHAUSTED")
    with pytest.raises(genai_errors.ClientError) as missing:
        _gemini_models(google).generate_content(model="gemini-9", contents="hi")
    assert (missing.value.code, missing.value.status) == (404, "NOT_FOUND")
    with pytest.raises(genai_errors.ClientError) as bad_key:
        _gemini_models(google, key="wrong").generate_content(model="gemini-2.5-flash", contents="hi")
    assert (bad_key.value.code, bad_key.value.status) == (400, "INVALID_ARGUMENT")


def test_genai_lists_the_models(google):
    assert [m.name for m in _gemini_models(google).list()] == ["models/gemini-2.5-flash"]


# -- OpenAI embeddings (the gateway's /v1/embeddings upstream) -------------------------------------------


def test_openai_sdk_reads_embeddings_as_floats_and_base64(fake_upstream: FakeUpstream):
    client = openai.OpenAI(base_url=fake_upstream.base_url, api_key="k", max_retries=0)
    floats = client.embeddings.create(model="gpt-5", input="a", encoding_format="float").data[0].embedding
    packed = client.embeddings.create(model="gpt-5", input="a").data[0].embedding
    assert len(floats) == 8
    assert packed == pytest.approx(floats)
    assert fake_upstream.hits[-1].body["encoding_format"] == "base64"


# -- Model listings (catalog discovery) -----------------------------------------------------------------


def test_azure_sdk_lists_the_deployments_with_the_listing_api_version(azure):
    azure.pending = ("gpt-4.1",)
    listing = openai.AzureOpenAI(
        azure_endpoint=azure.endpoint,
        api_key="azure-key-000",
        api_version="2023-03-15-preview",
        max_retries=0,
    ).get("/deployments", cast_to=object)
    assert [(d["id"], d["status"]) for d in listing["data"]] == [
        ("gpt-4o", "succeeded"),
        ("gpt-4.1", "creating"),
    ]
    assert (
        azure.hits[-1].path == "/openai/deployments" and azure.hits[-1].headers["api-key"] == "azure-key-000"
    )
    with pytest.raises(openai.NotFoundError):  # later versions dropped the data plane's listing
        _azure_client(azure).get("/deployments", cast_to=object)


def test_boto3_reads_the_summary_fields_of_every_listed_model(aws):
    aws.listed = {"amazon.titan-embed-text-v2:0": {"outputModalities": ["EMBEDDING"]}}
    client = _bedrock_control(aws)
    summaries = client.list_foundation_models()["modelSummaries"]
    assert [(m["modelId"], m["outputModalities"]) for m in summaries] == [
        (CLAUDE, ["TEXT"]),
        ("amazon.titan-embed-text-v2:0", ["EMBEDDING"]),
    ]


def test_genai_pages_through_the_models_and_reads_their_methods(google):
    google.models = ("gemini-2.5-flash", "gemini-2.5-pro", "gemini-2.0-flash")
    google.embedders = ("text-embedding-004",)
    listed = list(_gemini_models(google).list(config={"page_size": 3}))
    assert [(m.name, m.supported_actions) for m in listed] == [
        ("models/gemini-2.5-flash", ["generateContent", "countTokens"]),
        ("models/gemini-2.5-pro", ["generateContent", "countTokens"]),
        ("models/gemini-2.0-flash", ["generateContent", "countTokens"]),
        ("models/text-embedding-004", ["embedContent"]),
    ]
    assert len(google.hits) == 2  # the second page asked with the first one's token


def test_boto3_pages_through_the_inference_profiles_of_each_type(aws):
    aws.profiles = {"us." + CLAUDE: (CLAUDE,), "eu." + CLAUDE: (CLAUDE,)}
    aws.application_profiles = {"team-a7x": (CLAUDE,)}
    pages = list(
        _bedrock_control(aws)
        .get_paginator("list_inference_profiles")
        .paginate(PaginationConfig={"PageSize": 1})
    )
    assert [p["inferenceProfileSummaries"][0]["inferenceProfileId"] for p in pages] == [
        "us." + CLAUDE,
        "eu." + CLAUDE,
    ]
    (own,) = _bedrock_control(aws).list_inference_profiles(typeEquals="APPLICATION")[
        "inferenceProfileSummaries"
    ]
    assert (
        own["inferenceProfileArn"]
        == f"arn:aws:bedrock:us-east-1:{aws.account}:application-inference-profile/team-a7x"
    )
    assert own["models"] == [{"modelArn": f"arn:aws:bedrock:us-east-1::foundation-model/{CLAUDE}"}]


def test_boto3_calls_a_profile_by_its_id_or_arn_and_an_application_profile_by_its_arn_only(aws):
    aws.profiles = {"us." + CLAUDE: (CLAUDE,)}
    aws.application_profiles = {"team-a7x": (CLAUDE,)}
    for model in ("us." + CLAUDE, aws.profile_arn("us." + CLAUDE), aws.profile_arn("team-a7x")):
        answer = _bedrock_client(aws).converse(modelId=model, messages=TURN)
        assert answer["output"]["message"]["content"] == [{"text": "hello from bedrock"}]
        assert aws.hits[-1].model == model  # botocore percent-encodes the ARN's `:` and `/`
    with pytest.raises(botocore.exceptions.ClientError) as bare:
        _bedrock_client(aws).converse(modelId="team-a7x", messages=TURN)
    assert bare.value.response["Error"]["Code"] == "ValidationException"


# -- Google Vertex AI -----------------------------------------------------------------------------------

GEMINI, CLAUDE_ON_VERTEX = "gemini-2.5-flash", "claude-sonnet-4@20250514"


@pytest.fixture
def vertex_ai():
    with VertexFake() as fake:
        yield fake


def _service_account(fake: VertexFake) -> service_account.Credentials:
    """google-auth's own credentials of the fake's key file (its token_uri is the fake's)."""
    info = json.loads(fake.key_file())
    return service_account.Credentials.from_service_account_info(
        info, scopes=["https://www.googleapis.com/auth/cloud-platform"]
    )


def _anthropic_vertex(fake: VertexFake) -> anthropic.AnthropicVertex:
    return anthropic.AnthropicVertex(
        region=fake.location,
        project_id=fake.project,
        credentials=_service_account(fake),
        base_url=f"{fake.endpoint}/v1",
        max_retries=0,
    )


def _genai_vertex(fake: VertexFake):
    _clients.append(
        genai.Client(
            vertexai=True,
            project=fake.project,
            location=fake.location,
            credentials=_service_account(fake),
            http_options={"base_url": fake.endpoint},
        )
    )
    return _clients[-1].models


# The body's version Anthropic's Vertex guide requires and anthropic-sdk-python's AnthropicVertex sends; the
# build installed here sends its own API version date instead, so it is given explicitly (the SDK keeps it).
VERSIONED = {"extra_body": {"anthropic_version": ANTHROPIC_VERSION}}


def test_google_auth_exchanges_the_key_file_for_a_token_the_fake_accepts(vertex_ai):
    credentials = _service_account(vertex_ai)
    credentials.refresh(GoogleRequest())
    assert credentials.valid and credentials.token.startswith("ya29.")
    assert vertex_ai.exchanges == 1
    vertex_ai.revoke_key()
    with pytest.raises(google_auth_errors.RefreshError) as refused:
        _service_account(vertex_ai).refresh(GoogleRequest())
    assert "invalid_grant" in str(refused.value)


def test_anthropic_vertex_reads_raw_predict_answers_and_streams(vertex_ai):
    client = _anthropic_vertex(vertex_ai)
    answer = client.messages.create(
        model=CLAUDE_ON_VERTEX, max_tokens=20, messages=[{"role": "user", "content": "hi"}], **VERSIONED
    )
    assert answer.content[0].text == "hello from vertex"
    hit = vertex_ai.hits[-1]
    where = f"/v1/projects/{vertex_ai.project}/locations/us-east5/publishers/anthropic/models"
    assert hit.path == f"{where}/{CLAUDE_ON_VERTEX}:rawPredict"
    assert "model" not in hit.body and hit.headers["authorization"].startswith("Bearer ya29.")
    with client.messages.stream(
        model=CLAUDE_ON_VERTEX, max_tokens=20, messages=[{"role": "user", "content": "hi"}], **VERSIONED
    ) as s:
        assert "".join(s.text_stream) == "hello from vertex"
    assert vertex_ai.hits[-1].path.endswith(":streamRawPredict")
    assert vertex_ai.exchanges == 1  # the SDK keeps its token too


def test_anthropic_vertex_reads_vertex_s_and_claude_s_errors(vertex_ai):
    client = _anthropic_vertex(vertex_ai)
    turn = {
        "model": CLAUDE_ON_VERTEX,
        "max_tokens": 20,
        "messages": [{"role": "user", "content": "hi"}],
        **VERSIONED,
    }
    vertex_ai.script(CLAUDE_ON_VERTEX, gemini.resource_exhausted())
    with pytest.raises(anthropic.RateLimitError):
        client.messages.create(**turn)
    vertex_ai.script(CLAUDE_ON_VERTEX, refusal())
    assert client.messages.create(**turn).stop_reason == "refusal"
    with pytest.raises(anthropic.BadRequestError) as unversioned:
        client.messages.create(**{**turn, "extra_body": {"anthropic_version": "2023-06-01"}})
    assert unversioned.value.body["error"]["type"] == "invalid_request_error"
    vertex_ai.revoke_tokens()
    with pytest.raises(anthropic.AuthenticationError):
        client.messages.create(**turn)


def test_genai_on_vertex_reads_generate_content_and_streams_with_the_token(vertex_ai):
    models = _genai_vertex(vertex_ai)
    assert models.generate_content(model=GEMINI, contents="hi").text == "hello from vertex"
    hit = vertex_ai.hits[-1]
    where = f"/v1beta1/projects/{vertex_ai.project}/locations/us-east5/publishers/google/models"
    assert hit.path == f"{where}/{GEMINI}:generateContent"
    assert hit.headers["authorization"].startswith("Bearer ya29.")
    assert (
        "".join(c.text for c in models.generate_content_stream(model=GEMINI, contents="hi"))
        == "hello from vertex"
    )


def test_genai_on_vertex_reads_google_s_errors(vertex_ai):
    models = _genai_vertex(vertex_ai)
    with pytest.raises(genai_errors.ClientError) as missing:
        models.generate_content(model="gemini-9", contents="hi")
    assert (missing.value.code, missing.value.status) == (404, "NOT_FOUND")
    vertex_ai.revoke_tokens()
    with pytest.raises(genai_errors.ClientError) as revoked:
        models.generate_content(model=GEMINI, contents="hi")
    assert (revoked.value.code, revoked.value.status) == (401, "UNAUTHENTICATED")


def test_genai_on_vertex_lists_model_garden_s_base_models_page_by_page(vertex_ai):
    vertex_ai.garden = ("imagen-4.0-generate-001",)
    listed = list(_genai_vertex(vertex_ai).list(config={"page_size": 1}))
    assert [m.name for m in listed] == [
        "publishers/google/models/gemini-2.5-flash",
        "publishers/google/models/imagen-4.0-generate-001",
    ]
    assert [hit.path for hit in vertex_ai.hits if hit.path != "/token"] == [
        "/v1beta1/publishers/google/models"
    ] * 2
