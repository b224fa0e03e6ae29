"""`count_tokens` without an Anthropic-shaped account (SPEC §4): the gateway's own estimate, labelled
`x-gateway-token-count: estimated`, never a 503; checked against the counts Anthropic documents."""

import anthropic
import pytest

from devkit.behaviours import serve
from proxy.wire.translations.token_estimate import estimate_input_tokens
from tests.gateway_fixtures import GATEWAY_KEY
from tests.proxy.fixtures_e2e import attempts_of, post, record_of

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Get the current weather in a given location",
    "input_schema": {
        "type": "object",
        "properties": {
            "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"}
        },
        "required": ["location"],
    },
}
# Requests and counts from Anthropic's token-counting guide (platform.claude.com/docs/en/build-with-
# claude/token-counting): the basic system + message example, and the tool example.
KNOWN = [
    ({"system": "You are a scientist", "messages": [{"role": "user", "content": "Hello, Claude"}]}, 14),
    (
        {
            "tools": [WEATHER_TOOL],
            "messages": [{"role": "user", "content": "What's the weather like in San Francisco?"}],
        },
        403,
    ),
]


@pytest.mark.parametrize(("body", "count"), KNOWN)
def test_the_estimate_is_within_ten_percent_of_documented_counts(body, count):
    estimate = estimate_input_tokens({"model": "claude-opus-5", **body})
    assert abs(estimate - count) <= 0.10 * count, (estimate, count)


def test_the_estimate_grows_with_the_text_and_counts_images_and_tool_results():
    short = estimate_input_tokens({"messages": [{"role": "user", "content": "word " * 10}]})
    long = estimate_input_tokens({"messages": [{"role": "user", "content": "word " * 1000}]})
    assert 1100 <= long <= 1400 and short < 30  # 5 bytes a word: about 1,250 tokens
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A" * 10}}
    with_image = estimate_input_tokens({"messages": [{"role": "user", "content": [image]}]})
    assert with_image >= 1600
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "x" * 400}
    assert estimate_input_tokens({"messages": [{"role": "user", "content": [result]}]}) >= 100
    assert estimate_input_tokens({"messages": "not a list", "system": 5}) == 3  # framing only, no error


def test_an_openai_only_pool_answers_the_estimate_to_the_anthropic_sdk(gateway, two_assignments):
    a, b, _ = two_assignments
    client = anthropic.Anthropic(base_url=gateway, api_key=GATEWAY_KEY, max_retries=0, timeout=15)
    with client:
        raw = client.messages.with_raw_response.count_tokens(
            model="gpt-5", system=KNOWN[0][0]["system"], messages=KNOWN[0][0]["messages"]
        )
    assert raw.headers["x-gateway-token-count"] == "estimated"
    assert raw.parse().input_tokens == estimate_input_tokens(KNOWN[0][0])
    assert a.hits == [] and b.hits == []
    record = record_of(raw.http_response)
    assert (record.outcome, record.status_code) == ("ok", 200)
    assert {x.ineligible_reason for x in attempts_of(record)} == {"capability"}


def test_an_anthropic_account_counts_for_itself(gateway, two_assignments, fake_upstream_factory):
    from catalog.models import Provenance
    from pools.models import Assignment
    from tests.factories import AssignmentFactory, CatalogEntryFactory
    from tests.gateway_fixtures import UPSTREAM_KEY_ENV

    claude = fake_upstream_factory("claude", models=("gpt-5",))
    claude.script("gpt-5", serve(input_tokens=77))
    row = AssignmentFactory(
        pool=Assignment.objects.first().pool,
        name="acct-claude",
        adapter="anthropic",
        base_url=claude.base_url,
        api_key_env=UPSTREAM_KEY_ENV,
    )
    CatalogEntryFactory(assignment=row, model="gpt-5", provenance=Provenance.CONFIGURED)
    counted = post(gateway, "/v1/messages/count_tokens", {"model": "gpt-5", **KNOWN[0][0]})
    assert counted.json() == {"input_tokens": 77}
    assert "x-gateway-token-count" not in counted.headers
