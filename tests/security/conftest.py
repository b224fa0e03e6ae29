"""The adversarial suite (issue 45, SECURITY.md): attacks against the gateway as production serves it
(`python -m gatewaysite.server`, a real uvicorn process on a database of its own: SQLite, or PostgreSQL
when DATABASE_URL names one), each test marked `attack` (`make attack` runs them alone) and naming the
threat of SECURITY.md it covers. After each attack the worker must still answer `/healthz` promptly.

`served`: one such gateway for a test module, with one pool whose account `acct-bedrock` is a
Chat-shaped (`openai_compatible`) fake that gives every answer the same id, `chatcmpl-bedrock`, as
Bedrock's streamed answers do; the key is `KEY`.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from devkit.databases import Database
from devkit.gateway import GatewayProcess, gateway_config
from devkit.harness import PYTHON, free_port, spawn, stop

KEY = "sk-gw-attack-test-key-0123456789"
UPSTREAM_KEY_ENV = "GATEWAY_UPSTREAM_ATTACK_KEY"
MODEL = "gpt-5"
CLIENT_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 3.0


def responsive(base: str) -> bool:
    """Whether the worker answers `/healthz` within 100 ms (any of three tries: a loaded machine may
    delay one; a frozen worker answers none)."""
    for _ in range(3):
        try:
            if httpx.get(f"{base}/healthz", timeout=0.1).status_code == 200:
                return True
        except httpx.TransportError:
            pass
    return False


@pytest.fixture(scope="module")
def repeating_upstream(tmp_path_factory) -> Iterator[str]:
    """A fast fake whose every answer carries the id `chatcmpl-bedrock`: its base URL."""
    port = free_port()
    log = tmp_path_factory.mktemp("upstream") / "upstream.log"
    proc = spawn(
        [PYTHON, "-m", "devkit.fast_upstream", "--port", str(port), "--name", "bedrock", "--models", MODEL],
        {"PATH": "/usr/bin:/bin"},
        log,
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1"
    stop(proc)


@pytest.fixture(scope="module")
def served(tmp_path_factory, repeating_upstream) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("served")
    database = Database.create(workdir)
    process = GatewayProcess(
        database,
        workdir,
        env_extra={
            UPSTREAM_KEY_ENV: "sk-attack-upstream",
            "GATEWAY_CLIENT_TIMEOUT_S": str(CLIENT_TIMEOUT_S),
            "GATEWAY_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
            # Every large block mmapped and given back when freed (glibc would otherwise raise the
            # threshold and keep freed megabytes): the RSS the tests read is what the process holds.
            "MALLOC_MMAP_THRESHOLD_": "131072",
        },
    )
    config = gateway_config(
        {"bedrock": repeating_upstream}, key=KEY, key_env=UPSTREAM_KEY_ENV, models=(MODEL,)
    )
    config["pools"][0]["assignments"][0]["adapter"] = "openai_compatible"
    process.prepare(config)
    process.start()
    yield process
    process.kill()
    database.drop()
