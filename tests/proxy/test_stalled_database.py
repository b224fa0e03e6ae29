"""A database that stops answering holds no request past its deadline (issue 21, fault 4): the request
path's waits on it (the key check, the routing read, the probe lease, the budget reservation, the
state and affinity writes) are bounded by `x-gateway-deadline-ms`. What a write still takes for a
request after it stopped waiting (a reservation, a probe lease) is given back.

A stall is held here by another connection: on PostgreSQL a row or table lock, on SQLite the
database's write lock. The request path's reads go on (MVCC, WAL); its writes wait as they would on
a stalled server."""

import contextlib
import json
import sqlite3
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg
import pytest
from django.db import connection

from devkit.behaviours import slow_stream, slow_unavailable
from pools.models import BudgetHold, GatewayKey, GatewaySettings, KeyLimitWindow
from proxy.ledger.models import RequestRecord
from proxy.ledger.recorder import writer
from routing.models import Affinity, Circuit
from routing.policy.vocabulary import CircuitReason, CircuitState
from tests.proxy.fixtures_e2e import RESPONSES, wait_for
from tests.proxy.test_budget import AUTH, BODY, CHAT, _price
from tests.proxy.test_ledger_writer import _exchange

DEADLINE = {"x-gateway-deadline-ms": "1500"}


@contextlib.contextmanager
def _stalled(postgres_lock: str):
    """Another connection holds `postgres_lock` (one statement) on PostgreSQL, or SQLite's write lock,
    until the block ends."""
    db = connection.settings_dict
    if connection.vendor == "postgresql":
        with psycopg.connect(
            host=db["HOST"],
            port=db["PORT"] or 5432,
            user=db["USER"],
            password=db["PASSWORD"],
            dbname=db["NAME"],
        ) as other:
            other.execute(postgres_lock)
            yield
            other.rollback()
        return
    other = sqlite3.connect(db["NAME"], isolation_level=None, timeout=20)
    try:
        other.execute("BEGIN IMMEDIATE")
        yield
        other.execute("ROLLBACK")
    finally:
        other.close()


def _wait_for_a_lock_wait(timeout: float = 20.0) -> None:
    db = connection.settings_dict
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"], autocommit=True
    ) as probe:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            waiting = probe.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            ).fetchone()
            if waiting and waiting[0]:
                return
            time.sleep(0.02)
    raise AssertionError("the request never waited for the key's row")


def _post(gateway: str, path: str, **kwargs) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = httpx.post(f"{gateway}{path}", headers={**AUTH, **DEADLINE}, timeout=8, **kwargs)
    return response, time.monotonic() - started


def test_a_reservation_the_database_does_not_grant_by_the_deadline_is_a_503_and_is_given_back(
    gateway, two_assignments
):
    a, b, _ = two_assignments
    _price(1_000_000, 1_000_000)
    GatewayKey.objects.update(budget_micros=1_000_000)
    key = GatewayKey.objects.get()
    table = GatewayKey._meta.db_table
    with _stalled(f"SELECT 1 FROM {table} WHERE id = {key.pk} FOR UPDATE"):
        response, waited = _post(gateway, "/v1/chat/completions", content=BODY)
    assert (response.status_code, response.json()["error"]["code"]) == (503, "gateway_unavailable")
    assert waited < 5, waited  # its 1.5 s deadline, not the 8 s the client would have waited
    assert a.hits == [] and b.hits == []
    # Once the database answers, the reservation it grants late is released at once.
    time.sleep(1.0)
    writer.flush()
    key.refresh_from_db()
    assert (key.reserved_micros, key.spent_micros) == (0, 0)


