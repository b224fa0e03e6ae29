"""Per-key limits across nodes: two uvicorn processes on one PostgreSQL, the counts in the database
(no REDIS_URL) or in Redis; and the check-and-count step itself under many simultaneous callers, each
with its own connection (the way several nodes reach the same rows and keys)."""

import asyncio
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from django.db import connection, connections

from pools.models import GatewayKey, KeyLimitSlot
from pools.selectors import KeyLimits
from proxy import limits
from tests.gateway_fixtures import GATEWAY_KEY

REPO = Path(__file__).resolve().parents[2]
AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
CHAT = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}
REDIS_URL = "redis://127.0.0.1:6379/0"

postgres = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="several nodes need a shared server database (PostgreSQL)"
)


def _redis_clean(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        for k in client.scan_iter(f"{prefix}:*"):
            client.delete(k)
    finally:
        client.close()


@pytest.fixture(params=["database", "redis"])
def nodes(request, two_assignments, gateway_nodes):
    """Two uvicorn processes serving the gateway on the test database, counting limits in the
    database or in Redis (a prefix of this test's own)."""
    prefix = f"gw-test-{uuid.uuid4().hex[:12]}"
    redis_url = REDIS_URL if request.param == "redis" else ""
    try:
        yield gateway_nodes.start(2, REDIS_URL=redis_url, GATEWAY_REDIS_PREFIX=prefix)
    finally:
        gateway_nodes.stop()
        _redis_clean(prefix)


def _early_in_a_minute(margin_s: float = 20) -> None:
    """The nodes count UTC clock minutes with the real clock: start where `margin_s` of the minute
    is certainly left, so that the requests of one test fall in one window."""
    left = 60 - time.time() % 60
    if left < margin_s:
        time.sleep(left + 0.2)


@postgres
@pytest.mark.parametrize("order", [(0, 1, 0, 1), (1, 1, 1, 0)])
def test_the_fourth_request_of_an_rpm_3_key_is_refused_whichever_node_it_reaches(
    nodes, two_assignments, order
):
    a, b, _ = two_assignments
    GatewayKey.objects.filter(name="e2e").update(limit_rpm=3)
    _early_in_a_minute()
    answers = [
        httpx.post(f"{nodes[n]}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=15) for n in order
    ]

    assert [r.status_code for r in answers] == [200, 200, 200, 429]
    refused = answers[3]
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.headers["x-should-retry"] == "true" and 1 <= int(refused.headers["retry-after"]) <= 60
    assert a.hit_count() + b.hit_count() == 3


@postgres
def test_concurrent_1_holds_across_nodes(nodes, two_assignments):
    from devkit.behaviours import slow_stream

    a, _, _ = two_assignments
    GatewayKey.objects.filter(name="e2e").update(limit_concurrent=1)
    a.script("gpt-5", slow_stream(0.3, "one two three four"))
    results: dict[int, httpx.Response] = {}

    def call(n: int) -> None:
        body = {**CHAT, "stream": True}
        results[n] = httpx.post(f"{nodes[n]}/v1/chat/completions", json=body, headers=AUTH, timeout=15)

    threads = [threading.Thread(target=call, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert sorted(r.status_code for r in results.values()) == [200, 429]
    assert a.hit_count() == 1


# --- the check-and-count step under simultaneous callers ------------------------------------------


def _simultaneously(count: int, call) -> list:
    """`call()` from `count` threads released together; each thread has its own connection."""
    barrier, results = threading.Barrier(count), [None] * count

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = call()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


@pytest.fixture
def key(transactional_db):
    from tests.factories import GatewayKeyFactory

    return GatewayKeyFactory(name="burst", raw_key="sk-gw-burst-test-0123456789")


@postgres
def test_the_database_admits_exactly_rpm_of_many_simultaneous_requests(key):
    now = 1_800_000_001.0
    results = _simultaneously(16, lambda: limits.db_admit(key.pk, KeyLimits(rpm=5), uuid.uuid4().hex, now))
    assert sorted(refused or "admitted" for refused, _ in results) == ["admitted"] * 5 + ["rpm"] * 11


@postgres
def test_the_database_hands_out_exactly_concurrent_slots_to_simultaneous_requests(key):
    now = 1_800_000_001.0
    results = _simultaneously(
        12, lambda: limits.db_admit(key.pk, KeyLimits(concurrent=3), uuid.uuid4().hex, now)
    )
    slots = sorted(slot for refused, slot in results if refused is None)
    assert slots == [0, 1, 2]
    assert KeyLimitSlot.objects.filter(key=key).count() == 3


@pytest.mark.parametrize(
    ("caps", "admitted", "refused"),
    [(KeyLimits(rpm=5), 5, "rpm"), (KeyLimits(concurrent=3), 3, "concurrent")],
)
def test_redis_admits_exactly_the_limit_of_many_simultaneous_requests(settings, caps, admitted, refused):
    prefix = f"gw-test-{uuid.uuid4().hex[:12]}"
    settings.REDIS_URL, settings.GATEWAY_REDIS_PREFIX = REDIS_URL, prefix
    now = 1_800_000_001.0

    async def burst() -> list:
        # Twenty calls in flight at once, each on its own connection from the client's pool.
        return await asyncio.gather(*(limits.redis_admit(7, caps, uuid.uuid4().hex, now) for _ in range(20)))

    try:
        results = asyncio.run(burst())
    finally:
        _redis_clean(prefix)
    assert sorted(r or "admitted" for r in results) == ["admitted"] * admitted + [refused] * (20 - admitted)
