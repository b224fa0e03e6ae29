"""Per-key limits (SPEC §3 `limits: {rpm, tpm, concurrent}`; §4 `rate_limit_exceeded`) end to end:
a live gateway on a real socket, fake upstreams on loopback, the counts in the database (no
REDIS_URL) or in Redis at 127.0.0.1:6379 under a prefix of the test's own. The window clock is the
module's `clock`, stopped 1 s into a minute so that no test straddles a minute's end."""

import asyncio
import json
import threading
import time
import uuid

import httpx
import openai
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from devkit.behaviours import serve, slow_stream, unavailable
from pools.models import GatewayKey, KeyLimitSlot, KeyLimitWindow
from pools.selectors import KeyLimits, key_authenticate
from proxy import limits
from proxy.ledger.models import RequestRecord
from tests.gateway_fixtures import GATEWAY_KEY
from tests.proxy.fixtures_e2e import AUTH, CHAT, ledger_settled, record_of

REDIS_URL = "redis://127.0.0.1:6379/0"
MESSAGES = {"model": "gpt-5", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def _redis_keys(prefix: str) -> list[str]:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        return [k.decode() for k in client.scan_iter(f"{prefix}:*")]
    finally:
        client.close()


def _redis_clean(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        for k in client.scan_iter(f"{prefix}:*"):
            client.delete(k)
    finally:
        client.close()


@pytest.fixture(params=["database", "redis"])
def backend(request, settings):
    """Where the counts live: the database (no REDIS_URL) or Redis, with a prefix of this test's own."""
    if request.param == "redis":
        prefix = f"gw-test-{uuid.uuid4().hex[:12]}"
        settings.REDIS_URL, settings.GATEWAY_REDIS_PREFIX = REDIS_URL, prefix
        yield request.param
        _redis_clean(prefix)
    else:
        settings.REDIS_URL = ""
        yield request.param


def _limit(**values) -> None:
    GatewayKey.objects.filter(name="e2e").update(**{f"limit_{k}": v for k, v in values.items()})


def _chat(gateway: str, body: dict | None = None, **kwargs) -> httpx.Response:
    return httpx.post(f"{gateway}/v1/chat/completions", json=body or CHAT, headers=AUTH, timeout=15, **kwargs)


def _assert_refused_openai(response: httpx.Response, limit: str) -> None:
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_exceeded", "rate_limit_exceeded")
    assert error["param"] == limit
    assert limit in error["message"]
    assert response.headers["x-should-retry"] == "true"
    assert 1 <= int(response.headers["retry-after"]) <= 60


# --- rpm ------------------------------------------------------------------------------------------


def test_the_fourth_request_of_an_rpm_3_key_is_refused_before_the_upstream(
    gateway, two_assignments, backend, minute_clock
):
    a, b, _ = two_assignments
    _limit(rpm=3)
    assert [_chat(gateway).status_code for _ in range(3)] == [200, 200, 200]

    refused = _chat(gateway)

    _assert_refused_openai(refused, "rpm")
    assert int(refused.headers["retry-after"]) == 59  # the seconds left in the clock minute
    assert (a.hit_count(), b.hit_count()) == (3, 0)  # nothing of the 4th reached an upstream
    record = record_of(refused)
    assert (record.outcome, record.status_code, record.attempts.count()) == ("rate_limit_exceeded", 429, 0)
    scraped = text_string_to_metric_families(httpx.get(f"{gateway}/metrics", timeout=15).text)
    refusals = [  # /metrics names the outcome as the ledger does
        sample.value
        for family in scraped
        for sample in family.samples
        if sample.name == "gateway_requests_total"
        and sample.labels.get("outcome") == "rate_limit_exceeded"
        and sample.labels.get("route") == "/v1/chat/completions"
    ]
    assert refusals and refusals[0] >= 1


def test_a_new_minute_admits_again(gateway, two_assignments, backend, minute_clock, monkeypatch):
    _limit(rpm=1)
    assert _chat(gateway).status_code == 200
    assert _chat(gateway).status_code == 429
    monkeypatch.setattr(limits, "clock", lambda: minute_clock + 60)
    assert _chat(gateway).status_code == 200


def test_anthropic_routes_answer_in_anthropics_envelope(gateway, two_assignments, backend, minute_clock):
    _limit(rpm=1)
    headers = {"x-api-key": GATEWAY_KEY, "anthropic-version": "2023-06-01"}
    first = httpx.post(f"{gateway}/v1/messages", json=MESSAGES, headers=headers, timeout=15)
    assert first.status_code == 200, first.text

    refused = httpx.post(f"{gateway}/v1/messages", json=MESSAGES, headers=headers, timeout=15)

    assert refused.status_code == 429
    body = refused.json()
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    assert "rpm" in body["error"]["message"]
    assert refused.headers["x-should-retry"] == "true" and int(refused.headers["retry-after"]) >= 1


def test_the_openai_sdk_sees_a_retryable_rate_limit_error(gateway, two_assignments, backend, minute_clock):
    _limit(rpm=1)
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, max_retries=0)
    client.chat.completions.create(**CHAT)

    with pytest.raises(openai.RateLimitError) as raised:
        client.chat.completions.create(**CHAT)

    error = raised.value
    assert error.status_code == 429 and error.code == "rate_limit_exceeded"
    assert error.response.headers["x-should-retry"] == "true"
    assert int(error.response.headers["retry-after"]) >= 1
    assert error.request_id  # the gateway's request id, where the SDK reads it


def test_a_websocket_response_create_gets_a_typed_error_event(
    gateway, two_assignments, backend, minute_clock
):
    a, _, _ = two_assignments
    _limit(rpm=1)
    url = gateway.replace("http://", "ws://") + "/v1/responses"
    with connect(url, additional_headers=AUTH, open_timeout=5) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "gpt-5", "input": "hi"}))
        while json.loads(ws.recv(timeout=10))["type"] not in ("response.completed", "error"):
            pass
        ledger_settled()
        ws.send(json.dumps({"type": "response.create", "model": "gpt-5", "input": "again"}))
        event = json.loads(ws.recv(timeout=10))
    assert event["type"] == "error", event
    assert event["status"] == 429
    assert (event["error"]["code"], event["error"]["param"]) == ("rate_limit_exceeded", "rpm")
    assert a.hit_count() + a.ws_connections <= 2  # the refused frame reached no upstream
    ledger_settled()
    assert RequestRecord.objects.filter(outcome="rate_limit_exceeded", status_code=429).count() == 1


