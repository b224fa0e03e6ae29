"""The OpenAI-shaped adapters' request building (pure)."""

import pytest

from proxy.adapters.openai import OPENROUTER_PRIVACY, build_request, turn_requirements
from routing.route import Target
from routing.types import Requirements


def target(adapter: str) -> Target:
    return Target(1, "acct", 1, adapter, "http://127.0.0.1:9/api/v1/", "NO_SUCH_ENV_VAR")


def test_the_body_is_forwarded_with_only_the_model_set():
    body = {"model": "alias", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.2}
    url, headers, payload = build_request(
        target("openai"), "/chat/completions", body, model="gpt-5", requirements=Requirements()
    )
    assert url == "http://127.0.0.1:9/api/v1/chat/completions"
    assert payload == {**body, "model": "gpt-5"}
    assert "provider" not in payload
    assert headers["content-type"] == "application/json"


@pytest.mark.parametrize("client_provider", [None, {"order": ["x"], "data_collection": "allow"}])
def test_openrouter_gets_the_privacy_block_whenever_the_turn_needs_zero_retention(client_provider):
    body = {"model": "m", "messages": []}
    if client_provider is not None:
        body["provider"] = client_provider
    _, _, payload = build_request(
        target("openrouter"),
        "/chat/completions",
        body,
        model="m",
        requirements=Requirements(zero_retention=True),
    )
    assert payload["provider"]["data_collection"] == "deny"  # a client's own value never weakens it
    assert {k: payload["provider"][k] for k in OPENROUTER_PRIVACY} == OPENROUTER_PRIVACY
    if client_provider is not None:
        assert payload["provider"]["order"] == ["x"]


def test_openai_never_gets_openrouter_fields():
    _, _, payload = build_request(
        target("openai"),
        "/chat/completions",
        {"model": "m"},
        model="m",
        requirements=Requirements(zero_retention=True),
    )
    assert "provider" not in payload


def test_turn_requirements_see_tools_tool_results_images_and_limits_at_any_depth():
    deep: dict = {"type": "image_url", "image_url": {"url": "data:,"}}
    for _ in range(2000):  # deeper than the interpreter's recursion limit
        deep = {"content": [deep]}
    body = {
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}, deep],
        "max_tokens": 77,
    }
    r = turn_requirements(body, body_size=400)
    assert (r.tools_offered, r.untrusted_content, r.vision) == (True, True, True)
    assert (r.prompt_tokens, r.max_output_tokens) == (100, 77)
