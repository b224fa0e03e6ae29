"""`make bench-pool`'s fake accounts (devkit/pool_upstream.py): the limiter, headers and prompt cache as
pure code on a fixed clock, then over a real socket through the official `openai` and `anthropic` SDKs,
so the fake answers as the real services do (rate-limit headers the SDKs expose, 429s they raise as
RateLimitError, cached tokens where they read them)."""

import datetime as dt
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from devkit.pool_upstream import (
    Account,
    AccountSpec,
    Bucket,
    Outage,
    Pool,
    PoolServer,
    PrefixCache,
    conversation_of,
    go_duration,
    prompt_items,
)

WALL = 1_800_000_000.0  # a fixed Unix time for Anthropic's reset instants
SYSTEM = "[conv:c7] " + "You are a careful coding agent. " * 400  # about 3,200 tokens


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def chat(*turns: str, max_tokens: int = 100) -> dict:
    messages = [{"role": "system", "content": SYSTEM}] + [{"role": "user", "content": t} for t in turns]
    return {"model": "m", "messages": messages, "max_tokens": max_tokens}


# --- pure --------------------------------------------------------------------------------------------


def test_bucket_refills_a_minutes_limit_over_a_minute_and_never_above_it():
    bucket = Bucket(60, now=0.0)
    assert bucket.take(60, 0.0)
    assert not bucket.take(1, 0.5)  # half a request refilled
    assert bucket.remaining(10.0) == 10
    assert bucket.wait_s(15, 10.0) == pytest.approx(5.0)
    assert bucket.full_in_s(10.0) == pytest.approx(50.0)
    assert bucket.remaining(1000.0) == 60


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.25, "250ms"), (1, "1s"), (12.5, "12.5s"), (60, "1m0s"), (360, "6m0s"), (83.25, "1m23.25s")],
)
def test_openai_resets_are_go_durations(seconds, text):
    assert go_duration(seconds) == text


def test_a_prefix_is_cached_per_account_until_its_ttl_and_only_above_the_minimum():
    cache = PrefixCache(ttl_s=300)
    first = cache.prefixes(prompt_items("chat", chat("one")))
    assert cache.cached(first, now=0.0) == 0
    cache.remember(first, now=0.0)
    second = cache.prefixes(prompt_items("chat", chat("one", "two")))
    assert cache.cached(second, now=299.0) == first[-1][1]  # the whole earlier prompt
    assert cache.cached(second, now=301.0) == 0  # expired
    short = PrefixCache()
    tiny = short.prefixes([{"role": "system", "content": "short"}, {"role": "user", "content": "x"}])
    short.remember(tiny, now=0.0)
    assert short.cached(tiny, now=1.0) == 0  # under 1024 tokens: never reported cached


def test_an_openai_account_counts_prompt_and_max_tokens_and_answers_429_with_its_headers():
    spec = AccountSpec("a", "openai", rpm=100, tpm=8000)
    account = Account(spec, now=0.0)
    body = chat("hi", max_tokens=1000)
    first = account.answer("chat", body, t=0, now=0.0, wall=WALL)
    cost = first.usage.input_tokens + 1000
    assert first.status == 200
    assert first.headers["x-ratelimit-remaining-tokens"] == str(8000 - cost)
    assert first.headers["x-ratelimit-remaining-requests"] == "99"
    assert first.headers["x-ratelimit-reset-requests"] == "600ms"
    over = account.answer("chat", body, t=0, now=0.0, wall=WALL)
    assert over.status == 429
    assert over.body["error"]["code"] == "rate_limit_exceeded"
    assert over.body["error"]["type"] == "tokens"
    assert int(over.headers["retry-after"]) >= 1
    assert int(over.headers["x-ratelimit-remaining-tokens"]) < cost


