"""Budgets (SPEC §5.3, §7.4): a reservation held before dispatch by one conditional UPDATE, settled to the
actual cost (or kept when usage never arrives); periods; unknown prices never count."""

import asyncio
import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from django.db import connection

from catalog.models import CatalogEntry
from catalog.prices import bundled_price
from devkit.behaviours import cut_stream, rate_limited, serve
from pools.models import BudgetHold, GatewayKey
from proxy.ledger.models import Attempt
from proxy.ledger.recorder import writer
from routing.policy.pricing import cost_micros
from routing.policy.types import Price, PriceSource
from tests.gateway_fixtures import GATEWAY_KEY

AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
CHAT = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}


def _price(input_micros, output_micros):
    CatalogEntry.objects.update(input_per_mtok_micros=input_micros, output_per_mtok_micros=output_micros)


UNPRICED = "house-model-1"  # named by no configured price and not in catalog/prices.yaml


def _unpriced(*fakes) -> dict:
    """Both accounts serve a model no price table knows; the request body that asks for it."""
    assert bundled_price(UNPRICED) is None
    for fake in fakes:
        fake.models = (UNPRICED,)
    CatalogEntry.objects.update(model=UNPRICED)
    return {**CHAT, "model": UNPRICED}


def test_a_served_request_spends_its_known_cost(gateway, two_assignments):
    _price(1_000_000, 2_000_000)  # 1 and 2 micros per token
    GatewayKey.objects.update(budget_micros=1_000_000)
    response = httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=10)
    assert response.status_code == 200
    writer.flush()
    attempt = Attempt.objects.get(status="succeeded")
    assert attempt.cost_micros == attempt.input_tokens * 1 + attempt.output_tokens * 2
    assert GatewayKey.objects.get().spent_micros == attempt.cost_micros


def test_a_configured_price_wins_over_the_bundled_one(gateway, two_assignments):
    _price(1_000_000, 2_000_000)  # gpt-5 is in catalog/prices.yaml at other rates
    assert bundled_price("gpt-5") != Price(1_000_000, 2_000_000, PriceSource.BUNDLED)
    response = httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=10)
    assert response.status_code == 200
    writer.flush()
    attempt = Attempt.objects.get(status="succeeded")
    assert attempt.cost_micros == attempt.input_tokens * 1 + attempt.output_tokens * 2


def test_without_a_configured_price_the_bundled_list_price_serves_a_budget_and_is_recorded(
    gateway, two_assignments
):
    bundled = bundled_price("gpt-5")
    assert bundled is not None and bundled.provenance == PriceSource.BUNDLED
    GatewayKey.objects.update(budget_micros=1_000_000)  # no price configured on any entry
    response = httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=10)
    assert response.status_code == 200
    writer.flush()
    attempt = Attempt.objects.get(status="succeeded")
    expected = cost_micros(bundled, input_tokens=attempt.input_tokens, output_tokens=attempt.output_tokens)
    assert attempt.cost_micros == expected > 0
    assert GatewayKey.objects.get().spent_micros == expected


def test_an_unknown_price_with_a_budget_is_ineligible(gateway, two_assignments):
    a, b, _ = two_assignments
    body = _unpriced(a, b)
    GatewayKey.objects.update(budget_micros=1_000_000)  # prices stay unknown
    response = httpx.post(f"{gateway}/v1/chat/completions", json=body, headers=AUTH, timeout=10)
    assert response.status_code == 503
    assert (response.json()["error"]["code"], response.json()["error"]["param"]) == (
        "no_eligible_backend",
        "price_unknown",
    )
    assert a.hits == [] and b.hits == []


def test_an_exhausted_budget_is_ineligible_and_without_a_budget_unknown_cost_is_null(
    gateway, two_assignments
):
    a, b, _ = two_assignments
    _price(1_000_000, 1_000_000)
    GatewayKey.objects.update(budget_micros=5, spent_micros=0)  # reservation: prompt estimate + 10 > 5
    response = httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=10)
    assert (response.status_code, response.json()["error"]["code"]) == (429, "budget_exceeded")
    assert a.hits == [] and b.hits == []

    GatewayKey.objects.update(budget_micros=None)
    _price(None, None)
    body = _unpriced(a, b)
    assert (
        httpx.post(f"{gateway}/v1/chat/completions", json=body, headers=AUTH, timeout=10).status_code == 200
    )
    writer.flush()
    assert Attempt.objects.get(status="succeeded").cost_micros is None
    assert GatewayKey.objects.get().spent_micros == 0