# --- concurrent -----------------------------------------------------------------------------------


def _in_threads(*calls):
    results: list = [None] * len(calls)

    def run(i, call):
        results[i] = call()

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_concurrent_1_refuses_the_second_of_two_simultaneous_slow_requests_then_frees_the_slot(
    gateway, two_assignments, backend, minute_clock
):
    a, _, _ = two_assignments
    _limit(concurrent=1)
    a.script("gpt-5", slow_stream(0.3, "one two three"))  # about a second per stream
    body = {**CHAT, "stream": True}

    first, second = _in_threads(lambda: _chat(gateway, body), lambda: _chat(gateway, body))

    statuses = sorted([first.status_code, second.status_code])
    assert statuses == [200, 429]
    refused = first if first.status_code == 429 else second
    _assert_refused_openai(refused, "concurrent")
    assert refused.headers["retry-after"] == "1"
    assert a.hit_count() == 1
    # Both ended: the slot is free again for the next request.
    a.script("gpt-5", serve())
    assert _chat(gateway).status_code == 200


def test_the_slot_is_freed_when_every_upstream_fails(gateway, two_assignments, backend, minute_clock):
    a, b, _ = two_assignments
    _limit(concurrent=1)
    a.script("gpt-5", unavailable())
    b.script("gpt-5", unavailable())
    assert _chat(gateway).status_code == 503
    a.script("gpt-5", serve())
    assert _chat(gateway).status_code == 200


def test_the_slot_is_freed_when_the_client_goes_away_mid_stream(
    gateway, two_assignments, backend, minute_clock
):
    a, _, _ = two_assignments
    _limit(concurrent=1)
    a.script("gpt-5", slow_stream(0.5, "a b c d e f g h i j k l"), serve())
    with httpx.stream(
        "POST", f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH, timeout=15
    ) as response:
        assert response.status_code == 200
        next(response.iter_raw())  # the stream has begun; now the client hangs up
    deadline = time.monotonic() + 10
    while (status := _chat(gateway).status_code) == 429 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status == 200


