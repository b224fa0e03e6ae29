"""Faults around the gateway, injected for real: its database going away and coming back, an upstream
dying mid-stream, and SIGTERM while a stream is in flight.

- Database: a gateway process (uvicorn) reaches PostgreSQL through a TCP forwarder on loopback that
  the test stops and restarts. While the database is unreachable, requests fail fast with a typed
  503 `gateway_unavailable` and /readyz says 503; once it is back, the same process serves again.
  Both ways a database goes away: the host refuses connections (the forwarder stopped), and a
  network partition (the forwarder keeps every socket open and moves no byte), where a request must
  still end, typed, within its deadline. PostgreSQL only (an SQLite file has no socket to cut).
- Upstream killed mid-stream: the client keeps the visible part and gets one sanitized terminal
  event, never a 500, and the request has its RequestRecord.
- SIGTERM mid-stream: the stream finishes (or, past the server's grace period, ends with a typed
  terminal event), the process exits by itself, and the ledger has the record. The ledger table is
  write-locked from another connection around the shutdown (a database that is slow at that moment),
  so only a flush at exit can save the record: a record lost on a fast exit is seen every time.
"""

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from django.db import connection

from devkit.behaviours import slow_stream
from devkit.databases import Database, LedgerStall
from devkit.gateway import GatewayProcess, gateway_config
from devkit.upstream import FakeUpstream
from tests.proxy.fixtures_e2e import AUTH, CHAT, RESPONSES, attempts_of, error_events, record_of, sse_events

KEY = "sk-gw-faults-0123456789abcdef"
UPSTREAM_KEY_ENV = "GATEWAY_UPSTREAM_FAULTS_KEY"
HEADERS = {"authorization": f"Bearer {KEY}"}
WORDS = "one two three four five six seven eight nine ten"
FAKE_MESSAGES = ("The server had an error while processing your request.",)
requires_postgres = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="the database is made unreachable over TCP: needs DATABASE_URL=postgres://...",
)


# --- a TCP forwarder the test can stop and restart ---------------------------------------------


class Forwarder:
    """127.0.0.1:<port> -> target, in its own thread and event loop.

    `down()` stops listening and resets every forwarded connection (the database host is gone:
    connection refused); `up()` listens again on the same port. `partition()` keeps every socket open
    but moves no more bytes and answers no new connection (a network partition: packets vanish);
    `heal()` moves bytes again."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="db-forwarder")
        self.server: asyncio.base_events.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.flowing = threading.Event()
        self.flowing.set()

    def __enter__(self) -> "Forwarder":
        self.thread.start()
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def up(self) -> None:
        self._call(self._listen())

    def down(self) -> None:
        self._call(self._close())

    def partition(self) -> None:
        self.flowing.clear()

    def heal(self) -> None:
        self.flowing.set()

    async def _flowing(self) -> None:
        while not self.flowing.is_set():
            await asyncio.sleep(0.05)

    async def _listen(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None
        for writer in list(self.writers):
            writer.transport.abort()
        self.writers.clear()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        await self._flowing()
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self.writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    await self._flowing()
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self.writers -= {writer, up_writer}


def _via(url: str, port: int) -> str:
    """`url` with its host and port replaced by the forwarder's."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{userinfo + '@' if userinfo else ''}127.0.0.1:{port}"))


@pytest.fixture
def fake_upstream_a(fake_upstream_factory) -> FakeUpstream:
    return fake_upstream_factory("a", models=("gpt-5",))


@pytest.fixture
def gateway_process(tmp_path: Path, fake_upstream_a, monkeypatch) -> Iterator:
    """`start(**kw)`: a gateway process on a fresh database (PostgreSQL when DATABASE_URL is, else an
    SQLite file) with pool `soak` -> the fake upstream `a`, and the key KEY."""
    monkeypatch.setenv(UPSTREAM_KEY_ENV, "sk-faults-upstream")
    started: list[tuple[GatewayProcess, Database]] = []

    def start(
        *,
        uvicorn_args: list[str] | None = None,
        via: str = "",
        database: Database | None = None,
        env: dict[str, str] | None = None,
    ) -> GatewayProcess:
        database = database or Database.create(tmp_path)
        process = GatewayProcess(
            database, tmp_path, uvicorn_args=uvicorn_args or [], database_url=via, env_extra=env or {}
        )
        started.append((process, database))
        config = gateway_config(
            {"a": fake_upstream_a.base_url},
            key=KEY,
            key_env=UPSTREAM_KEY_ENV,
            retry={"max_attempts": 2, "backoff_base_ms": 0, "default_deadline_ms": 60000},
        )
        process.prepare(config)
        process.start()
        return process

    yield start
    for process, database in started:
        process.kill()
        database.drop()


# --- (a) the database unreachable, then back ---------------------------------------------------


def _assert_gateway_unavailable(response: httpx.Response, took: float) -> None:
    label = f"{response.status_code} {response.text[:300]!r} after {took:.1f} s"
    assert took < 5.0, f"not fast: {label}"
    assert response.status_code == 503, label
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "code", "param"}, label
    assert body["error"]["code"] == "gateway_unavailable", label