# -- reservations and periods (SPEC §7.4) -----------------------------------------------------------

BODY = json.dumps({**CHAT, "stream": True}).encode()
RESERVATION = len(BODY) // 4 + 10  # 1 micro per token: the prompt estimate plus max_tokens


def _send(gateway: str, body: bytes = BODY) -> httpx.Response:
    headers = {**AUTH, "content-type": "application/json"}
    return httpx.post(f"{gateway}/v1/chat/completions", content=body, headers=headers, timeout=10)


def _key() -> GatewayKey:
    writer.flush()
    return GatewayKey.objects.get()


def test_a_stream_is_reserved_then_settled_to_its_actual_cost(gateway, two_assignments):
    a, _, _ = two_assignments
    _price(1_000_000, 1_000_000)
    a.script("gpt-5", serve("one two", input_tokens=4, output_tokens=2))
    GatewayKey.objects.update(budget_micros=RESERVATION)  # exactly one reservation fits
    response = _send(gateway)
    assert response.status_code == 200 and "[DONE]" in response.text
    key = _key()
    assert (key.spent_micros, key.reserved_micros) == (6, 0)  # settled to the actual cost, released
    assert Attempt.objects.get(status="succeeded").cost_micros == 6


def test_a_dearer_later_candidate_tops_the_reservation_up_and_all_of_it_is_settled(gateway, two_assignments):
    """Window 5 (top-ups): acct-a rate-limits, and acct-b, twice its price, needs twice its
    reservation: the request reserves the difference on top. Its hold grows with it, and the record
    settles all of it: nothing stays reserved, the spend is acct-b's known cost."""
    a, b, (_, acct_b) = two_assignments
    _price(1_000_000, 1_000_000)
    CatalogEntry.objects.filter(assignment=acct_b).update(
        input_per_mtok_micros=2_000_000, output_per_mtok_micros=2_000_000
    )
    a.script("gpt-5", rate_limited())
    b.script("gpt-5", serve("one two", input_tokens=4, output_tokens=2))
    GatewayKey.objects.update(budget_micros=1_000)
    response = _send(gateway)
    assert response.status_code == 200 and "[DONE]" in response.text
    assert len(a.hits) == 1 and len(b.hits) == 1
    key = _key()
    assert (key.spent_micros, key.reserved_micros) == (12, 0)
    assert not BudgetHold.objects.exists()


def test_a_reservation_that_does_not_fit_beside_those_in_flight_sends_nothing(gateway, two_assignments):
    a, b, _ = two_assignments
    _price(1_000_000, 1_000_000)
    # Other requests in flight hold all but one micro of what this one needs.
    GatewayKey.objects.update(budget_micros=RESERVATION, reserved_micros=1)
    response = _send(gateway)
    assert (response.status_code, response.json()["error"]["code"]) == (429, "budget_exceeded")
    assert "$0.000001 held by requests in flight" in response.json()["error"]["message"]
    assert a.hits == [] and b.hits == []
    assert (_key().spent_micros, _key().reserved_micros) == (0, 1)  # nothing of its own was held


def test_an_answer_whose_usage_never_arrives_costs_its_reservation(gateway, two_assignments):
    a, _, _ = two_assignments
    _price(1_000_000, 1_000_000)
    a.script("gpt-5", cut_stream())  # output, then the connection dies: no usage chunk ever comes
    GatewayKey.objects.update(budget_micros=1_000)
    response = _send(gateway)
    assert response.status_code == 200
    key = _key()
    assert (key.spent_micros, key.reserved_micros) == (RESERVATION, 0)


def test_a_daily_budget_starts_again_each_utc_day(gateway, two_assignments):
    a, _, _ = two_assignments
    _price(1_000_000, 1_000_000)
    a.script("gpt-5", serve("one two", input_tokens=4, output_tokens=2))
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    GatewayKey.objects.update(
        budget_micros=RESERVATION, budget_period="day", spent_micros=RESERVATION, period_start=today
    )
    spent_today = _send(gateway)
    assert (spent_today.status_code, spent_today.json()["error"]["code"]) == (429, "budget_exceeded")

    GatewayKey.objects.update(period_start=today - timedelta(days=1))  # yesterday's spend
    served = _send(gateway)
    assert served.status_code == 200
    key = _key()
    assert (key.spent_micros, key.reserved_micros, key.period_start) == (6, 0, today)


