"""proxy/wire/providers/openrouter.py: OpenAI's shape, plus the privacy routing block (pure)."""

import pytest

from proxy.wire.providers.openrouter import PRIVACY
from proxy.wire.providers.openrouter import PROVIDER as openrouter
from routing.policy.route import Target
from routing.policy.types import Requirements


def target() -> Target:
    return Target(1, "acct", 1, "openrouter", "http://127.0.0.1:9/api/v1/", "NO_SUCH_ENV_VAR")


@pytest.mark.parametrize("path", ["/chat/completions", "/messages"])
@pytest.mark.parametrize("client_provider", [None, {"order": ["x"], "data_collection": "allow"}])
def test_openrouter_gets_the_privacy_block_whenever_the_turn_needs_zero_retention(path, client_provider):
    body: dict = {"model": "m", "messages": [], "max_tokens": 5}
    if client_provider is not None and path == "/chat/completions":  # Messages has no such field
        body["provider"] = client_provider
    sent = openrouter.call(
        path,
        target(),
        body,
        model="m",
        requirements=Requirements(zero_retention=True),
        credential="",
        created=0,
    )
    assert sent.payload["provider"]["data_collection"] == "deny"  # a client's own value never weakens it
    assert {k: sent.payload["provider"][k] for k in PRIVACY} == PRIVACY
    if client_provider is not None and path == "/chat/completions":
        assert sent.payload["provider"]["order"] == ["x"]


def test_without_zero_retention_the_body_is_as_sent():
    sent = openrouter.call(
        "/chat/completions",
        target(),
        {"messages": []},
        model="m",
        requirements=Requirements(),
        credential="k",
        created=0,
    )
    assert sent.payload == {"messages": [], "model": "m"}
    assert sent.headers["authorization"] == "Bearer k"


def test_openrouter_has_no_files_api():
    assert "/files" not in openrouter.routes
