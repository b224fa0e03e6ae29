"""Pool operator groups in the YAML (issue 47 point 1): `operators[]` names a Django group, exactly the
pools it operates, its access level and its members; loaded in the same transaction as the rest, shown
by --dry-run, dumped so that a dump reloads as no change, and every change that takes access away is a
warning line."""

from io import StringIO

import pytest
import yaml
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.urls import reverse

from gatewayconfig.operators import group_permissions
from pools.models import Pool
from pools.scoping import OPERATOR_PERMISSIONS, OperatorAccess
from tests.gatewayconfig.test_document import base, db_state, dump, environment, load_fails, write  # noqa: F401

pytestmark = pytest.mark.django_db

PASSWORD = "operator-password-0123456789"


@pytest.fixture
def users():
    return {name: User.objects.create_user(name, password=PASSWORD, is_staff=True) for name in ("ann", "bob")}


def with_operators(*operators: dict) -> dict:
    doc = base()
    doc["operators"] = list(operators)
    return doc


ONCALL = {"group": "oncall", "pools": ["main"], "access": "change", "users": ["ann", "bob"]}
AUDIT = {"group": "audit", "pools": ["main", "spare"], "access": "view"}


def _load(tmp_path, doc, **options) -> tuple[list[str], list[str]]:
    out, err = StringIO(), StringIO()
    call_command("load_gateway_config", str(write(tmp_path, doc)), stdout=out, stderr=err, **options)
    return out.getvalue().splitlines(), err.getvalue().splitlines()


def state() -> dict:
    """Who operates what: every group's pools, permissions and members."""
    return {
        group.name: (
            sorted(group.operated_pools.values_list("name", flat=True)),
            sorted(group_permissions(group)),
            sorted(group.user_set.values_list("username", flat=True)),
        )
        for group in Group.objects.order_by("name")
    }


def test_the_file_grants_pools_access_and_members_and_the_admin_follows(tmp_path, users, client):
    out, err = _load(tmp_path, with_operators(ONCALL, AUDIT))
    assert err == []
    assert "operator groups: 2 created, 0 updated, 0 unchanged, 0 deleted" in out
    assert state() == {
        "audit": (["main", "spare"], sorted(OPERATOR_PERMISSIONS[OperatorAccess.VIEW]), []),
        "oncall": (["main"], sorted(OPERATOR_PERMISSIONS[OperatorAccess.CHANGE]), ["ann", "bob"]),
    }
    # Ann now operates pool main in the admin, and nothing of spare.
    client.login(username="ann", password=PASSWORD)
    html = client.get(reverse("admin:pools_pool_changelist")).content.decode()
    assert ">main<" in html and "spare" not in html
    assert (
        client.get(reverse("admin:pools_pool_change", args=[Pool.objects.get(name="main").pk])).status_code
        == 200
    )

    out, err = _load(tmp_path, with_operators(ONCALL, AUDIT))  # the same file again
    assert "operator groups: 0 created, 0 updated, 2 unchanged, 0 deleted" in out and err == []


def test_every_change_that_takes_access_away_is_a_warning_and_a_dry_run_changes_nothing(tmp_path, users):
    _load(tmp_path, with_operators(ONCALL, AUDIT))
    before = (state(), db_state())
    narrower = with_operators({**ONCALL, "access": "view", "users": ["ann"]}, {**AUDIT, "pools": ["main"]})
    out, err = _load(tmp_path, narrower, dry_run=True)
    assert (state(), db_state()) == before
    assert out[0] == "dry run: nothing was changed; applying it would do this:"
    assert "operator groups: 0 created, 2 updated, 0 unchanged, 0 deleted" in out
    removed = sorted(e for e in err if "access removed" in e)
    assert removed == [
        "warning: access removed: group 'audit' no longer operates pool(s) spare",
        "warning: access removed: group 'oncall' loses permission(s) add_catalogentry, change_assignment, "
        "change_catalogentry, change_gatewaykey, change_pool, delete_catalogentry",
        "warning: access removed: user 'bob' leaves group 'oncall'",
    ]
    _, applied = _load(tmp_path, narrower)  # for real: the same warnings, and the change
    assert sorted(e for e in applied if "access removed" in e) == removed
    assert state()["oncall"][2] == ["ann"] and state()["audit"][0] == ["main"]


def test_a_group_the_file_does_not_name_is_left_alone_unless_pruned(tmp_path, users):
    _load(tmp_path, with_operators(ONCALL, AUDIT))
    _, err = _load(tmp_path, with_operators(ONCALL))
    assert state()["audit"][0] == ["main", "spare"] and not any("audit" in e for e in err)
    _, err = _load(tmp_path, with_operators(ONCALL), prune=True)
    assert "warning: access removed: group 'audit' no longer operates pool(s) main, spare" in err
    assert state()["audit"][0] == []
    assert "audit" not in dump()  # it operates nothing: not an operator group any more


def test_null_access_and_users_leave_the_groups_permissions_and_members_as_they_are(tmp_path, users):
    _load(tmp_path, with_operators(ONCALL))
    out, err = _load(tmp_path, with_operators({"group": "oncall", "pools": ["main"]}))
    assert state()["oncall"] == (
        ["main"],
        sorted(OPERATOR_PERMISSIONS[OperatorAccess.CHANGE]),
        ["ann", "bob"],
    )
    assert "operator groups: 0 created, 0 updated, 1 unchanged, 0 deleted" in out and err == []


def test_the_dump_names_each_groups_pools_access_and_members_and_reloads_as_no_change(tmp_path, users):
    custom = Group.objects.create(name="custom")  # permissions that are no level: dumped without access
    _load(tmp_path, with_operators(ONCALL, AUDIT))
    custom.operated_pools.add(Pool.objects.get(name="spare"))
    operators = yaml.safe_load(dump())["operators"]
    assert operators == [
        {"group": "audit", "pools": ["main", "spare"], "access": "view", "users": []},
        {"group": "custom", "pools": ["spare"], "users": []},
        ONCALL,
    ]
    before = state()
    out, err = _load(tmp_path, yaml.safe_load(dump()), prune=True)
    assert "no changes" in out and err == [] and state() == before


@pytest.mark.parametrize(
    ("operator", "path", "message"),
    [
        ({"group": "x", "pools": ["nowhere"]}, "operators[1].pools[0]", "unknown pool 'nowhere'"),
        ({"group": "x", "users": ["carol"]}, "operators[1].users[0]", "no user 'carol'"),
        ({"group": "x", "access": "admin"}, "operators[1].access", "must be one of view, change"),
        ({"pools": ["main"]}, "operators[1].group", "required"),
        ({"group": "x", "role": "view"}, "operators[1].role", "unknown field"),
    ],
)
def test_a_bad_operator_entry_is_an_error_with_its_path_and_changes_nothing(
    tmp_path, users, operator, path, message
):
    before = (state(), db_state())
    errors = load_fails(tmp_path, with_operators(ONCALL, operator))
    assert any(e.startswith(f"{path}: {message}") for e in errors), errors
    assert (state(), db_state()) == before  # not even the valid group, pools or keys


def test_a_group_named_twice_is_an_error(tmp_path, users):
    errors = load_fails(tmp_path, with_operators(ONCALL, {"group": "oncall", "pools": ["spare"]}))
    assert "operators[1].group: duplicate group 'oncall' (also operators[0])" in errors
