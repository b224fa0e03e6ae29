"""A 256 MiB upload through the gateway as `make run` serves it (`python -m gatewaysite.server`, a real
uvicorn process on its own database), with the server's peak memory read from /proc (SPEC §4): the
upload is streamed to the upstream, and replayed to the next account from disk after a 429, without
ever being held in memory."""

import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devkit.behaviours import rate_limited
from devkit.databases import Database
from devkit.gateway import GatewayProcess, gateway_config
from devkit.procfs import peak_rss_kb, peak_rss_reset
from devkit.upstream import FakeUpstream

KEY = "sk-gw-files-process-key-0123456789"
UPSTREAM_KEY_ENV = "GATEWAY_UPSTREAM_FILES_KEY"
MIB = 1 << 20
SIZE = 256 * MIB
BOUNDARY = "gateway-rss-test-boundary"


@pytest.fixture
def accounts(fake_upstream_factory) -> tuple[FakeUpstream, FakeUpstream]:
    return fake_upstream_factory("a"), fake_upstream_factory("b")


@pytest.fixture
def served(tmp_path: Path, accounts, monkeypatch) -> Iterator[GatewayProcess]:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, "sk-files-upstream")
    a, b = accounts
    database = Database.create(tmp_path)
    process = GatewayProcess(database, tmp_path)
    config = gateway_config({"a": a.base_url, "b": b.base_url}, key=KEY, key_env=UPSTREAM_KEY_ENV)
    config["retry"] = {"backoff_base_ms": 0}
    config["pools"][0]["assignments"][1]["tier"] = 1  # a first (equal accounts would share uploads)
    process.prepare(config)
    process.start()
    yield process
    process.kill()
    database.drop()


def _multipart(digest) -> tuple[Iterator[bytes], int]:
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n'
        "Content-Type: application/jsonl\r\n\r\n"
    ).encode()
    tail = f"\r\n--{BOUNDARY}--\r\n".encode()

    def chunks() -> Iterator[bytes]:
        yield head
        block = b'{"custom_id": "x", "body": {}}'.ljust(31) + b"\n"
        block *= MIB // len(block)  # 1 MiB of JSONL
        for _ in range(SIZE // len(block)):
            digest.update(block)
            yield block
        yield tail

    return chunks(), len(head) + SIZE + len(tail)


def test_a_256_mib_upload_is_streamed_and_replayed_without_growing_the_servers_memory(served, accounts):
    a, b = accounts
    a.script_files(rate_limited())  # answered after the whole upload was read: the gateway replays it
    digest = hashlib.sha256()
    body, length = _multipart(digest)
    peak_rss_reset(served.pid)
    before = peak_rss_kb(served.pid)
    response = httpx.post(
        f"http://127.0.0.1:{served.port}/v1/files",
        content=body,
        headers={
            "authorization": f"Bearer {KEY}",
            "content-type": f"multipart/form-data; boundary={BOUNDARY}",
            "content-length": str(length),
        },
        timeout=120,
    )
    grown = peak_rss_kb(served.pid) - before
    assert response.status_code == 200, response.text
    created = response.json()
    assert (created["object"], created["bytes"], created["purpose"]) == ("file", SIZE, "batch")
    assert response.headers["x-gateway-attempts"] == "2"
    assert a.files == {} and b.files[created["id"]].sha256 == digest.hexdigest()
    assert grown < 32 * 1024, f"peak RSS grew by {grown} KiB"