@pytest.fixture
def request_path_queries(monkeypatch):
    """Statements the request path runs: on a Django cursor (any thread but the ledger writer's, which
    batches off the request's critical path) and on the event loop's connections (runtime.loopdb)."""
    import threading

    from django.db.backends import utils

    from runtime import loopdb

    seen: list[str] = []
    execute, on_loop, on_loop_write, on_loop_sqlite = (
        utils.CursorWrapper.execute,
        loopdb.ReadConnection.rows,
        loopdb.ReadConnection.count,
        loopdb.SQLiteReadCursor.rows,
    )

    def counting(self, sql, params=None):
        if threading.current_thread().name != "ledger-writer":
            seen.append(sql)
        return execute(self, sql, params)

    async def counting_on_loop(conn, sql, params):
        seen.append(sql)
        return await on_loop(conn, sql, params)

    async def counting_on_loop_write(conn, sql, params):
        seen.append(sql)
        return await on_loop_write(conn, sql, params)

    def counting_on_loop_sqlite(cursor, sql, params):
        seen.append(sql)
        return on_loop_sqlite(cursor, sql, params)

    monkeypatch.setattr(utils.CursorWrapper, "execute", counting)
    monkeypatch.setattr(loopdb.ReadConnection, "rows", counting_on_loop)
    monkeypatch.setattr(loopdb.ReadConnection, "count", counting_on_loop_write)
    monkeypatch.setattr(loopdb.SQLiteReadCursor, "rows", counting_on_loop_sqlite)
    return seen


@pytest.fixture
def statement_places(monkeypatch):
    """(where, statement) for each statement outside the ledger writer: "loop" for one on the event
    loop's connections (runtime.loopdb), else the Django cursor's thread name."""
    import threading

    from django.db.backends import utils

    from runtime import loopdb

    seen: list[tuple[str, str]] = []
    execute, on_loop, on_loop_write, on_loop_sqlite = (
        utils.CursorWrapper.execute,
        loopdb.ReadConnection.rows,
        loopdb.ReadConnection.count,
        loopdb.SQLiteReadCursor.rows,
    )

    def on_thread(self, sql, params=None):
        if threading.current_thread().name != "ledger-writer":
            seen.append((threading.current_thread().name, sql))
        return execute(self, sql, params)

    async def counted_on_loop(conn, sql, params):
        seen.append(("loop", sql))
        return await on_loop(conn, sql, params)

    async def counted_on_loop_write(conn, sql, params):
        seen.append(("loop", sql))
        return await on_loop_write(conn, sql, params)

    def counted_on_loop_sqlite(cursor, sql, params):
        try:
            asyncio.get_running_loop()
            seen.append(("loop", sql))
        except RuntimeError:
            seen.append((threading.current_thread().name, sql))
        return on_loop_sqlite(cursor, sql, params)

    monkeypatch.setattr(utils.CursorWrapper, "execute", on_thread)
    monkeypatch.setattr(loopdb.ReadConnection, "rows", counted_on_loop)
    monkeypatch.setattr(loopdb.ReadConnection, "count", counted_on_loop_write)
    monkeypatch.setattr(loopdb.SQLiteReadCursor, "rows", counted_on_loop_sqlite)
    return seen


@pytest.mark.parametrize("kept", [False, True])
def test_a_healthy_requests_read_runs_on_the_event_loop_on_postgresql(
    gateway, two_assignments, statement_places, monkeypatch, kept
):
    """No thread hop before dispatch: a read thread's hand-off costs the loop the GIL (runtime.loopdb).
    On PostgreSQL the statement goes out on the loop's pool; on SQLite it runs on the loop itself."""
    from runtime import loopdb

    if kept:  # as production keeps its connections (the suite's CONN_MAX_AGE is 0): the loop's pool
        monkeypatch.setattr(loopdb, "_max_age", lambda: 300)
    assert _send(gateway).status_code == 200  # warm the routing config cache
    writer.flush()
    statement_places.clear()
    assert _send(gateway).status_code == 200
    assert _send(gateway).status_code == 200
    assert len(loopdb._pools) == (1 if kept and connection.vendor == "postgresql" else 0)
    places = [where for where, _ in statement_places]
    assert places == ["loop", "loop"], statement_places  # one statement a request
    assert len(loopdb._sqlite) == (1 if connection.vendor == "sqlite" else 0)


