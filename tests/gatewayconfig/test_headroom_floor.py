"""`headroom_floor` (SPEC §5.4 headroom) in the YAML file: gateway-wide under `circuit:`, and per assignment
where `null` (or nothing) means the gateway-wide one; 0 to 1, checked with its path; dumped back as loaded;
and what the router is given for each assignment (`Target.headroom_floor`)."""

from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from pools.models import Assignment, GatewaySettings
from routing.policy.headroom import DEFAULT_FLOOR
from routing.selectors import config_load
from tests.gatewayconfig.test_document import dump, load, load_fails

DOC = """
circuit:
  headroom_floor: 0.25
pools:
  - name: main
    assignments:
      - name: own-floor
        adapter: openai
        base_url: http://127.0.0.1:9101/v1
        headroom_floor: 0.05
        models: [{id: gpt-5}]
      - name: gateway-floor
        adapter: anthropic
        base_url: http://127.0.0.1:9102/v1
        models: [{id: gpt-5}]
keys: []
"""


def doc() -> dict[str, Any]:
    return yaml.safe_load(DOC)


def _assignments(dumped: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["name"]: a for a in dumped["pools"][0]["assignments"]}


@pytest.mark.django_db
def test_the_floors_load_dump_and_reload_unchanged(tmp_path):
    load(tmp_path, DOC)
    assert GatewaySettings.objects.get(pk=1).headroom_floor == 0.25
    floors = dict(Assignment.objects.values_list("name", "headroom_floor"))
    assert floors == {"own-floor": 0.05, "gateway-floor": None}

    first = dump()
    dumped = yaml.safe_load(first)
    assert dumped["circuit"]["headroom_floor"] == 0.25
    assignments = _assignments(dumped)
    assert assignments["own-floor"]["headroom_floor"] == 0.05
    assert "headroom_floor" not in assignments["gateway-floor"]  # the gateway-wide one: not written

    load(tmp_path, first)
    assert dump() == first


@pytest.mark.django_db
def test_without_the_key_the_default_floor_applies_and_is_dumped(tmp_path):
    document = doc()
    del document["circuit"]
    load(tmp_path, document)
    assert GatewaySettings.objects.get(pk=1).headroom_floor == DEFAULT_FLOOR == 0.10
    assert yaml.safe_load(dump())["circuit"]["headroom_floor"] == 0.10


@pytest.mark.django_db
def test_an_explicit_null_on_an_assignment_is_the_gateway_wide_floor(tmp_path):
    document = doc()
    _assignments(document)["own-floor"]["headroom_floor"] = None
    load(tmp_path, DOC)
    load(tmp_path, document)  # a floor that was set, set back to the gateway's
    assert Assignment.objects.get(name="own-floor").headroom_floor is None


@pytest.mark.django_db
@pytest.mark.parametrize("value", [1.5, -0.1, "low", True])
@pytest.mark.parametrize(
    ("where", "path"),
    [("circuit", "circuit.headroom_floor"), ("assignment", "pools[0].assignments[0].headroom_floor")],
)
def test_a_floor_outside_0_to_1_is_refused_with_its_path(tmp_path, value, where, path):
    document = doc()
    if where == "circuit":
        document["circuit"]["headroom_floor"] = value
    else:
        _assignments(document)["own-floor"]["headroom_floor"] = value
    assert load_fails(tmp_path, document) == [f"{path}: must be a number between 0 and 1"]
    assert not GatewaySettings.objects.exists() and not Assignment.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("value", [0, 1])
def test_the_range_is_inclusive(tmp_path, value):
    document = doc()
    document["circuit"]["headroom_floor"] = value
    _assignments(document)["own-floor"]["headroom_floor"] = value
    load(tmp_path, document)
    assert GatewaySettings.objects.get(pk=1).headroom_floor == value
    assert Assignment.objects.get(name="own-floor").headroom_floor == value


@pytest.mark.django_db
def test_the_router_gets_each_assignments_own_floor_else_the_gateway_wide_one(tmp_path):
    load(tmp_path, DOC)
    snapshot = config_load(
        tuple(Assignment.objects.values_list("pool_id", flat=True).distinct()), datetime.now(UTC)
    )
    floors = {target.name: target.headroom_floor for target in snapshot.targets.values()}
    assert floors == {"own-floor": 0.05, "gateway-floor": 0.25}
