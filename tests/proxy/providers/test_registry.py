"""proxy/wire/providers/registry.py: one provider per Adapter value, the carrier table derived from their
declarations, the upstream call and credential headers looked up by adapter."""

import httpx
import pytest

from catalog.services import discover_models
from pools.models import Adapter, Assignment
from proxy.wire.apis.registry import RELAYED
from proxy.wire.providers.registry import PROVIDERS, carriers, provider, upstream_call
from routing.policy.route import Target
from routing.policy.types import Requirements

ENV = "GATEWAY_UPSTREAM_TEST_REGISTRY"
EVERY_PROVIDER = {
    "openai", "openrouter", "anthropic", "azure_openai", "openai_compatible", "gemini", "bedrock", "vertex"
}  # fmt: skip


def test_every_adapter_has_exactly_one_provider_under_its_name():
    assert set(PROVIDERS) == set(Adapter.values)
    assert all(name == p.name for name, p in PROVIDERS.items())


@pytest.mark.parametrize(
    ("route", "adapters"),
    [
        (
            "/chat/completions",
            EVERY_PROVIDER,
        ),
        (
            "/messages",
            EVERY_PROVIDER,
        ),
        # Native on OpenAI-shaped accounts, translated through Chat on every other (issue 18 point 2).
        (
            "/responses",
            EVERY_PROVIDER,
        ),
        # No Anthropic or Chat form; compatible servers are declared without it.
        ("/responses/compact", {"openai", "openrouter", "azure_openai"}),
        ("/messages/count_tokens", {"anthropic"}),  # no OpenAI form
        # Anthropic has no embeddings API.
        ("/embeddings", {"openai", "openrouter", "azure_openai", "openai_compatible"}),
        ("/files", {"openai"}),  # the Files API exists on OpenAI itself only
    ],
)
def test_carriers_are_derived_from_what_each_provider_declares(route, adapters):
    assert carriers(route) == adapters


def test_every_client_route_has_a_carrier():
    assert all(carriers(route.tail) for route in RELAYED)


@pytest.mark.parametrize(
    ("adapter", "path"),
    [("anthropic", "/responses/compact"), ("openai", "/messages/count_tokens"), ("openrouter", "/files/f-1")],
)
def test_a_route_the_provider_cannot_carry_is_a_caller_bug(adapter, path):
    with pytest.raises(ValueError):
        upstream_call(
            path,
            Target(1, "a", 1, adapter, "http://x/v1", ""),
            {},
            model="m",
            requirements=Requirements(),
            credential="",
            created=0,
        )


@pytest.mark.parametrize(
    ("adapter", "expected"),
    [
        ("openai", {"authorization": "Bearer sk-x"}),
        ("openrouter", {"authorization": "Bearer sk-x"}),
        ("anthropic", {"x-api-key": "sk-x", "anthropic-version": "2023-06-01"}),
    ],
)
def test_each_provider_carries_the_credential_in_its_own_headers(adapter, expected):
    assert provider(adapter).auth_headers("sk-x") == expected
    sent = upstream_call(
        "/chat/completions",
        Target(1, "a", 1, adapter, "http://x/v1", ""),
        {"messages": [{"role": "user", "content": "hi"}]},
        model="m",
        requirements=Requirements(),
        credential="sk-x",
        created=0,
    )
    assert expected.items() <= sent.headers.items()


def test_discovery_follows_the_providers_own_paging(monkeypatch):
    """Anthropic pages its listing (`has_more`/`last_id`, asked again as `after_id`)."""
    monkeypatch.setenv(ENV, "sk-ant")
    asked = []

    def listing(request: httpx.Request) -> httpx.Response:
        asked.append((request.url.path, dict(request.url.params), request.headers.get("x-api-key")))
        if "after_id" not in request.url.params:
            return httpx.Response(
                200, json={"data": [{"id": "a"}, {"id": "b"}], "has_more": True, "last_id": "b"}
            )
        return httpx.Response(200, json={"data": [{"id": "c"}], "has_more": False, "last_id": "c"})

    assignment = Assignment(name="acct", adapter="anthropic", base_url="http://up.test/v1/", api_key_env=ENV)
    with httpx.Client(transport=httpx.MockTransport(listing)) as client:
        assert discover_models(assignment, client) == {"a", "b", "c"}
    assert asked == [("/v1/models", {}, "sk-ant"), ("/v1/models", {"after_id": "b"}, "sk-ant")]
