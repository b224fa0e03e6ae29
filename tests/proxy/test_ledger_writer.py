"""The ledger writer batches off the critical path, and flush() does not wait out its linger."""

import asyncio
import json
import logging
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import sync_to_async
from prometheus_client.parser import text_string_to_metric_families

from proxy.ledger import recorder as ledger
from proxy.ledger import spool
from proxy.ledger.exchange import AttemptLog, Exchange
from proxy.ledger.models import RequestRecord
from routing import services
from routing.models import Affinity, AffinityKind
from tests.factories import GatewayKeyFactory, finished_exchange, reserve
from tests.gateway_fixtures import GATEWAY_KEY

pytestmark = pytest.mark.django_db(transaction=True)


def _exchange() -> Exchange:
    return finished_exchange()


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


# -- the spool (SPEC §7.3: no served request loses its record to a database outage) -----------------


@pytest.fixture
def outage(monkeypatch):
    """`outage.down = True` makes every ledger write fail the way an unreachable database does."""
    from django.db import OperationalError

    from proxy.ledger import services as ledger_services

    real = ledger_services.request_records_write

    class Outage:
        down = False
        calls = 0

    def write(**kwargs):
        Outage.calls += 1
        if Outage.down:
            raise OperationalError("connection refused")
        return real(**kwargs)

    monkeypatch.setattr(ledger_services, "request_records_write", write)
    monkeypatch.setattr(ledger, "REPLAY_EVERY_S", 0.05)
    return Outage


def _spooled_lines() -> list[str]:
    from pathlib import Path

    from django.conf import settings

    return [
        line
        for path in Path(settings.GATEWAY_LEDGER_SPOOL_DIR).glob("ledger-*.jsonl")
        for line in path.read_text().splitlines()
    ]


def test_records_written_while_the_database_is_away_are_spooled_then_replayed_once(outage):
    from tests.factories import AssignmentFactory

    key = GatewayKeyFactory(budget_micros=1_000)
    assignment = AssignmentFactory()
    writer = ledger.LedgerWriter()
    lost = [reserve(_exchange(), key.pk, 10) for _ in range(3)]  # each held 10, none reported usage
    outage.down = True
    for exchange in lost:
        exchange.attempts = [AttemptLog(1, assignment.pk, "gpt-5", "http", "succeeded", "completed")]
        writer.submit(exchange)
    assert writer.flush(timeout=5)
    assert RequestRecord.objects.count() == 0
    assert sorted(line.split('"request_id":"')[1][:32] for line in _spooled_lines()) == sorted(
        x.request_id for x in lost
    )
    assert writer.spool_pending

    outage.down = False  # the database is back: the writer replays on its own
    deadline = time.monotonic() + 5
    while writer.spool_pending and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not writer.spool_pending and _spooled_lines() == []
    assert set(RequestRecord.objects.values_list("request_id", flat=True)) == {x.request_id for x in lost}
    key.refresh_from_db()
    # Settled exactly once: the reservations released, each kept as the cost (no usage arrived).
    assert (key.reserved_micros, key.spent_micros) == (0, 30)


def test_a_replay_skips_records_the_database_already_has():
    """A commit can reach the database while its acknowledgement does not: the batch is spooled
    although stored. The replay is idempotent by request id: one row, one charge."""
    from proxy.ledger.services import request_records_write

    stored, fresh = _exchange(), _exchange()
    request_records_write(exchanges=[stored])
    ledger.writer.spool.append([stored, fresh])
    assert ledger.writer.spool.replay(lambda b: request_records_write(exchanges=b, idempotent=True)) == 2
    assert RequestRecord.objects.filter(request_id=stored.request_id).count() == 1
    assert RequestRecord.objects.filter(request_id=fresh.request_id).count() == 1
    assert _spooled_lines() == []


def test_a_gone_process_spool_is_replayed_by_the_next_writer(outage):
    from pathlib import Path

    from django.conf import settings

    from proxy.ledger.spool import Spool, encode

    orphan = _exchange()
    dead_pid = 2**22 + 12345  # above the default pid_max: no such process
    path = Path(settings.GATEWAY_LEDGER_SPOOL_DIR) / f"ledger-{Spool.database_tag()}-{dead_pid}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode(orphan) + b"\n")
    writer = ledger.LedgerWriter()
    writer.submit(_exchange())
    assert writer.flush(timeout=5)
    assert RequestRecord.objects.filter(request_id=orphan.request_id).exists()
    assert not path.exists()


