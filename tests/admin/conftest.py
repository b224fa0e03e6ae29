"""Builders shared by the /admin/upstreams/ tests: operators with group grants, and a routing state
with every kind of signal (closed, failing, open, open past its cooldown, half-open), provenance,
unknown capabilities, demotions and a ledger inside and outside the usage window."""

from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.urls import reverse

from catalog.models import CatalogEntry
from pools.models import Assignment, GatewayKey, Pool
from proxy.ledger.models import Attempt, RequestRecord
from routing.models import Circuit, Demotion

PASSWORD = "correct-horse-battery-staple-42"
RAW_KEY = "sk-gw-panel-canary-5b1e9c0d7a"
CREDENTIAL = "sk-upstream-credential-canary-81f2"
URL_PASSWORD = "userinfo-canary-pass-3c7d"
PROVIDER_MESSAGE = "provider-message-canary-9e4a"
UPSTREAMS = "/admin/upstreams/"


def upstreams_url() -> str:
    return reverse("admin:upstreams")


def make_user(
    username: str,
    *,
    staff: bool = True,
    superuser: bool = False,
    perms: tuple[str, ...] = ("view_assignment",),
    pools: tuple[Pool, ...] = (),
) -> User:
    """A user whose permissions and pool grants come through one group, as an operator team's would."""
    user = User.objects.create_user(username, password=PASSWORD, is_staff=staff, is_superuser=superuser)
    group = Group.objects.create(name=f"{username}-team")
    group.permissions.set(Permission.objects.filter(codename__in=perms))
    for pool in pools:
        pool.operator_groups.add(group)
    user.groups.add(group)
    return user


@dataclass
class RoutingState:
    now: datetime
    alpha: Pool
    beta: Pool
    acct_a: Assignment
    acct_b: Assignment
    acct_z: Assignment
    key: GatewayKey
    circuits: dict[str, Circuit] = field(default_factory=dict)


