"""Latency (SPEC §5.4): the ledger writer folds each batch's times to first byte into a moving average
per (assignment, model), and the request's one statement before dispatch reads it into the candidates.
Never written on a request's path, kept in a process no longer than a ledger batch lingers
(`routing.request_state.FIGURES_MAX_AGE_S`): every node routes on the same average."""

import json
import time
from datetime import UTC, datetime
from io import StringIO

import httpx
import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from devkit.behaviours import Serve
from pools.models import Assignment, GatewayKey
from proxy.ledger.exchange import AttemptLog, Exchange
from proxy.ledger.models import RequestRecord
from proxy.ledger.recorder import LedgerWriter
from routing.health_state import RowKind
from routing.models import Demotion, Latency
from routing.policy.latency import Fold
from routing.policy.types import RouteClass
from routing.request_state import (
    FIGURES_MAX_AGE_S,
    Narrowing,
    narrowing,
    request_state_from_rows,
    request_state_load,
    request_state_query,
)
from routing.selectors import config_snapshot, routing_view_load
from routing.services import latencies_record
from runtime import rawsql
from tests.factories import (
    AssignmentFactory,
    CatalogEntryFactory,
    GatewayKeyFactory,
    PoolFactory,
    finished_exchange,
)
from tests.gateway_fixtures import GATEWAY_KEY
from tests.proxy.fixtures_e2e import CHAT, RESPONSES, ledger_settled, post
from tests.proxy.test_websocket import open_ws, read_response

pytestmark = pytest.mark.django_db(transaction=True)


def _attempt(assignment_id: int, ttfb_ms: int | None, *, status="succeeded", model="gpt-5", ordinal=1):
    return AttemptLog(
        ordinal=ordinal,
        assignment_id=assignment_id,
        model=model,
        route_class="http",
        status=status,
        ttfb_ms=ttfb_ms,
    )


def _exchange(*attempts: AttemptLog) -> Exchange:
    return finished_exchange(attempts=list(attempts))


def _saved(writer: LedgerWriter, *exchanges: Exchange) -> None:
    for exchange in exchanges:
        writer.submit(exchange)
    assert writer.flush(timeout=10)


def _average(assignment: Assignment, model: str = "gpt-5") -> tuple[float, int]:
    row = Latency.objects.get(assignment=assignment, model=model)
    return round(row.ewma_ms, 6), row.samples


def test_the_writer_folds_each_batchs_samples_into_the_pairs_moving_average():
    a = AssignmentFactory()
    writer = LedgerWriter()
    _saved(writer, _exchange(_attempt(a.pk, 100)))
    assert _average(a) == (100.0, 1)
    _saved(
        writer,
        _exchange(_attempt(a.pk, 200)),
        # A failed attempt's timing is no sample, nor is an attempt that never had a first byte.
        _exchange(_attempt(a.pk, 5000, status="retryable_failed"), _attempt(a.pk, 300, ordinal=2)),
        _exchange(_attempt(a.pk, None)),
    )
    # Each sample moves the average a fifth of the way towards itself: 100 -> 120 -> 156.
    assert _average(a) == (156.0, 3)
    assert RequestRecord.objects.count() == 4


def test_a_sample_of_an_assignment_deleted_meanwhile_costs_neither_the_records_nor_the_other_samples():
    a, gone = AssignmentFactory(), AssignmentFactory()
    gone_id = gone.pk
    gone.delete()
    x = _exchange(_attempt(gone_id, 100), _attempt(a.pk, 200, ordinal=2))
    _saved(LedgerWriter(), x)
    assert RequestRecord.objects.filter(request_id=x.request_id).exists()
    assert _average(a) == (200.0, 1)
    assert not Latency.objects.filter(assignment_id=gone_id).exists()


def test_the_fold_is_one_statement_for_a_batch_and_none_for_a_batch_without_samples(
    django_assert_num_queries,
):
    a, b = AssignmentFactory(), AssignmentFactory()
    without = [_exchange(_attempt(a.pk, None)), _exchange(_attempt(a.pk, 90, status="failed"))]
    with django_assert_num_queries(0):
        LedgerWriter._fold_latencies(without)
    pairs = [_exchange(_attempt(a.pk, 100)), _exchange(_attempt(b.pk, 200), _attempt(a.pk, 300, model="o3"))]
    with django_assert_num_queries(1):
        LedgerWriter._fold_latencies(pairs)
    assert sorted(Latency.objects.values_list("assignment_id", "model", "ewma_ms")) == [
        (a.pk, "gpt-5", 100.0),
        (a.pk, "o3", 300.0),
        (b.pk, "gpt-5", 200.0),
    ]