def test_an_anthropic_account_counts_only_uncached_input_against_its_input_limit():
    spec = AccountSpec("b", "anthropic", rpm=100, tpm=5000)
    account = Account(spec, now=0.0)
    body = {"model": "m", "system": SYSTEM, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
    first = account.answer("messages", body, t=0, now=0.0, wall=WALL)
    assert first.status == 200
    spent = 5000 - int(first.headers["anthropic-ratelimit-input-tokens-remaining"])
    assert spent == first.usage.input_tokens
    again = account.answer("messages", body, t=0, now=0.0, wall=WALL)
    assert again.body["usage"]["cache_read_input_tokens"] > 0
    left = int(again.headers["anthropic-ratelimit-input-tokens-remaining"])
    assert 5000 - spent - left == again.usage.input_tokens - again.usage.cached_tokens
    reset = again.headers["anthropic-ratelimit-requests-reset"]
    assert dt.datetime.fromisoformat(reset) > dt.datetime.fromtimestamp(WALL, dt.UTC)


@pytest.mark.parametrize(
    ("kind", "shape", "status"),
    [
        ("unavailable", "openai", 503),
        ("unavailable", "anthropic", 529),
        ("unauthorized", "openai", 401),
        ("unauthorized", "anthropic", 401),
    ],
)
def test_an_outage_answers_for_its_window_only(kind, shape, status):
    account = Account(AccountSpec("c", shape, 100, 100_000, (Outage(10, 30, kind),)), now=0.0)
    route, body = ("chat", chat("x")) if shape == "openai" else ("messages", {**chat("x"), "messages": []})
    assert account.answer(route, body, t=9.9, now=0.0, wall=WALL).status == 200
    assert account.answer(route, body, t=10, now=0.0, wall=WALL).status == status
    assert account.answer(route, body, t=30, now=0.0, wall=WALL).status == 200


def test_a_hung_account_never_answers():
    account = Account(AccountSpec("d", "openai", 100, 100_000, (Outage(0, None, "hang"),)), now=0.0)
    assert account.answer("chat", chat("x"), t=50, now=0.0, wall=WALL).body is None


@pytest.mark.parametrize("shape", ["openai", "anthropic"])
def test_the_record_keeps_the_smallest_share_left_that_the_answers_headers_report(shape):
    if shape == "openai":
        header = "x-ratelimit-{}-{}".format
        kinds: tuple[str, ...] = ("requests", "tokens")
    else:
        header = "anthropic-ratelimit-{1}-{0}".format
        kinds = ("requests", "input-tokens", "output-tokens")
    clock = Clock()
    pool = Pool(
        [AccountSpec("e", shape, rpm=4, tpm=1_000_000, outages=(Outage(5, 6, "unavailable"),))], clock
    )
    path, body = (
        ("chat/completions", chat("x")) if shape == "openai" else ("messages", {**chat("x"), "messages": []})
    )
    for _ in range(5):
        answer = pool.answer("e", path, body)
        reported = [
            int(answer.headers[header("remaining", kind)]) / int(answer.headers[header("limit", kind)])
            for kind in kinds
        ]
        assert pool.events[-1][7] == pytest.approx(min(reported), abs=1e-4)
    assert [e[4] for e in pool.events] == [200, 200, 200, 200, 429]
    assert pool.events[-1][7] == 0.0  # the requests limit is spent
    clock.now += 5.5  # in the outage: no rate-limit headers, no headroom
    assert pool.answer("e", path, body).status in (503, 529)
    assert pool.events[-1][7] is None


def test_a_request_names_its_conversation_and_turn_in_every_shape():
    assert conversation_of(prompt_items("chat", chat("a", "b"))) == ("c7", 2)
    responses = {"instructions": SYSTEM, "input": [{"role": "user", "content": "a"}]}
    assert conversation_of(prompt_items("responses", responses)) == ("c7", 1)
    messages = {"system": SYSTEM, "messages": [{"role": "user", "content": "a"}]}
    assert conversation_of(prompt_items("messages", messages)) == ("c7", 1)


# --- through the official SDKs -----------------------------------------------------------------------


@pytest.fixture
def pool() -> Iterator[tuple[Pool, str]]:
    specs = [
        AccountSpec("oa", "openai", rpm=2, tpm=1_000_000),
        AccountSpec("an", "anthropic", rpm=2, tpm=1_000_000),
    ]
    pool = Pool(specs, clock=Clock())  # a clock that never moves: no refill between calls
    server = PoolServer(pool)
    port = server.start()
    yield pool, f"http://127.0.0.1:{port}"
    server.stop()


def test_openai_sdk_reads_headers_and_cached_tokens_and_raises_rate_limit_error(pool):
    _, root = pool
    client = openai.OpenAI(base_url=f"{root}/oa/v1", api_key="sk-test", max_retries=0)
    body = chat("first")
    first = client.chat.completions.with_raw_response.create(**body)
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert first.headers["x-request-id"]
    assert first.parse().usage.prompt_tokens_details.cached_tokens == 0
    response = client.responses.create(
        model="m", instructions=SYSTEM, input=[{"role": "user", "content": "first"}], max_output_tokens=50
    )
    assert response.output_text
    assert response.usage.input_tokens_details.cached_tokens == 0  # a Responses prompt is another prefix
    with pytest.raises(openai.RateLimitError) as raised:
        client.chat.completions.create(**chat("first", "second"))
    error = raised.value
    assert error.code == "rate_limit_exceeded"
    assert error.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert int(error.response.headers["retry-after"]) >= 1


def test_openai_sdk_sees_the_earlier_prompt_cached_on_the_same_account(pool):
    _, root = pool
    client = openai.OpenAI(base_url=f"{root}/oa/v1", api_key="sk-test", max_retries=0)
    first = client.chat.completions.create(**chat("first"))
    second = client.chat.completions.create(**chat("first", "second"))
    assert second.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_anthropic_sdk_reads_cache_reads_and_raises_rate_limit_error(pool):
    events, root = pool
    client = anthropic.Anthropic(base_url=f"{root}/an", api_key="sk-test", max_retries=0)
    turn = [{"role": "user", "content": "first"}]
    first = client.messages.with_raw_response.create(model="m", system=SYSTEM, messages=turn, max_tokens=64)
    assert first.headers["anthropic-ratelimit-requests-remaining"] == "1"
    assert first.headers["request-id"]
    assert first.parse().usage.cache_read_input_tokens == 0
    more = [*turn, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "second"}]
    second = client.messages.create(model="m", system=SYSTEM, messages=more, max_tokens=64)
    assert second.usage.cache_read_input_tokens > 3000
    assert second.content[0].text
    with pytest.raises(anthropic.RateLimitError) as raised:
        client.messages.create(model="m", system=SYSTEM, messages=turn, max_tokens=64)
    assert raised.value.body["error"]["type"] == "rate_limit_error"
    assert int(raised.value.response.headers["retry-after"]) >= 1
    assert raised.value.response.headers["anthropic-ratelimit-requests-remaining"] == "0"
    statuses = [
        (account, conversation, turn, status) for _, account, conversation, turn, status, *_ in events.events
    ]
    assert statuses == [("an", "c7", 1, 200), ("an", "c7", 2, 200), ("an", "c7", 1, 429)]


def test_a_request_without_a_credential_is_refused(pool):
    _, root = pool
    answer = httpx.post(f"{root}/oa/v1/chat/completions", json=chat("x"))
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "invalid_api_key"