def build_routing_state(now: datetime) -> RoutingState:
    alpha = Pool.objects.create(name="alpha")
    beta = Pool.objects.create(name="zeta-pool")
    acct_a = Assignment.objects.create(
        pool=alpha,
        name="acct-a",
        adapter="openai",
        base_url=f"http://operator:{URL_PASSWORD}@127.0.0.1:9101/v1",
        api_key_env="GATEWAY_UPSTREAM_PANEL_ACCT_A",
        tier=0,
        region="us",
        tools="true",
        write_tools="false",
        role_separation="true",
        tool_representation="native",
        quality=0.9,
    )
    acct_b = Assignment.objects.create(
        pool=alpha,
        name="acct-b",
        adapter="anthropic",
        base_url="http://127.0.0.1:9102/v1",
        tier=1,
        router="third_party",
        enabled=False,
    )
    acct_z = Assignment.objects.create(
        pool=beta, name="acct-zeta", adapter="openrouter", base_url="http://127.0.0.1:9103/v1"
    )
    CatalogEntry.objects.create(assignment=acct_a, model="gpt-5", provenance="observed", tools="true")
    CatalogEntry.objects.create(
        assignment=acct_a, model="gpt-5-mini", provenance="configured", vision="false"
    )
    CatalogEntry.objects.create(assignment=acct_b, model="claude-x", provenance="preserved")
    CatalogEntry.objects.create(assignment=acct_z, model="zeta-model", provenance="observed")

    def circuit(name: str, assignment: Assignment, model: str, route_class: str, **state) -> None:
        pool = assignment.pool
        row = Circuit.objects.create(
            pool=pool, assignment=assignment, model=model, route_class=route_class, **state
        )
        circuits[name] = row

    circuits: dict[str, Circuit] = {}
    circuit(
        "blocked",
        acct_a,
        "gpt-5",
        "http",
        state="open",
        reason="upstream_model_unavailable",
        consecutive_failures=3,
        cooldown_seconds=600,
        open_until=now + timedelta(seconds=600),
    )
    circuit(
        "half_open",
        acct_a,
        "gpt-5",
        "sse",
        state="half_open",
        reason="timeout",
        consecutive_failures=4,
        cooldown_seconds=120,
        open_until=now - timedelta(seconds=5),
        probes_in_flight=1,
        probe_lease_expires_at=now + timedelta(seconds=600),
    )
    circuit(
        "failing",
        acct_a,
        "gpt-5-mini",
        "websocket",
        state="closed",
        reason="rate_limited",
        consecutive_failures=1,
    )
    circuit(
        "probe_due",
        acct_b,
        "claude-x",
        "http",
        state="open",
        reason="upstream_unavailable",
        consecutive_failures=3,
        cooldown_seconds=60,
        open_until=now - timedelta(seconds=10),
    )
    circuit(
        "unadvertised",
        acct_a,
        "gpt-4o-legacy",
        "http",
        state="open",
        reason="upstream_model_unavailable",
        consecutive_failures=3,
        cooldown_seconds=600,
        open_until=now + timedelta(seconds=600),
    )
    circuit(
        "hidden",
        acct_z,
        "zeta-model",
        "http",
        state="open",
        reason="timeout",
        consecutive_failures=3,
        cooldown_seconds=600,
        open_until=now + timedelta(seconds=600),
    )
    Demotion.objects.create(
        assignment=acct_a,
        model="gpt-5",
        reason="upstream_model_unavailable",
        until=now + timedelta(seconds=600),
    )
    Demotion.objects.create(
        assignment=acct_b,
        model="claude-x",
        reason="upstream_model_unavailable",
        until=now - timedelta(seconds=5),
    )
    Demotion.objects.create(
        assignment=acct_z, model="zeta-model", reason="timeout", until=now + timedelta(seconds=600)
    )

    key = GatewayKey(name="panel-key", allowed_models=["*"])
    key.set_key(RAW_KEY)
    key.save()
    key.pools.set([alpha, beta])

    def request(request_id: str, started: datetime, *attempts: dict) -> None:
        record = RequestRecord.objects.create(
            request_id=request_id,
            key=key,
            route="/v1/chat/completions",
            transport="http",
            outcome="ok",
            started_at=started,
        )
        for ordinal, attempt in enumerate(attempts, start=1):
            Attempt.objects.create(request=record, ordinal=ordinal, route_class="http", **attempt)

    recent = now - timedelta(seconds=30)
    ok = {"status": "succeeded", "dispatch_state": "completed"}
    # A handoff from gpt-5 to gpt-5-mini, with a provider message where only a code belongs (a bug the
    # panel must not make visible).
    request(
        "req-handoff",
        recent,
        {
            "assignment": acct_a,
            "model": "gpt-5",
            "status": "retryable_failed",
            "failure_class": "model_unavailable",
            "dispatch_state": "rejected",
            "upstream_status": 404,
            "error_code": PROVIDER_MESSAGE,
        },
        {"assignment": acct_a, "model": "gpt-5-mini", "input_tokens": 7, "output_tokens": 3, **ok},
    )
    request(
        "req-ok-1",
        recent,
        {"assignment": acct_a, "model": "gpt-5", "input_tokens": 10, "output_tokens": 20, **ok},
    )
    request("req-ok-2", recent, {"assignment": acct_a, "model": "gpt-5", **ok})
    request(
        "req-ineligible",
        recent,
        {"assignment": acct_b, "model": "claude-x", "status": "ineligible", "dispatch_state": "not_sent"},
    )
    request("req-zeta", recent, {"assignment": acct_z, "model": "zeta-model", **ok})
    request("req-old", now - timedelta(minutes=6), {"assignment": acct_a, "model": "gpt-5", **ok})
    return RoutingState(now, alpha, beta, acct_a, acct_b, acct_z, key, circuits)


@pytest.fixture
def credential(monkeypatch):
    monkeypatch.setenv("GATEWAY_UPSTREAM_PANEL_ACCT_A", CREDENTIAL)
    return CREDENTIAL
