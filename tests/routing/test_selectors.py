"""The plan selector: plain values for the pure core, in a constant number of queries."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from catalog.models import Provenance
from pools.models import GatewayKey, GatewaySettings, ModelFallback
from pools.selectors import key_authenticate
from routing import services
from routing.affinities import Affinities, AffinityIds, affinities_load, session_named
from routing.health_state import health_load
from routing.models import AffinityKind, Circuit, Demotion
from routing.policy.types import (
    AFFINITY_KEY_MAX,
    ASSIGNMENT_WIDE,
    CircuitReason,
    Health,
    RouteClass,
    TriState,
)
from routing.request_state import request_state_load
from routing.selectors import GovernedRoutes, routing_view_load
from routing.services import CircuitKey
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory

pytestmark = pytest.mark.django_db

RAW = "sk-gw-selector-test-0123456789"


def _populate(pools: int, assignments: int, models: int):
    created = []
    for p in range(pools):
        pool = PoolFactory(name=f"pool-{p}", auto_models=["m-0"])
        created.append(pool)
        for a in range(assignments):
            assignment = AssignmentFactory(pool=pool, name=f"p{p}-a{a}", tier=a % 3)
            for m in range(models):
                CatalogEntryFactory(assignment=assignment, model=f"m-{m}")
            now = timezone.now()
            key = CircuitKey(pool.pk, assignment.pk, "m-0", "http")
            services.circuit_record_failure(
                key=key, reason=CircuitReason.UPSTREAM_UNAVAILABLE, settings=_bs(), now=now
            )
            services.demotion_record(
                services.Demote(
                    assignment.pk, "m-0", CircuitReason.UPSTREAM_MODEL_UNAVAILABLE, now + timedelta(minutes=1)
                ),
            )
    return created


def _bs():
    from routing.policy.breaker import BreakerSettings

    return BreakerSettings()


def _queries(pool_ids):
    with CaptureQueriesContext(connection) as ctx:
        view, _ = routing_view_load(pool_ids=pool_ids, route_class=RouteClass.HTTP, now=timezone.now())
    return len(ctx.captured_queries), view


def test_the_plan_selector_runs_the_same_queries_for_1_and_50_assignments():
    GatewaySettings.load()  # the singleton row exists once any configuration was loaded
    small = _populate(pools=1, assignments=1, models=1)
    small_count, small_view = _queries(tuple(p.pk for p in small))
    PoolFactory._meta.model.objects.all().delete()
    large = _populate(pools=2, assignments=25, models=3)
    large_count, large_view = _queries(tuple(p.pk for p in large))
    assert sum(len(c) for c in small_view.routes.values()) == 1
    assert sum(len(c) for c in large_view.routes.values()) == 150
    assert small_count == large_count


def test_the_view_carries_catalog_values_health_and_demotions():
    pool = PoolFactory(auto_models=["gpt-5"])
    a = AssignmentFactory(pool=pool, name="a", tools="true", tier=1)
    b = AssignmentFactory(pool=pool, name="b", enabled=False)
    CatalogEntryFactory(assignment=a, model="gpt-5", context_window=1000, vision="false")
    CatalogEntryFactory(assignment=a, model="gpt-x", provenance=Provenance.PRESERVED)
    CatalogEntryFactory(assignment=b, model="gpt-5")
    now = timezone.now()
    Circuit.objects.create(
        pool=pool,
        assignment=a,
        model="gpt-5",
        route_class="http",
        state="open",
        reason="upstream_model_unavailable",
        open_until=now + timedelta(minutes=1),
    )
    view, _ = routing_view_load(pool_ids=(pool.pk,), route_class=RouteClass.HTTP, now=now)
    (candidate,) = view.routes["gpt-5"]  # the disabled assignment is not a route
    assert (candidate.assignment, candidate.tier, candidate.tools) == ("a", 1, TriState.TRUE)
    assert (candidate.context_window, candidate.model_vision, candidate.write_tools) == (
        1000,
        TriState.FALSE,
        TriState.UNKNOWN,
    )
    assert candidate.health is Health.BLOCKED
    assert view.routes["gpt-x"][0].health is Health.HEALTHY
    # The catalog's provenance travels with each candidate, for the code-less 404 (SPEC §5.6).
    assert view.routes["gpt-x"][0].provenance == "preserved"
    sse, _ = routing_view_load(pool_ids=(pool.pk,), route_class=RouteClass.SSE, now=now)
    assert sse.routes["gpt-5"][0].health is Health.HEALTHY  # circuits are per route class
    assert view.auto_models == ("gpt-5",)


def test_health_is_applied_to_a_model_as_its_routes_are_looked_up_and_the_view_reads_as_a_dict():
    """The view's routes govern one model at a time (`GovernedRoutes`): each model looked up, iterated or
    compared has its circuits and demotions applied, and asking which models exist applies none."""
    pool = PoolFactory()
    a = AssignmentFactory(pool=pool, name="a", tier=0)
    b = AssignmentFactory(pool=pool, name="b", tier=1)
    for assignment in (a, b):
        for model in ("gpt-5", "gpt-x"):
            CatalogEntryFactory(assignment=assignment, model=model)
    now = timezone.now()
    Circuit.objects.create(pool=pool, assignment=a, model="gpt-x", route_class="http", consecutive_failures=2)
    Demotion.objects.create(
        assignment=b, model="gpt-5", reason="upstream_model_unavailable", until=now + timedelta(minutes=1)
    )
    view, _ = routing_view_load(pool_ids=(pool.pk,), route_class=RouteClass.HTTP, now=now)
    assert isinstance(view.routes, GovernedRoutes)
    assert "gpt-x" in view.routes and "gpt-4" not in view.routes and len(view.routes) == 2
    models = view.routes.keys()
    assert "gpt-x" in models and "gpt-4" not in models and sorted(models) == ["gpt-5", "gpt-x"]
    assert view.routes.get("gpt-4", ()) == ()
    assert view.routes._done == {}  # which models exist: nothing governed yet
    assert [c.health for c in view.routes.get("gpt-x", ())] == [Health.FAILING, Health.HEALTHY]
    assert list(view.routes._done) == ["gpt-x"]
    governed = {m: [(c.assignment, c.health, c.demoted) for c in cs] for m, cs in view.routes.items()}
    assert governed == {
        "gpt-5": [("a", Health.HEALTHY, False), ("b", Health.HEALTHY, True)],
        "gpt-x": [("a", Health.FAILING, False), ("b", Health.HEALTHY, False)],
    }
    assert view.routes.get("gpt-4") is None and view.routes["gpt-x"] is view.routes["gpt-x"]


def test_key_authenticate_accepts_only_the_enabled_secret():
    pool = PoolFactory()
    key = GatewayKeyFactory(raw_key=RAW, pools=[pool], allowed_models=["gpt-5"], budget_micros=100)
    authenticated = key_authenticate(RAW)
    assert authenticated is not None
    policy = authenticated.key
    assert (policy.name, policy.pool_ids, policy.allowed_models) == (key.name, (pool.pk,), ("gpt-5",))
    assert policy.requirements.budget_remaining_micros == 100
    assert key_authenticate(RAW + "x") is None
    assert key_authenticate("") is None
    key.enabled = False
    key.save()
    assert key_authenticate(RAW) is None


def _explain(**options) -> str:
    out = StringIO()
    call_command("routing_explain", stdout=out, **options)
    return out.getvalue()


@pytest.fixture
def explained_setup():
    pool = PoolFactory(name="main")
    eu = AssignmentFactory(pool=pool, name="eu-a", region="eu", tier=1)
    us = AssignmentFactory(pool=pool, name="us-a", region="us", tier=0)
    for assignment in (eu, us):
        CatalogEntryFactory(assignment=assignment, model="claude-opus-4-8")
    CatalogEntryFactory(assignment=us, model="claude-opus-4-1")
    GatewayKeyFactory(name="ci", raw_key=RAW, pools=[pool])
    return pool


def test_routing_explain_prints_order_and_reasons(explained_setup):
    out = _explain(key="ci", model="claude-opus-4-8", requirements="region=eu")
    assert "model claude-opus-4-8 -> served claude-opus-4-8" in out
    assert "1. eu-a / claude-opus-4-8 [tier 1, healthy]" in out
    assert "ineligible: us-a / claude-opus-4-8 [tier 0, healthy]: region" in out


def test_routing_explain_shows_family_fallback_and_cross_model_candidates(explained_setup):
    out = _explain(key="ci", model="claude-opus-5")
    assert "model claude-opus-5 -> served claude-opus-4-8 (fallback: family)" in out
    out = _explain(key="ci", model="claude-opus-4-8")
    assert "cross-model fallback: claude-opus-4-1 (family)" in out
    assert "us-a / claude-opus-4-1 [tier 0, healthy, cross-model]" in out


def test_routing_explain_reports_no_eligible_backend_with_the_condition(explained_setup):
    out = _explain(key="ci", model="claude-opus-4-8", requirements="region=ap")
    assert "plan: empty -> no_eligible_backend (region)" in out


def test_routing_explain_honours_explicit_fallbacks_and_pins(explained_setup):
    ModelFallback.objects.create(requested="claude-opus-5", served="claude-opus-4-1")
    assert "served claude-opus-4-1 (fallback: explicit)" in _explain(key="ci", model="claude-opus-5")
    us = explained_setup.assignments.get(name="us-a")
    services.affinity_record(
        gateway_key_id=GatewayKey.objects.get(name="ci").pk,
        kind=AffinityKind.RESPONSE,
        key="resp_1",
        assignment_id=us.pk,
        ttl=timedelta(hours=1),
        now=timezone.now(),
    )
    out = _explain(key="ci", model="claude-opus-4-8", previous_response_id="resp_1")
    assert "1. us-a" in out and "eu-a" not in out


def test_routing_explain_names_a_long_session_as_the_proxy_does(explained_setup):
    """The proxy remembers a session by the first AFFINITY_KEY_MAX characters of its header; routing_explain
    given the same header value finds the same session and keeps the request on its account."""
    eu = explained_setup.assignments.get(name="eu-a")  # tier 1: second without the session
    header = "s" * (AFFINITY_KEY_MAX + 20)
    services.affinity_record(
        gateway_key_id=GatewayKey.objects.get(name="ci").pk,
        kind=AffinityKind.SESSION,
        key=session_named(header),
        assignment_id=eu.pk,
        model="claude-opus-4-8",
        ttl=timedelta(hours=1),
        now=timezone.now(),
    )
    assert "1. us-a" in _explain(key="ci", model="claude-opus-4-8")
    assert "1. eu-a" in _explain(key="ci", model="claude-opus-4-8", session=header)


def test_routing_explain_pins_only_the_keys_own_response(explained_setup):
    """As the proxy does (SPEC §7.2): another key's response id, like an unknown one, is not forwarded;
    the key's own pins its account."""
    other = GatewayKeyFactory(name="other", pools=[explained_setup])
    ci = GatewayKey.objects.get(name="ci")
    eu = explained_setup.assignments.get(name="eu-a")
    for owner, response_id in ((other, "resp_other"), (ci, "resp_ours")):
        services.affinity_record(
            gateway_key_id=owner.pk,
            kind=AffinityKind.RESPONSE,
            key=response_id,
            assignment_id=eu.pk,
            ttl=timedelta(hours=1),
            now=timezone.now(),
        )
    for response_id in ("resp_other", "resp_never_seen"):
        out = _explain(key="ci", model="claude-opus-4-8", previous_response_id=response_id)
        assert "no dispatch: previous_response_not_found" in out and "plan:" not in out
    out = _explain(key="ci", model="claude-opus-4-8", previous_response_id="resp_ours")
    assert "1. eu-a" in out and "us-a" not in out.split("plan:")[1].split("ineligible")[0]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"key": "nope", "model": "gpt-5"}, "unknown key"),
        ({"key": "ci", "model": "gpt-5", "requirements": "teleport"}, "cannot read 'teleport'"),
    ],
)
def test_routing_explain_rejects_bad_input(explained_setup, options, message):
    with pytest.raises(CommandError, match=message):
        _explain(**options)