@pytest.mark.parametrize("kept", [False, True])
def test_a_request_naming_a_session_reads_its_affinity_in_the_same_statement(
    gateway, two_assignments, statement_places, monkeypatch, kept
):
    """A request that names an affinity (here a session; a previous response or a file alike) reads it
    with its key: one statement before dispatch, on the event loop, no thread hop."""
    from runtime import loopdb

    if kept:
        monkeypatch.setattr(loopdb, "_max_age", lambda: 300)
    headers = {**AUTH, "content-type": "application/json", "x-gateway-session": "agent-7"}

    def send() -> httpx.Response:
        return httpx.post(f"{gateway}/v1/chat/completions", content=BODY, headers=headers, timeout=10)

    assert send().status_code == 200  # the config cached, the session's affinity written
    writer.flush()
    statement_places.clear()
    for _ in range(2):  # the same account serves the session: nothing to write
        answer = send()
        assert answer.status_code == 200
    places = [where for where, _ in statement_places]
    assert places == ["loop", "loop"], statement_places
    assert all("routing_affinity" in sql for _, sql in statement_places)


def test_a_healthy_request_builds_no_database_wrapper_on_the_event_loop(
    gateway, two_assignments, monkeypatch
):
    """`django.db.connection` is one wrapper per thread and per asyncio context: asked on the event
    loop, every request would build a new one (runtime.rawsql.backend)."""
    import asyncio

    from django.db.backends.base.base import BaseDatabaseWrapper

    built_on_loop: list[str] = []
    init = BaseDatabaseWrapper.__init__

    def counting(self, *args, **kwargs):
        try:
            asyncio.get_running_loop()
            built_on_loop.append(type(self).__module__)
        except RuntimeError:
            pass  # a thread's own connection, made once per thread
        init(self, *args, **kwargs)

    assert _send(gateway).status_code == 200  # the routing config cached, the threads' connections made
    writer.flush()
    monkeypatch.setattr(BaseDatabaseWrapper, "__init__", counting)
    for _ in range(3):
        assert _send(gateway).status_code == 200
    assert built_on_loop == []


def test_a_read_the_loops_pool_cannot_take_goes_to_the_threads(
    gateway, two_assignments, statement_places, monkeypatch
):
    """No connection to give on PostgreSQL, a lock the loop's SQLite connection would wait for."""
    from runtime import loopdb

    async def no_connection(conn, sql, params):
        raise loopdb.NoConnection

    def locked(cursor, sql, params):
        raise loopdb.NoConnection

    assert _send(gateway).status_code == 200  # the key known to the edge, the routing config cached
    writer.flush()
    monkeypatch.setattr(loopdb.ReadConnection, "rows", no_connection)
    monkeypatch.setattr(loopdb.SQLiteReadCursor, "rows", locked)
    statement_places.clear()
    assert _send(gateway).status_code == 200
    [(where, _)] = statement_places  # the whole read, on a thread
    assert where.startswith("gateway-db_")


def test_a_healthy_request_makes_no_extra_round_trip_and_a_budget_costs_one_statement(
    gateway, two_assignments, request_path_queries
):
    _price(1_000_000, 1_000_000)
    assert _send(gateway).status_code == 200  # warm the routing config cache
    writer.flush()
    request_path_queries.clear()
    assert _send(gateway).status_code == 200
    healthy = list(request_path_queries)
    assert len(healthy) == 1, healthy  # the key and its pools' health, one statement, as before budgets

    GatewayKey.objects.update(budget_micros=1_000_000)
    writer.flush()
    request_path_queries.clear()
    assert _send(gateway).status_code == 200
    budgeted = [sql.lstrip().upper() for sql in request_path_queries]
    # One conditional UPDATE holds the reservation, the request's hold written with it (in the same
    # statement on PostgreSQL; SQLite has no UPDATE in a WITH: a second statement in its transaction);
    # once answered, what the answer did not cost is given back the same way (the key's next request
    # must not find it held, SPEC §7.4); the settlement of the cost rides in the ledger's batch.
    if connection.vendor == "postgresql":
        assert len(budgeted) == 3 and budgeted[1].startswith("WITH RESERVED AS (UPDATE"), budgeted
        assert budgeted[2].startswith("WITH RELEASED AS (UPDATE"), budgeted
    else:
        verbs = [sql.split()[0] for sql in budgeted[1:]]
        assert verbs == ["BEGIN", "UPDATE", "INSERT", "BEGIN", "UPDATE", "UPDATE"], budgeted


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite's writes wait for its writer's lock")
def test_a_reservation_runs_on_the_event_loop_and_on_a_thread_when_the_loop_has_no_connection(
    gateway, two_assignments, statement_places, monkeypatch
):
    """A thread's hand-back of the reservation's answer waits for the loop as a read's did (runtime.loopdb
    `write_within`): on PostgreSQL the reservation goes out on the loop's write pool; with no connection
    to give there, it goes to runtime.db's write threads, granted all the same."""
    from runtime import loopdb

    _price(1_000_000, 1_000_000)
    GatewayKey.objects.update(budget_micros=1_000_000)
    assert _send(gateway).status_code == 200  # the config cached, the loop's pools opened
    writer.flush()
    statement_places.clear()
    assert _send(gateway).status_code == 200
    writer.flush()
    assert [where for where, _ in statement_places] == ["loop", "loop", "loop"], statement_places
    assert statement_places[1][1].lstrip().upper().startswith("WITH RESERVED AS (UPDATE")

    async def no_connection(conn, sql, params):
        raise loopdb.NoConnection

    monkeypatch.setattr(loopdb.ReadConnection, "count", no_connection)
    statement_places.clear()
    assert _send(gateway).status_code == 200
    writer.flush()
    places = [where for where, _ in statement_places]
    assert places[0] == "loop" and all(where.startswith("gateway-db-write_") for where in places[1:]), places
    key = _key()
    assert key.spent_micros > 0 and key.reserved_micros == 0  # three requests charged, nothing held
    assert not BudgetHold.objects.exists()