def test_a_responses_answer_does_not_wait_past_its_deadline_for_its_affinity_write(gateway, two_assignments):
    table = Affinity._meta.db_table
    with _stalled(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE"):
        response, waited = _post(gateway, "/v1/responses", json=RESPONSES)
    assert response.status_code == 200
    assert waited < 5, waited
    # The write was not abandoned: it lands once the database answers.
    response_id = response.json()["id"]
    wait_for(lambda: Affinity.objects.filter(key=response_id).first(), what="the late affinity")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a row lock that leaves other tables writable")
@pytest.mark.parametrize(
    ("cooldown", "waited"),
    [
        # Past the cooldown: acct-a opened, cooled down and went half-open while the request waited.
        (1, 1.2),
        # Before the cooldown is over: the failure that opened acct-a was computed 0.9 s before the
        # request's read but committed after it, so acct-a is half-open already. A view younger than
        # the cooldown is trusted for only half of it (proxy.outcomes.TRUSTED_SHARE).
        (2, 1.3),
    ],
)
def test_a_request_that_waited_does_not_dispatch_on_the_health_it_read_before(
    gateway, two_assignments, cooldown, waited
):
    """Fault 5 (half_open_probes): a request read acct-a's circuit closed, then waited on the database
    (its budget reservation). Meanwhile acct-a went half-open with another request's probe in flight.
    On the health it had read, the request would try acct-a first, a second probe in parallel (SPEC
    §7.1: only the lease holder tries a half-open assignment first). It reads the circuit again before
    dispatching, and takes acct-b."""
    a, b, (acct_a, _) = two_assignments
    _price(1_000_000, 1_000_000)
    GatewaySettings.objects.filter(pk=1).update(cooldown_seconds=cooldown)
    GatewayKey.objects.update(budget_micros=1_000_000)
    key = GatewayKey.objects.get()
    table = GatewayKey._meta.db_table
    answer: list[httpx.Response] = []
    with _stalled(f"SELECT 1 FROM {table} WHERE id = {key.pk} FOR UPDATE"):
        request = threading.Thread(
            target=lambda: answer.append(
                httpx.post(
                    f"{gateway}/v1/chat/completions",
                    content=BODY,
                    headers={**AUTH, "x-gateway-deadline-ms": "10000"},
                    timeout=15,
                )
            )
        )
        request.start()
        _wait_for_a_lock_wait()  # it has read acct-a closed and waits for its reservation...
        time.sleep(waited)
        now = datetime.now(UTC)
        Circuit.objects.create(  # acct-a is half-open by now; another request probes it
            pool=acct_a.pool,
            assignment=acct_a,
            model="gpt-5",
            route_class="sse",  # BODY is a stream
            state=CircuitState.HALF_OPEN,
            reason=CircuitReason.UPSTREAM_UNAVAILABLE,
            consecutive_failures=3,
            cooldown_seconds=cooldown,
            open_until=now - timedelta(seconds=0.2),
            probes_in_flight=1,
            probe_lease_expires_at=now + timedelta(seconds=60),
        )
    request.join(15)
    assert answer and answer[0].status_code == 200
    assert a.hits == [] and len(b.hits) == 1


def test_an_open_assignment_reached_after_its_cooldown_ended_is_probed_with_the_lease(
    gateway, two_assignments
):
    """Fault 5, a second path (the full soak's last violation): acct-a was open with its cooldown
    running when the request read it, so it came last; by the time acct-b had failed, the cooldown
    was over. Dispatched without the probe lease, it ran beside the request that took the lease next.
    It is now a probe like any other: it takes the lease first (the circuit is half-open with one
    probe while it runs)."""
    a, b, (acct_a, _) = two_assignments
    a.script("gpt-5", slow_stream(1.5))
    b.script("gpt-5", slow_unavailable(1.0))
    now = datetime.now(UTC)
    Circuit.objects.create(
        pool=acct_a.pool,
        assignment=acct_a,
        model="gpt-5",
        route_class="http",
        state=CircuitState.OPEN,
        reason=CircuitReason.UPSTREAM_UNAVAILABLE,
        consecutive_failures=3,
        cooldown_seconds=1,
        open_until=now + timedelta(seconds=0.5),
    )
    answer: list[httpx.Response] = []
    request = threading.Thread(
        target=lambda: answer.append(
            httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=15)
        )
    )
    request.start()
    seen = set()
    while request.is_alive():
        row = Circuit.objects.filter(assignment=acct_a).values_list("state", "probes_in_flight").first()
        seen.add(row)
        time.sleep(0.02)
    assert answer and answer[0].status_code == 200
    assert (len(b.hits), len(a.hits)) == (1, 1), (answer[0].headers, answer[0].text[:300], seen)
    assert (CircuitState.HALF_OPEN, 1) in seen, seen


