"""A PostgreSQL outage in the middle of a load loses no ledger row (SPEC §7.3, issue #13).

The test starts its own PostgreSQL cluster (initdb/pg_ctl of the installed server) on its own port,
a gateway (uvicorn) on it and a load of streamed and plain requests; stops the cluster for
GATEWAY_TEST_OUTAGE_S seconds (default 8; the issue's scenario is 30: `GATEWAY_TEST_OUTAGE_S=30`),
starts it again and keeps the load going. Requests in flight when it stopped finish and requests
that arrive meanwhile get a typed 503; afterwards every answer the clients received has exactly one
RequestRecord, written from the gateway's local spool once the database returned.
"""

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from devkit.harness import free_port
from devkit.upstream import FakeUpstream, slow_stream

REPO = Path(__file__).resolve().parents[2]
OUTAGE_S = float(os.environ.get("GATEWAY_TEST_OUTAGE_S", "8"))
KEY = "sk-gw-outage-test-key-0123456789"
PG_BINS = sorted(glob.glob("/usr/lib/postgresql/*/bin"))

pytestmark = pytest.mark.skipif(
    not PG_BINS or (os.geteuid() == 0 and not shutil.which("runuser")),
    reason="needs the installed PostgreSQL server binaries (initdb, pg_ctl)",
)


class Cluster:
    """A throwaway PostgreSQL cluster (as the `postgres` user when the tests run as root)."""

    def __init__(self, root: Path) -> None:
        self.bin = Path(PG_BINS[-1])
        self.data, self.log = root / "data", root / "server.log"
        self.port = free_port()
        self.as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_owner:
            shutil.chown(root, "postgres")
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"
        )

    def _run(self, *cmd: str) -> None:
        subprocess.run([*self.as_owner, *cmd], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start"
        )

    def stop(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"


@pytest.fixture
def cluster():
    # Not under pytest's tmp dir: its root-only parents would keep the `postgres` user out.
    root = Path(tempfile.mkdtemp(prefix="gateway-pg-outage-"))
    cluster = Cluster(root)
    cluster.start()
    yield cluster
    subprocess.run(
        [*cluster.as_owner, str(cluster.bin / "pg_ctl"), "-D", str(cluster.data), "-m", "immediate", "stop"],
        capture_output=True,
        timeout=60,
    )
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def upstream():
    with FakeUpstream("outage", ("gpt-5",)) as fake:
        yield fake


@pytest.fixture
def gateway(cluster, upstream, tmp_path):
    config = tmp_path / "gateway.yaml"
    config.write_text(
        f"""
pools:
  - name: main
    assignments:
      - name: acct-a
        adapter: openai
        base_url: {upstream.base_url}
        api_key_env: GATEWAY_UPSTREAM_OUTAGE
        models:
          - id: gpt-5
keys:
  - name: load
    key: {KEY}
    pools: [main]
    allowed_models: ["*"]
"""
    )
    spool = tmp_path / "spool"
    env = {
        **os.environ,
        "DATABASE_URL": cluster.url,
        "DJANGO_SECRET_KEY": "test-only-secret-key-not-for-deployment",
        "DJANGO_DEBUG": "false",
        "GATEWAY_LOG_LEVEL": "WARNING",
        "GATEWAY_UPSTREAM_OUTAGE": "sk-upstream-outage",
        "GATEWAY_LEDGER_SPOOL_DIR": str(spool),
    }
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v0"], cwd=REPO, env=env, check=True, timeout=300)
    subprocess.run([*manage, "load_gateway_config", str(config)], cwd=REPO, env=env, check=True, timeout=120)
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", "gatewaysite.asgi:application", "--port", str(port)]
    log = (tmp_path / "gateway.log").open("wb")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)
    else:
        pytest.fail("the gateway did not start")
    yield url, spool
    proc.terminate()
    proc.wait(30)
    log.close()


def _load(url: str, stop: threading.Event, answers: list[tuple[str, int, float]]) -> None:
    auth = {"authorization": f"Bearer {KEY}"}
    chat = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(timeout=30) as client:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                response = client.post(
                    f"{url}/v1/chat/completions", json={**chat, "stream": n % 2 == 0}, headers=auth
                )
            except httpx.TransportError:
                continue  # no answer reached the client: nothing it could look up
            answers.append((response.headers["x-gateway-request-id"], response.status_code, time.monotonic()))


def test_a_database_outage_under_load_loses_no_ledger_row(cluster, upstream, gateway):
    url, spool = gateway
    upstream.script("gpt-5", slow_stream(0.1, "one two three four five"))  # about 0.6 s per answer
    stop = threading.Event()
    answers: list[tuple[str, int, float]] = []
    workers = [threading.Thread(target=_load, args=(url, stop, answers)) for _ in range(6)]
    for worker in workers:
        worker.start()
    time.sleep(2)
    cluster.stop()
    down_at = time.monotonic()
    time.sleep(OUTAGE_S)
    cluster.start()
    up_at = time.monotonic()
    time.sleep(3)
    stop.set()
    for worker in workers:
        worker.join(60)

    during = [(rid, status) for rid, status, at in answers if down_at < at < up_at]
    assert any(status == 200 for _, status, at in answers if at < down_at)
    assert any(status == 503 for _, status in during), "requests during the outage get a typed 503"
    assert any(status == 200 for _, status, at in answers if at > up_at + 1), "served again after it"
    ids = [rid for rid, _, _ in answers]
    assert len(set(ids)) == len(ids)

    deadline = time.monotonic() + 60
    while True:
        with psycopg.connect(cluster.url) as db:
            rows = db.execute(
                "SELECT request_id, count(*) FROM proxy_requestrecord GROUP BY request_id"
            ).fetchall()
        stored = dict(rows)
        if set(ids) <= stored.keys() or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    missing = [rid for rid in ids if rid not in stored]
    assert missing == [], f"{len(missing)} of {len(ids)} answered requests have no ledger row"
    assert all(stored[rid] == 1 for rid in ids)
    assert list(spool.glob("ledger-*.jsonl")) == []  # the spool was replayed and emptied