@pytest.fixture
def pool_of_two():
    a = AssignmentFactory(name="acct-a")
    b = AssignmentFactory(name="acct-b", pool=a.pool)
    for assignment in (a, b):
        CatalogEntryFactory(assignment=assignment, model="gpt-5")
    GatewayKeyFactory(name="lat", raw_key=GATEWAY_KEY, pools=[a.pool])
    return a, b


@pytest.mark.parametrize("troubled", ["none", "demoted"])
def test_the_requests_one_statement_reads_the_latency_into_its_candidates(
    pool_of_two, troubled, django_assert_num_queries
):
    """Whether or not another candidate has a health row: a request with none (the fast path, which
    hands the configuration's candidates on untouched) must carry the latency too."""
    a, b = pool_of_two
    now = timezone.now()
    latencies_record(folds=[Fold(a.pk, "gpt-5", 250.4, 3)], now=now)
    if troubled == "demoted":
        Demotion.objects.create(
            assignment=b, model="gpt-5", reason="headroom", until=now.replace(year=now.year + 1)
        )
    with django_assert_num_queries(1):
        state = request_state_load(GATEWAY_KEY, route_class=RouteClass.HTTP, now=now)
    assert state is not None
    view, _ = routing_view_load(
        pool_ids=state.authenticated.key.pool_ids, route_class=RouteClass.HTTP, now=now, health=state.health
    )
    assert {c.assignment: (c.latency_ms, c.demoted) for c in view.routes["gpt-5"]} == {
        "acct-a": (250.0, False),
        "acct-b": (None, troubled == "demoted"),
    }


def test_a_narrowed_statement_reads_the_requests_models_latency_unless_the_keys_pools_or_version_moved(
    pool_of_two, django_assert_num_queries
):
    """With the key's last pools and version, the request's one statement reads the latency rows of the
    models it plans over and no other model's; when the key's pools or the config
    version are not the ones assumed, every row of its pools, as without a narrowing."""
    a, b = pool_of_two
    for assignment in (a, b):
        CatalogEntryFactory(assignment=assignment, model="gpt-4o")
    now = timezone.now()
    latencies_record(folds=[Fold(x.pk, m, 100.0, 3) for x in (a, b) for m in ("gpt-5", "gpt-4o")], now=now)
    first = request_state_load(GATEWAY_KEY, route_class=RouteClass.HTTP, now=now)
    assert first is not None and len(first.health.latency) == 4
    pools, version = first.authenticated.key.pool_ids, first.authenticated.config_version
    config_snapshot(pools, version, now)  # as the key's first request leaves it cached
    narrow = narrowing(pools, version, "gpt-5", now)
    assert narrow == Narrowing(pools, version, ("gpt-5",))

    def latency_read(narrow: Narrowing) -> set[tuple[int, str]]:
        query = request_state_query(GATEWAY_KEY, route_class=RouteClass.HTTP, now=now, narrow=narrow)
        assert query is not None
        with django_assert_num_queries(1):
            state = request_state_from_rows(rawsql.fetch(query.sql, query.params), query.digest)
        assert state is not None and state.authenticated.key.name == "lat"
        return set(state.health.latency)

    assert latency_read(narrow) == {(a.pk, "gpt-5"), (b.pk, "gpt-5")}
    assert latency_read(Narrowing(pools, version, ("gpt-4o", "o3"))) == {(a.pk, "gpt-4o"), (b.pk, "gpt-4o")}
    every = {(x.pk, m) for x in (a, b) for m in ("gpt-5", "gpt-4o")}
    assert latency_read(Narrowing(pools, version + 1, ("gpt-5",))) == every
    assert latency_read(Narrowing((*pools, pools[0] + 1), version, ("gpt-5",))) == every
    assert latency_read(Narrowing((pools[0] + 1,), version, ("gpt-5",))) == every
    GatewayKey.objects.get(name="lat").pools.add(PoolFactory())  # the key now has a pool more
    now_version = request_state_load(GATEWAY_KEY, route_class=RouteClass.HTTP, now=now)
    assert now_version is not None
    assert latency_read(Narrowing(pools, now_version.authenticated.config_version, ("gpt-5",))) == every


