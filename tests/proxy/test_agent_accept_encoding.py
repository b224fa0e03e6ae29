"""The coding agents' `accept-encoding` (issue 44): Codex sends `zstd,gzip`, Claude Code `gzip, deflate, br,
zstd`. Whatever the account answered in (the fake compresses what it may), each gets an answer it can
decode, plain and SSE: identity or gzip, never zstd or br, which the gateway does not write. Raw httpx
-> the gateway -> a fake on loopback that compresses its own answers when offered."""

import gzip
import json

import httpx
import pytest

from pools.models import Adapter
from tests.gateway_fixtures import GATEWAY_KEY
from tests.proxy.test_anthropic_ingress import Setup, setup

__all__ = ["setup"]  # the fixture this module uses

MODEL = "agent-model"
CODEX = ("/v1/responses", {"model": MODEL, "input": "hi"}, Adapter.OPENAI, "zstd,gzip")
CLAUDE = (
    "/v1/messages",
    {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
    Adapter.ANTHROPIC,
    "gzip, deflate, br, zstd",
)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
@pytest.mark.parametrize(
    ("path", "body", "adapter", "offered"), [CODEX, CLAUDE], ids=["codex", "claude-code"]
)
def test_an_agent_gets_an_answer_it_can_decode(
    gateway, setup: Setup, fake_upstream_factory, path, body, adapter, offered, stream
):
    setup.add(fake_upstream_factory, "acct", adapter, (MODEL,))
    headers = {"authorization": f"Bearer {GATEWAY_KEY}", "accept-encoding": offered}
    with (
        httpx.Client(timeout=15) as client,
        client.stream(
            "POST", f"{gateway}{path}", json={**body, "stream": stream}, headers=headers
        ) as response,
    ):
        raw = b"".join(response.iter_raw())  # the bytes as sent: decoded here, by what the client has
    encoding = response.headers.get("content-encoding", "identity")
    assert response.status_code == 200 and encoding in ("identity", "gzip")
    text = (gzip.decompress(raw) if encoding == "gzip" else raw).decode()
    if stream:
        assert "data: " in text and text.rstrip().endswith(("[DONE]", "}"))
    else:
        assert json.loads(text)["model"] == MODEL
