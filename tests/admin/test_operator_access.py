"""The YAML's `operators[].access` levels (pools.scoping.OPERATOR_PERMISSIONS) against the admin as it is:
`view` opens every page that holds pool data and changes nothing, `change` changes what a pool operator may
change, and every permission a level names exists (a model renamed or removed fails here, not at load)."""

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.urls import reverse

from pools.models import Assignment
from pools.scoping import OPERATOR_PERMISSIONS, OperatorAccess, operator_access
from tests.admin.conftest import PASSWORD
from tests.admin.test_admin_powers import form_data
from tests.admin.test_scoping import _scoped_admins, _world

pytestmark = pytest.mark.django_db


def _operator(client, level: OperatorAccess, pool) -> None:
    group = Group.objects.create(name=f"{level}-team")
    codes = OPERATOR_PERMISSIONS[level]
    group.permissions.set(
        [
            p
            for p in Permission.objects.select_related("content_type")
            if (p.content_type.app_label, p.codename) in codes
        ]
    )
    assert group.permissions.count() == len(codes)  # every permission the level names exists
    pool.operator_groups.add(group)
    user = User.objects.create_user(f"{level}-user", password=PASSWORD, is_staff=True)
    user.groups.add(group)
    client.force_login(user)


def test_the_view_level_opens_every_page_of_pool_data_and_changes_nothing(client):
    world = _world("alpha")
    _operator(client, OperatorAccess.VIEW, world["pool"])
    for model, _ in _scoped_admins():
        info = (model._meta.app_label, model._meta.model_name)
        assert client.get(reverse("admin:{}_{}_changelist".format(*info))).status_code == 200, model
        row = next(r for r in world.values() if type(r) is model)
        page = client.get(reverse("admin:{}_{}_change".format(*info), args=[row.pk]))
        assert page.status_code == 200 and 'name="_save"' not in page.content.decode(), model
    for name in ("upstreams", "spend"):
        assert client.get(reverse(f"admin:{name}")).status_code == 200


def test_the_change_level_changes_an_assignment_of_its_pool(client):
    world = _world("alpha")
    _operator(client, OperatorAccess.CHANGE, world["pool"])
    url = reverse("admin:pools_assignment_change", args=[world["assignment"].pk])
    assert client.post(url, form_data(client, url, tier="4")).status_code == 302
    assert Assignment.objects.get(pk=world["assignment"].pk).tier == 4


def test_a_level_is_read_back_only_from_exactly_its_permissions():
    for level, codes in OPERATOR_PERMISSIONS.items():
        assert operator_access(set(codes)) is level
    view = set(OPERATOR_PERMISSIONS[OperatorAccess.VIEW])
    assert operator_access(view | {("auth", "view_user")}) is None
    assert operator_access(set()) is None


def test_the_view_level_covers_every_registered_admin_of_pool_data():
    scoped = {(m._meta.app_label, f"view_{m._meta.model_name}") for m, _ in _scoped_admins()}
    assert scoped <= OPERATOR_PERMISSIONS[OperatorAccess.VIEW]
