"""The configuration schema is declared once (gatewayconfig/schema.py) and takes its limits and defaults
from the models (issue 16 point 7): a new column is in the file or named here as not configurable, and a
column's length is the file's limit without a second number to keep in step."""

import copy

import pytest
import yaml

from catalog.models import CatalogEntry
from gatewayconfig.document import parse_config
from gatewayconfig.fields import columns
from gatewayconfig.schema import ASSIGNMENT, KEY, MODEL, POOL, SETTINGS
from pools.models import Assignment, GatewayKey, GatewaySettings, Pool

# Columns the file never declares: identities and relations it spells otherwise, secrets and their
# hints, and state the gateway keeps (spend, discovery, rotation).
NOT_IN_THE_FILE = {
    Pool: {"id", "operator_groups"},
    Assignment: {"id", "pool", "credential", "credential_hint"},
    CatalogEntry: {"id", "assignment", "provenance", "observed_at"},
    GatewayKey: {
        "id",
        "key_hash",
        "prefix",
        "pools",
        "spent_micros",
        "reserved_micros",
        "period_start",
        "previous_key_hash",
        "previous_prefix",
        "previous_valid_until",
    },
    GatewaySettings: {"id"},
}


@pytest.mark.parametrize(
    ("model", "section"),
    [
        (Pool, POOL),
        (Assignment, ASSIGNMENT),
        (CatalogEntry, MODEL),
        (GatewayKey, KEY),
        (GatewaySettings, SETTINGS),
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
def test_every_column_is_in_the_schema_or_named_as_not_configurable(model, section):
    table = {f.name for f in model._meta.get_fields() if f.concrete or f.many_to_many} - {
        f.name for f in model._meta.get_fields() if f.auto_created and not f.concrete
    }
    declared = set(columns(section))

    assert declared <= table, f"the schema names columns {model.__name__} does not have"
    assert declared.isdisjoint(NOT_IN_THE_FILE[model])
    assert declared | NOT_IN_THE_FILE[model] == table


BASE = {
    "pools": [
        {
            "name": "main",
            "assignments": [
                {
                    "name": "acct-a",
                    "adapter": "openai",
                    "base_url": "http://127.0.0.1:9101/v1",
                    "region": "us",
                    "models": [{"id": "gpt-5"}],
                }
            ],
        }
    ],
    "keys": [{"name": "ci", "key": "sk-gw-ci-0123456789abcdef", "pools": ["main"]}],
}


@pytest.mark.parametrize(
    ("path", "model", "column"),
    [
        (("pools", 0, "name"), Pool, "name"),
        (("pools", 0, "assignments", 0, "name"), Assignment, "name"),
        (("pools", 0, "assignments", 0, "region"), Assignment, "region"),
        (("pools", 0, "assignments", 0, "models", 0, "id"), CatalogEntry, "model"),
        (("keys", 0, "name"), GatewayKey, "name"),
    ],
)
def test_a_strings_limit_is_its_columns_max_length(path, model, column):
    limit = model._meta.get_field(column).max_length
    printed = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")

    def errors_with(value: str) -> list[str]:
        doc = copy.deepcopy(BASE)
        node = doc
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
        return [str(e) for e in parse_config(yaml.safe_dump(doc), env={}).errors]

    assert f"{printed}: must be at most {limit} characters" in errors_with("x" * (limit + 1))
    assert not [e for e in errors_with("x" * limit) if e.startswith(f"{printed}:")]


def test_an_absent_field_takes_its_columns_default():
    config = parse_config(yaml.safe_dump(BASE), env={}).config
    assert config is not None
    assignment = config.pools[0].assignments[0]
    defaults = {
        name: Assignment._meta.get_field(name).get_default()
        for name in assignment.values()
        if Assignment._meta.get_field(name).has_default()
    }
    assert len(defaults) == 14  # tier, weight, router, the privacy and capability facts, ...
    assert {name: assignment.values()[name] for name in defaults} == defaults
    assert config.settings.values() == {
        name: GatewaySettings._meta.get_field(name).get_default() for name in config.settings.values()
    }
