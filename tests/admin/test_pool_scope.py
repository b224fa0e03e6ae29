"""The pool grant (`Pool.operator_groups`) scopes the ordinary admin pages the way it scopes
/admin/upstreams/: an operator neither lists nor opens another team's pools, assignments, catalog
entries, circuits or demotions, and only a superuser changes who operates a pool."""

import pytest
from django.urls import reverse
from django.utils import timezone

from catalog.models import CatalogEntry
from routing.models import Circuit, Demotion
from tests.admin.conftest import build_routing_state, make_user

pytestmark = pytest.mark.django_db

VIEW_ALL = (
    "view_pool",
    "change_pool",
    "view_assignment",
    "view_catalogentry",
    "view_circuit",
    "view_demotion",
)


@pytest.fixture
def state():
    return build_routing_state(timezone.now())


@pytest.fixture
def operator_client(client, state):
    client.force_login(make_user("operator", perms=VIEW_ALL, pools=(state.alpha,)))
    return client


@pytest.mark.parametrize(
    ("changelist", "visible", "hidden"),
    [
        ("admin:pools_pool_changelist", "alpha", "zeta-pool"),
        ("admin:pools_assignment_changelist", "acct-a", "acct-zeta"),
        ("admin:catalog_catalogentry_changelist", "gpt-5-mini", "zeta-model"),
        ("admin:routing_circuit_changelist", "gpt-4o-legacy", "zeta-model"),
        ("admin:routing_demotion_changelist", "gpt-5", "zeta-model"),
    ],
)
def test_changelists_list_only_granted_pools(operator_client, changelist, visible, hidden):
    html = operator_client.get(reverse(changelist)).content.decode()
    assert visible in html
    assert hidden not in html
    assert "zeta" not in html  # not even as a filter choice


def test_objects_of_other_pools_cannot_be_opened(operator_client, state):
    hidden = [
        reverse("admin:pools_pool_change", args=[state.beta.pk]),
        reverse("admin:pools_assignment_change", args=[state.acct_z.pk]),
        reverse("admin:catalog_catalogentry_change", args=[CatalogEntry.objects.get(model="zeta-model").pk]),
        reverse("admin:routing_circuit_change", args=[Circuit.objects.get(model="zeta-model").pk]),
        reverse("admin:routing_demotion_change", args=[Demotion.objects.get(model="zeta-model").pk]),
    ]
    for url in hidden:
        response = operator_client.get(url)
        # The admin answers a row outside the queryset by redirecting to the index with a message.
        assert response.status_code == 302, url
        assert "zeta" not in operator_client.get(response.url).content.decode()
    assert (
        operator_client.get(reverse("admin:pools_assignment_change", args=[state.acct_a.pk])).status_code
        == 200
    )


def test_only_a_superuser_changes_who_operates_a_pool(operator_client, admin_client, state):
    url = reverse("admin:pools_pool_change", args=[state.alpha.pk])
    operator_page = operator_client.get(url).content.decode()
    assert 'name="operator_groups"' not in operator_page
    assert "operator-team" in operator_page  # shown read-only
    assert 'name="operator_groups"' in admin_client.get(url).content.decode()
    response = operator_client.post(
        url,
        {
            "name": "alpha",
            "auto_models": "[]",
            "operator_groups": [],
            "assignments-TOTAL_FORMS": "0",
            "assignments-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 302
    assert list(state.alpha.operator_groups.values_list("name", flat=True)) == ["operator-team"]
