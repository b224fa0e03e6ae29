"""Two gateway processes on one PostgreSQL: health is shared through the database, not the process."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from django.db import connection

from routing.models import Circuit
from tests.fakes.upstream import model_not_found, serve
from tests.proxy.conftest import GATEWAY_KEY

REPO = Path(__file__).resolve().parents[2]
AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
CHAT = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="two processes need a shared server database (PostgreSQL)"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def nodes(two_assignments):
    """Two uvicorn processes serving the gateway on the test database."""
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DATABASE_CONN_MAX_AGE": "0",
        "DJANGO_SECRET_KEY": "test-only-secret-key-not-for-deployment",
        "DJANGO_DEBUG": "false",
        "GATEWAY_LOG_LEVEL": "WARNING",
    }
    procs, urls = [], []
    for _ in range(2):
        port = _free_port()
        cmd = [sys.executable, "-m", "uvicorn", "gatewaysite.asgi:application", "--port", str(port)]
        procs.append(
            subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        )
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        for _ in range(200):
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        else:
            pytest.fail(f"gateway node at {url} did not start")
    yield urls
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(15)


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