def _ws_answer_time(gateway: str, deadline_ms: int, stall) -> tuple[float, object]:
    """Seconds from a `response.create` sent right after the handshake to its answer (its terminal or
    error event, or the connection's close), and that answer, while `stall()` holds the database."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    url = gateway.replace("http://", "ws://") + "/v1/responses"
    headers = {**AUTH, "x-gateway-deadline-ms": str(deadline_ms)}
    with stall(), connect(url, additional_headers=headers, open_timeout=5) as ws:
        sent = time.monotonic()
        ws.send(json.dumps({"type": "response.create", **RESPONSES}))
        try:
            answer: object = json.loads(ws.recv(timeout=15))
        except ConnectionClosed as closed:
            answer = closed.rcvd.code if closed.rcvd else None
        return time.monotonic() - sent, answer


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a lock that stalls reads (not SQLite's WAL)")
def test_a_websocket_frame_is_answered_by_its_deadline_while_the_handshake_key_check_stalls(
    gateway, two_assignments
):
    """The soak's db_restart case: a frame sent right after the handshake, while the database does not
    answer the key check. The check is bounded by the handshake's deadline, and the frame's clock
    runs from when it was sent: the client hears `gateway unavailable` by its deadline, not after
    the gateway's own 5 s read bound."""
    a, b, _ = two_assignments
    table = GatewayKey._meta.db_table
    waited, answer = _ws_answer_time(
        gateway, 1500, lambda: _stalled(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    )
    assert answer == 1013, answer  # closed: "gateway unavailable"
    assert waited < 3.5, waited  # its 1.5 s deadline, not the 5 s read bound
    assert a.hits == [] and b.hits == []


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a lock that stalls reads (not SQLite's WAL)")
def test_a_websocket_frames_deadline_counts_the_wait_for_its_handshakes_key_check(gateway, two_assignments):
    """The key check answers late (1.7 s of a 2 s deadline), then the frame's routing read stalls: the
    frame gets its typed 503 by its own deadline, counted from when it was sent, not a whole deadline
    more after the key check."""
    a, b, _ = two_assignments
    keys, circuits = GatewayKey._meta.db_table, Circuit._meta.db_table

    @contextlib.contextmanager
    def stall():
        with _stalled(f"LOCK TABLE {circuits} IN ACCESS EXCLUSIVE MODE"):
            locked = threading.Event()

            def hold_keys() -> None:
                with _stalled(f"LOCK TABLE {keys} IN ACCESS EXCLUSIVE MODE"):
                    locked.set()
                    time.sleep(1.7)

            holder = threading.Thread(target=hold_keys)
            holder.start()
            locked.wait(5)
            yield
            holder.join()

    waited, answer = _ws_answer_time(gateway, 2000, stall)
    assert isinstance(answer, dict) and answer["error"]["code"] == "gateway_unavailable", answer
    assert waited < 3.0, waited  # its 2 s deadline; 1.7 s + a whole 2 s more is what the bug took
    assert a.hits == [] and b.hits == []


def test_a_keys_limits_admission_waits_no_longer_than_the_deadline(gateway, two_assignments, settings):
    """A key with limits is admitted in the database (no REDIS_URL); a stalled database answers the
    admission late. The request's deadline bounds that wait, as it bounds its other waits."""
    a, b, _ = two_assignments
    settings.REDIS_URL = ""
    GatewayKey.objects.update(limit_rpm=100)
    with _stalled(f"LOCK TABLE {KeyLimitWindow._meta.db_table} IN ACCESS EXCLUSIVE MODE"):
        response, waited = _post(gateway, "/v1/chat/completions", content=BODY)
    assert (response.status_code, response.json()["error"]["code"]) == (503, "gateway_unavailable")
    assert waited < 3.5, waited  # its 1.5 s deadline, not the limiter's own 5 s bound
    assert a.hits == [] and b.hits == []


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a row lock the request's write waits for")
def test_a_client_that_leaves_while_its_reservation_waits_is_recorded_and_holds_nothing(
    gateway, two_assignments
):
    """Window 5 of budget_reservations: the client left while its request's reservation waited for
    the key's row. The UPDATE still runs on its thread and commits once the row is free; the request,
    cancelled, never took its answer. It is recorded as cancelled (499), and the reservation granted
    after it stopped waiting is given back (runtime.db.write_within's undo), as after a deadline."""
    a, b, _ = two_assignments
    _price(1_000_000, 1_000_000)
    GatewayKey.objects.update(budget_micros=1_000_000, budget_period="day")  # the UPDATE sets period_start
    key = GatewayKey.objects.get()
    table = GatewayKey._meta.db_table
    # The reservation's UPDATE waits for the key's row; the ledger's write of the record does not (its
    # foreign key's share lock does not conflict), so the record is settled before the reservation
    # commits: only the undo can give it back.
    with _stalled(f"SELECT 1 FROM {table} WHERE id = {key.pk} FOR NO KEY UPDATE"):
        with pytest.raises(httpx.ReadTimeout):  # it leaves: the connection closes, the request is cancelled
            httpx.post(
                f"{gateway}/v1/chat/completions",
                content=BODY,
                headers={**AUTH, "x-gateway-deadline-ms": "60000"},
                timeout=httpx.Timeout(10, read=0.5),
            )
        record = wait_for(
            lambda: writer.flush() and RequestRecord.objects.filter(key_id=key.pk).first(), what="its record"
        )
    assert (record.outcome, record.status_code) == ("cancelled", 499)
    wait_for(lambda: GatewayKey.objects.get().period_start, what="the late reservation")
    wait_for(lambda: GatewayKey.objects.get().reserved_micros == 0, what="the late reservation given back")
    assert not BudgetHold.objects.exists()
    assert a.hits == [] and b.hits == []


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a row lock the request's write waits for")
def test_a_late_reservation_whose_give_back_fails_is_released_from_the_journal(
    gateway, two_assignments, monkeypatch
):
    """Window 2, the give-back failing: the reservation was granted after its request's deadline and
    after its record was settled (with nothing held), and the database failed the give-back too. The
    request's hold is journaled for good; the writer that replays this process's journal once it is
    gone (here a copy of the line, in a journal no process holds) releases it and charges nothing."""
    from django.conf import settings
    from django.db import OperationalError

    from proxy import relay
    from proxy.ledger import recorder as ledger

    def give_back_fails(**kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(relay, "key_budget_give_back", give_back_fails)
    _price(1_000_000, 1_000_000)
    GatewayKey.objects.update(budget_micros=1_000_000, budget_period="day")  # the UPDATE sets period_start
    key = GatewayKey.objects.get()
    table = GatewayKey._meta.db_table
    with _stalled(f"SELECT 1 FROM {table} WHERE id = {key.pk} FOR NO KEY UPDATE"):
        response, _ = _post(gateway, "/v1/chat/completions", content=BODY)
        record = wait_for(
            lambda: writer.flush() and RequestRecord.objects.filter(key_id=key.pk).first(), what="its record"
        )
    assert (response.status_code, response.json()["error"]["code"]) == (503, "gateway_unavailable")
    wait_for(lambda: GatewayKey.objects.get().period_start, what="the late reservation")
    spool = Path(settings.GATEWAY_LEDGER_SPOOL_DIR)

    def journaled() -> list[str]:
        return [
            line
            for path in spool.glob("journal-*.jsonl")
            for line in path.read_text().splitlines()
            if record.request_id in line and '"held":true' in line
        ]

    lines = wait_for(journaled, what="the hold journaled for good")
    assert GatewayKey.objects.get().reserved_micros > 0  # held in the database until the replay

    tag = ledger.writer.spool.database_tag()
    (spool / f"journal-{tag}-1-gone-0.jsonl").write_text(lines[-1] + "\n")
    replaying = ledger.LedgerWriter()
    replaying.submit(_exchange())  # any record: its writer looks for journals as it starts
    assert replaying.flush(timeout=10)
    key.refresh_from_db()
    assert (key.reserved_micros, key.spent_micros) == (0, 0)
    assert not BudgetHold.objects.exists()
    assert RequestRecord.objects.filter(request_id=record.request_id).count() == 1