def test_a_replayed_spool_keeps_a_line_separator_in_a_field_and_skips_a_torn_last_line(outage):
    """The journal is written by orjson, which leaves U+2028 and other non-ASCII text unescaped: the
    replay splits on newlines alone (str.splitlines would cut such a record in two), and a last line
    torn inside a character is skipped, not the whole file lost (runtime.fastjson)."""
    from pathlib import Path

    from django.conf import settings

    from proxy.ledger.spool import Spool, encode

    odd = _exchange()
    odd.served_model = "model\u2028with\u0085separators-é"
    dead_pid = 2**22 + 12346  # above the default pid_max: no such process
    path = Path(settings.GATEWAY_LEDGER_SPOOL_DIR) / f"ledger-{Spool.database_tag()}-{dead_pid}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    cut = _exchange()
    cut.served_model = "torn-é"
    torn = encode(cut)[: encode(cut).index("é".encode()) + 1]  # ends inside the character
    path.write_bytes(encode(odd) + b"\n" + torn)
    writer = ledger.LedgerWriter()
    writer.submit(_exchange())
    assert writer.flush(timeout=5)
    assert RequestRecord.objects.get(request_id=odd.request_id).served_model == odd.served_model
    assert not path.exists()


def test_the_spool_keeps_every_field_of_an_exchange():
    """A field added to Exchange or AttemptLog (a datetime above all) must survive the spool, or a
    record written during an outage comes back without it, or is never written at all."""
    from datetime import UTC, datetime, timedelta

    from proxy.ledger import spool

    exchange = _exchange()
    exchange.first_output_at = exchange.started_at + timedelta(milliseconds=250)
    exchange.finished_at = datetime.now(UTC)
    exchange.attempts = [
        AttemptLog(
            1, 7, "gpt-5", "sse", "succeeded", "completed", assignment="acct-a", pool="main", cost_micros=5
        )
    ]
    assert spool.decode(spool.encode(exchange)) == exchange


def test_a_record_orjson_refuses_and_a_hold_are_journaled_field_by_field():
    """A record is orjson's own encoding of the dataclass; one that orjson refuses (an upstream's usage
    beyond 64 bits) and a budget hold take the field-by-field path, which must read back the same."""
    import json
    from datetime import UTC, datetime

    from proxy.ledger import spool

    exchange = _exchange()
    exchange.finished_at = datetime.now(UTC)
    exchange.attempts = [AttemptLog(1, 7, "gpt-5", "http", "succeeded", "completed", output_tokens=2**70)]
    assert spool.decode(spool.encode(exchange)) == exchange
    exchange.attempts[0].output_tokens = 5
    held = json.loads(spool.encode(exchange, held=True))
    assert held.pop("held") is True
    assert held == json.loads(spool.encode(exchange))


def test_a_record_the_database_refuses_still_releases_its_reservation():
    key = GatewayKeyFactory(budget_micros=1_000)
    refused, fine = _exchange(), _exchange()
    refused.transport = "carrier-pigeon"  # the ledger's check constraint refuses it
    for exchange in (refused, fine):
        reserve(exchange, key.pk, 5)
    writer = ledger.LedgerWriter()
    writer.submit(refused)
    writer.submit(fine)
    assert writer.flush(timeout=5)
    assert list(RequestRecord.objects.values_list("request_id", flat=True)) == [fine.request_id]
    key.refresh_from_db()
    assert (key.reserved_micros, key.spent_micros) == (0, 0)  # both released, nothing was charged