def test_routing_explain_says_model_not_found(explained_setup):
    assert "no dispatch: model_not_found" in _explain(key="ci", model="gpt-9")


def test_a_warm_request_reads_once_before_dispatch_and_sees_config_changes():
    pool = PoolFactory()
    assignment = AssignmentFactory(pool=pool, name="a")
    CatalogEntryFactory(assignment=assignment, model="gpt-5")
    GatewayKeyFactory(raw_key=RAW, pools=[pool])

    def request_reads():
        with CaptureQueriesContext(connection) as ctx:
            now = timezone.now()
            state = request_state_load(RAW, route_class=RouteClass.HTTP, now=now)
            authenticated, health = state.authenticated, state.health
            view, _ = routing_view_load(
                pool_ids=authenticated.key.pool_ids,
                route_class=RouteClass.HTTP,
                now=now,
                config_version=authenticated.config_version,
                health=health,
            )
        return len(ctx.captured_queries), view

    request_reads()  # the first request of a process loads the configuration
    reads, view = request_reads()
    assert reads == 1
    assert [c.assignment for c in view.routes["gpt-5"]] == ["a"]

    AssignmentFactory(pool=pool, name="b", tier=1).catalog_entries.create(
        model="gpt-5", provenance="configured"
    )
    reads, view = request_reads()
    assert reads > 1  # the config version moved: reloaded
    assert [c.assignment for c in view.routes["gpt-5"]] == ["a", "b"]
    assert request_reads()[0] == 1