@pytest.fixture(params=["loop", "threads"])
def reserve_on(request, monkeypatch) -> str:
    """Where the request's reservation runs: on the loop's write pool (PostgreSQL), or on runtime.db's
    write threads (SQLite; PostgreSQL when the loop has no connection to give)."""
    from runtime import loopdb

    if request.param == "loop" and connection.vendor != "postgresql":
        pytest.skip("SQLite's reservations run on threads")
    if request.param == "threads" and connection.vendor == "postgresql":

        async def no_connection(conn, sql, params):
            raise loopdb.NoConnection

        monkeypatch.setattr(loopdb.ReadConnection, "count", no_connection)
    return request.param


def _break_reservation(where: str, monkeypatch, *, committed: bool) -> None:
    """The reservation's connection breaks: after its commit (the answer lost), or before it is sent."""
    import psycopg
    from django.db import OperationalError

    from proxy import relay
    from runtime import loopdb

    message = "server closed the connection unexpectedly" if committed else "connection refused"
    if where == "loop":
        count = loopdb.ReadConnection.count

        async def broken_on_loop(conn, sql, params):
            if committed:
                assert await count(conn, sql, params) == 1
            raise psycopg.OperationalError(message)

        monkeypatch.setattr(loopdb.ReadConnection, "count", broken_on_loop)
        return
    reserve = relay.key_budget_reserve

    def broken(**kwargs):
        if committed:
            assert reserve(**kwargs)
        raise OperationalError(message)

    monkeypatch.setattr(relay, "key_budget_reserve", broken)


def test_a_reservation_that_committed_though_its_answer_was_lost_is_released_by_the_record(
    gateway, two_assignments, monkeypatch, reserve_on
):
    """Window 2 of budget_reservations: the reservation's UPDATE committed, but its answer never
    reached the request (the connection broke after the commit, as when the database goes down). The
    request answers 503 believing it holds nothing; its ledger record settles what the database holds
    for it (its hold), so nothing stays reserved."""
    a, b, _ = two_assignments
    _price(1_000_000, 1_000_000)
    GatewayKey.objects.update(budget_micros=1_000_000)
    _break_reservation(reserve_on, monkeypatch, committed=True)
    response = _send(gateway)
    assert (response.status_code, response.json()["error"]["code"]) == (503, "gateway_unavailable")
    assert a.hits == [] and b.hits == []
    key = _key()
    assert (key.reserved_micros, key.spent_micros) == (0, 0)  # released; nothing was dispatched
    assert not BudgetHold.objects.exists()


def test_a_reservation_the_database_cannot_take_is_a_typed_503_not_a_budget_refusal(
    gateway, two_assignments, monkeypatch, reserve_on
):
    a, b, _ = two_assignments
    _price(1_000_000, 1_000_000)
    GatewayKey.objects.update(budget_micros=1_000_000)
    _break_reservation(reserve_on, monkeypatch, committed=False)
    response = _send(gateway)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "gateway_unavailable"
    assert response.headers["x-should-retry"] == "true"
    assert a.hits == [] and b.hits == []