def test_a_keys_next_request_reads_only_its_models_latency(gateway, two_assignments, monkeypatch):
    """The key's first request reads every latency row of its pools (nothing is known of the key yet);
    its next, narrowed by the key's first read, only the requested model's, and is served from them."""
    from routing import request_state

    _a, _b, (acct_a, acct_b) = two_assignments
    latencies_record(
        folds=[Fold(x.pk, m, 100.0, 3) for x in (acct_a, acct_b) for m in ("gpt-5", "gpt-4o")],
        now=timezone.now(),
    )
    narrowed: list[tuple[str, ...] | None] = []
    read: list[set[tuple[int, str]]] = []
    query, learn = request_state.request_state_query, request_state.READER._learn

    def spy_query(*args, **kwargs):
        narrowed.append(kwargs["narrow"].models if kwargs.get("narrow") else None)
        return query(*args, **kwargs)

    def spy_learn(*args):
        state = learn(*args)
        read.append(set(state.health.latency))
        return state

    monkeypatch.setattr(request_state, "request_state_query", spy_query)
    monkeypatch.setattr(request_state.READER, "_learn", spy_learn)
    for _ in range(2):
        assert post(gateway, "/v1/chat/completions", CHAT).status_code == 200

    assert narrowed == [None, ("gpt-5",)]
    pairs = {(x.pk, m) for x in (acct_a, acct_b) for m in ("gpt-5", "gpt-4o")}
    assert read == [pairs, {(acct_a.pk, "gpt-5"), (acct_b.pk, "gpt-5")}]


def _latency_rows(rows: list[tuple]) -> int:
    return sum(1 for row in rows if row[0] == RowKind.LATENCY)


def test_a_key_not_known_yet_is_narrowed_as_the_last_key_read_and_the_guess_is_checked(
    gateway, two_assignments, monkeypatch
):
    """A key the reader has not read yet (new, or forgotten past its limit) is narrowed with the pools of
    the last key read: on the same pools its statement reads none of the kept figures (not every latency
    row of the pools, once a request); on other pools the statement finds the guess wrong and reads every
    latency row of the key's own pools, which the request routes on, never on the kept ones."""
    from routing import request_state

    _a, _b, (acct_a, acct_b) = two_assignments
    other = PoolFactory(name="other")
    acct_c = AssignmentFactory(
        pool=other, name="acct-c", base_url=acct_a.base_url, api_key_env=acct_a.api_key_env
    )
    CatalogEntryFactory(assignment=acct_c, model="gpt-5")
    GatewayKeyFactory(name="same-pools", raw_key="sk-gw-same-pools-0123456789", pools=[acct_a.pool])
    GatewayKeyFactory(name="other-pools", raw_key="sk-gw-other-pools-0123456789", pools=[other])
    latencies_record(
        folds=[Fold(x.pk, m, 100.0, 3) for x in (acct_a, acct_b, acct_c) for m in ("gpt-5", "gpt-4o")],
        now=timezone.now(),
    )
    seen: list[tuple[tuple[str, ...] | None, int, set[tuple[int, str]]]] = []
    learn = request_state.READER._learn

    def spy_learn(digest, rows, known, narrow=None, cached=None):
        state = learn(digest, rows, known, narrow, cached)
        seen.append((narrow.models if narrow else None, _latency_rows(rows), set(state.health.latency)))
        return state

    monkeypatch.setattr(request_state.READER, "_learn", spy_learn)
    monkeypatch.setattr(request_state, "FIGURES_MAX_AGE_S", 3600.0)
    for key in (GATEWAY_KEY, GATEWAY_KEY, "sk-gw-same-pools-0123456789", "sk-gw-other-pools-0123456789"):
        reply = post(gateway, "/v1/chat/completions", CHAT, headers={"authorization": f"Bearer {key}"})
        assert reply.status_code == 200

    main = {(x.pk, m) for x in (acct_a, acct_b) for m in ("gpt-5", "gpt-4o")}
    narrowed = {(acct_a.pk, "gpt-5"), (acct_b.pk, "gpt-5")}
    assert seen == [
        (None, 4, main),  # nothing read yet: every latency row of the pools
        (("gpt-5",), 2, narrowed),  # the key narrowed by its own last read: its model's rows, kept
        (("gpt-5",), 0, narrowed),  # a key not known yet, on the same pools: the kept rows, none read
        (("gpt-5",), 2, {(acct_c.pk, "gpt-5"), (acct_c.pk, "gpt-4o")}),  # other pools: its own, all
    ]


