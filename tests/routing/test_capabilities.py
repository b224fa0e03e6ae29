"""Capability provenance (routing.policy.capabilities): qualified evidence while valid, else declared, else
unknown; an expired verdict or one about another configuration is never used."""

import hashlib
import json
from datetime import UTC, datetime, timedelta

import pytest

from routing.policy.capabilities import (
    Capability,
    CapabilityProvenance,
    Evidence,
    effective,
    effective_all,
    latest,
    route_config_hash,
    valid_until,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HASH = route_config_hash(adapter="openai", base_url="http://127.0.0.1:9101/v1", model="gpt-5")


def evidence(
    capability=Capability.TOOLS, qualified=True, *, age=timedelta(days=1), days=30, config_hash=HASH
):
    at = NOW - age
    return Evidence(capability, qualified, at, at + timedelta(days=days), "qualify-1:abc", config_hash)


@pytest.mark.parametrize(
    ("declared", "item", "value", "provenance"),
    [
        ("unknown", None, "unknown", CapabilityProvenance.UNKNOWN),
        ("true", None, "true", CapabilityProvenance.DECLARED),
        ("false", None, "false", CapabilityProvenance.DECLARED),
        ("unknown", evidence(), "true", CapabilityProvenance.QUALIFIED),
        ("true", evidence(qualified=False), "false", CapabilityProvenance.QUALIFIED),
        # Expired: exactly at the expiry and after it.
        ("true", evidence(qualified=False, age=timedelta(days=30)), "true", CapabilityProvenance.DECLARED),
        ("unknown", evidence(age=timedelta(days=31)), "unknown", CapabilityProvenance.UNKNOWN),
        # One second before the expiry it still holds.
        (
            "unknown",
            evidence(age=timedelta(days=30) - timedelta(seconds=1)),
            "true",
            CapabilityProvenance.QUALIFIED,
        ),
        # About another configuration of the route.
        ("unknown", evidence(config_hash="0" * 64), "unknown", CapabilityProvenance.UNKNOWN),
        ("false", evidence(config_hash="0" * 64), "false", CapabilityProvenance.DECLARED),
    ],
)
def test_effective_value_and_provenance(declared, item, value, provenance):
    found = effective(Capability.TOOLS, declared, item, config_hash=HASH, now=NOW)
    assert (found.value, found.provenance) == (value, provenance)
    assert (found.expires_at is not None) == (provenance is CapabilityProvenance.QUALIFIED)


@pytest.mark.parametrize(("qualified", "value"), [(True, "native"), (False, "emulated")])
def test_tool_representation_verdicts_read_native_or_emulated(qualified, value):
    item = evidence(Capability.TOOL_REPRESENTATION, qualified)
    assert (
        effective(Capability.TOOL_REPRESENTATION, "unknown", item, config_hash=HASH, now=NOW).value == value
    )


@pytest.mark.parametrize(
    "change",
    [
        {"adapter": "anthropic"},
        {"base_url": "http://127.0.0.1:9102/v1"},
        {"model": "gpt-5-mini"},
        {"settings": {"anthropic-version": "2024-01-01"}},
        {"account": "9f" * 32},
    ],
)
def test_every_route_fact_changes_the_hash(change):
    facts = {"adapter": "openai", "base_url": "http://127.0.0.1:9101/v1", "model": "gpt-5"}
    assert route_config_hash(**{**facts, **change}) != HASH


def test_a_route_without_a_credential_hashes_as_before_accounts_were_hashed():
    """Its evidence recorded before the account was part of the hash stays valid (issue 50)."""
    legacy = {
        "scheme": "route-config/1",
        "adapter": "openai",
        "base_url": "http://127.0.0.1:9101/v1",
        "model": "gpt-5",
        "settings": {},
    }
    assert hashlib.sha256(json.dumps(legacy, sort_keys=True).encode()).hexdigest() == HASH


def test_a_trailing_slash_is_the_same_route():
    assert route_config_hash(adapter="openai", base_url="http://127.0.0.1:9101/v1/", model="gpt-5") == HASH


def test_the_latest_verdict_wins_and_the_first_expiry_bounds_a_cache():
    old = evidence(qualified=True, age=timedelta(days=2))
    new = evidence(qualified=False, age=timedelta(days=1))
    found = latest([((1, "gpt-5"), old), ((1, "gpt-5"), new)])
    assert found[(1, "gpt-5")][Capability.TOOLS] is new
    values = effective_all(
        {Capability.TOOLS: "true"},
        {Capability.TOOLS: new, Capability.VISION: evidence(Capability.VISION, age=timedelta(days=10))},
        config_hash=HASH,
        now=NOW,
    )
    assert [v.capability for v in values] == list(Capability)
    assert values[0].value == "false"
    assert valid_until(values) == NOW - timedelta(days=10) + timedelta(days=30)
    assert valid_until(effective_all({}, {}, config_hash=HASH, now=NOW)) is None