@requires_postgres
def test_without_its_database_the_gateway_fails_fast_typed_and_recovers_without_restart(
    gateway_process, tmp_path
):
    database = Database.create(tmp_path, server_url=os.environ["DATABASE_URL"])
    target = (urlsplit(database.url).hostname or "127.0.0.1", database.port or 5432)
    with Forwarder(target) as forwarder:
        process = gateway_process(via=_via(database.url, forwarder.port), database=database)
        url = process.url
        served = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=HEADERS, timeout=10)
        assert served.status_code == 200, served.text
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200

        forwarder.down()
        for _ in range(3):
            started = time.monotonic()
            response = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=HEADERS, timeout=15)
            _assert_gateway_unavailable(response, time.monotonic() - started)
        started = time.monotonic()
        models = httpx.get(f"{url}/v1/models", headers=HEADERS, timeout=15)
        _assert_gateway_unavailable(models, time.monotonic() - started)
        assert httpx.get(f"{url}/readyz", timeout=15).status_code == 503
        assert httpx.get(f"{url}/healthz", timeout=15).status_code == 200  # alive, only not ready

        forwarder.up()
        deadline = time.monotonic() + 20
        while True:
            response = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=HEADERS, timeout=15)
            if response.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        assert response.status_code == 200, (
            f"not recovered 20 s after the database came back: {response.text}"
        )
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
        assert process.proc is not None and process.proc.poll() is None  # the same process, never restarted
        request_id = response.headers["x-gateway-request-id"]
        deadline = time.monotonic() + 10
        while not database.query("SELECT 1 FROM proxy_requestrecord WHERE request_id = %s", (request_id,)):
            assert time.monotonic() < deadline, "the request served after recovery has no RequestRecord"
            time.sleep(0.1)


# --- (b) an upstream killed mid-stream ---------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_an_upstream_killed_mid_stream_leaves_the_visible_part_and_one_sanitized_terminal_event(
    gateway, two_assignments, path
):
    a, b, _ = two_assignments
    a.script("gpt-5", slow_stream(0.3, WORDS))
    body = {**(CHAT if path.endswith("completions") else RESPONSES), "stream": True}
    received = b""
    with httpx.stream("POST", f"{gateway}{path}", json=body, headers=AUTH, timeout=15) as response:
        assert response.status_code == 200
        chunks = response.iter_raw()
        while b"one" not in received:  # the first visible word reached the client
            received += next(chunks)
        a.stop()  # the upstream dies: every connection closed mid-response
        started = time.monotonic()
        for chunk in chunks:
            received += chunk
    assert time.monotonic() - started < 5
    events = sse_events(received.decode())
    errors = error_events(events)
    assert len(errors) == 1, events
    assert events[-1].data.get("error") == errors[0] or events[-1].data == {"error": errors[0]}, events[-1]
    assert errors[0]["message"] not in FAKE_MESSAGES
    assert errors[0]["type"] and isinstance(errors[0]["message"], str)
    text = "".join(
        (e.data.get("delta") or "") if e.type == "response.output_text.delta" else _chat_delta(e.data)
        for e in events
        if isinstance(e.data, dict)
    )
    assert text and WORDS.startswith(text), text
    assert b.hit_count() == 0  # nothing is retried after visible output
    record = record_of(response)
    assert record.status_code == 200
    assert record.outcome not in ("ok", "")
    attempts = attempts_of(record)
    assert [(x.status, x.dispatch_state) for x in attempts] == [("failed", "unknown")]
    assert record.retry_count == 0


def _chat_delta(data: dict) -> str:
    choices = data.get("choices") or []
    return "".join((c.get("delta") or {}).get("content") or "" for c in choices if isinstance(c, dict))


# --- (c) SIGTERM while a stream is in flight ---------------------------------------------------


def _stream_through_sigterm(
    process: GatewayProcess, words: str, stall_cap_s: float
) -> tuple[bytes, float, int | None, float]:
    """Start a chat stream, SIGTERM the gateway once output began (with the ledger table locked from
    then until the process exits, at most `stall_cap_s`), read the stream to its end.
    Returns (what the client got, seconds from SIGTERM to the stream's end, exit code, seconds from
    SIGTERM to the exit)."""
    assert process.proc is not None
    stall = LedgerStall(process.database)
    body = {**CHAT, "stream": True}
    received = b""
    with httpx.stream(
        "POST", f"{process.url}/v1/chat/completions", json=body, headers=HEADERS, timeout=30
    ) as response:
        assert response.status_code == 200, response.read()
        chunks = response.iter_raw()
        while words.split()[0].encode() not in received:
            received += next(chunks)
        stall.acquire()
        sigterm_at = time.monotonic()
        process.proc.send_signal(signal.SIGTERM)
        try:
            for chunk in chunks:
                received += chunk
        except httpx.HTTPError:
            pass  # the connection was cut: what arrived is checked below
        stream_end = time.monotonic() - sigterm_at
    deadline = sigterm_at + stall_cap_s
    while process.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    stall.release()
    code = process.wait(20)
    return received, stream_end, code, time.monotonic() - sigterm_at


