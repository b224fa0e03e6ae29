"""A key's budget in admin is in dollars (issue 47 point 3), as the YAML's `budget_usd` and the spend
page: the list and the page show dollars, the form takes dollars, the column keeps micros."""

import pytest
from django.urls import reverse

from pools.models import GatewayKey, Pool
from tests.factories import GatewayKeyFactory, PoolFactory

pytestmark = pytest.mark.django_db


def _form(pool: Pool, budget: str) -> dict:
    return {
        "name": "agents",
        "pools": [pool.pk],
        "allowed_models": '["*"]',
        "regions": "[]",
        "allow_third_party_router": "on",
        "min_quality": "0",
        "enabled": "on",
        "budget_usd": budget,
    }


def test_the_key_list_and_page_show_dollars(admin_client):
    key = GatewayKeyFactory(budget_micros=50_000_000, spent_micros=1_852, reserved_micros=250_000)
    listing = admin_client.get(reverse("admin:pools_gatewaykey_changelist")).content.decode()
    assert "$50.00" in listing and "$0.001852" in listing and "$0.25" in listing
    page = admin_client.get(reverse("admin:pools_gatewaykey_change", args=[key.pk])).content.decode()
    assert 'name="budget_usd"' in page and 'value="50.00"' in page and "$0.001852" in page


def test_the_form_takes_dollars_and_stores_micros(admin_client):
    pool = PoolFactory()
    add = admin_client.post(
        reverse("admin:pools_gatewaykey_add"),
        {**_form(pool, "12.50"), "raw_key": "sk-gw-admin-new-key-0123456789"},
    )
    assert add.status_code == 302, add.content
    key = GatewayKey.objects.get(name="agents")
    assert key.budget_micros == 12_500_000
    change = admin_client.post(reverse("admin:pools_gatewaykey_change", args=[key.pk]), _form(pool, ""))
    assert change.status_code == 302, change.content
    assert GatewayKey.objects.get(pk=key.pk).budget_micros is None  # empty: no budget
