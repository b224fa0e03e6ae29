"""Pytest fixtures for end-to-end tests: the gateway's ASGI app served on a real loopback socket
(uvicorn in a thread, sharing the test database), and pools of assignments on fake upstreams with the
e2e key; and several gateway processes on the test database (`gateway_nodes`, PostgreSQL). Registered
for the whole suite by tests/conftest.py, so tests in any directory request them by name."""

import asyncio
import contextlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from django.db import connection

from catalog.models import Provenance
from devkit.harness import PYTHON, free_port, spawn, stop, tail
from devkit.upstream import FakeUpstream
from gatewaysite.server import HttpToolsProtocol
from pools.models import Assignment, GatewaySettings
from proxy import limits
from proxy.ledger import recorder as ledger
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory

GATEWAY_KEY = "sk-gw-e2e-test-key-0123456789"
UPSTREAM_KEY_ENV = "GATEWAY_UPSTREAM_E2E_KEY"
UPSTREAM_KEY = "sk-upstream-credential-canary-42"


class _Server(uvicorn.Server):
    """uvicorn in a test's thread; `exit()` wakes its main loop at once, where uvicorn's own loop would
    notice `should_exit` at its next tick (0.1 s apart): half a tick saved in each of some 500 teardowns."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def install_signal_handlers(self) -> None:  # not the main thread
        pass

    async def main_loop(self) -> None:
        """uvicorn's `main_loop` (a tick every 0.1 s until `on_tick` says exit), woken by `exit`."""
        self._loop = asyncio.get_running_loop()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.1)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's `shutdown` (stop listening, ask each connection to close, wait until the connections
        and their tasks are gone), with its lifespan off. uvicorn sleeps 0.1 s after asking, then polls
        every 0.1 s: here every 5 ms, and a closed keep-alive connection is gone at once. Measured 0.1 s
        of the 0.11 s a gateway's teardown took, in each of some 450 tests a run."""
        for server in self.servers:
            server.close()
        for protocol in list(self.server_state.connections):
            protocol.shutdown()
        while self.server_state.connections or self.server_state.tasks:
            await asyncio.sleep(0.005)
        for server in self.servers:
            await server.wait_closed()

    def exit(self) -> None:
        self.should_exit = True
        if self._loop is not None:  # else the loop's first tick, still to come, sees `should_exit`
            with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone already
                self._loop.call_soon_threadsafe(self._wake.set)


@contextlib.contextmanager
def live(application, on_loop_exit: Callable[[], Awaitable[object]] | None = None) -> Iterator[str]:
    """`application` served by uvicorn on a loopback port, in a thread of its own, with the HTTP
    protocol production serves the gateway with (`gatewaysite.server`): its base URL. On leaving, the
    server stops listening, finishes the responses in flight and closes every connection, then awaits
    `on_loop_exit` on its loop."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = _Server(
        uvicorn.Config(
            application,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
            http=HttpToolsProtocol,
        )
    )

    async def serve() -> None:
        try:
            await server.serve()
        finally:
            if on_loop_exit is not None:
                await on_loop_exit()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.exit()
        thread.join(10)


@pytest.fixture
def gateway(transactional_db):
    """Base URL of a live gateway sharing the test database."""
    from gatewaysite.asgi import application, close_clients

    with live(application, on_loop_exit=close_clients) as url:
        yield url
    ledger.writer.flush()  # before the test database is emptied under it


@pytest.fixture
def minute_clock(monkeypatch):
    """The limits' wall clock (for the in-process `gateway`) stands still 1 s into a minute: a test's
    requests stay in one window however slow the machine is, and `retry-after` is exactly the 59 s left
    in it."""
    start = (time.time() // 60 + 1) * 60 + 1
    monkeypatch.setattr(limits, "clock", lambda: start)
    return start


@pytest.fixture
def build_assignments(transactional_db, fake_upstream_factory, monkeypatch):
    """`build(n)`: pool `main` with n assignments `acct-a`, `acct-b`, ... (tiers 0..n-1) on their own
    fakes, all configured for gpt-5, and the e2e key. Returns (fakes, assignments)."""

    def build(count: int) -> tuple[list[FakeUpstream], list[Assignment]]:
        monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
        GatewaySettings.objects.update_or_create(pk=1, defaults={"backoff_base_ms": 0})
        pool = PoolFactory(name="main")
        fakes, rows = [], []
        for tier in range(count):
            letter = "abcdefgh"[tier]
            fake = fake_upstream_factory(letter, models=("gpt-5",))
            assignment = AssignmentFactory(
                pool=pool,
                name=f"acct-{letter}",
                base_url=fake.base_url,
                tier=tier,
                api_key_env=UPSTREAM_KEY_ENV,
            )
            CatalogEntryFactory(assignment=assignment, model="gpt-5", provenance=Provenance.CONFIGURED)
            fakes.append(fake)
            rows.append(assignment)
        GatewayKeyFactory(name="e2e", raw_key=GATEWAY_KEY, pools=[pool])
        return fakes, rows

    return build


@pytest.fixture
def two_assignments(build_assignments):
    """Pool `main`: `acct-a` (tier 0) and `acct-b` (tier 1), both configured for gpt-5: (a, b, rows)."""
    (a, b), rows = build_assignments(2)
    return a, b, rows


@pytest.fixture
def three_assignments(build_assignments):
    """Pool `main`: `acct-a`, `acct-b`, `acct-c` (tiers 0, 1, 2), each on its own fake, all for gpt-5."""
    return build_assignments(3)


class GatewayNodes:
    """Gateway nodes (`python -m gatewaysite.server`, one process each) on the test database,
    as several nodes share one PostgreSQL (or one SQLite file, for a single node); logs in `log_dir`."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []

    def start(self, count: int = 2, **env_extra: str) -> list[str]:
        """Start `count` nodes (the environment plus `env_extra`) and wait until each answers
        /healthz: their base URLs."""
        db = connection.settings_dict
        if connection.vendor == "sqlite":  # the test database is a file (gatewaysite/settings.py)
            url = f"sqlite:///{db['NAME']}"
        else:
            url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        env = {
            **os.environ,
            "DATABASE_URL": url,
            "DATABASE_CONN_MAX_AGE": "0",
            "DJANGO_SECRET_KEY": "test-only-secret-key-not-for-deployment",
            "DJANGO_DEBUG": "false",
            "GATEWAY_LOG_LEVEL": "WARNING",
            **env_extra,
        }
        started = []
        for _ in range(count):
            port = free_port()
            log_path = self.log_dir / f"node-{len(self.procs)}.log"
            cmd = [PYTHON, "-m", "gatewaysite.server", "--port", str(port)]
            self.procs.append(spawn(cmd, env, log_path))
            started.append((f"http://127.0.0.1:{port}", self.procs[-1], log_path))
        for base, proc, log_path in started:
            deadline = time.monotonic() + 30
            while not self._healthy(base):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"gateway node at {base} did not start: {tail(log_path)}")
                time.sleep(0.05)
        return [base for base, _, _ in started]

    @staticmethod
    def _healthy(base: str) -> bool:
        try:
            return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        for proc in self.procs:
            stop(proc, 15)
        self.procs.clear()


@pytest.fixture
def gateway_nodes(transactional_db, tmp_path):
    """`gateway_nodes.start(n, **env)`: n gateway processes on the test database; stopped after the
    test (or by `gateway_nodes.stop()`)."""
    nodes = GatewayNodes(tmp_path)
    yield nodes
    nodes.stop()
