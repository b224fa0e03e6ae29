"""proxy/wire/providers/anthropic.py: Messages as sent, a Chat client translated, the paged model listing."""

import copy
import json

import pytest

from proxy.wire.providers.anthropic import PROVIDER as anthropic
from proxy.wire.sse import Dialect
from routing.policy.route import Target
from routing.policy.types import Requirements
from tests.proxy.test_translate import ANTHROPIC_ADVERSARIAL, FORGED, INSTRUCTION


def target() -> Target:
    return Target(1, "acct", 1, "anthropic", "http://127.0.0.1:9101/v1/", "NO_SUCH_ENV_VAR")


def call(path: str, body: dict, *, credential: str = "sk-ant-test", beta: str | None = None):
    return anthropic.call(
        path,
        target(),
        body,
        model="claude-opus-4-8",
        requirements=Requirements(zero_retention=True),
        credential=credential,
        created=0,
        client_headers={"anthropic-beta": beta} if beta else {},
    )


@pytest.mark.parametrize("path", ["/messages", "/messages/count_tokens"])
def test_messages_replace_only_the_model(path):
    body = {"model": "claude-opus-5", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    before = copy.deepcopy(body)
    sent = call(path, body)
    assert sent.url == f"http://127.0.0.1:9101/v1{path}"
    assert sent.headers == {
        "x-api-key": "sk-ant-test",
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
    }
    assert sent.payload == {**before, "model": "claude-opus-4-8"}
    assert body == before  # the client's body is not modified in place
    assert (sent.dialect, sent.stream()) == (Dialect.ANTHROPIC, None)


def test_without_credential_and_with_beta():
    sent = call("/messages", {"model": "m"}, credential="", beta="context-1m-2025-08-07")
    assert sent.headers == {
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
        "anthropic-beta": "context-1m-2025-08-07",
    }


def test_a_chat_client_is_translated_to_messages_and_back():
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = call("/chat/completions", body, beta="ignored-beta")
    assert sent.url == "http://127.0.0.1:9101/v1/messages"
    assert "anthropic-beta" not in sent.headers  # a Chat client's request has no Anthropic beta
    assert sent.payload["model"] == "claude-opus-4-8" and sent.dialect is Dialect.ANTHROPIC
    answer = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
    assert json.loads(sent.response(json.dumps(answer).encode()))["object"] == "chat.completion"
    assert sent.stream() is not None


def test_pass_through_carries_the_adversarial_fixture_unchanged():
    sent = call("/messages", ANTHROPIC_ADVERSARIAL)
    assert sent.payload == {**ANTHROPIC_ADVERSARIAL, "model": "claude-opus-4-8"}
    assert sent.payload["system"] == INSTRUCTION
    assert sent.payload["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_01", "content": FORGED}
    ]


@pytest.mark.parametrize(
    ("payload", "next_query"),
    [
        ({"data": [{"id": "a"}], "has_more": True, "last_id": "a"}, {"after_id": "a"}),
        ({"data": [{"id": "a"}], "has_more": False, "last_id": "a"}, None),
        ({"data": [{"id": "a"}], "has_more": True, "last_id": ""}, None),
        ({"data": [{"id": "a"}], "has_more": True}, None),
    ],
)
def test_the_model_listing_pages_by_last_id(payload, next_query):
    page = anthropic.model_page(payload)
    assert (page.ids, page.next_query) == (["a"], next_query)