@pytest.mark.parametrize("route_class", [RouteClass.HTTP, RouteClass.SSE])
def test_the_one_statement_reads_what_the_key_and_health_reads_read(route_class):
    """The request path's statement (key and health together) against the two reads it replaces, on
    the same data: two pools of the key (their order is the names'), a pool it does not have, an
    open circuit per route class, an assignment-wide one, demotions live and expired."""
    now = timezone.now()
    pools = [PoolFactory(name=name) for name in ("zeta", "alpha", "other")]
    assignments = [AssignmentFactory(pool=pool, name=f"a-{pool.name}") for pool in pools]
    for pool, assignment in zip(pools, assignments, strict=True):
        for model, route in (("gpt-5", "http"), ("gpt-5", "sse"), ("", "any")):
            Circuit.objects.create(
                pool=pool,
                assignment=assignment,
                model=model if route != "any" else ASSIGNMENT_WIDE,
                route_class=route if route != "any" else ASSIGNMENT_WIDE,
                state="open",
                reason="upstream_unavailable",
                consecutive_failures=3,
                open_until=now + timedelta(minutes=1),
            )
        for model, until in (("gpt-5", now + timedelta(minutes=1)), ("gpt-4", now - timedelta(minutes=1))):
            services.demotion_record(
                services.Demote(assignment.pk, model, CircuitReason.UPSTREAM_MODEL_UNAVAILABLE, until)
            )
    GatewayKeyFactory(raw_key=RAW, pools=pools[:2], limit_rpm=7)

    state = request_state_load(RAW, route_class=route_class, now=now)
    authenticated, health = state.authenticated, state.health
    assert authenticated == key_authenticate(RAW)
    assert authenticated.key.pool_ids == (pools[1].pk, pools[0].pk)
    assert health == health_load(pool_ids=authenticated.key.pool_ids, route_class=route_class, now=now)
    assert set(health.circuits) == {(assignments[0].pk, "gpt-5"), (assignments[1].pk, "gpt-5")}
    assert set(health.wide) == {assignments[0].pk, assignments[1].pk}
    assert health.demoted == {(assignments[0].pk, "gpt-5"), (assignments[1].pk, "gpt-5")}
    assert request_state_load(RAW + "x", route_class=route_class, now=now) is None
    assert request_state_load("", route_class=route_class, now=now) is None