def test_a_narrowings_figures_are_read_once_per_max_age_and_routed_on_meanwhile(
    gateway, two_assignments, monkeypatch
):
    """The latency, headroom and load rows of a narrowing's models are read by one request and routed on
    by the next ones of the same narrowing for FIGURES_MAX_AGE_S, whose statements read none of them; a
    request after that reads them again and routes on what the ledger writers wrote meanwhile."""
    from routing import request_state

    _a, _b, (acct_a, acct_b) = two_assignments
    latencies_record(folds=[Fold(acct_a.pk, "gpt-5", 100.0, 3)], now=timezone.now())
    seen: list[tuple[int, dict[tuple[int, str], float]]] = []
    learn = request_state.READER._learn

    def spy_learn(digest, rows, *rest):
        state = learn(digest, rows, *rest)
        seen.append((_latency_rows(rows), dict(state.health.latency)))
        return state

    monkeypatch.setattr(request_state.READER, "_learn", spy_learn)
    monkeypatch.setattr(request_state, "FIGURES_MAX_AGE_S", 3600.0)
    for _ in range(3):
        assert post(gateway, "/v1/chat/completions", CHAT).status_code == 200
    latencies_record(folds=[Fold(acct_b.pk, "gpt-5", 50.0, 3)], now=timezone.now())
    assert post(gateway, "/v1/chat/completions", CHAT).status_code == 200  # within the max age
    monkeypatch.setattr(request_state, "FIGURES_MAX_AGE_S", 0.0)
    ledger_settled()  # the requests' own samples folded into a's average
    assert post(gateway, "/v1/chat/completions", CHAT).status_code == 200  # past it

    first = {(acct_a.pk, "gpt-5"): 100.0}
    assert seen[:4] == [
        (1, first),  # nothing known of the key: every latency row of its pools
        (1, first),  # narrowed, nothing kept for the narrowing yet: its models' rows
        (0, first),  # kept: none read (a's average moved with the samples of the requests before)
        (0, first),  # b's average written meanwhile, not read yet
    ]
    rows, latency = seen[4]  # read again: b's average, and a's as the writer folded a's samples
    assert rows == 2 and latency[(acct_b.pk, "gpt-5")] == 50.0 and latency[(acct_a.pk, "gpt-5")] < 100.0


def test_a_kept_narrowings_figures_are_not_routed_on_once_the_keys_pools_moved(pool_of_two):
    """Figures are kept per narrowing (the key's pools, the config version, the models): a request whose
    key's pools are no longer the narrowing's reads every latency row of its pools, whatever is kept."""
    from routing.request_state import READER, Figures

    a, b = pool_of_two
    now = timezone.now()
    latencies_record(folds=[Fold(x.pk, "gpt-5", 100.0, 3) for x in (a, b)], now=now)
    first = request_state_load(GATEWAY_KEY, route_class=RouteClass.HTTP, now=now)
    assert first is not None
    pools, version = first.authenticated.key.pool_ids, first.authenticated.config_version
    config_snapshot(pools, version, now)
    narrow = narrowing(pools, version, "gpt-5", now)
    assert narrow is not None
    kept = Figures({}, {}, {}, read_at=time.monotonic())  # as if read just now, with nothing in it
    query = request_state_query(
        GATEWAY_KEY, route_class=RouteClass.HTTP, now=now, narrow=narrow, figures=False
    )
    assert query is not None
    rows = rawsql.fetch(query.sql, query.params)
    assert _latency_rows(rows) == 0
    state = READER._learn(query.digest, rows, None, narrow, kept)
    assert state is not None and state.health.latency is kept.latency  # the kept figures, routed on

    GatewayKey.objects.get(name="lat").pools.add(PoolFactory())  # the key now has a pool more
    query = request_state_query(
        GATEWAY_KEY, route_class=RouteClass.HTTP, now=now, narrow=narrow, figures=False
    )
    assert query is not None
    rows = rawsql.fetch(query.sql, query.params)
    state = READER._learn(query.digest, rows, None, narrow, kept)
    assert state is not None and set(state.health.latency) == {(a.pk, "gpt-5"), (b.pk, "gpt-5")}