def test_a_crashed_nodes_slot_is_taken_again_once_its_lease_runs_out(backend, minute_clock, transactional_db):
    """A node that died holding a slot never frees it; its lease does, LEASE_S later."""
    from tests.factories import GatewayKeyFactory

    key = GatewayKeyFactory(name="crash", raw_key="sk-gw-crash-test-0123456789")
    caps = KeyLimits(concurrent=1)

    async def scenario(monkeypatch_clock):
        held = await limits.admit(key.pk, caps)
        held._finalizer.detach()  # the node "crashes": nothing will ever end this ticket
        held._renewer.cancel()
        with pytest.raises(limits.LimitExceeded):
            await limits.admit(key.pk, caps)
        monkeypatch_clock(limits.LEASE_S + 2)
        taken = await limits.admit(key.pk, caps)
        await taken.end(0)

    def shift(seconds):
        limits.clock = lambda: minute_clock + seconds

    original = limits.clock
    try:
        asyncio.run(scenario(shift))
    finally:
        limits.clock = original


# --- tpm ------------------------------------------------------------------------------------------


def test_tpm_refuses_once_the_minutes_reported_tokens_reach_the_limit(
    gateway, two_assignments, backend, minute_clock
):
    a, _, _ = two_assignments
    _limit(tpm=50)
    a.script("gpt-5", serve("one two", input_tokens=20, output_tokens=10))  # 30 tokens a request
    assert _chat(gateway).status_code == 200  # 30 < 50
    assert _chat(gateway).status_code == 200  # admitted at 30; the minute reaches 60
    ledger_settled()

    refused = _chat(gateway)

    _assert_refused_openai(refused, "tpm")
    assert a.hit_count() == 2


# --- keys without limits and the single statement ------------------------------------------------


def test_a_key_without_limits_never_reaches_the_limiter(gateway, two_assignments, backend, monkeypatch):
    async def forbidden(*args, **kwargs):
        raise AssertionError("a key without limits must not pay a round trip")

    monkeypatch.setattr(limits, "admit", forbidden)
    assert [_chat(gateway).status_code for _ in range(5)] == [200] * 5
    assert not KeyLimitWindow.objects.exists() and not KeyLimitSlot.objects.exists()
    if backend == "redis":
        from django.conf import settings

        assert _redis_keys(settings.GATEWAY_REDIS_PREFIX) == []


def test_the_limits_come_with_the_key_in_its_one_statement(two_assignments):
    _limit(rpm=3, tpm=1000, concurrent=2)
    with CaptureQueriesContext(connection) as queries:
        authenticated = key_authenticate(GATEWAY_KEY)
    assert len(queries.captured_queries) == 1
    assert authenticated.limits == KeyLimits(rpm=3, tpm=1000, concurrent=2)


# --- every route, every end -----------------------------------------------------------------------


def test_a_files_upload_counts_and_is_refused_before_any_byte_goes_upstream(
    gateway, two_assignments, backend, minute_clock
):
    a, b, _ = two_assignments
    _limit(rpm=1)
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, max_retries=0, timeout=15)
    client.files.create(file=("a.jsonl", b'{"x": 1}\n'), purpose="user_data")

    with pytest.raises(openai.RateLimitError) as raised:
        client.files.create(file=("b.jsonl", b'{"x": 2}\n'), purpose="user_data")

    assert raised.value.response.headers["x-should-retry"] == "true"
    assert int(raised.value.response.headers["retry-after"]) >= 1
    assert len(a.files) + len(b.files) == 1


def test_the_slot_is_freed_when_the_request_path_raises(gateway, two_assignments, backend, minute_clock):
    """An exception nobody expected (a bug) ends the request with a 500; the slot it held does not
    stay taken until its lease runs out."""
    from proxy.relay import Relay

    _limit(concurrent=1)
    original = Relay.run

    async def broken(self):
        raise RuntimeError("a bug")

    Relay.run = broken
    try:
        assert _chat(gateway).status_code == 500
    finally:
        Relay.run = original
    deadline = time.monotonic() + 5
    while (status := _chat(gateway).status_code) == 429 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status == 200


def test_a_running_requests_lease_is_renewed_until_it_ends(backend, transactional_db, monkeypatch):
    """A request that runs longer than the lease keeps its slot (its node renews the lease), and
    gives it back when it ends."""
    from tests.factories import GatewayKeyFactory

    key = GatewayKeyFactory(name="long", raw_key="sk-gw-long-running-0123456789")
    monkeypatch.setattr(limits, "LEASE_S", 0.6)
    monkeypatch.setattr(limits, "clock", time.time)
    caps = KeyLimits(concurrent=1)

    async def scenario() -> None:
        running = await limits.admit(key.pk, caps)
        await asyncio.sleep(1.5)  # more than twice the lease
        with pytest.raises(limits.LimitExceeded):
            await limits.admit(key.pk, caps)
        await running.end(0)
        await (await limits.admit(key.pk, caps)).end(0)

    asyncio.run(scenario())
