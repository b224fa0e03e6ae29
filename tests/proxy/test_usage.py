"""Usage is read from every shape (SPEC §6.0): plain and streamed, Chat, Responses and Anthropic,
native and translated both ways. The fake sends usage in a Chat stream only when the request asks
for it (`stream_options.include_usage`), as OpenAI does, so an unasked stream would go uncharged."""

import json

import pytest

from catalog.models import CatalogEntry, Provenance
from devkit.behaviours import serve
from pools.models import Assignment
from tests.factories import AssignmentFactory, CatalogEntryFactory
from tests.gateway_fixtures import UPSTREAM_KEY_ENV
from tests.proxy.fixtures_e2e import (
    CHAT,
    RESPONSES,
    attempts_of,
    post,
    record_of,
    sse_events,
)

MESSAGES = {"model": "gpt-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
PRICE = {"input_per_mtok_micros": 1_000_000, "output_per_mtok_micros": 3_000_000}


@pytest.fixture
def priced(two_assignments):
    a, b, _ = two_assignments
    CatalogEntry.objects.update(**PRICE)
    a.script("gpt-5", serve("one two three four", input_tokens=11, output_tokens=4))
    return a, b


@pytest.fixture
def anthropic_upstream(priced, fake_upstream_factory):
    """Only an `anthropic` assignment serves gpt-5 (the OpenAI-shaped ones are disabled)."""
    fake = fake_upstream_factory("claude", models=("gpt-5",))
    fake.script("gpt-5", serve("one two three four", input_tokens=11, output_tokens=4))
    pool = Assignment.objects.first().pool
    Assignment.objects.update(enabled=False)
    row = AssignmentFactory(
        pool=pool,
        name="acct-claude",
        adapter="anthropic",
        base_url=fake.base_url,
        api_key_env=UPSTREAM_KEY_ENV,
    )
    CatalogEntryFactory(assignment=row, model="gpt-5", provenance=Provenance.CONFIGURED, **PRICE)
    return fake


def _charged(response) -> tuple[int | None, int | None, int | None]:
    [attempt] = [a for a in attempts_of(record_of(response)) if a.status == "succeeded"]
    return attempt.input_tokens, attempt.output_tokens, attempt.cost_micros


COST = -(-(11 * 1_000_000 + 4 * 3_000_000) // 1_000_000)  # 23 micros, rounded up


def test_a_chat_stream_asks_for_usage_and_hides_the_usage_chunk_the_client_did_not_ask_for(gateway, priced):
    a, _ = priced
    response = post(gateway, "/v1/chat/completions", {**CHAT, "stream": True})
    assert response.status_code == 200
    assert a.hits[0].body["stream_options"] == {"include_usage": True}
    chunks = [e.data for e in sse_events(response.text) if isinstance(e.data, dict)]
    assert chunks and all(c["choices"] for c in chunks)  # no usage-only chunk reached the client
    assert sse_events(response.text)[-1].data == "[DONE]"
    assert _charged(response) == (11, 4, COST)


def test_a_client_that_asked_for_usage_gets_its_usage_chunk(gateway, priced):
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    response = post(gateway, "/v1/chat/completions", body)
    usage_chunks = [
        e.data for e in sse_events(response.text) if isinstance(e.data, dict) and e.data["choices"] == []
    ]
    assert [c["usage"]["completion_tokens"] for c in usage_chunks] == [4]
    assert _charged(response) == (11, 4, COST)


@pytest.mark.parametrize("stream", [False, True])
def test_responses_usage_is_read(gateway, priced, stream):
    response = post(gateway, "/v1/responses", {**RESPONSES, "stream": stream})
    assert response.status_code == 200
    assert _charged(response) == (11, 4, COST)


@pytest.mark.parametrize("stream", [False, True])
def test_an_anthropic_client_on_an_openai_upstream_is_charged(gateway, priced, stream):
    a, _ = priced
    response = post(gateway, "/v1/messages", {**MESSAGES, "stream": stream})
    assert response.status_code == 200
    if stream:
        assert a.hits[0].body["stream_options"] == {"include_usage": True}
        [delta] = [e.data for e in sse_events(response.text) if e.type == "message_delta"]
        assert delta["usage"]["output_tokens"] == 4
    else:
        assert response.json()["usage"] == {"input_tokens": 11, "output_tokens": 4}
    assert _charged(response) == (11, 4, COST)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_usage_is_read_natively_and_for_a_chat_client(gateway, anthropic_upstream, stream):
    for path, body in (("/v1/messages", MESSAGES), ("/v1/chat/completions", CHAT)):
        response = post(gateway, path, {**body, "stream": stream})
        assert response.status_code == 200, response.text
        # Input tokens come in message_start and output tokens in message_delta: both are kept.
        assert _charged(response) == (11, 4, COST), path
    assert all("stream_options" not in json.dumps(hit.body) for hit in anthropic_upstream.hits)
