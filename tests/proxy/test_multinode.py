"""Two gateway processes on one PostgreSQL: health is shared through the database, not the process."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.db import connection
from django.utils import timezone

from devkit.behaviours import Serve, model_not_found, serve, unavailable
from routing.models import Circuit
from tests.gateway_fixtures import GATEWAY_KEY

REPO = Path(__file__).resolve().parents[2]
AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
CHAT = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="two processes need a shared server database (PostgreSQL)"
)


@pytest.fixture(params=["300", "0"], ids=["kept-connections", "connection-per-read"])
def nodes(request, two_assignments, gateway_nodes):
    """Two uvicorn processes serving the gateway on the test database: with production's kept
    connections (the request's read on each node's pooled loop connections, runtime.loopdb) and with a
    new connection for every read."""
    # Each node names its own PostgreSQL connections, so a test can find the backends serving it.
    return [
        *gateway_nodes.start(1, DATABASE_CONN_MAX_AGE=request.param, PGAPPNAME="multinode-0"),
        *gateway_nodes.start(1, DATABASE_CONN_MAX_AGE=request.param, PGAPPNAME="multinode-1"),
    ]


def test_each_node_reads_on_its_own_kept_connection(request, nodes):
    """Production keeps connections (CONN_MAX_AGE 300): each node's read before dispatch goes out on
    that node's pooled loop connections (runtime.loopdb), which stay open after the request and serve
    the next ones: no new backend per read. With CONN_MAX_AGE 0 no reader outlives its read."""
    from routing.request_state import _request_state_sql

    kept = request.node.callspec.params["nodes"] == "300"
    head = _request_state_sql()[:60]

    def backends(app: str) -> tuple[set[int], set[int]]:
        """(every backend of the node, those idle after the request's read as their last statement)"""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid, state = 'idle' AND left(query, 60) = %s FROM pg_stat_activity "
                "WHERE application_name = %s",
                [head, app],
            )
            rows = cursor.fetchall()
        return {pid for pid, _ in rows}, {pid for pid, reader in rows if reader}

    rounds = []
    for _ in range(4):
        for node in nodes:
            answer = httpx.post(f"{node}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=10)
            assert answer.status_code == 200
        rounds.append([backends(f"multinode-{i}") for i in range(len(nodes))])
    first = rounds[0]
    if kept:
        for i in range(len(nodes)):
            assert all(r[i][1] for r in rounds)  # a kept connection served the node's last read
            assert all(r[i][1] <= first[i][0] for r in rounds)  # one already open at the first
        assert not first[0][0] & first[1][0]  # each node its own
    else:
        # No reader outlives its read: each read's connection closes with it (its backend may take a
        # moment to go; a kept one would stay).
        deadline = time.monotonic() + 10
        while any(backends(f"multinode-{i}")[1] for i in range(len(nodes))) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(backends(f"multinode-{i}")[1] for i in range(len(nodes)))


def test_a_circuit_opened_through_one_node_is_honoured_by_the_other(nodes, two_assignments):
    from pools.models import GatewaySettings

    a, b, (acct_a, _) = two_assignments
    GatewaySettings.objects.filter(pk=1).update(
        failure_threshold=1, cooldown_seconds=600, max_cooldown_seconds=600
    )
    first, second = nodes
    # Both nodes have served (and cached whatever they cache) before the circuit opens.
    for node in nodes:
        assert (
            httpx.post(f"{node}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=10).status_code == 200
        )
    assert a.hit_count(model="gpt-5") == 2

    a.script("gpt-5", model_not_found())
    b.script("gpt-5", serve("from b"))
    opened = httpx.post(f"{first}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=10)
    assert (opened.status_code, opened.headers["x-gateway-attempts"]) == (200, "2")
    assert Circuit.objects.get(assignment=acct_a, route_class="http").state == "open"

    honoured = httpx.post(f"{second}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=10)
    assert honoured.status_code == 200
    assert honoured.headers["x-gateway-attempts"] == "1"  # the open circuit made acct-a ineligible
    assert honoured.json()["choices"][0]["message"]["content"] == "from b"
    assert a.hit_count(model="gpt-5") == 3  # no hit from the second node


def test_concurrent_streams_over_two_nodes_never_overspend_a_budget_by_more_than_one_reservation(
    nodes, two_assignments
):
    """SPEC §7.4: 50 streamed requests at once, half through each node, on a budget that covers a
    handful: the conditional UPDATE admits a reservation only while it fits beside those in flight, so
    what is spent in the end exceeds the budget by at most one reservation's estimate error."""
    import asyncio
    import json

    from catalog.models import CatalogEntry
    from devkit.behaviours import slow_stream
    from pools.models import GatewayKey

    a, b, _ = two_assignments
    CatalogEntry.objects.update(input_per_mtok_micros=1_000_000, output_per_mtok_micros=1_000_000)
    body = json.dumps({**CHAT, "stream": True, "max_tokens": 10}).encode()
    reservation = len(body) // 4 + 10  # 1 micro per token, prompt estimate + max_tokens
    budget = 4 * reservation
    GatewayKey.objects.update(budget_micros=budget)
    for fake in (a, b):  # each answer costs 10 input + 4 output tokens, well under its reservation
        fake.script("gpt-5", slow_stream(0.05, "one two three four"))

    async def one(client: httpx.AsyncClient, node: str) -> tuple[int, str]:
        response = await client.post(
            f"{node}/v1/chat/completions",
            content=body,
            headers={**AUTH, "content-type": "application/json"},
        )
        return response.status_code, response.text

    async def burst() -> list[tuple[int, str]]:
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=100)) as client:
            return await asyncio.gather(*(one(client, nodes[i % 2]) for i in range(50)))

    results = asyncio.run(burst())
    served = [text for status, text in results if status == 200]
    refused = [json.loads(text) for status, text in results if status == 429]
    assert len(served) + len(refused) == 50
    assert all("[DONE]" in text for text in served)
    assert {r["error"]["code"] for r in refused} <= {"budget_exceeded"}
    assert served and refused  # the budget really was the limit

    def settled() -> GatewayKey | None:
        key = GatewayKey.objects.get()
        return key if key.reserved_micros == 0 and key.spent_micros > 0 else None

    deadline = time.monotonic() + 15
    while (key := settled()) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert key is not None, "the nodes' ledgers did not settle the reservations"
    assert key.spent_micros == 14 * len(served)  # every served stream charged its actual usage
    assert key.spent_micros <= budget + reservation


def test_an_account_answering_503_is_ordered_last_by_the_other_node(nodes, two_assignments):
    """Transient health is shared too: after acct-a's circuit opened for upstream_unavailable through
    one node, the other node sends nothing to it while acct-b can serve (SPEC §5.4 group 3). A node
    that ignored circuits would try acct-a first and hand off (2 attempts)."""
    from pools.models import GatewaySettings

    a, b, (acct_a, _) = two_assignments
    GatewaySettings.objects.filter(pk=1).update(
        failure_threshold=1, cooldown_seconds=600, max_cooldown_seconds=600
    )
    first, second = nodes
    a.script("gpt-5", unavailable(503))
    b.script("gpt-5", serve("from b"))
    opened = httpx.post(f"{first}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=10)
    assert (opened.status_code, opened.headers["x-gateway-attempts"]) == (200, "2")
    assert Circuit.objects.get(assignment=acct_a).reason == "upstream_unavailable"
    for _ in range(3):
        honoured = httpx.post(f"{second}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=10)
        assert (honoured.status_code, honoured.headers["x-gateway-attempts"]) == (200, "1")
    assert a.hit_count(model="gpt-5") == 1


@pytest.mark.parametrize("reason", ["upstream_unavailable", "timeout", "credential_rejected"])
def test_after_the_cooldown_exactly_one_request_across_both_nodes_probes(nodes, two_assignments, reason):
    """SPEC §5.4/§7.1: in half-open exactly one request across all nodes (the lease holder) tries the
    assignment first, whatever the circuit's reason; every other request orders it last. Ten
    concurrent requests over two uvicorn processes, while the probe is still in flight."""
    a, b, (acct_a, _) = two_assignments
    wide = reason == "credential_rejected"  # an assignment-wide circuit: every model and route class
    Circuit.objects.create(
        pool=acct_a.pool,
        assignment=acct_a,
        model="*" if wide else "gpt-5",
        route_class="*" if wide else "http",
        state="open",
        reason=reason,
        consecutive_failures=3,
        cooldown_seconds=60,
        open_until=timezone.now() - timedelta(seconds=1),  # the cooldown just ended
    )
    a.script("gpt-5", Serve(text="probe answered", delay_s=1.5))  # the probe is slow: still in flight
    b.script("gpt-5", serve("from b"))
    start = threading.Barrier(10)

    def one(n: int) -> httpx.Response:
        start.wait()
        node = nodes[n % 2]
        return httpx.post(f"{node}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=20)

    with ThreadPoolExecutor(10) as pool:
        responses = list(pool.map(one, range(10)))
    assert [r.status_code for r in responses] == [200] * 10
    texts = sorted(r.json()["choices"][0]["message"]["content"] for r in responses)
    assert texts == ["from b"] * 9 + ["probe answered"]
    assert a.hit_count(model="gpt-5") == 1
    assert b.hit_count(model="gpt-5") == 9
    circuit = Circuit.objects.get(assignment=acct_a)
    assert (circuit.state, circuit.probes_in_flight) == ("closed", 0)  # the probe's success closed it