def test_the_one_statement_reads_a_key_without_pools():
    GatewayKeyFactory(raw_key=RAW, pools=[])
    PoolFactory()  # a pool, with health, that is not the key's
    state = request_state_load(RAW, route_class=RouteClass.HTTP, now=timezone.now())
    authenticated, health = state.authenticated, state.health
    assert authenticated == key_authenticate(RAW)
    assert authenticated.key.pool_ids == ()
    assert (health.circuits, health.wide, health.demoted) == ({}, {}, set())


def _affinities_seen(found: Affinities) -> dict:
    rows = [found.response, found.session, *found.files.values()]
    return {(a.kind, a.key): (a.assignment_id, a.model, a.expires_at) for a in rows if a}


@pytest.mark.parametrize(
    "ids",
    [
        AffinityIds(response_id="id-1"),
        AffinityIds(session="id-1"),
        AffinityIds(file_ids=("id-1", "id-2", "id-old")),
        AffinityIds(response_id="id-1", session="id-2", file_ids=("id-1", "id-unknown")),
        AffinityIds(response_id="id-unknown"),
    ],
    ids=["response", "session", "files", "all", "unknown"],
)
def test_the_one_statement_finds_the_keys_affinities_as_affinities_load_does(django_assert_num_queries, ids):
    """A request naming a previous response, a session or files reads their affinities with its key:
    still one statement, and the same rows as the lookup by the key's id (SPEC §7.2): the key's own,
    live ones; another key's rows for the same ids (here on another account) never."""
    pool = PoolFactory()
    mine, theirs = AssignmentFactory(pool=pool, name="mine"), AssignmentFactory(pool=pool, name="theirs")
    owner = GatewayKeyFactory(raw_key=RAW, pools=[pool])
    stranger = GatewayKeyFactory(pools=[pool])
    now = timezone.now()
    for key, assignment in ((owner, mine), (stranger, theirs)):
        for kind in AffinityKind:
            for name, ttl in (("id-1", 1), ("id-2", 1), ("id-old", -1)):
                services.affinity_record(
                    gateway_key_id=key.pk,
                    kind=kind,
                    key=name,
                    assignment_id=assignment.pk,
                    model=f"{key.pk}-{kind}-{name}",
                    ttl=timedelta(hours=ttl),
                    now=now,
                )
    plain = request_state_load(RAW, route_class=RouteClass.HTTP, now=now)
    with django_assert_num_queries(1):
        state = request_state_load(RAW, route_class=RouteClass.HTTP, now=now, affinity=ids)
    expected = affinities_load(
        key_id=owner.pk, now=now, response_id=ids.response_id, session=ids.session, file_ids=ids.file_ids
    )
    assert state.affinities == expected
    assert (state.authenticated, state.health) == (plain.authenticated, plain.health)
    assert plain.affinities == Affinities()
    seen = _affinities_seen(state.affinities)
    assert all(row[:2] == (mine.pk, f"{owner.pk}-{kind}-{key}") for (kind, key), row in seen.items())
    named = {
        *([(AffinityKind.RESPONSE, ids.response_id)] if ids.response_id else []),
        *([(AffinityKind.SESSION, ids.session)] if ids.session else []),
        *((AffinityKind.FILE, f) for f in ids.file_ids),
    }
    assert set(seen) == {n for n in named if n[1] in ("id-1", "id-2")}  # neither expired nor unknown


