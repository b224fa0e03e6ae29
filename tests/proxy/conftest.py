"""The gateway's ASGI app served on a real loopback socket (uvicorn in a thread), for end-to-end tests."""

import asyncio
import socket
import threading
import time

import pytest
import uvicorn

from catalog.models import Provenance
from pools.models import GatewaySettings
from proxy import ledger, upstream
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory

GATEWAY_KEY = "sk-gw-e2e-test-key-0123456789"


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # not the main thread
        pass


@pytest.fixture
def gateway(transactional_db):
    """Base URL of a live gateway sharing the test database."""
    from gatewaysite.asgi import application

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = _Server(
        uvicorn.Config(application, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )

    async def serve() -> None:
        try:
            await server.serve()
        finally:
            await upstream.close_client()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)
    ledger.writer.flush()  # before the test database is emptied under it


@pytest.fixture
def two_assignments(transactional_db, fake_upstream_factory, monkeypatch):
    """Pool `main`: `acct-a` (tier 0) and `acct-b` (tier 1), both configured for gpt-5."""
    monkeypatch.setenv("GATEWAY_UPSTREAM_E2E_KEY", "sk-upstream-credential-canary-42")
    GatewaySettings.objects.update_or_create(pk=1, defaults={"backoff_base_ms": 0})
    a = fake_upstream_factory("a", models=("gpt-5",))
    b = fake_upstream_factory("b", models=("gpt-5",))
    pool = PoolFactory(name="main")
    rows = []
    for tier, (name, fake) in enumerate((("acct-a", a), ("acct-b", b))):
        assignment = AssignmentFactory(
            pool=pool, name=name, base_url=fake.base_url, tier=tier, api_key_env="GATEWAY_UPSTREAM_E2E_KEY"
        )
        CatalogEntryFactory(assignment=assignment, model="gpt-5", provenance=Provenance.CONFIGURED)
        rows.append(assignment)
    GatewayKeyFactory(name="e2e", raw_key=GATEWAY_KEY, pools=[pool])
    return a, b, rows
