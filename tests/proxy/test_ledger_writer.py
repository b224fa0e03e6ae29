"""The ledger writer batches off the critical path, and flush() does not wait out its linger."""

import time
import uuid
from datetime import UTC, datetime

import pytest

from proxy import ledger
from proxy.models import RequestRecord
from proxy.relay import Exchange

pytestmark = pytest.mark.django_db(transaction=True)


def _exchange() -> Exchange:
    now = datetime.now(UTC)
    return Exchange(
        request_id=uuid.uuid4().hex,
        key_id=None,
        route="/v1/chat/completions",
        transport="http",
        requested_model="gpt-5",
        started_at=now,
        outcome="ok",
        status_code=200,
        finished_at=now,
    )


def test_flush_saves_a_lingering_batch_at_once(monkeypatch):
    monkeypatch.setattr(ledger, "LINGER_S", 5.0)  # a linger no test could wait out
    writer = ledger.LedgerWriter()
    exchanges = [_exchange() for _ in range(3)]
    for exchange in exchanges:
        writer.submit(exchange)
    started = time.monotonic()
    assert writer.flush(timeout=4.0)
    assert time.monotonic() - started < 2.0
    ids = {x.request_id for x in exchanges}
    assert RequestRecord.objects.filter(request_id__in=ids).count() == 3


def test_flush_with_nothing_submitted_returns_at_once():
    assert ledger.LedgerWriter().flush(timeout=0.1)
