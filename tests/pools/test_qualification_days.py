"""`qualification_days` (SPEC §8.1) in the YAML configuration: validated, applied, dumped."""

import pytest
import yaml

from pools.models import GatewaySettings
from tests.gatewayconfig.test_document import base, dump, environment, load, load_fails  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db


def test_qualification_days_defaults_to_30_and_round_trips(tmp_path):
    doc = base()
    doc.pop("qualification_days", None)
    load(tmp_path, doc)
    assert GatewaySettings.objects.get(pk=1).qualification_days == 30
    assert yaml.safe_load(dump())["qualification_days"] == 30

    doc["qualification_days"] = 7
    load(tmp_path, doc)
    assert GatewaySettings.objects.get(pk=1).qualification_days == 7
    dumped = yaml.safe_load(dump())
    assert dumped["qualification_days"] == 7
    load(tmp_path, dumped)  # the dump loads back unchanged
    assert GatewaySettings.objects.get(pk=1).qualification_days == 7


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "qualification_days: must be an integer >= 1"),
        ("30d", "qualification_days: must be an integer >= 1"),
        (True, "qualification_days: must be an integer >= 1"),
        (5000, "qualification_days: must be an integer <= 3650"),
    ],
)
def test_a_bad_qualification_days_is_refused_with_its_path_and_changes_nothing(tmp_path, value, message):
    load(tmp_path, {**base(), "qualification_days": 9})
    printed = load_fails(tmp_path, {**base(), "qualification_days": value})
    assert any(message in line for line in printed), printed
    assert GatewaySettings.objects.get(pk=1).qualification_days == 9
