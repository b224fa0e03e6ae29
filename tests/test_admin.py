import pytest
from django.contrib import admin
from django.urls import reverse
from django.utils import timezone

from pools.models import Assignment, GatewayKey, Pool
from proxy.ledger.models import Attempt, RequestRecord
from routing.models import Affinity, Circuit, Demotion

RAW_KEY = "sk-gw-admin-canary-7f3c9e1d2b"


@pytest.fixture
def state(db):
    pool = Pool.objects.create(name="main")
    assignment = Assignment.objects.create(
        pool=pool,
        name="acct-a",
        adapter="openai",
        base_url="http://127.0.0.1:9/v1",
        api_key_env="GATEWAY_UPSTREAM_ACCT_A",
    )
    key = GatewayKey(name="ci", allowed_models=["*"])
    key.set_key(RAW_KEY)
    key.save()
    now = timezone.now()
    circuit = Circuit.objects.create(
        pool=pool, assignment=assignment, model="gpt-5", route_class="http", state="open", open_until=now
    )
    demotion = Demotion.objects.create(
        assignment=assignment, model="gpt-5", reason="upstream_model_unavailable", until=now
    )
    affinity = Affinity.objects.create(
        gateway_key=key, kind="response", key="resp_1", assignment=assignment, expires_at=now
    )
    record = RequestRecord.objects.create(
        request_id="req-1", route="/v1/chat/completions", transport="http", outcome="ok", started_at=now
    )
    attempt = Attempt.objects.create(
        request=record,
        ordinal=1,
        assignment=assignment,
        model="gpt-5",
        route_class="http",
        status="succeeded",
        dispatch_state="completed",
    )
    return {"key": key, "state_rows": [circuit, demotion, affinity, record, attempt]}


def test_every_model_has_an_admin_changelist(admin_client, state):
    for model in admin.site._registry:
        if model._meta.app_label not in {"pools", "catalog", "routing", "proxy"}:
            continue
        url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        assert admin_client.get(url).status_code == 200, url


@pytest.mark.parametrize("model", [Circuit, Demotion, Affinity, RequestRecord, Attempt])
def test_state_and_ledger_admins_are_read_only(admin_client, state, model):
    row = model.objects.get()
    meta = model._meta
    add = reverse(f"admin:{meta.app_label}_{meta.model_name}_add")
    change = reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[row.pk])
    delete = reverse(f"admin:{meta.app_label}_{meta.model_name}_delete", args=[row.pk])
    assert admin_client.get(add).status_code == 403
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    page = admin_client.get(change)
    assert page.status_code == 200
    assert b'type="submit"' not in page.content.split(b'id="content-main"')[1]
    assert admin_client.post(change, {}).status_code == 403
    assert model.objects.filter(pk=row.pk).exists()


def test_key_admin_shows_the_prefix_never_the_key_or_its_hash(admin_client, state):
    key = state["key"]
    pages = [
        admin_client.get(reverse("admin:pools_gatewaykey_changelist")).content.decode(),
        admin_client.get(reverse("admin:pools_gatewaykey_change", args=[key.pk])).content.decode(),
    ]
    for html in pages:
        assert key.prefix in html
        assert RAW_KEY not in html
        assert key.key_hash not in html


def test_key_admin_hashes_a_new_key(admin_client, state):
    pool = Pool.objects.get()
    response = admin_client.post(
        reverse("admin:pools_gatewaykey_add"),
        {
            "name": "agents",
            "raw_key": "sk-gw-admin-new-key-0123456789",
            "pools": [pool.pk],
            "allowed_models": '["gpt-5"]',
            "regions": "[]",
            "allow_third_party_router": "on",
            "min_quality": "0",
            "enabled": "on",
        },
    )
    assert response.status_code == 302, response.content
    key = GatewayKey.objects.get(name="agents")
    assert key.prefix == "sk-gw-admi"
    assert key.key_hash and "sk-gw-admin-new-key-0123456789" not in key.key_hash
