"""A PostgreSQL outage in the middle of a load loses no ledger row (SPEC §7.3, issue #13).

The test starts its own PostgreSQL cluster (initdb/pg_ctl of the installed server) on its own port,
a gateway (uvicorn) on it and a load of streamed and plain requests; stops the cluster for
GATEWAY_TEST_OUTAGE_S seconds (default 8; the issue's scenario is 30: `GATEWAY_TEST_OUTAGE_S=30`),
starts it again and keeps the load going. Requests in flight when it stopped finish and requests
that arrive meanwhile get a typed 503; afterwards every answer the clients received has exactly one
RequestRecord, written from the gateway's local spool once the database returned.
"""

import os
import shutil
import threading
import time

import httpx
import pytest

from devkit.behaviours import slow_stream
from devkit.databases import Database, PostgresCluster, postgres_available
from devkit.gateway import GatewayProcess, gateway_config
from devkit.upstream import FakeUpstream

OUTAGE_S = float(os.environ.get("GATEWAY_TEST_OUTAGE_S", "8"))
KEY = "sk-gw-outage-test-key-0123456789"

pytestmark = pytest.mark.skipif(
    not postgres_available() or (os.geteuid() == 0 and not shutil.which("runuser")),
    reason="needs the installed PostgreSQL server binaries (initdb, pg_ctl)",
)


@pytest.fixture
def cluster(tmp_path):
    cluster = PostgresCluster(tmp_path / "postgres.log")
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def upstream():
    with FakeUpstream("outage", ("gpt-5",)) as fake:
        yield fake


@pytest.fixture
def gateway(cluster, upstream, tmp_path):
    """The gateway (uvicorn) on a database of the cluster, with a spool of its own: (process, spool)."""
    spool = tmp_path / "spool"
    database = Database.create(tmp_path, server_url=cluster.url)
    process = GatewayProcess(
        database,
        tmp_path,
        env_extra={"GATEWAY_UPSTREAM_OUTAGE": "sk-upstream-outage", "GATEWAY_LEDGER_SPOOL_DIR": str(spool)},
    )
    process.prepare(gateway_config({"a": upstream.base_url}, key=KEY, key_env="GATEWAY_UPSTREAM_OUTAGE"))
    process.start()
    yield process, spool
    process.terminate(30)


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
    process, spool = gateway
    url = process.url
    upstream.script("gpt-5", slow_stream(0.1, "one two three four five"))  # about 0.6 s per answer
    stop = threading.Event()
    answers: list[tuple[str, int, float]] = []
    workers = [threading.Thread(target=_load, args=(url, stop, answers)) for _ in range(6)]
    for worker in workers:
        worker.start()
    time.sleep(2)
    cluster.take_down()
    down_at = time.monotonic()
    time.sleep(OUTAGE_S)
    cluster.bring_up()
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
        rows = process.database.query(
            "SELECT request_id, count(*) FROM proxy_requestrecord GROUP BY request_id"
        )
        stored = dict(rows)
        if set(ids) <= stored.keys() or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    missing = [rid for rid in ids if rid not in stored]
    assert missing == [], f"{len(missing)} of {len(ids)} answered requests have no ledger row"
    assert all(stored[rid] == 1 for rid in ids)
    assert list(spool.glob("ledger-*.jsonl")) == []  # the spool was replayed and emptied
