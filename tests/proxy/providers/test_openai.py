"""proxy/wire/providers/openai.py: OpenAI's requests as sent, and a Messages client translated to Chat
(pure)."""

import copy
import json

import pytest

from proxy.wire.providers.openai import PROVIDER as openai
from proxy.wire.sse import Dialect
from routing.policy.route import Target
from routing.policy.types import Requirements
from tests.proxy.test_translate import CHAT_ADVERSARIAL

BASE = "http://127.0.0.1:9/api/v1/"


def target(adapter: str = "openai") -> Target:
    return Target(1, "acct", 1, adapter, BASE, "NO_SUCH_ENV_VAR")


def call(path: str, body: dict, *, credential: str = "sk-test", **kwargs):
    return openai.call(
        path,
        target(),
        body,
        model="gpt-5",
        requirements=Requirements(),
        credential=credential,
        created=0,
        **kwargs,
    )


def test_the_body_is_forwarded_with_only_the_model_set():
    body = {"model": "alias", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.2}
    before = copy.deepcopy(body)
    sent = call("/chat/completions", body)
    assert sent.url == "http://127.0.0.1:9/api/v1/chat/completions"
    assert sent.payload == {**before, "model": "gpt-5"}
    assert body == before  # the client's body is not modified in place
    assert sent.headers == {"authorization": "Bearer sk-test", "content-type": "application/json"}
    assert (sent.dialect, sent.strip_usage, sent.stream()) == (Dialect.CHAT, False, None)
    assert sent.response(b'{"x": 1}') == b'{"x": 1}'  # relayed as it came


def test_no_credential_sends_no_authorization():
    assert "authorization" not in call("/chat/completions", {}, credential="").headers


def test_openai_never_gets_openrouter_fields():
    sent = openai.call(
        "/chat/completions",
        target(),
        {"model": "m"},
        model="m",
        requirements=Requirements(zero_retention=True),
        credential="",
        created=0,
    )
    assert "provider" not in sent.payload


@pytest.mark.parametrize("options", [None, {"include_usage": False}, {"other": 1}])
def test_a_stream_asks_for_usage_the_client_did_not_ask_for_and_strips_it(options):
    body: dict = {"stream": True, "messages": []}
    if options is not None:
        body["stream_options"] = options
    sent = call("/chat/completions", body)
    assert sent.payload["stream_options"] == {**(options or {}), "include_usage": True}
    assert sent.strip_usage is True


def test_a_stream_that_asked_for_usage_keeps_it():
    sent = call("/chat/completions", {"stream": True, "stream_options": {"include_usage": True}})
    assert sent.strip_usage is False


@pytest.mark.parametrize("path", ["/responses", "/responses/compact", "/embeddings"])
def test_responses_and_embeddings_go_as_sent(path):
    sent = call(path, {"input": "hi", "stream": True})
    assert (sent.url, sent.dialect, sent.payload) == (
        f"http://127.0.0.1:9/api/v1{path}",
        Dialect.RESPONSES,
        {"input": "hi", "stream": True, "model": "gpt-5"},
    )
    assert "stream_options" not in sent.payload


def test_a_messages_client_is_translated_to_chat_and_back():
    body = {"model": "x", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    sent = call("/messages", body)
    assert sent.url == "http://127.0.0.1:9/api/v1/chat/completions"
    assert sent.payload["model"] == "gpt-5" and sent.payload["messages"][-1]["role"] == "user"
    answer = {
        "id": "c1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1},
    }
    relayed = json.loads(sent.response(json.dumps(answer).encode()))
    assert relayed["type"] == "message" and relayed["model"] == "gpt-5"
    assert sent.stream() is not None and sent.stream() is not sent.stream()  # fresh per answer


@pytest.mark.parametrize("path", ["/files", "/files/file-1", "/files/file-1/content"])
def test_files_requests_carry_only_the_credential(path):
    sent = call(path, {})
    assert (sent.url, sent.headers, sent.payload) == (
        f"http://127.0.0.1:9/api/v1{path}",
        {"authorization": "Bearer sk-test"},  # the upload's own content type is the client's
        {},
    )


def test_pass_through_carries_the_adversarial_fixture_unchanged():
    sent = call("/chat/completions", CHAT_ADVERSARIAL)
    assert sent.payload == {**CHAT_ADVERSARIAL, "model": "gpt-5"}
    assert [m["role"] for m in sent.payload["messages"]] == ["system", "user", "assistant", "tool"]


def test_the_model_listing_is_one_page():
    page = openai.model_page({"data": [{"id": "a"}, {"id": "b"}], "has_more": True, "last_id": "b"})
    assert (page.ids, page.next_query) == (["a", "b"], None)
    assert openai.models_url(BASE) == "http://127.0.0.1:9/api/v1/models"


@pytest.mark.parametrize("payload", [[], {"data": {}}, {"data": [{"id": ""}]}, {"data": [{"name": "a"}]}])
def test_a_listing_that_is_not_a_model_list_is_refused(payload):
    with pytest.raises(ValueError):
        openai.model_page(payload)
