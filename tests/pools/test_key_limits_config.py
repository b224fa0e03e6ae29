"""`keys[].limits: {rpm, tpm, concurrent}` in YAML (load/dump) and in admin (SPEC §3)."""

import pytest
import yaml

from gatewayconfig.document import IssueCode, database_facts, parse_config
from pools.models import GatewayKey
from tests.gatewayconfig.test_document import (
    OPS_KEY,
    base,
    db_state,
    dump,
    environment,  # noqa: F401  (autouse: the variables the base file names)
    load,
    load_fails,
)

pytestmark = pytest.mark.django_db


def _with_limits(value) -> dict:
    doc = base()
    doc["keys"][0]["limits"] = value
    return doc


def test_limits_are_loaded_and_dumped_and_the_dump_loads_to_the_same_state(tmp_path):
    load(tmp_path, _with_limits({"rpm": 3, "tpm": 100000, "concurrent": 2}))
    ci = GatewayKey.objects.get(name="ci")
    assert (ci.limit_rpm, ci.limit_tpm, ci.limit_concurrent) == (3, 100000, 2)
    assert GatewayKey.objects.get(name="ops").limit_rpm is None  # no `limits`: no limit

    dumped = yaml.safe_load(dump())
    by_name = {k["name"]: k for k in dumped["keys"]}
    assert by_name["ci"]["limits"] == {"rpm": 3, "tpm": 100000, "concurrent": 2}
    assert "limits" not in by_name["ops"]

    before = db_state()
    doc = base()
    doc["keys"][0]["limits"] = by_name["ci"]["limits"]
    load(tmp_path, doc)
    assert db_state() == before  # loading the dumped limits again changes nothing


def test_a_partial_or_null_limits_leaves_the_others_unlimited(tmp_path):
    load(tmp_path, _with_limits({"concurrent": 1, "rpm": None}))
    ci = GatewayKey.objects.get(name="ci")
    assert (ci.limit_rpm, ci.limit_tpm, ci.limit_concurrent) == (None, None, 1)
    assert yaml.safe_load(dump())["keys"][0]["limits"] == {"rpm": None, "tpm": None, "concurrent": 1}

    load(tmp_path, _with_limits(None))  # `limits: null`: the limits are removed
    ci.refresh_from_db()
    assert ci.limit_concurrent is None


@pytest.mark.parametrize(
    ("limits", "line", "code"),
    [
        ({"rpm": 0}, "keys[0].limits.rpm: must be an integer >= 1", IssueCode.INVALID),
        ({"tpm": -5}, "keys[0].limits.tpm: must be an integer >= 1", IssueCode.INVALID),
        ({"concurrent": "2"}, "keys[0].limits.concurrent: must be an integer >= 1", IssueCode.INVALID),
        ({"rpm": 1.5}, "keys[0].limits.rpm: must be an integer >= 1", IssueCode.INVALID),
        ({"rpm": True}, "keys[0].limits.rpm: must be an integer >= 1", IssueCode.INVALID),
        ({"tpm": 2**31}, "keys[0].limits.tpm: must be an integer <= 2147483647", IssueCode.INVALID),
        ({"rps": 3}, "keys[0].limits.rps: unknown field", IssueCode.UNKNOWN_FIELD),
        ([3, 4], "keys[0].limits: must be a mapping", IssueCode.INVALID),
        ("rpm=3", "keys[0].limits: must be a mapping", IssueCode.INVALID),
    ],
)
def test_bad_limits_are_refused_with_their_path_and_change_nothing(tmp_path, limits, line, code):
    doc = _with_limits(limits)
    text = yaml.safe_dump(doc, sort_keys=False)

    printed = load_fails(tmp_path, text)

    assert line in printed
    issues = parse_config(text, env={"GW_OPS_KEY": OPS_KEY}, facts=database_facts()).errors
    assert code in {e.code for e in issues if str(e) == line}
    assert db_state()["keys"] == []


def test_admin_edits_a_keys_limits(admin_client):
    from tests.factories import GatewayKeyFactory, PoolFactory

    pool = PoolFactory(name="main")
    key = GatewayKeyFactory(name="ci", raw_key="sk-gw-admin-limits-0123456789", pools=[pool])
    url = f"/admin/pools/gatewaykey/{key.pk}/change/"
    page = admin_client.get(url)
    for field in ("limit_rpm", "limit_tpm", "limit_concurrent"):
        assert f'name="{field}"' in page.content.decode()

    form = {
        "name": "ci",
        "pools": [pool.pk],
        "allowed_models": '["*"]',
        "regions": "[]",
        "min_quality": "0",
        "allow_third_party_router": "on",
        "enabled": "on",
        "limit_rpm": "60",
        "limit_tpm": "",
        "limit_concurrent": "0",
    }
    refused = admin_client.post(url, form)
    assert refused.status_code == 200  # the form again, with its error
    assert "greater than or equal to 1" in refused.content.decode()
    key.refresh_from_db()
    assert key.limit_rpm is None

    form["limit_concurrent"] = "4"
    saved = admin_client.post(url, form)
    assert saved.status_code == 302, saved.content.decode()[:2000]
    key.refresh_from_db()
    assert (key.limit_rpm, key.limit_tpm, key.limit_concurrent) == (60, None, 4)
