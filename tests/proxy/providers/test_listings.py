"""Where each account's model listing is asked and what of it is kept (catalog discovery, SPEC §8): pure."""

import pytest

from proxy.wire.providers.azure_openai import PROVIDER as AZURE
from proxy.wire.providers.base import SignedListing
from proxy.wire.providers.bedrock import PROVIDER as BEDROCK
from proxy.wire.providers.gemini import PROVIDER as GEMINI
from proxy.wire.providers.registry import PROVIDERS


@pytest.mark.parametrize(
    ("base_url", "listing"),
    [
        (
            "https://bedrock-runtime.eu-west-3.amazonaws.com",
            "https://bedrock.eu-west-3.amazonaws.com/foundation-models",
        ),
        (
            "https://bedrock-runtime-fips.us-east-1.amazonaws.com/",
            "https://bedrock-fips.us-east-1.amazonaws.com/foundation-models",
        ),
        ("http://127.0.0.1:9000", "http://127.0.0.1:9000/foundation-models"),  # a double serves both
        (
            "https://proxy.example/bedrock-runtime.x",
            "https://proxy.example/bedrock-runtime.x/foundation-models",
        ),
    ],
)
def test_bedrock_lists_on_the_control_plane_twin_of_its_runtime_host(base_url, listing):
    assert BEDROCK.models_url(base_url) == listing


def test_bedrock_keeps_the_on_demand_text_models_only():
    def summary(model: str, **fields: list[str]) -> dict:
        return {
            "modelId": model,
            "outputModalities": ["TEXT"],
            "inferenceTypesSupported": ["ON_DEMAND"],
            **fields,
        }

    page = BEDROCK.model_page(
        {
            "modelSummaries": [
                summary("anthropic.claude-3-haiku-20240307-v1:0"),
                summary("amazon.titan-embed-text-v2:0", outputModalities=["EMBEDDING"]),
                summary("stability.sd3-large-v1:0", outputModalities=["IMAGE"]),
                summary("anthropic.claude-opus-4-1-v1:0", inferenceTypesSupported=["INFERENCE_PROFILE"]),
                summary(
                    "meta.llama3-70b-instruct-v1:0", inferenceTypesSupported=["ON_DEMAND", "PROVISIONED"]
                ),
                {"modelId": "cohere.command-r-v1:0"},  # no modalities named: not shown servable
            ]
        }
    )
    assert page.ids == ["anthropic.claude-3-haiku-20240307-v1:0", "meta.llama3-70b-instruct-v1:0"]
    assert page.next_query is None
    with pytest.raises(ValueError):
        BEDROCK.model_page({"modelSummaries": [{"modelName": "no id"}]})


def test_only_bedrock_signs_its_listing_and_for_the_region_its_host_names():
    assert [name for name, p in PROVIDERS.items() if isinstance(p, SignedListing)] == ["bedrock"]
    signature = BEDROCK.signature(
        "https://bedrock-runtime.eu-west-3.amazonaws.com", "us-east-1", "AKID:secret:tok"
    )
    assert (signature.service, signature.region, signature.access_key_id) == ("bedrock", "eu-west-3", "AKID")
    assert (signature.secret_access_key, signature.session_token) == ("secret", "tok")


def test_gemini_keeps_the_models_that_generate_content_and_names_the_next_page():
    page = GEMINI.model_page(
        {
            "models": [
                {"name": "models/gemini-2.5-flash", "supportedGenerationMethods": ["generateContent"]},
                {"name": "models/text-embedding-004", "supportedGenerationMethods": ["embedContent"]},
                {"name": "models/imagen-4.0-generate-001", "supportedGenerationMethods": ["predict"]},
                {"name": "models/gemini-exp"},  # methods not named: listed as the listing gives it
            ],
            "nextPageToken": "Cg2",
        }
    )
    assert (page.ids, page.next_query) == (["gemini-2.5-flash", "gemini-exp"], {"pageToken": "Cg2"})


@pytest.mark.parametrize(
    "base_url",
    [
        "https://res.openai.azure.com",
        "https://res.openai.azure.com/",
        "https://res.openai.azure.com/openai/v1",
        "https://res.openai.azure.com/openai/v1/",
    ],
)
def test_azure_lists_the_deployments_of_the_resource_on_either_surface(base_url):
    assert (
        AZURE.models_url(base_url)
        == "https://res.openai.azure.com/openai/deployments?api-version=2023-03-15-preview"
    )


def test_azure_keeps_the_deployments_that_serve():
    page = AZURE.model_page(
        {
            "data": [
                {"id": "chat", "model": "gpt-4o", "status": "succeeded"},
                {"id": "new", "model": "gpt-4.1", "status": "creating"},
                {"id": "broken", "model": "gpt-4.1", "status": "failed"},
                {"id": "plain", "model": "gpt-4o-mini"},
            ],
            "object": "list",
        }
    )
    assert (page.ids, page.next_query) == (["chat", "plain"], None)
    with pytest.raises(ValueError):
        AZURE.model_page({"value": []})  # the management plane's shape is not this listing