def _records(database: Database) -> list[tuple]:
    return database.query(
        "SELECT id, outcome, status_code, retry_count, finished_at FROM proxy_requestrecord ORDER BY id"
    )


def test_sigterm_lets_an_in_flight_stream_finish_and_the_ledger_keeps_its_record(
    gateway_process, fake_upstream_a
):
    fake_upstream_a.script("gpt-5", slow_stream(0.25, WORDS))
    process = gateway_process()
    received, stream_end, code, exited = _stream_through_sigterm(process, WORDS, stall_cap_s=10)
    events = sse_events(received.decode())
    assert events and events[-1].data == "[DONE]", events[-3:]  # the stream finished
    assert "".join(_chat_delta(e.data) for e in events if isinstance(e.data, dict)) == WORDS
    assert stream_end < 10
    assert code in (0, -signal.SIGTERM), f"exit code {code}"  # uvicorn re-raises SIGTERM after its shutdown
    assert exited < 15
    records = _records(process.database)
    assert len(records) == 1, "SIGTERM lost the ledger record of the stream that finished during shutdown"
    _, outcome, status, retries, finished_at = records[0]
    assert (outcome, status, retries) == ("ok", 200, 0) and finished_at is not None
    attempts = process.database.query(
        "SELECT ordinal, status, dispatch_state FROM proxy_attempt WHERE request_id = %s", (records[0][0],)
    )
    assert attempts == [(1, "succeeded", "completed")]


def test_sigterm_past_the_grace_period_ends_the_stream_with_a_typed_event_and_keeps_the_record(
    gateway_process, fake_upstream_a
):
    long_words = " ".join(f"w{i}" for i in range(60))  # 30 s at 0.5 s a word: longer than the grace
    fake_upstream_a.script("gpt-5", slow_stream(0.5, long_words))
    # The gateway's own grace (GATEWAY_SHUTDOWN_GRACE_S) is set below the server's, as the README says.
    process = gateway_process(
        uvicorn_args=["--timeout-graceful-shutdown", "3"], env={"GATEWAY_SHUTDOWN_GRACE_S": "1.5"}
    )
    received, stream_end, code, exited = _stream_through_sigterm(process, long_words, stall_cap_s=10)
    assert stream_end < 8, f"the stream outlived the 3 s grace period by {stream_end - 3:.1f} s"
    events = sse_events(received.decode())
    errors = error_events(events)
    assert len(errors) == 1 and events[-1].data == {"error": errors[0]}, (
        f"no typed terminal event at the end of a stream cut by the shutdown: {received[-300:]!r}"
    )
    assert errors[0]["message"] not in FAKE_MESSAGES
    assert code in (0, -signal.SIGTERM), f"exit code {code}"
    assert exited < 15
    records = _records(process.database)
    assert len(records) == 1, "the record of the stream cut at shutdown is missing"
    _, outcome, status, _, finished_at = records[0]
    assert outcome and status is not None and finished_at is not None  # complete, not half-written


@requires_postgres
def test_a_partitioned_database_gets_a_typed_503_within_the_deadline_and_recovers(gateway_process, tmp_path):
    database = Database.create(tmp_path, server_url=os.environ["DATABASE_URL"])
    target = (urlsplit(database.url).hostname or "127.0.0.1", database.port or 5432)
    with Forwarder(target) as forwarder:
        process = gateway_process(via=_via(database.url, forwarder.port), database=database)
        url = process.url
        assert (
            httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=HEADERS, timeout=10).status_code
            == 200
        )

        forwarder.partition()  # the open connections go silent; new ones are never answered
        deadline_headers = {**HEADERS, "x-gateway-deadline-ms": "3000"}
        for _ in range(2):
            started = time.monotonic()
            try:
                response = httpx.post(
                    f"{url}/v1/chat/completions", json=CHAT, headers=deadline_headers, timeout=15
                )
            except httpx.ReadTimeout:
                pytest.fail("no answer within 15 s while the database was partitioned (deadline 3 s)")
            took = time.monotonic() - started
            assert took < 8.0, f"{took:.1f} s for a request with a 3 s deadline"
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "gateway_unavailable", response.text
        started = time.monotonic()
        try:
            ready = httpx.get(f"{url}/readyz", timeout=15).status_code
        except httpx.ReadTimeout:
            ready = None
        assert (ready, time.monotonic() - started < 8.0) == (503, True), "readyz under a partition"

        forwarder.heal()
        deadline = time.monotonic() + 30
        while True:
            try:
                status = httpx.post(
                    f"{url}/v1/chat/completions", json=CHAT, headers=HEADERS, timeout=15
                ).status_code
            except httpx.ReadTimeout:
                status = None
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        assert status == 200, "not recovered 30 s after the partition healed"
