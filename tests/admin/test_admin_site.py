"""The admin as a whole (issue 47 point 7): no link to a site the gateway does not serve, one date-time
format on lists and pages, list columns edited as lists, and no page that shows a form-only field read
from the row ("Raw key: None", "Budget usd: None")."""

import re
from datetime import UTC, datetime

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.urls import reverse

from pools.models import GatewayKey, Pool
from routing.models import Circuit
from tests.admin.conftest import make_user
from tests.admin.test_admin_powers import form_data
from tests.admin.test_scoping import _world
from tests.factories import AssignmentFactory, GatewayKeyFactory, PoolFactory

pytestmark = pytest.mark.django_db

WHEN = datetime(2026, 12, 5, 5, 30, 7, tzinfo=UTC)


def test_there_is_no_view_site_link_to_a_404(admin_client):
    html = admin_client.get(reverse("admin:index")).content.decode()
    assert "View site" not in html
    assert admin.site.site_url is None


def test_a_list_and_a_page_write_a_time_alike_to_the_second_in_utc(admin_client):
    pool = PoolFactory(name="alpha")
    assignment = AssignmentFactory(pool=pool)
    circuit = Circuit.objects.create(
        pool=pool, assignment=assignment, model="gpt-5", route_class="http", state="open", open_until=WHEN
    )
    key = GatewayKeyFactory(name="k", pools=[pool])
    GatewayKey.objects.filter(pk=key.pk).update(period_start=WHEN)
    shown = "2026-12-05 05:30:07 UTC"
    circuit_list = admin_client.get(reverse("admin:routing_circuit_changelist")).content.decode()
    circuit_page = admin_client.get(
        reverse("admin:routing_circuit_change", args=[circuit.pk])
    ).content.decode()
    key_page = admin_client.get(reverse("admin:pools_gatewaykey_change", args=[key.pk])).content.decode()
    for html in (circuit_list, circuit_page, key_page):
        assert shown in html
        assert not re.search(r"\b[ap]\.m\.", html)


def test_a_keys_models_and_regions_and_a_pools_auto_models_are_edited_one_per_line(admin_client):
    pool = PoolFactory(name="alpha")
    key = GatewayKeyFactory(name="k", pools=[pool], allowed_models=["gpt-5", "claude-x"])
    url = reverse("admin:pools_gatewaykey_change", args=[key.pk])
    html = admin_client.get(url).content.decode()
    assert re.search(r'<textarea name="allowed_models"[^>]*>\s*gpt-5\nclaude-x</textarea>', html), html
    data = form_data(
        admin_client, url, allowed_models="gpt-5\n\nanthropic/claude-opus-4-8, gpt-5", regions="eu\nus"
    )
    assert admin_client.post(url, data).status_code == 302
    key.refresh_from_db()
    assert key.allowed_models == ["gpt-5", "anthropic/claude-opus-4-8"] and key.regions == ["eu", "us"]
    # The JSON the box used to hold still reads; a name with a space is refused with a message, not a 500.
    assert admin_client.post(url, {**data, "allowed_models": '["*"]'}).status_code == 302
    key.refresh_from_db()
    assert key.allowed_models == ["*"]
    response = admin_client.post(url, {**data, "allowed_models": "gpt 5"})
    assert (
        response.status_code == 200
        and "One name per line, without spaces: gpt 5" in response.content.decode()
    )
    assert GatewayKey.objects.get(pk=key.pk).allowed_models == ["*"]

    pool_url = reverse("admin:pools_pool_change", args=[pool.pk])
    pool_data = form_data(admin_client, pool_url, auto_models="gpt-5\ngpt-5-mini")
    pool_data.update({"assignments-TOTAL_FORMS": "0", "assignments-INITIAL_FORMS": "0"})
    assert admin_client.post(pool_url, pool_data).status_code == 302
    assert Pool.objects.get(pk=pool.pk).auto_models == ["gpt-5", "gpt-5-mini"]


def test_a_new_key_starts_with_every_model_in_its_box(admin_client):
    html = admin_client.get(reverse("admin:pools_gatewaykey_add")).content.decode()
    assert re.search(r'<textarea name="allowed_models"[^>]*>\s*\*</textarea>', html)


@pytest.mark.parametrize("who", ["view-only operator", "superuser"])
def test_no_page_shows_a_field_of_its_form_read_from_the_row_as_none(client, who):
    """Every registered ModelAdmin's change page, as a user who may only look and as a superuser: no
    read-only value is the word None (what a form-only field read from the row shows)."""
    world = _world("alpha")
    GatewayKey.objects.filter(pk=world["key"].pk).update(budget_micros=5_000_000)
    if who == "superuser":
        user = make_user("root", superuser=True)
    else:
        views = Permission.objects.filter(codename__startswith="view_").exclude(
            content_type__app_label="auth"
        )
        user = make_user(
            "viewer", perms=tuple(views.values_list("codename", flat=True)), pools=(world["pool"],)
        )
    client.force_login(user)
    seen = 0
    for model, _ in admin.site._registry.items():
        row = next((r for r in world.values() if type(r) is model), None)
        if row is None:
            continue
        response = client.get(
            reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_change", args=[row.pk])
        )
        assert response.status_code == 200, model
        html = response.content.decode()
        assert not re.search(r'<div class="readonly">\s*None\s*</div>', html), model
        seen += 1
    assert seen >= 10
    if who != "superuser":  # the key's budget, read-only, in dollars
        html = client.get(reverse("admin:pools_gatewaykey_change", args=[world["key"].pk])).content.decode()
        assert re.search(r'Budget \(USD\):</label>\s*<div class="readonly">\$5\.00</div>', html), html
