"""The ledger writer batches off the critical path, and flush() does not wait out its linger."""

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from proxy import ledger
from proxy.models import RequestRecord
from proxy.relay import Exchange
from routing import services
from routing.models import Affinity, AffinityKind
from tests.factories import GatewayKeyFactory

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


def test_the_writer_prunes_expired_affinities_at_most_once_a_period(monkeypatch):
    """Expired affinities go without any request paying for it (SPEC §7.2): the writer deletes a
    bounded batch after saving, then waits PRUNE_EVERY_S before the next."""
    owner = GatewayKeyFactory()
    now = datetime.now(UTC)

    def affinity(key: str, ttl: timedelta) -> None:
        services.affinity_record(
            gateway_key_id=owner.pk, kind=AffinityKind.SESSION, key=key, assignment_id=None, ttl=ttl, now=now
        )

    affinity("expired", timedelta(seconds=-1))
    affinity("live", timedelta(hours=1))
    writer = ledger.LedgerWriter()
    writer.submit(_exchange())
    assert writer.flush(timeout=4.0)
    assert list(Affinity.objects.values_list("key", flat=True)) == ["live"]

    affinity("expired-later", timedelta(seconds=-1))
    writer.submit(_exchange())
    assert writer.flush(timeout=4.0)
    assert Affinity.objects.filter(key="expired-later").exists()  # within the period: not yet

    monkeypatch.setattr(writer, "_next_prune", 0.0)  # the period has passed
    writer.submit(_exchange())
    assert writer.flush(timeout=4.0)
    assert list(Affinity.objects.values_list("key", flat=True)) == ["live"]