def test_one_request_reads_stale_figures_again_while_the_others_route_on_them():
    """Concurrent requests that find a narrowing's figures stale do not each read them (each would decode
    and build a pool's rows): the first reads them, the others route on the last ones meanwhile."""
    from routing.request_state import Figures, Reader

    reader = Reader()
    narrow = Narrowing((1,), 1, ("gpt-5",))
    assert reader._kept(narrow) is None  # nothing kept: read
    stale = Figures({(1, "gpt-5"): 40.0}, {}, {}, read_at=time.monotonic() - 1)
    reader.figures[narrow] = stale
    assert reader._kept(narrow) is None  # the first to find them stale reads them
    meanwhile = reader._kept(narrow)
    assert meanwhile is not None and meanwhile.latency is stale.latency  # the others: the last ones
    assert reader._kept(None) is None


def test_figures_are_kept_no_longer_than_a_ledger_batch_lingers():
    """A copy of the rows the ledger writers change once a batch is at most one batch behind."""
    from proxy.ledger.recorder import LINGER_S
    from routing.request_state import FIGURES_MAX_AGE_S

    assert FIGURES_MAX_AGE_S <= LINGER_S


@pytest.mark.parametrize("features", [True, False])
def test_routing_explain_prints_each_candidates_weight_and_latency_as_the_router_reads_them(
    pool_of_two, settings, features
):
    settings.GATEWAY_POOL_FEATURES = features
    a, b = pool_of_two
    Assignment.objects.filter(pk=b.pk).update(weight=3)
    latencies_record(folds=[Fold(a.pk, "gpt-5", 250.4, 3)], now=timezone.now())
    out = StringIO()
    call_command("routing_explain", key="lat", model="gpt-5", stdout=out)
    # With the pool features on, b (weight 3, no average yet: counted as fast as the fastest) is drawn
    # three times in four, and a, which served three requests lately, loses to it whenever b is one of
    # the four draws (a comes first only when drawn four times: 1/256); off, nothing is drawn.
    chances = (", first 0%", ", first 100%") if features else ("", "")
    assert f"  acct-a / gpt-5: weight 1, latency 250 ms, load 3.0{chances[0]}\n" in out.getvalue()
    assert f"  acct-b / gpt-5: weight 3, latency unknown (no answer yet){chances[1]}\n" in out.getvalue()


@pytest.mark.parametrize("transport", ["http", "websocket"])
def test_a_served_requests_time_to_first_byte_becomes_its_accounts_latency(
    gateway, two_assignments, transport
):
    """Over HTTP the first byte is the answer's headers; over a websocket, the turn's first event after
    its frame was sent (the fake waits 0.3 s before each, so the average cannot be less)."""
    a, _b, (acct_a, acct_b) = two_assignments
    a.script("gpt-5", Serve(delay_s=0.3))
    if transport == "http":
        assert post(gateway, "/v1/chat/completions", CHAT).status_code == 200
    else:
        with open_ws(gateway) as ws:
            ws.send(json.dumps({"type": "response.create", **RESPONSES}))
            assert read_response(ws)[-1]["type"] == "response.completed"
    ledger_settled()
    ewma, samples = _average(acct_a)
    assert samples == 1 and ewma >= 300
    assert not Latency.objects.filter(assignment=acct_b).exists()  # it served nothing


@pytest.mark.skipif(connection.vendor != "postgresql", reason="two processes need a shared server database")
def test_two_gateway_processes_route_on_the_same_latency(gateway_nodes, two_assignments):
    """With the pool features off the plan is a priority list (tier, weight, then latency): two equal
    accounts go in name order until the average one node's writer kept says the second is faster; then
    both nodes send to it."""
    a, b, (acct_a, acct_b) = two_assignments
    Assignment.objects.update(tier=0)
    nodes = gateway_nodes.start(2, GATEWAY_POOL_FEATURES="false")
    auth = {"authorization": f"Bearer {GATEWAY_KEY}"}

    def served_by_each_node() -> list[str]:
        answers = [httpx.post(f"{n}/v1/chat/completions", json=CHAT, headers=auth, timeout=10) for n in nodes]
        return [answer.json()["choices"][0]["message"]["content"] for answer in answers]

    assert served_by_each_node() == ["hello from a", "hello from a"]
    latencies_record(
        folds=[Fold(acct_a.pk, "gpt-5", 900.0, 5), Fold(acct_b.pk, "gpt-5", 100.0, 5)], now=datetime.now(UTC)
    )
    time.sleep(FIGURES_MAX_AGE_S)  # each node's copy of the rows is this old at most
    assert served_by_each_node() == ["hello from b", "hello from b"]
    assert (a.hit_count(), b.hit_count()) == (2, 2)
