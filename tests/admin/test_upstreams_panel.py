"""/admin/upstreams/ over Django's test client: who may see what, that it shows the database's state
and nothing secret, that it never writes, and that its query count does not grow with the data."""

import re
from datetime import timedelta

import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

from catalog.models import CapabilityEvidence, CatalogEntry
from catalog.selectors import route_hash
from pools.models import Assignment, GatewaySettings, Pool
from proxy.ledger.models import Attempt, RequestRecord
from routing.models import Circuit, Demotion, Latency
from routing.policy.panel import Panel
from tests.admin.conftest import (
    CREDENTIAL,
    PROVIDER_MESSAGE,
    RAW_KEY,
    URL_PASSWORD,
    build_routing_state,
    make_user,
    upstreams_url,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def state(credential):
    return build_routing_state(timezone.now())


def _content_main(response) -> str:
    html = response.content.decode()
    return html[html.index('id="content-main"') :]


def _panel(response) -> Panel:
    return response.context["panel"]


def test_the_page_lives_at_admin_upstreams():
    assert upstreams_url() == "/admin/upstreams/"


def test_an_anonymous_user_gets_the_login_page(client, state):
    response = client.get(upstreams_url())
    assert response.status_code == 302
    assert response.url == f"{reverse('admin:login')}?next={upstreams_url()}"


def test_a_non_staff_user_gets_the_login_page_even_with_the_permission(client, state):
    client.force_login(make_user("outsider", staff=False, pools=(state.alpha,)))
    response = client.get(upstreams_url(), follow=True)
    assert response.redirect_chain[0][0].startswith(reverse("admin:login"))
    html = response.content.decode()
    for name in ("acct-a", "gpt-5", "alpha", "zeta"):
        assert name not in html


def test_a_staff_user_without_the_view_permission_gets_403(client, state):
    client.force_login(make_user("intern", perms=(), pools=(state.alpha,)))
    response = client.get(upstreams_url())
    assert response.status_code == 403
    html = response.content.decode()
    for name in ("acct-a", "gpt-5", "alpha"):
        assert name not in html


def test_the_change_permission_implies_the_view(client, state):
    client.force_login(make_user("editor", perms=("change_assignment",), pools=(state.alpha,)))
    assert client.get(upstreams_url()).status_code == 200


def test_an_operator_sees_only_the_pools_granted_to_their_groups(client, state):
    client.force_login(make_user("operator", pools=(state.alpha,)))
    response = client.get(upstreams_url())
    assert response.status_code == 200
    panel = _panel(response)
    assert [p.name for p in panel.pools] == ["alpha"]
    assert [a.name for a in panel.pools[0].assignments] == ["acct-a", "acct-b"]
    assert {u.model for u in panel.usage} == {"gpt-5", "gpt-5-mini"}
    assert "zeta" not in response.content.decode()


def test_a_staff_user_of_another_pool_sees_nothing_of_this_one(client, state):
    client.force_login(make_user("zeta-ops", pools=(state.beta,)))
    panel = _panel(client.get(upstreams_url()))
    assert [p.name for p in panel.pools] == ["zeta-pool"]
    html = client.get(upstreams_url()).content.decode()
    for name in ("alpha", "acct-a", "acct-b", "gpt-5", "claude-x", "gpt-4o-legacy"):
        assert name not in html
    assert [u.model for u in panel.usage] == ["zeta-model"]


def test_an_operator_with_no_granted_pool_sees_an_empty_page(client, state):
    client.force_login(make_user("newcomer"))
    response = client.get(upstreams_url())
    assert response.status_code == 200
    assert _panel(response).pools == ()
    assert _panel(response).usage == ()
    assert "No pool is visible to you" in response.content.decode()


def test_a_superuser_sees_every_pool(admin_client, state):
    panel = _panel(admin_client.get(upstreams_url()))
    assert [p.name for p in panel.pools] == ["alpha", "zeta-pool"]
    assert {u.model for u in panel.usage} == {"gpt-5", "gpt-5-mini", "zeta-model"}


def test_the_admin_index_links_the_page_only_for_users_who_may_open_it(client, state):
    client.force_login(make_user("operator", pools=(state.alpha,)))
    assert f'href="{upstreams_url()}"' in client.get(reverse("admin:index")).content.decode()
    client.force_login(make_user("intern", perms=()))
    assert upstreams_url() not in client.get(reverse("admin:index")).content.decode()


def test_the_page_uses_the_admin_layout(admin_client, state):
    html = admin_client.get(upstreams_url()).content.decode()
    assert '<div class="breadcrumbs">' in html
    assert re.search(r'<a href="/admin/">Home</a>\s*&rsaquo; Upstreams', html)
    assert 'id="nav-sidebar"' in html  # each_context: the admin's own sidebar and user tools
    assert "<h1>Upstreams</h1>" in html


def test_signals_follow_the_circuit_rows(admin_client, state):
    panel = _panel(admin_client.get(upstreams_url()))
    alpha = panel.pools[0]
    acct_a, acct_b = alpha.assignments
    models = {m.model: m for m in acct_a.models}
    assert list(models) == ["gpt-4o-legacy", "gpt-5", "gpt-5-mini"]

    http, sse, ws = models["gpt-5"].signals
    assert (http.state, http.health, http.reason) == ("open", "blocked", "upstream_model_unavailable")
    assert http.until == state.circuits["blocked"].open_until
    assert (sse.state, sse.health, sse.reason, sse.probes_in_flight) == ("half_open", "cooling", "timeout", 1)
    assert (ws.state, ws.health, ws.reason) == ("closed", "healthy", None)

    assert [(s.state, s.health) for s in models["gpt-5-mini"].signals] == [
        ("closed", "healthy"),
        ("closed", "healthy"),
        ("closed", "failing"),
    ]
    (claude,) = acct_b.models
    assert (claude.signals[0].state, claude.signals[0].health) == ("open", "probe")
    assert claude.provenance == "preserved"
    assert models["gpt-4o-legacy"].provenance == "not advertised"


def test_a_credential_circuit_shows_for_the_whole_assignment_and_governs_its_signals(admin_client, state):
    """SPEC §5.6/§9: credential_rejected opens one circuit for the assignment (model and route class
    `*`); the panel shows it once for the assignment and, as the router does, on every signal."""
    acct_b = Assignment.objects.get(name="acct-b")
    Circuit.objects.create(
        pool=acct_b.pool,
        assignment=acct_b,
        model="*",
        route_class="*",
        state="open",
        reason="credential_rejected",
        consecutive_failures=1,
        cooldown_seconds=60,
        open_until=timezone.now() + timedelta(minutes=1),
    )
    response = admin_client.get(upstreams_url())
    row = next(a for p in _panel(response).pools for a in p.assignments if a.name == "acct-b")
    assert (row.credential.state, row.credential.reason) == ("open", "credential_rejected")
    assert {(s.state, s.reason) for m in row.models for s in m.signals} == {("open", "credential_rejected")}
    assert all(m.model != "*" for m in row.models)  # not shown as a model
    html = _content_main(response)
    assert "Whole assignment:" in html and "credential rejected" in html


def test_provenance_capabilities_and_demotions_are_shown(admin_client, state):
    response = admin_client.get(upstreams_url())
    acct_a = _panel(response).pools[0].assignments[0]
    models = {m.model: m for m in acct_a.models}
    assert models["gpt-5"].provenance == "observed"
    assert models["gpt-5-mini"].provenance == "configured"
    assert (models["gpt-5"].tools, models["gpt-5"].vision) == ("true", "unknown")
    assert models["gpt-5"].demotion is not None
    assert models["gpt-5"].demotion.reason == "upstream_model_unavailable"
    assert models["gpt-5-mini"].demotion is None
    caps = {c.label: c.value for c in acct_a.capabilities}
    assert caps == {
        "Tools": "true",
        "Write tools": "false",
        "Vision": "unknown",
        "Role separation": "true",
        "Tool representation": "native",
        "Zero retention": "unknown",
        "Data collection": "unknown",
    }
    # An expired demotion is not active.
    claude = _panel(response).pools[0].assignments[1].models[0]
    assert claude.demotion is None

    html = _content_main(response)
    for word, glyph in (("unknown", "?"), ("true", "✓"), ("false", "✗")):
        badge = (
            f'<span class="value value-{word}" data-value="{word}"><span aria-hidden="true">{glyph}</span>'
        )
        assert f"{badge} {word}</span>" in html
    for provenance in ("observed", "configured", "preserved", "not advertised"):
        assert f'data-provenance="{provenance}"' in html
    for label in ("HTTP", "SSE", "Websocket"):
        assert f'<th scope="col">{label}</th>' in html
    assert "open until" in html and "half-open" in html and 'data-demoted="true"' in html


def test_the_leaderboard_counts_the_last_five_minutes_of_attempts(admin_client, state):
    usage = {u.model: u for u in _panel(admin_client.get(upstreams_url())).usage}
    gpt5 = usage["gpt-5"]
    # req-handoff, req-ok-1, req-ok-2; req-old is outside the window.
    assert (gpt5.requests, gpt5.successes, gpt5.handoffs, gpt5.tokens) == (3, 2, 1, 30)
    mini = usage["gpt-5-mini"]
    assert (mini.requests, mini.successes, mini.handoffs, mini.tokens) == (1, 1, 0, 10)
    # An ineligible candidate was never dispatched: not usage.
    assert "claude-x" not in usage
    assert list(usage)[:2] == ["gpt-5", "gpt-5-mini"]  # busiest first


def test_unreported_tokens_are_unknown_not_zero(admin_client, state):
    Attempt.objects.filter(model="gpt-5").update(input_tokens=None, output_tokens=None)
    response = admin_client.get(upstreams_url())
    usage = {u.model: u for u in _panel(response).usage}
    assert usage["gpt-5"].tokens is None
    row = _content_main(response).split('<tr data-model="gpt-5">')[-1].split("</tr>")[0]
    assert 'data-value="unknown"' in row


def test_no_credential_key_hash_or_provider_message_reaches_the_page(admin_client, state):
    html = admin_client.get(upstreams_url()).content.decode()
    for secret in (
        CREDENTIAL,
        "GATEWAY_UPSTREAM_PANEL_ACCT_A",
        URL_PASSWORD,
        RAW_KEY,
        RAW_KEY[:10],
        state.key.key_hash,
        PROVIDER_MESSAGE,
        "127.0.0.1:910",
    ):
        assert secret not in html, secret


def test_the_page_offers_nothing_that_acts(admin_client, state):
    html = _content_main(admin_client.get(upstreams_url()))
    for tag in ("<form", "<button", "<input", "<select", "<textarea", "<a "):
        assert tag not in html, tag
    assert html.count("<summary>") == 2  # the Routing block of each pool: a disclosure, not an action


def _every_row():
    return {
        model._meta.label: list(model.objects.order_by("pk").values())
        for model in apps.get_models()
        if model._meta.label != "sessions.Session"
    }


def test_a_get_changes_no_row(admin_client, state):
    GatewaySettings.objects.all().delete()  # the page must not create the singleton on a read
    before = _every_row()
    for _ in range(2):
        assert admin_client.get(upstreams_url()).status_code == 200
        assert admin_client.head(upstreams_url()).status_code == 200
    assert _every_row() == before
    assert not GatewaySettings.objects.exists()


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_only_get_and_head_are_answered(admin_client, state, method):
    before = _every_row()
    response = getattr(admin_client, method)(upstreams_url())
    assert response.status_code == 405
    assert sorted(response["Allow"].split(", ")) == ["GET", "HEAD"]
    assert _every_row() == before


def test_each_account_shows_its_share_of_the_window_its_headroom_and_its_latency_per_model(admin_client):
    """Issue 43's panel line: share = its attempts over its pool's in the last 5 minutes (ineligible
    candidates and older attempts are no traffic); headroom low while a `headroom` demotion runs, ample
    when it answered without one, unknown when it did not answer; latency per model as the router reads it."""
    now = timezone.now()
    pool, other = Pool.objects.create(name="shared"), Pool.objects.create(name="other")
    busy, spent, idle = (
        Assignment.objects.create(pool=pool, name=name, adapter="openai", base_url="http://127.0.0.1:9/v1")
        for name in ("busy", "spent", "idle")
    )
    elsewhere = Assignment.objects.create(
        pool=other, name="elsewhere", adapter="openai", base_url="http://x/v1"
    )
    CatalogEntry.objects.create(assignment=busy, model="gpt-5", provenance="observed")
    record = RequestRecord.objects.create(
        request_id="now", route="/v1/chat/completions", transport="http", outcome="ok", started_at=now
    )
    old = RequestRecord.objects.create(
        request_id="old",
        route="/v1/chat/completions",
        transport="http",
        outcome="ok",
        started_at=now - timedelta(minutes=6),
    )
    sent = [
        (busy, "succeeded"),
        (busy, "succeeded"),
        (busy, "retryable_failed"),
        (spent, "succeeded"),
        (idle, "ineligible"),
        (elsewhere, "succeeded"),
    ]
    Attempt.objects.bulk_create(
        Attempt(
            request=record,
            ordinal=i,
            assignment=a,
            model="gpt-5",
            route_class="http",
            status=status,
            dispatch_state="completed",
        )
        for i, (a, status) in enumerate(sent, 1)
    )
    Attempt.objects.create(
        request=old,
        ordinal=1,
        assignment=idle,
        model="gpt-5",
        route_class="http",
        status="succeeded",
        dispatch_state="completed",
    )
    until = now + timedelta(minutes=3)
    Demotion.objects.create(assignment=spent, model="gpt-5", reason="headroom", until=until)
    Demotion.objects.create(assignment=busy, model="gpt-5", reason="timeout", until=until)  # not headroom
    Latency.objects.create(assignment=busy, model="gpt-5", ewma_ms=123.4, samples=7, updated_at=now)

    response = admin_client.get(upstreams_url())
    shared = next(p for p in _panel(response).pools if p.name == "shared")
    rows = {a.name: a for a in shared.assignments}
    assert {name: (a.attempts, a.share) for name, a in rows.items()} == {
        "busy": (3, 0.75),
        "spent": (1, 0.25),
        "idle": (0, 0.0),
    }
    assert {name: (a.headroom.state, a.headroom.until) for name, a in rows.items()} == {
        "busy": ("ample", None),
        "spent": ("low", until),
        "idle": ("unknown", None),
    }
    (model,) = rows["busy"].models
    assert (model.latency.ewma_ms, model.latency.samples) == (123.4, 7)
    html = _content_main(response)
    assert 'data-attempts="3"' in html and "75% (3 attempts)" in html
    assert 'data-headroom="low"' in html and 'data-headroom="unknown"' in html
    assert 'data-latency-ms="123">123 ms, 7 answers' in html


def _populate(pools: int, assignments: int, models: int) -> list[Pool]:
    """pools x assignments x models catalog entries, each model with a circuit on every route class,
    a demotion and a latency average, and a ledger entry per model, in a handful of bulk inserts."""
    now = timezone.now()
    created = [Pool.objects.create(name=f"load-{p}") for p in range(pools)]
    rows = Assignment.objects.bulk_create(
        Assignment(pool=pool, name=f"load-{p}-{a}", adapter="openai", base_url="http://127.0.0.1:9/v1")
        for p, pool in enumerate(created)
        for a in range(assignments)
    )
    CatalogEntry.objects.bulk_create(
        CatalogEntry(assignment=a, model=f"m-{m}", provenance="observed") for a in rows for m in range(models)
    )
    Circuit.objects.bulk_create(
        Circuit(
            pool_id=a.pool_id,
            assignment=a,
            model=f"m-{m}",
            route_class=rc,
            state="open",
            reason="timeout",
            consecutive_failures=3,
            open_until=now + timedelta(minutes=5),
        )
        for a in rows
        for m in range(models)
        for rc in ("http", "sse", "websocket")
    )
    Demotion.objects.bulk_create(
        Demotion(assignment=a, model=f"m-{m}", reason="timeout", until=now + timedelta(minutes=5))
        for a in rows
        for m in range(models)
    )
    CapabilityEvidence.objects.bulk_create(
        CapabilityEvidence(
            assignment=a,
            model=f"m-{m}",
            capability=capability,
            qualified=True,
            detail="ok",
            qualified_at=now,
            expires_at=now + timedelta(days=30),
            corpus_version="qualify-1:load",
            config_hash=route_hash(adapter="openai", base_url="http://127.0.0.1:9/v1", model=f"m-{m}"),
        )
        for a in rows
        for m in range(models)
        for capability in ("tools", "vision")
    )
    Latency.objects.bulk_create(
        Latency(assignment=a, model=f"m-{m}", ewma_ms=100.0, samples=1, updated_at=now)
        for a in rows
        for m in range(models)
    )
    record = RequestRecord.objects.create(
        request_id="load", route="/v1/responses", transport="sse", outcome="ok", started_at=now
    )
    Attempt.objects.bulk_create(
        Attempt(
            request=record,
            ordinal=i,
            assignment=rows[i % len(rows)],
            model=f"m-{i % models}",
            route_class="sse",
            status="succeeded",
            dispatch_state="completed",
            input_tokens=1,
            output_tokens=1,
        )
        for i in range(models)
    )
    return created


# Session, user, settings, pools, assignments, capability evidence, catalog entries, circuits, demotions,
# latency averages, attempts per assignment and usage per model; then the
# admin's sidebar: a superuser's asks whether the settings singleton exists (may it be added?), an
# operator's loads their user and group permissions once (and, lacking the add permission, asks no more).
QUERIES = {"superuser": 13, "operator": 14}


@pytest.mark.parametrize("who", QUERIES)
@pytest.mark.parametrize(
    ("pools", "assignments", "models"), [(1, 1, 1), (5, 20, 30)], ids=["1x1x1", "5x20x30"]
)
def test_the_page_runs_the_same_number_of_queries_whatever_the_data(
    client, django_assert_num_queries, who, pools, assignments, models
):
    created = _populate(pools, assignments, models)
    if who == "superuser":
        user = User.objects.create_superuser("root", password="x")
    else:
        user = make_user("operator", pools=tuple(created))
    client.force_login(user)
    with django_assert_num_queries(QUERIES[who]):
        response = client.get(upstreams_url())
    assert response.status_code == 200
    panel = _panel(response)
    assert len(panel.pools) == pools
    assert sum(len(p.assignments) for p in panel.pools) == pools * assignments
    assert sum(len(a.models) for p in panel.pools for a in p.assignments) == pools * assignments * models
    assert all(
        m.signals[0].state == "open"
        and m.demotion is not None
        and m.latency is not None
        and [c.provenance for c in m.capabilities]
        == ["qualified", "unknown", "qualified", "unknown", "unknown"]
        for p in panel.pools
        for a in p.assignments
        for m in a.models
    )