def test_a_response_id_longer_than_any_remembered_one_names_no_affinity():
    """An affinity holds an id of at most AFFINITY_KEY_MAX characters (a longer one is never remembered):
    a longer previous_response_id pins nothing, on the request's read and in affinities_load alike,
    not even to a remembered id it starts with."""
    pool = PoolFactory()
    assignment = AssignmentFactory(pool=pool)
    owner = GatewayKeyFactory(raw_key=RAW, pools=[pool])
    now = timezone.now()
    remembered = "r" * AFFINITY_KEY_MAX
    services.affinity_record(
        gateway_key_id=owner.pk,
        kind=AffinityKind.RESPONSE,
        key=remembered,
        assignment_id=assignment.pk,
        ttl=timedelta(hours=1),
        now=now,
    )
    for named, found in ((remembered, True), (remembered + "x", False)):
        ids = AffinityIds(response_id=named)
        state = request_state_load(RAW, route_class=RouteClass.HTTP, now=now, affinity=ids)
        assert (state.affinities.response is not None) is found
        loaded = affinities_load(key_id=owner.pk, now=now, response_id=named)
        assert (loaded.response is not None) is found


def test_every_kind_of_configuration_write_moves_the_version():
    from catalog.models import CatalogEntry
    from pools.models import Assignment, ConfigVersion, ModelAlias, Pool

    def version():
        return ConfigVersion.objects.filter(pk=1).values_list("value", flat=True).first() or 0

    pool = PoolFactory()
    entry = CatalogEntryFactory(assignment=AssignmentFactory(pool=pool))
    writes = [
        lambda: Pool.objects.filter(pk=pool.pk).update(auto_models=["x"]),  # bulk: no signal fires
        lambda: Assignment.objects.update(tier=5),
        lambda: CatalogEntry.objects.filter(pk=entry.pk).update(input_per_mtok_micros=1),
        lambda: GatewaySettings.load(),
        lambda: ModelAlias.objects.create(alias="g5", canonical="gpt-5"),
        lambda: ModelFallback.objects.create(requested="gpt-9", served="gpt-5"),
        lambda: CatalogEntry.objects.all().delete(),
    ]
    for write in writes:
        before = version()
        write()
        assert version() > before


