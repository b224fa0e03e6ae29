"""A pool operator in the admin (issue 45 findings 7 and 8). Threat (SECURITY.md, Pool operator): an
operator takes over a client of its pools (sets its key's secret, reads its response ids) or reads a
secret-bearing column through a changelist lookup. Django's test client on the real admin site."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from pools.models import Assignment, GatewayKey, hash_key
from routing.models import Affinity, AffinityKind
from routing.services import affinity_record
from tests.admin.conftest import make_user
from tests.admin.test_admin_powers import OPERATOR_PERMS, form_data
from tests.factories import AssignmentFactory, GatewayKeyFactory, PoolFactory

pytestmark = [pytest.mark.attack, pytest.mark.django_db]
CLIENT_SECRET = "sk-gw-the-clients-own-secret-000"
NEW_SECRET = "sk-gw-the-operators-chosen-secret-0"
RESPONSE_ID = "resp_0123456789abcdef0123456789abcdef"


@pytest.fixture
def world():
    pool = PoolFactory(name="alpha")
    account = AssignmentFactory(pool=pool, name="alpha-acct", base_url="http://127.0.0.1:9101/v1")
    account.set_credential("sk-upstream-credential-0000")
    account.save()
    key = GatewayKeyFactory(name="client", raw_key=CLIENT_SECRET, pools=[pool])
    now = datetime.now(UTC)
    affinity_record(
        gateway_key_id=key.pk,
        kind=AffinityKind.RESPONSE,
        key=RESPONSE_ID,
        assignment_id=account.pk,
        ttl=timedelta(hours=1),
        now=now,
    )
    return pool, account, key


@pytest.fixture
def operator(client, world):
    perms = (*OPERATOR_PERMS, "view_affinity")
    client.force_login(make_user("operator", perms=perms, pools=(world[0],)))
    return client


@pytest.fixture
def root(client, world):
    client.force_login(make_user("root", superuser=True))
    return client


def test_a_pool_operator_cannot_set_a_clients_key_secret(operator, world):
    _, _, key = world
    url = reverse("admin:pools_gatewaykey_change", args=[key.pk])
    page = operator.get(url).content.decode()
    assert 'name="raw_key"' not in page
    response = operator.post(url, {**form_data(operator, url), "raw_key": NEW_SECRET})
    assert response.status_code == 302  # the rest of the form is still the operator's to change
    key.refresh_from_db()
    assert key.key_hash == hash_key(CLIENT_SECRET)


def test_a_superuser_still_sets_a_keys_secret(root, world):
    _, _, key = world
    url = reverse("admin:pools_gatewaykey_change", args=[key.pk])
    response = root.post(url, {**form_data(root, url), "raw_key": NEW_SECRET})
    assert response.status_code == 302
    key.refresh_from_db()
    assert key.key_hash == hash_key(NEW_SECRET)


def test_a_pool_operator_sees_affinity_ids_truncated(operator, world):
    changelist = reverse("admin:routing_affinity_changelist")
    page = operator.get(changelist).content.decode().replace("<wbr>", "")  # a cell's break opportunities
    assert RESPONSE_ID[:8] in page and RESPONSE_ID not in page
    detail = reverse("admin:routing_affinity_change", args=[Affinity.objects.get().pk])
    assert RESPONSE_ID not in operator.get(detail).content.decode()


def test_a_superuser_sees_affinity_ids_whole(root, world):
    assert RESPONSE_ID in root.get(reverse("admin:routing_affinity_changelist")).content.decode()


@pytest.mark.parametrize(
    ("model", "lookup"),
    [
        (Assignment, "credential__startswith=gAAAAA"),
        (Assignment, "credential__regex=^g"),
        (Assignment, "base_url__contains=127"),
        (GatewayKey, "key_hash__startswith=0"),
        (GatewayKey, "prefix__startswith=sk"),
        (Assignment, "enabled__exact=1&credential__isnull=False"),
    ],
)
@pytest.mark.parametrize("who", ["operator", "root"])
def test_a_changelist_takes_only_its_declared_filters(request, world, model, lookup, who):
    client = request.getfixturevalue(who)
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    assert client.get(f"{url}?{lookup}").status_code == 400  # DisallowedModelAdminLookup


@pytest.mark.parametrize("lookup", ["enabled__exact=1", "adapter__exact=openai", "pool__id__exact=1"])
def test_the_declared_filters_still_filter(root, world, lookup):
    assert root.get(f"{reverse('admin:pools_assignment_changelist')}?{lookup}").status_code == 200


def test_every_changelist_filter_link_is_allowed(root, world):
    """Every filter link a changelist offers is itself allowed (the walk over the admin's models)."""
    from django.contrib import admin

    for model in admin.site._registry:
        url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        response = root.get(url)
        assert response.status_code == 200, url
        for spec in getattr(response.context.get("cl"), "filter_specs", []):
            for choice in spec.choices(response.context["cl"]):
                assert root.get(f"{url}{choice['query_string']}").status_code == 200, choice["query_string"]
