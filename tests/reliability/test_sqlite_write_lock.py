"""The SQLite default under a held write lock (issue 21): another process holds the database's write
lock (a backup, a migration, an operator's shell) while requests arrive. Requests that need a write
(a Responses answer remembers its response id for `previous_response_id`) wait for it; requests that
need no write (a Chat Completions answer on healthy circuits) are answered at once, never a 503.

Before the fix the request path's reads and writes shared one small thread pool: four Responses
requests waiting for the lock held every thread, and every other request's reads queued behind them
until their read timeout (503 gateway_unavailable after 5 s).

The gateway is a real uvicorn process on a fresh SQLite file; the lock is SQLite's own (`BEGIN
IMMEDIATE` on another connection, devkit/databases.py LedgerStall). Nothing here measures time: the
test holds the lock until the chat requests are answered and checks the order of events."""

import secrets
import threading

import httpx
import pytest
from django.db import connection

from devkit.databases import Database, LedgerStall
from devkit.gateway import GatewayProcess, gateway_config
from devkit.upstream import FakeUpstream

pytestmark = pytest.mark.skipif(
    connection.vendor != "sqlite", reason="SQLite's database-wide write lock (the embedded default)"
)

KEY_ENV = "GATEWAY_UPSTREAM_LOCK_TEST_KEY"
CHAT = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "gpt-5", "input": "hi"}
WAITING_WRITERS = 6  # more than the request path's database threads


@pytest.fixture
def gateway(tmp_path):
    upstream = FakeUpstream("locked").start()
    key = f"sk-gw-lock-{secrets.token_hex(16)}"
    database = Database.create(tmp_path, server_url="")
    process = GatewayProcess(database, tmp_path, env_extra={KEY_ENV: "sk-upstream-" + "x" * 20})
    try:
        process.prepare(gateway_config({"locked": upstream.base_url}, key=key, key_env=KEY_ENV))
        process.start()
        yield process, database, upstream, {"authorization": f"Bearer {key}"}
    finally:
        process.kill()
        upstream.stop()


def test_a_held_write_lock_delays_only_the_requests_that_write(gateway):
    process, database, upstream, headers = gateway
    with httpx.Client(base_url=process.url, headers=headers, timeout=60) as client:
        assert client.post("/v1/responses", json=RESPONSES).status_code == 200  # warm: one of each
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    served_before = upstream.hit_count(path="/v1/responses")

    lock = LedgerStall(database)
    lock.acquire()
    released = threading.Event()
    writers: list[tuple[int, bool]] = []  # (status, finished before the lock was released)

    def responses_request() -> None:
        with httpx.Client(base_url=process.url, headers=headers, timeout=60) as client:
            status = client.post("/v1/responses", json=RESPONSES).status_code
        writers.append((status, not released.is_set()))

    threads = [threading.Thread(target=responses_request) for _ in range(WAITING_WRITERS)]
    try:
        for t in threads:
            t.start()
        # Every one of them has its answer from the upstream: each now waits for its write.
        pause = threading.Event()
        for _ in range(200):
            if upstream.hit_count(path="/v1/responses") >= served_before + WAITING_WRITERS:
                break
            pause.wait(0.05)
        reached = upstream.hit_count(path="/v1/responses") - served_before
        assert reached == WAITING_WRITERS, (
            f"only {reached} of {WAITING_WRITERS} Responses requests reached the upstream: the others' "
            "reads wait behind the writes stuck on the lock"
        )

        with httpx.Client(base_url=process.url, headers=headers, timeout=60) as client:
            chats = [client.post("/v1/chat/completions", json=CHAT) for _ in range(WAITING_WRITERS)]
        still_waiting = sum(t.is_alive() for t in threads)
    finally:
        released.set()
        lock.release()
    for t in threads:
        t.join(60)

    assert [c.status_code for c in chats] == [200] * WAITING_WRITERS, [c.text[:200] for c in chats]
    # The lock was really in the way: the writers were still waiting when the chats were answered...
    assert still_waiting == WAITING_WRITERS
    # ...and once it is released they are answered too, none of them before.
    assert sorted(writers) == [(200, False)] * WAITING_WRITERS
