"""Usage is read from every shape (SPEC §6.0): plain and streamed, Chat, Responses and Anthropic,
native and translated both ways. The fake sends usage in a Chat stream only when the request asks
for it (`stream_options.include_usage`), as OpenAI does, so an unasked stream would go uncharged."""

import json

import pytest
from django.urls import reverse

from catalog.models import CatalogEntry, Provenance
from devkit.behaviours import serve
from pools.models import Assignment
from routing.policy.pricing import dollars
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


# -- cached input (SPEC §7.3) ------------------------------------------------------------------------

# Per million tokens: input $1, output $3, cache read $0.10, cache write $1.25 (micros).
CACHED_PRICE = {**PRICE, "cached_input_per_mtok_micros": 100_000, "cache_write_per_mtok_micros": 1_250_000}
# 130 input tokens of which 100 read from the cache (and, where the API reports writes, 20 written).
CACHED = serve("one two three four five", input_tokens=130, output_tokens=5, cached_read_tokens=100)
WRITTEN = serve(
    "one two three four five",
    input_tokens=130,
    output_tokens=5,
    cached_read_tokens=100,
    cached_write_tokens=20,
)
OPENAI_COST = 30 + 10 + 15  # 30 uncached at $1, 100 read at $0.10, 5 out at $3
ANTHROPIC_COST = 10 + 10 + 25 + 15  # 10 uncached, 100 read, 20 written at $1.25, 5 out


def _ledger(response) -> tuple:
    [attempt] = [a for a in attempts_of(record_of(response)) if a.status == "succeeded"]
    return (
        attempt.input_tokens,
        attempt.output_tokens,
        attempt.cached_read_tokens,
        attempt.cached_write_tokens,
        attempt.cost_micros,
    )


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path, body", [("/v1/chat/completions", CHAT), ("/v1/responses", RESPONSES)])
def test_openai_cached_tokens_are_recorded_and_priced_at_the_cached_rate(gateway, priced, path, body, stream):
    a, _ = priced
    CatalogEntry.objects.update(**CACHED_PRICE)
    a.script("gpt-5", CACHED)
    options = {"stream_options": {"include_usage": True}} if stream and path.endswith("completions") else {}
    response = post(gateway, path, {**body, "stream": stream, **options})
    assert response.status_code == 200, response.text
    # OpenAI's input count includes its cached part: 130 input, 100 of them read, nothing written.
    assert _ledger(response) == (130, 5, 100, None, OPENAI_COST)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_cache_reads_and_writes_are_recorded_once_and_priced_at_their_rates(
    gateway, anthropic_upstream, stream
):
    CatalogEntry.objects.update(**CACHED_PRICE)
    anthropic_upstream.script("gpt-5", WRITTEN)
    response = post(gateway, "/v1/messages", {**MESSAGES, "stream": stream})
    assert response.status_code == 200, response.text
    # The upstream said input_tokens 10 (uncached), cache reads 100, writes 20 (streamed: in
    # message_start and again, cumulatively, in message_delta): recorded as 130 input, never 230.
    assert _ledger(response) == (130, 5, 100, 20, ANTHROPIC_COST)
    usage = (
        response.json()["usage"]
        if not stream
        else next(e.data for e in sse_events(response.text) if e.type == "message_start")["message"]["usage"]
    )
    assert (usage["input_tokens"], usage["cache_read_input_tokens"]) == (10, 100)  # relayed as it came


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_client_of_an_anthropic_account_sees_its_cached_tokens_and_pays_the_cached_rates(
    gateway, anthropic_upstream, stream
):
    CatalogEntry.objects.update(**CACHED_PRICE)
    anthropic_upstream.script("gpt-5", WRITTEN)
    options = {"stream_options": {"include_usage": True}} if stream else {}
    response = post(gateway, "/v1/chat/completions", {**CHAT, "stream": stream, **options})
    assert response.status_code == 200, response.text
    if stream:
        [usage] = [
            e.data["usage"] for e in sse_events(response.text) if isinstance(e.data, dict) and e.data["usage"]
        ]
    else:
        usage = response.json()["usage"]
    assert (usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]) == (130, 100)
    assert _ledger(response) == (130, 5, 100, 20, ANTHROPIC_COST)


@pytest.mark.parametrize("stream", [False, True])
def test_a_messages_client_of_an_openai_account_sees_cache_reads_apart_from_its_input(
    gateway, priced, stream
):
    a, _ = priced
    CatalogEntry.objects.update(**CACHED_PRICE)
    a.script("gpt-5", CACHED)
    response = post(gateway, "/v1/messages", {**MESSAGES, "stream": stream})
    assert response.status_code == 200, response.text
    if stream:
        [delta] = [e.data for e in sse_events(response.text) if e.type == "message_delta"]
        usage = delta["usage"]
    else:
        usage = response.json()["usage"]
    assert (usage["input_tokens"], usage["cache_read_input_tokens"]) == (30, 100)
    assert _ledger(response) == (130, 5, 100, None, OPENAI_COST)


def test_the_request_page_and_the_spend_page_show_a_served_requests_cached_input(
    gateway, anthropic_upstream, admin_client
):
    CatalogEntry.objects.update(**CACHED_PRICE)
    anthropic_upstream.script("gpt-5", WRITTEN)
    response = post(gateway, "/v1/messages", {**MESSAGES, "stream": True})
    assert response.status_code == 200, response.text
    record = record_of(response)
    page = admin_client.get(reverse("admin:proxy_requestrecord_change", args=[record.pk])).content.decode()
    assert f"130 in (100 cached read, 20 cached write), 5 out; cost {dollars(ANTHROPIC_COST)}." in page
    spend = admin_client.get("/admin/spend/").content.decode()
    assert 'data-cached-read="100" data-input-tokens="130">100 of 130 input tokens (76%)</td>' in spend


def test_an_upstreams_absurd_counts_are_clamped_and_never_break_the_ledger(gateway, priced):
    """A count past the ledger's integer columns (or below zero) would fail the batch that writes it,
    and every other request's record with it: it is stored clamped."""
    a, _ = priced
    a.script("gpt-5", serve("one two", input_tokens=2**40, output_tokens=5, cached_read_tokens=-5))
    response = post(gateway, "/v1/chat/completions", CHAT)
    assert response.status_code == 200, response.text
    assert _ledger(response)[:4] == (2**31 - 1, 5, 0, None)