def test_a_batch_settles_all_its_keys_in_one_update_per_budget_period():
    """A batch over many keys settles them together: one UPDATE per budget period present, not one a key
    (with a key per request, a batch was as many round trips as records). Each key still gets its own
    release and charge, in its own period: a day key whose stored spend is from an earlier day starts
    the day again, a lifetime key adds to what it had."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from proxy.ledger.services import request_records_write
    from tests.factories import AssignmentFactory

    assignment = AssignmentFactory()
    day = [GatewayKeyFactory(budget_micros=10_000, budget_period="day") for _ in range(3)]
    lifetime = [GatewayKeyFactory(budget_micros=10_000) for _ in range(3)]
    yesterday = datetime.now(UTC) - timedelta(days=1)
    type(day[0]).objects.filter(pk__in=[day[0].pk, lifetime[0].pk]).update(
        spent_micros=500, period_start=yesterday
    )
    batch = []
    for n, key in enumerate(day + lifetime):
        exchange = reserve(finished_exchange(budget_period=key.budget_period), key.pk, 100 + n)
        exchange.attempts = [
            AttemptLog(1, assignment.pk, "gpt-5", "http", "succeeded", "completed", cost_micros=10 + n)
        ]
        batch.append(exchange)
    with CaptureQueriesContext(connection) as statements:
        request_records_write(exchanges=batch)
    key_table = day[0]._meta.db_table
    settles = [q["sql"] for q in statements if f"UPDATE {key_table} SET" in q["sql"]]
    assert len(settles) == 2, settles
    rows = dict(type(day[0]).objects.values_list("pk", "spent_micros"))
    assert [rows[k.pk] for k in day] == [10, 11, 12]  # the first key's 500 was yesterday's
    assert [rows[k.pk] for k in lifetime] == [513, 14, 15]
    assert set(type(day[0]).objects.values_list("reserved_micros", flat=True)) == {0}


def test_a_refused_records_reservation_is_settled_by_its_replay_when_the_database_goes_away_meanwhile(
    monkeypatch,
):
    """Window 3: the database refused a record, then went away before its reservation could be
    settled alone. The record is spooled; its replay, refused again, settles it once the database is
    back."""
    from django.db import OperationalError

    from proxy.ledger import services as ledger_services

    key = GatewayKeyFactory(budget_micros=1_000)
    refused = reserve(_exchange(), key.pk, 5)
    refused.transport = "carrier-pigeon"  # the ledger's check constraint refuses it
    settle = ledger_services.exchanges_settle
    away = [True]

    def settle_unless_away(**kwargs):
        if away[0]:
            raise OperationalError("connection refused")
        return settle(**kwargs)

    monkeypatch.setattr(ledger_services, "exchanges_settle", settle_unless_away)
    writer = ledger.LedgerWriter()
    writer.submit(refused)
    assert writer.flush(timeout=5)
    key.refresh_from_db()
    assert key.reserved_micros == 5 and writer.spool_pending  # not settled yet: kept in the spool

    away[0] = False
    writer._replay()
    key.refresh_from_db()
    assert (key.reserved_micros, key.spent_micros) == (0, 0)
    assert not writer.spool.pending() and not RequestRecord.objects.exists()


def test_a_hold_left_after_its_record_was_settled_is_released_by_the_journals_replay():
    """Window 2, the give-back failing: a reservation granted after its request stopped waiting
    committed after the request's record was settled, and giving it back failed too (the database
    went away again). The hold was journaled for good; the writer that replays that journal once its
    process is gone finds the record stored, releases the hold and charges nothing again."""
    import os

    from proxy.ledger.services import request_records_write
    from tests.factories import AssignmentFactory

    key = GatewayKeyFactory(budget_micros=1_000)
    late = _exchange()
    late.key_id, late.reserving = key.pk, True
    attempt = AttemptLog(1, AssignmentFactory().pk, "gpt-5", "http", "succeeded", "completed", cost_micros=3)
    late.attempts = [attempt]
    request_records_write(exchanges=[late])  # its record, settled: nothing held yet, 3 spent
    reserve(late, key.pk, 5)  # the late reservation
    gone = ledger.LedgerWriter()  # the request's process: it journals the hold for good, then exits
    gone.held(late, lasting=True)
    for fd, _ in gone.journal._open.values():
        os.close(fd)  # what its exit does: the segment's lock is free

    writer = ledger.LedgerWriter()
    writer.submit(_exchange())
    assert writer.flush(timeout=5)
    key.refresh_from_db()
    assert (key.reserved_micros, key.spent_micros) == (0, 3)
    assert RequestRecord.objects.filter(request_id=late.request_id).count() == 1
    assert not writer.spool.pending()


def test_a_lasting_hold_outlives_the_save_of_its_requests_record():
    """The hold journaled when a late reservation's give-back failed stays in the journal whenever
    the request's record is saved (the record's settlement may have come before the reservation)."""
    from pathlib import Path

    from django.conf import settings

    writer = ledger.LedgerWriter()
    late = _exchange()
    writer.held(late, lasting=True)
    writer.journal.saved(late.request_id, writer.journal.add(late))  # its record, saved after
    lines = [
        line
        for path in Path(settings.GATEWAY_LEDGER_SPOOL_DIR).glob("journal-*.jsonl")
        for line in path.read_text().splitlines()
    ]
    assert [line for line in lines if late.request_id in line and '"held":true' in line]


def test_a_batch_is_stored_as_submitted_each_attempt_under_its_own_record():
    from proxy.ledger.models import Attempt
    from proxy.ledger.services import request_records_write

    exchanges = [_exchange() for _ in range(3)]
    for n, exchange in enumerate(exchanges):
        exchange.finished_at = exchange.started_at + timedelta(milliseconds=1500 + n)
        exchange.config_version = 7
        exchange.attempts = [
            AttemptLog(i, None, f"model-{n}-{i}", "sse", "failed", "completed", upstream_status=500 + i)
            for i in range(n + 1)
        ]
    exchanges[1].served_model, exchanges[1].retry_count = "gpt-5-mini", 1
    request_records_write(exchanges=list(reversed(exchanges)))

    for exchange in exchanges:
        record = RequestRecord.objects.get(request_id=exchange.request_id)
        assert (record.started_at, record.finished_at) == (exchange.started_at, exchange.finished_at)
        assert (record.served_model, record.retry_count, record.status_code) == (
            exchange.served_model,
            exchange.retry_count,
            200,
        )
        stored = Attempt.objects.filter(request=record).order_by("ordinal")
        assert [(a.ordinal, a.model, a.upstream_status, a.config_version) for a in stored] == [
            (a.ordinal, a.model, a.upstream_status, 7) for a in exchange.attempts
        ]


def test_each_request_logs_one_structured_line_with_its_duration_and_no_content(caplog):
    """SPEC §10: one structured line per request (the server's own access line is off): when, whose
    key, which model asked and served, the pools and each attempt's assignment and failure class, tokens,
    cost, how long it took in milliseconds and the limit that refused it (issue 47 point 4); and one
    line per failed attempt with its class, status and canonical code."""
    caplog.set_level("INFO", logger="gateway")
    exchange = _exchange()
    exchange.started_at = exchange.finished_at - timedelta(milliseconds=1234.5)
    exchange.served_model, exchange.key_name = "gpt-5", "team-a"
    failed = AttemptLog(
        ordinal=1,
        assignment_id=1,
        model="gpt-5",
        route_class="http",
        status="retryable_failed",
        failure_class="rate_limited",
        upstream_status=429,
        error_code="rate_limit_exceeded",
        elapsed_ms=40,
        assignment="acct-a",
        pool="main",
        offset_ms=2,
    )
    served = AttemptLog(
        ordinal=2,
        assignment_id=2,
        model="gpt-5",
        route_class="http",
        status="succeeded",
        input_tokens=10,
        output_tokens=5,
        cached_read_tokens=4,
        cost_micros=1500,
        assignment="acct-b",
        pool="spare",
    )
    exchange.attempts = [failed, served]
    asyncio.run(ledger.record(exchange))
    assert ledger.writer.flush(timeout=10)
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "gateway"]
    assert lines == [
        {
            "event": "request",
            "time": exchange.finished_at.isoformat(timespec="milliseconds"),
            "request_id": exchange.request_id,
            "key": "team-a",
            "route": "/v1/chat/completions",
            "transport": "http",
            "requested_model": "gpt-5",
            "served_model": "gpt-5",
            "pools": ["main", "spare"],
            "outcome": "ok",
            "status": 200,
            "limit": None,
            "attempts": 2,
            "retries": 0,
            "assignments": [
                {
                    "assignment": "acct-a",
                    "model": "gpt-5",
                    "status": "retryable_failed",
                    "failure_class": "rate_limited",
                },
                {"assignment": "acct-b", "model": "gpt-5", "status": "succeeded", "failure_class": None},
            ],
            "input_tokens": 10,
            "output_tokens": 5,
            "cached_read_tokens": 4,
            "cost_usd": 0.0015,
            "duration_ms": 1234.5,
        },
        {
            "event": "attempt_failed",
            "time": (exchange.started_at + timedelta(milliseconds=2)).isoformat(timespec="milliseconds"),
            "request_id": exchange.request_id,
            "key": "team-a",
            "ordinal": 1,
            "pool": "main",
            "assignment": "acct-a",
            "model": "gpt-5",
            "status": "retryable_failed",
            "failure_class": "rate_limited",
            "upstream_status": 429,
            "error_code": "rate_limit_exceeded",
            "dispatch_state": "not_sent",
            "elapsed_ms": 40,
        },
    ]
    assert [r.levelname for r in caplog.records if r.name == "gateway"] == ["INFO", "WARNING"]


def test_the_request_line_names_the_limit_that_refused_it():
    """A key's own limit (the typed refusal names it) or its budget; none for an upstream's 429."""
    by_limit = _exchange()
    by_limit.refused("rate_limit_exceeded", "tpm", 429)
    by_budget = finished_exchange(outcome="budget_exceeded", status_code=429)
    by_upstream = finished_exchange(outcome="rate_limited", status_code=429)
    assert [ledger.request_line(x)["limit"] for x in (by_limit, by_budget, by_upstream)] == [
        "tpm",
        "budget",
        None,
    ]


class _RequestLines(logging.Handler):
    """The request ids of the gateway's request lines, in the order they were logged."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith('{"event": "request"'):
            self.ids.append(json.loads(message)["request_id"])


@pytest.fixture
def request_lines():
    lines = _RequestLines()
    logging.getLogger("gateway").addHandler(lines)
    yield lines
    logging.getLogger("gateway").removeHandler(lines)
    ledger.writer.flush()


async def test_requests_finished_together_are_observed_together_after_the_wait_in_their_order(
    request_lines, monkeypatch
):
    """What finishes within OBSERVE_EVERY_S is counted and logged in one batch, by the loop's own
    timer, in the order the requests finished; nothing of it before."""
    monkeypatch.setattr(ledger, "OBSERVE_EVERY_S", 0.2)
    exchanges = [_exchange() for _ in range(3)]
    loop = asyncio.get_running_loop()
    observed_at: list[tuple[float, int]] = []  # when, and in which of the loop's batches
    batches = 0
    real_observe, real_due = ledger.observe, ledger.observations._due

    def observe(exchange: Exchange) -> None:
        observed_at.append((loop.time(), batches))
        real_observe(exchange)

    def due() -> None:
        nonlocal batches
        batches += 1
        real_due()

    monkeypatch.setattr(ledger, "observe", observe)
    monkeypatch.setattr(ledger.observations, "_due", due)
    first = loop.time()
    for exchange in exchanges:
        await ledger.record(exchange)
        await asyncio.sleep(0.01)
    assert request_lines.ids == []
    deadline = time.monotonic() + 5
    while len(request_lines.ids) < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert request_lines.ids == [x.request_id for x in exchanges]
    assert min(when for when, _ in observed_at) >= first + 0.2  # the first one waited for the others
    assert [batch for _, batch in observed_at] == [1, 1, 1]  # one batch, not one timer each


def test_an_observation_left_by_a_closed_loop_is_made_with_the_next_loops_batch(request_lines, monkeypatch):
    """A loop that closes before its batch is due (a test's, a server's at exit) leaves its requests
    waiting; the next request on another loop starts a batch of its own, which takes them too."""
    monkeypatch.setattr(ledger, "OBSERVE_EVERY_S", 0.05)
    left, later = _exchange(), _exchange()
    asyncio.run(ledger.record(left))  # closed at once, its batch never due

    async def record_later() -> None:
        await ledger.record(later)
        deadline = time.monotonic() + 5
        while len(request_lines.ids) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    asyncio.run(record_later())
    assert request_lines.ids == [left.request_id, later.request_id]


def test_an_observation_that_fails_is_logged_and_the_rest_of_its_batch_is_made(
    request_lines, monkeypatch, caplog
):
    broken, fine = _exchange(), _exchange()
    real_observe = ledger.observe

    def observe(exchange: Exchange) -> None:
        if exchange is broken:
            raise RuntimeError("a bug")
        real_observe(exchange)

    monkeypatch.setattr(ledger, "observe", observe)
    monkeypatch.setattr(ledger, "OBSERVE_EVERY_S", 3600.0)

    async def finish_both() -> None:
        await ledger.record(broken)
        await ledger.record(fine)

    asyncio.run(finish_both())
    ledger.observations.drain()
    assert request_lines.ids == [fine.request_id]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        "ledger: a finished request could not be counted or logged"
    ]


def test_a_scrape_counts_every_request_this_process_answered_without_waiting_for_the_batch(
    client, monkeypatch
):
    """`/metrics` observes what waits before it reads the registry: a scrape after an answer finds
    that request counted, however long its batch still had to wait."""
    monkeypatch.setattr(ledger, "OBSERVE_EVERY_S", 3600.0)

    labels = {"route": "/v1/chat/completions", "transport": "http", "outcome": "ok", "status_class": "2xx"}

    def ok_requests() -> float:
        families = text_string_to_metric_families(client.get("/metrics").content.decode())
        samples = [s for family in families for s in family.samples]
        return sum(s.value for s in samples if s.name == "gateway_requests_total" and s.labels == labels)

    before = ok_requests()
    asyncio.run(ledger.record(_exchange()))
    assert ok_requests() - before == 1
    ledger.writer.flush()


def test_saved_journal_segments_are_emptied_and_reused_not_created_anew():
    """Each batch moves the journal to another segment; a saved one is emptied and used again
    instead of a new file being created (and unlinked) for every batch."""
    from pathlib import Path

    from django.conf import settings

    writer = ledger.LedgerWriter()
    for _ in range(12):  # twelve batches: each flushed before the next is submitted
        writer.submit(_exchange())
        writer.submit(_exchange())
        assert writer.flush(timeout=5)
    assert writer.journal._next <= spool.FREE_SEGMENTS  # files ever created: reused, not one per batch
    journals = list(
        Path(settings.GATEWAY_LEDGER_SPOOL_DIR).glob(f"journal-*-{writer.journal._owner}-*.jsonl")
    )
    assert journals and all(path.read_bytes() == b"" for path in journals)  # all saved: nothing to replay
    assert RequestRecord.objects.count() == 24


def test_a_saved_segment_is_reused_only_in_the_spool_directory_it_was_made_in(settings, tmp_path):
    journal = ledger.LedgerWriter().journal
    first = _exchange()
    segment = journal.add(first)
    journal.rotate()
    journal.saved(first.request_id, segment)  # saved: emptied and kept for reuse
    settings.GATEWAY_LEDGER_SPOOL_DIR = str(tmp_path / "elsewhere")
    second = _exchange()
    journal.add(second)
    [path] = (tmp_path / "elsewhere").glob("journal-*.jsonl")
    assert second.request_id in path.read_text()


def test_a_full_batch_ends_the_linger_without_a_flush(monkeypatch):
    monkeypatch.setattr(ledger, "LINGER_S", 30.0)  # a linger no test could wait out
    monkeypatch.setattr(ledger, "BATCH", 3)
    writer = ledger.LedgerWriter()
    exchanges = [_exchange() for _ in range(3)]
    writer.submit(exchanges[0])
    deadline = time.monotonic() + 10
    while not writer._queue.empty() and time.monotonic() < deadline:
        time.sleep(0.01)  # the writer took the first and lingers with it: two more make the batch
    for exchange in exchanges[1:]:
        writer.submit(exchange)
    ids = {x.request_id for x in exchanges}
    deadline = time.monotonic() + 10
    while RequestRecord.objects.filter(request_id__in=ids).count() < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert RequestRecord.objects.filter(request_id__in=ids).count() == 3


def test_a_full_batch_left_waiting_is_taken_without_a_linger(monkeypatch):
    """A burst that arrived while a batch was being saved leaves more than one batch waiting; once no
    record arrives any more, the batch after the next still goes at once, not after the linger."""
    from proxy.ledger import services

    monkeypatch.setattr(ledger, "LINGER_S", 30.0)  # a linger no test could wait out
    monkeypatch.setattr(ledger, "BATCH", 4)
    saving, release = threading.Event(), threading.Event()
    write = services.request_records_write

    def first_blocks(**kwargs):
        if not saving.is_set():
            saving.set()
            release.wait(10)
        return write(**kwargs)

    monkeypatch.setattr(services, "request_records_write", first_blocks)
    writer = ledger.LedgerWriter()
    exchanges = [_exchange() for _ in range(12)]
    # The writer holds the first record before the next arrive: `submit` counts the one a lingering writer
    # holds, so records queued before it took any would hurry a batch of three and shift every batch after.
    writer.submit(exchanges[0])
    deadline = time.monotonic() + 10
    while not writer._queue.empty() and time.monotonic() < deadline:
        time.sleep(0.01)
    for exchange in exchanges[1:5]:  # the fourth ends the linger, the fifth waits behind the full batch
        writer.submit(exchange)
    assert saving.wait(10)  # the first batch (four records) is being saved
    for exchange in exchanges[5:]:  # the burst: eight records wait, two batches
        writer.submit(exchange)
    release.set()
    ids = {x.request_id for x in exchanges}
    deadline = time.monotonic() + 10
    while RequestRecord.objects.filter(request_id__in=ids).count() < 12 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert RequestRecord.objects.filter(request_id__in=ids).count() == 12


# Text that COPY's text format or a VALUES list would have to quote or escape.
_AWKWARD = ["NULL", "", "a,b", "{x}", 'say "hi"', "back\\slash", "it's", " padded ", "ünï"]


def _mixed_batch(count: int, key_id: int, assignment_id: int) -> list[Exchange]:
    """`count` exchanges whose nullable columns alternate between NULL and a value, record by record
    and attempt by attempt, with the text columns' awkward values and costs beyond 32 bits."""
    exchanges = []
    for n in range(count):
        x = _exchange()
        x.started_at = x.started_at.replace(microsecond=n % 1_000_000)
        x.key_id = key_id if n % 2 else None
        x.status_code = None if n % 3 == 0 else 200 + n % 300
        x.finished_at = None if n % 4 == 0 else x.started_at + timedelta(microseconds=n + 1)
        x.served_model = _AWKWARD[n % len(_AWKWARD)]
        x.outcome = _AWKWARD[(n + 1) % len(_AWKWARD)] or "ok"
        x.operation_id = f"op-{n}" if n % 5 else ""
        x.retry_count = n % 4
        x.config_version = None if n % 2 else n
        x.transport = ["http", "sse", "websocket"][n % 3]
        x.attempts = [
            AttemptLog(
                i,
                None if (n + i) % 2 else assignment_id,
                f"model-{n}-{i}",
                "sse",
                "failed",
                "completed",
                failure_class=_AWKWARD[(n + i) % len(_AWKWARD)],
                upstream_status=None if i else 500 + n % 100,
                error_code=_AWKWARD[(n + 2 * i) % len(_AWKWARD)],
                elapsed_ms=n * 1000 + i,
                input_tokens=None if (n + i) % 3 == 0 else n,
                output_tokens=None if (n + i) % 3 == 1 else 70_000 + n,
                cost_micros=None if (n + i) % 4 == 0 else 5_000_000_000 + n,
            )
            for i in range(n % 3)
        ]
        exchanges.append(x)
    return exchanges


def _stored(exchanges: list[Exchange]) -> list[tuple]:
    from proxy.ledger.models import Attempt

    records = RequestRecord.objects.filter(request_id__in=[x.request_id for x in exchanges])
    attempt_fields = ["request__request_id", *(f for f in _ATTEMPT_FIELDS if f != "request_id")]
    return [
        *records.values_list(*_RECORD_FIELDS),
        *Attempt.objects.filter(request__in=records).values_list(*attempt_fields),
    ]


# Read back by name through the ORM: what each column holds, whatever order the INSERT wrote them in.
_RECORD_FIELDS = (
    "request_id", "operation_id", "key_id", "route", "transport", "requested_model", "served_model",
    "outcome", "status_code", "retry_count", "started_at", "finished_at",
)  # fmt: skip
_ATTEMPT_FIELDS = (
    "request_id", "ordinal", "assignment_id", "model", "route_class", "status", "failure_class",
    "ineligible_reason", "dispatch_state", "upstream_status", "error_code", "config_version",
    "elapsed_ms", "input_tokens", "output_tokens", "cost_micros",
)  # fmt: skip


def _written(exchanges: list[Exchange]) -> list[tuple]:
    return [
        *(
            (
                x.request_id,
                x.operation_id or x.request_id,
                x.key_id,
                x.route,
                x.transport,
                x.requested_model,
                x.served_model,
                x.outcome,
                x.status_code,
                x.retry_count,
                x.started_at,
                x.finished_at,
            )
            for x in exchanges
        ),
        *(
            (
                x.request_id,
                a.ordinal,
                a.assignment_id,
                a.model,
                a.route_class,
                a.status,
                a.failure_class,
                a.ineligible_reason,
                a.dispatch_state,
                a.upstream_status,
                a.error_code,
                x.config_version,
                a.elapsed_ms,
                a.input_tokens,
                a.output_tokens,
                a.cost_micros,
            )
            for x in exchanges
            for a in x.attempts
        ),
    ]


@pytest.mark.parametrize("count", [1, 5, 700])
def test_a_batch_mixing_nulls_and_values_in_every_nullable_column_reads_back_as_written(count):
    """PostgreSQL writes a batch of more than 50 values by COPY (5 records and their 4 attempts: 60 and
    64 values), a smaller one as a VALUES list; SQLite as VALUES lists of at most
    _PARAMS values (700 records and their 700 attempts take two statements per table there): each way,
    each value comes back as it went in, NULL or not, and each attempt under its own request's record."""
    from proxy.ledger.services import request_records_write
    from tests.factories import AssignmentFactory

    key, assignment = GatewayKeyFactory(), AssignmentFactory()
    exchanges = _mixed_batch(count, key.pk, assignment.pk)
    request_records_write(exchanges=exchanges)
    assert sorted(_stored(exchanges), key=repr) == sorted(_written(exchanges), key=repr)


def test_a_batch_with_every_nullable_column_null_reads_back_as_written():
    """A column that is NULL in every row of a batch (in the array-per-column INSERT this once was, it had
    no element to type it by)."""
    from proxy.ledger.services import request_records_write

    exchanges = _mixed_batch(6, 0, 0)
    for x in exchanges:
        x.key_id = x.status_code = x.finished_at = x.config_version = None
        for a in x.attempts:
            a.assignment_id = a.upstream_status = a.input_tokens = a.output_tokens = a.cost_micros = None
    request_records_write(exchanges=exchanges)
    assert sorted(_stored(exchanges), key=repr) == sorted(_written(exchanges), key=repr)


def test_batches_by_copy_and_by_values_take_their_ids_from_one_sequence():
    """A copied batch's records get their ids from the table's own sequence, as a VALUES list's and the
    ORM's do: interleaved, none collides, and every attempt stays under its own record."""
    from proxy.ledger.services import request_records_write
    from tests.factories import AssignmentFactory

    key, assignment = GatewayKeyFactory(), AssignmentFactory()
    batches = [_mixed_batch(count, key.pk, assignment.pk) for count in (8, 2, 8, 3)]  # copy, values, ...
    for exchanges in batches:
        request_records_write(exchanges=exchanges)
    RequestRecord.objects.create(
        request_id="orm-made", transport="http", requested_model="m", started_at=datetime.now(UTC)
    )
    every = [x for exchanges in batches for x in exchanges]
    assert sorted(_stored(every), key=repr) == sorted(_written(every), key=repr)
    assert RequestRecord.objects.count() == len(every) + 1


async def test_a_plain_answer_is_sent_before_its_request_is_counted_and_logged(two_assignments, monkeypatch):
    """The metrics, the trace and the log line wait for their batch (`ledger.observations`, at most
    OBSERVE_EVERY_S); the journal does not: when the body is sent, the request's record is in its
    journal but the request is neither counted nor logged, nor once the loop's step is over; the loop
    then observes it on its own (no flush, no scrape). The production application is driven on this
    test's loop with a recording `send` (its upstream a real socket): over a client socket, "before"
    would be a race."""
    from gatewaysite.asgi import application, close_clients
    from proxy.ledger.metrics import REQUESTS

    monkeypatch.setattr(ledger, "LINGER_S", 5.0)  # the record stays in its journal until the flush
    a, _, _ = two_assignments
    labels = {"route": "/v1/chat/completions", "transport": "http", "outcome": "ok", "status_class": "2xx"}

    def counted() -> float:
        # The counter's own samples: a scrape of the registry would query the database for its gauge.
        samples = [m for family in REQUESTS.collect() for m in family.samples]
        return sum(m.value for m in samples if m.name == "gateway_requests_total" and m.labels == labels)

    events: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if '"event": "request"' in record.getMessage():
                events.append("logged")

    body = json.dumps({"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}).encode()
    headers = {
        "host": "testserver",
        "authorization": f"Bearer {GATEWAY_KEY}",
        "content-type": "application/json",
        "content-length": str(len(body)),
    }
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "headers": [(name.encode(), value.encode()) for name, value in headers.items()],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 80),
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the client stays
        return {}

    request_id = ""

    def journaled() -> bool:
        journals = ledger.writer.spool.directory.glob("journal-*.jsonl")
        return any(request_id in path.read_text() for path in journals)

    async def send(message: dict) -> None:
        nonlocal request_id
        events.append(message["type"])
        if message["type"] == "http.response.start":
            request_id = dict(message["headers"])[b"x-gateway-request-id"].decode()
        else:
            events.append(f"journaled {journaled()}, counted {counted() - before:.0f}")

    lines = Lines()
    logging.getLogger("gateway").addHandler(lines)
    before = counted()
    try:
        await application(scope, receive, send)
        await asyncio.sleep(0)
        assert events == ["http.response.start", "http.response.body", "journaled True, counted 0"]
        assert counted() - before == 0
        deadline = time.monotonic() + 5
        while "logged" not in events and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        assert events == ["http.response.start", "http.response.body", "journaled True, counted 0", "logged"]
        assert counted() - before == 1
    finally:
        logging.getLogger("gateway").removeHandler(lines)
        await close_clients()
        ledger.writer.flush()
    assert a.hit_count(model="gpt-5") == 1
    saved = RequestRecord.objects.filter(request_id=request_id)
    assert await sync_to_async(saved.count)() == 1