def test_routing_explain_knows_which_adapters_carry_a_route(explained_setup):
    claude = AssignmentFactory(pool=explained_setup, name="claude-a", adapter="anthropic", tier=2)
    CatalogEntryFactory(assignment=claude, model="claude-opus-4-8")
    out = _explain(key="ci", model="claude-opus-4-8", route="/responses/compact")
    assert "route /responses/compact" in out
    assert "ineligible: claude-a / claude-opus-4-8 [tier 2, healthy]: capability" in out
    out = _explain(key="ci", model="claude-opus-4-8", route="/messages/count_tokens")
    assert "1. claude-a / claude-opus-4-8" in out
    assert "ineligible: us-a / claude-opus-4-8 [tier 0, healthy]: capability" in out
    assert "claude-a / claude-opus-4-8 [tier 2, healthy]" in _explain(key="ci", model="claude-opus-4-8")


def test_an_assignment_wide_credential_circuit_governs_every_model_and_route_class():
    pool = PoolFactory()
    a = AssignmentFactory(pool=pool, name="a")
    CatalogEntryFactory(assignment=a, model="gpt-5")
    CatalogEntryFactory(assignment=a, model="gpt-x")
    now = timezone.now()
    Circuit.objects.create(
        pool=pool,
        assignment=a,
        model="*",
        route_class="*",
        state="open",
        reason="credential_rejected",
        consecutive_failures=1,
        cooldown_seconds=60,
        open_until=now + timedelta(minutes=1),
    )
    for route_class in RouteClass:
        view, _ = routing_view_load(pool_ids=(pool.pk,), route_class=route_class, now=now)
        assert {c.health for model in ("gpt-5", "gpt-x") for c in view.routes[model]} == {Health.COOLING}
        assert view.wide[a.pk].reason is CircuitReason.CREDENTIAL_REJECTED


def test_routing_explain_orders_an_open_account_last_and_shows_the_lease_holders_plan(explained_setup):
    """SPEC §5.4: health before tier. us-a (tier 0) open and cooling goes after eu-a (tier 1); once its
    cooldown is over, the request that takes the probe lease tries it first; routing_explain (read
    only, it takes no lease) prints both orders."""
    us = explained_setup.assignments.get(name="us-a")
    circuit = Circuit.objects.create(
        pool=explained_setup,
        assignment=us,
        model="claude-opus-4-8",
        route_class="http",
        state="open",
        reason="upstream_unavailable",
        consecutive_failures=3,
        cooldown_seconds=60,
        open_until=timezone.now() + timedelta(minutes=1),
    )
    out = _explain(key="ci", model="claude-opus-4-8")
    assert "1. eu-a / claude-opus-4-8 [tier 1, healthy]" in out
    assert "2. us-a / claude-opus-4-8 [tier 0, cooling]" in out
    Circuit.objects.filter(pk=circuit.pk).update(open_until=timezone.now() - timedelta(seconds=1))
    out = _explain(key="ci", model="claude-opus-4-8")
    assert "probe: us-a / claude-opus-4-8 admits one probe" in out
    assert "1. us-a / claude-opus-4-8 [tier 0, held]" in out
    circuit.refresh_from_db()
    assert (circuit.state, circuit.probes_in_flight) == ("open", 0)  # explaining took no lease
