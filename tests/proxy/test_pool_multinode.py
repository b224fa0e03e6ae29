"""A pool across two gateway processes on one PostgreSQL (SPEC §5.4, §7.1): both nodes spread the
same way, a conversation keeps its account whichever node serves its next turn, and a healed account
is probed by exactly one request across the nodes."""

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
import pytest
from django.db import connection
from django.utils import timezone

from devkit.behaviours import slow_stream
from pools.models import Assignment
from routing.models import Affinity, Circuit
from routing.policy.types import ASSIGNMENT_WIDE
from tests.gateway_fixtures import GATEWAY_KEY

AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
CHAT = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="two processes need a shared server database (PostgreSQL)"
)


@pytest.fixture
def nodes(two_assignments, gateway_nodes):
    Assignment.objects.update(tier=0)  # equal accounts, before the nodes read the configuration
    return gateway_nodes.start(2)


def _post(node: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(
        f"{node}/v1/chat/completions", json=CHAT, headers={**AUTH, **(headers or {})}, timeout=15
    )


def test_both_nodes_spread_equal_accounts(nodes, two_assignments):
    a, b, _ = two_assignments
    for node in nodes:
        before = (a.hit_count(), b.hit_count())
        for _ in range(30):
            assert _post(node).status_code == 200
        # Each account drawn with chance 1/2: fewer than 5 of 30 happens once in 10^5 runs per node.
        assert a.hit_count() - before[0] >= 5 and b.hit_count() - before[1] >= 5


def test_a_conversation_keeps_its_account_across_nodes(nodes, two_assignments):
    a, b, _ = two_assignments
    for conversation in range(6):
        headers = {"x-claude-code-session-id": f"conversation-{conversation}"}
        before = (a.hit_count(), b.hit_count())
        for turn in range(6):
            assert _post(nodes[turn % 2], headers).status_code == 200
        gained = (a.hit_count() - before[0], b.hit_count() - before[1])
        assert sorted(gained) == [0, 6], gained  # all six turns, on both nodes, on one account
    assert Affinity.objects.filter(kind="session").count() == 6


def test_a_healed_account_is_probed_by_one_request_across_nodes(nodes, two_assignments):
    a, b, (acct_a, _) = two_assignments
    a.script("gpt-5", slow_stream(1.0, "probe"))  # the probe is in flight while the others arrive
    Circuit.objects.create(
        pool=acct_a.pool,
        assignment=acct_a,
        model=ASSIGNMENT_WIDE,
        route_class=ASSIGNMENT_WIDE,
        state="open",
        reason="credential_rejected",
        consecutive_failures=1,
        cooldown_seconds=60,
        open_until=timezone.now() - timedelta(seconds=1),
    )
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: _post(nodes[i % 2]), range(8)))
    assert [r.status_code for r in answers] == [200] * 8
    assert a.hit_count() == 1  # the one probe, whichever node took the lease
    assert b.hit_count() == 7
    assert Circuit.objects.get(assignment=acct_a).state == "closed"
