"""Helpers and fixtures shared by the end-to-end proxy tests (real sockets: httpx or the openai SDK ->
the gateway under uvicorn -> fake upstreams on loopback).

The ledger is written off the request's critical path (proxy.ledger.recorder), so a read of it first waits
for the writer to drain, then polls (bounded) for the row. Draining first matters on SQLite: the test
database is an in-memory shared cache whose table locks make a concurrent write fail at once (no busy
timeout), so the test must not read a ledger table while the writer writes it.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from django.db import OperationalError

from devkit.sse_reader import read_sse
from devkit.upstream import FakeUpstream
from proxy.ledger import recorder as ledger
from proxy.ledger.models import Attempt, RequestRecord
from tests.gateway_fixtures import GATEWAY_KEY

AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
TIMEOUT = httpx.Timeout(15.0)
CHAT = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "gpt-5", "input": "hi"}

T = TypeVar("T")


def post(
    gateway: str,
    path: str,
    body: dict | None = None,
    *,
    headers: dict[str, str] | None = None,
    content: bytes | None = None,
    auth: bool = True,
) -> httpx.Response:
    """One client request to the gateway, with the e2e key unless `auth` is False."""
    sent = {**(AUTH if auth else {}), **(headers or {})}
    if content is not None:
        sent.setdefault("content-type", "application/json")
        return httpx.post(f"{gateway}{path}", content=content, headers=sent, timeout=TIMEOUT)
    return httpx.post(f"{gateway}{path}", json=body, headers=sent, timeout=TIMEOUT)


def wait_for(probe: Callable[[], T | None], *, timeout: float = 5.0, what: str = "a condition") -> T:
    """Poll `probe` until it returns something truthy (the ledger writer may lag the response)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = probe()
        except OperationalError:  # SQLite's shared-cache test database: a writer holds the table
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def ledger_settled() -> None:
    """Wait until every ledger write submitted so far is saved. A response read to its end has been
    submitted (a stream's ledger hand-off runs before its body ends)."""
    ledger.writer.flush(timeout=10)


def record_of(response: httpx.Response) -> RequestRecord:
    """The ledger row of a gateway response, once written (with its attempts: one transaction)."""
    request_id = response.headers["x-gateway-request-id"]

    def probe() -> RequestRecord | None:
        ledger_settled()
        return RequestRecord.objects.filter(request_id=request_id).first()

    return wait_for(probe, what=f"the RequestRecord of {request_id}")


def attempt_statuses(record: RequestRecord) -> list[str]:
    return list(Attempt.objects.filter(request=record).order_by("ordinal").values_list("status", flat=True))


def attempts_of(record: RequestRecord) -> list[Attempt]:
    return list(Attempt.objects.filter(request=record).order_by("ordinal"))


def assert_hits(*expected: tuple[FakeUpstream, int]) -> None:
    """Every fake got exactly the given number of requests (so a wrong extra dispatch fails)."""
    actual = [(fake.name, fake.hit_count()) for fake, _ in expected]
    wanted = [(fake.name, count) for fake, count in expected]
    assert actual == wanted, f"upstream hits {actual}, expected {wanted}"


@dataclass(frozen=True)
class SSEEvent:
    event: str | None
    data: Any  # the parsed JSON, or the raw string (`[DONE]`)

    @property
    def type(self) -> str | None:
        """The Responses event type (`event:` line, else the data's `type`); None for chat chunks."""
        if self.event is not None:
            return self.event
        return self.data.get("type") if isinstance(self.data, dict) else None


def sse_events(text: str) -> list[SSEEvent]:
    """What the gateway sent, read by an independent reader (not the gateway's own parser)."""
    return [SSEEvent(name, data) for name, data in read_sse(text)]


def chat_text(events: list[SSEEvent]) -> str:
    return "".join(
        choice["delta"].get("content") or ""
        for e in events
        if isinstance(e.data, dict)
        for choice in e.data.get("choices", [])
    )


def responses_text(events: list[SSEEvent]) -> str:
    return "".join(e.data["delta"] for e in events if e.type == "response.output_text.delta")


def error_events(events: list[SSEEvent]) -> list[dict]:
    """The error objects of terminal error events, in either dialect's shape."""
    return [
        e.data["error"]
        for e in events
        if isinstance(e.data, dict) and isinstance(e.data.get("error"), dict) and e.type != "response.failed"
    ]
