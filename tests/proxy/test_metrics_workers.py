"""/metrics under several worker processes (issue 20): a scrape sums every worker, whichever answers."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from django.db import connection
from prometheus_client.multiprocess import MultiProcessCollector

from devkit.harness import free_port
from gatewaysite.server import workers
from tests.gateway_fixtures import GATEWAY_KEY

REPO = Path(__file__).resolve().parents[2]
AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
CHAT = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}
OK_SERIES = re.compile(
    r'^gateway_requests_total\{outcome="ok",route="/v1/chat/completions",status_class="2xx",'
    r'transport="http"\} (\S+)$',
    re.M,
)


def _ok_requests(families) -> float:
    return sum(
        sample.value
        for family in families
        if family.name == "gateway_requests"
        for sample in family.samples
        if sample.name == "gateway_requests_total"
        and sample.labels.get("outcome") == "ok"
        and sample.labels.get("route") == "/v1/chat/completions"
    )


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ([], {}, 1),
        (["--workers", "3"], {}, 3),
        (["--workers=2"], {}, 2),
        ([], {"WEB_CONCURRENCY": "4"}, 4),
        (["--workers", "2"], {"WEB_CONCURRENCY": "4"}, 2),
        (["--workers", "x"], {}, 1),
    ],
)
def test_the_server_counts_workers_as_uvicorn_does(args, env, expected, monkeypatch):
    monkeypatch.delenv("WEB_CONCURRENCY", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert workers(args) == expected


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="two worker processes need a shared server database (PostgreSQL)",
)
def test_a_scrape_sums_every_workers_requests(two_assignments, tmp_path):
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    (metrics_dir / "counter_999999.db").write_bytes(b"left over from an earlier run")
    db = connection.settings_dict
    database = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    env = {
        **os.environ,
        "DATABASE_URL": database,
        "DATABASE_CONN_MAX_AGE": "0",
        "DJANGO_SECRET_KEY": "test-only-secret-key-not-for-deployment",
        "DJANGO_DEBUG": "false",
        "GATEWAY_LOG_LEVEL": "WARNING",
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
    }
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "gatewaysite.server", "--port", str(port), "--workers", "2"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        else:
            pytest.fail("the gateway did not start")
        assert not (metrics_dir / "counter_999999.db").exists()  # an earlier run's counts are gone

        # New connections until both workers have served (the kernel decides who accepts).
        def per_worker() -> list[float]:
            return [
                _ok_requests(MultiProcessCollector.merge([str(f)])) for f in metrics_dir.glob("counter_*.db")
            ]

        sent = 0
        while sent < 400 and sum(1 for n in per_worker() if n) < 2:
            with httpx.Client() as client:
                assert client.post(f"{url}/v1/chat/completions", json=CHAT, headers=AUTH).status_code == 200
            sent += 1
        # A worker counts what it answered in batches, within OBSERVE_EVERY_S (proxy.ledger.recorder).
        deadline = time.monotonic() + 5
        while sum(shares := per_worker()) < sent and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sum(1 for n in shares if n) == 2, "one worker took every connection"
        assert sum(shares) == sent

        # Each worker alone holds only its share: any scrape that showed one worker would be short.
        for _ in range(6):
            with httpx.Client() as client:
                body = client.get(f"{url}/metrics").text
            assert [float(v) for v in OK_SERIES.findall(body)] == [sent]
            assert body.count("# TYPE gateway_open_circuits gauge") == 1
    finally:
        proc.terminate()
        proc.wait(20)
