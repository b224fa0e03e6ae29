"""Capability provenance (SPEC §3, §5.3, §8.1): which value of a route's capability eligibility uses,
and why.

Contract:
- A capability of an (assignment, model) route has one of three provenances: `qualified` (evidence
  recorded by `manage.py qualify`: a verdict from a replayed corpus, with an expiry), `declared` (a
  value typed into the configuration or admin), or `unknown` (neither).
- `effective` picks, in this order: the route's latest evidence when it has not expired (`now <
  expires_at`) and its configuration hash equals the route's current one; else the declared value when
  it is not unknown; else unknown. Evidence whose hash differs (the base_url, adapter, model or
  protocol version changed since it was recorded) or that has expired is ignored, never half-trusted:
  the route goes back to its declared value, or to unknown.
- A verdict is `qualified` true or false. For `tool_representation` true reads `native` and false
  reads `emulated`; for the other capabilities true/false read as the tri-state.
- `route_config_hash` is the route's configuration hash: SHA-256 over the facts that decide what the
  upstream receives and who answers it, the account included: a keyed fingerprint of its credential
  (never the credential), so another account behind the same base_url starts from declared/unknown.
- `valid_until` is the earliest instant at which an effective value taken from evidence changes by
  itself (its expiry): a cache of effective values is stale from then on.
Pure: `now` is passed in.
"""

import enum
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from routing.policy.types import ToolRepresentation, TriState


class Capability(enum.StrEnum):
    """The capabilities a qualification replay can show (SPEC §5.3), in the order they are shown."""

    TOOLS = "tools"
    WRITE_TOOLS = "write_tools"
    VISION = "vision"
    ROLE_SEPARATION = "role_separation"
    TOOL_REPRESENTATION = "tool_representation"


class CapabilityProvenance(enum.StrEnum):
    QUALIFIED = "qualified"
    DECLARED = "declared"
    UNKNOWN = "unknown"


# Part of every route's configuration hash: bumping it invalidates every recorded verdict at once (for a
# change of the gateway's own request building that changes what upstreams receive).
HASH_SCHEME = "route-config/1"


def route_config_hash(
    *, adapter: str, base_url: str, model: str, settings: Mapping[str, str] = {}, account: str = ""
) -> str:
    """The configuration hash of an (assignment, model) route. `settings` carries any other fact that
    changes what the upstream receives (e.g. the Anthropic API version header); `account` the keyed
    fingerprint of the credential sent ("" when none is: a route without a credential hashes as it did
    before accounts were part of the hash, so its evidence stayed valid), never a credential."""
    facts = {
        "scheme": HASH_SCHEME,
        "adapter": adapter,
        "base_url": base_url.rstrip("/"),
        "model": model,
        "settings": dict(sorted(settings.items())),
    }
    if account:
        facts["account"] = account
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Evidence:
    """One recorded verdict of `manage.py qualify` for one capability of one route."""

    capability: Capability
    qualified: bool
    qualified_at: datetime
    expires_at: datetime
    corpus_version: str
    config_hash: str

    def valid(self, *, config_hash: str, now: datetime) -> bool:
        return self.config_hash == config_hash and now < self.expires_at


@dataclass(frozen=True, slots=True)
class Effective:
    capability: Capability
    value: str  # a TriState value, or a ToolRepresentation value for tool_representation
    provenance: CapabilityProvenance
    expires_at: datetime | None = None  # qualified only
    qualified_at: datetime | None = None  # qualified only


def verdict_value(capability: Capability, qualified: bool) -> str:
    if capability is Capability.TOOL_REPRESENTATION:
        return ToolRepresentation.NATIVE if qualified else ToolRepresentation.EMULATED
    return TriState.TRUE if qualified else TriState.FALSE


def effective(
    capability: Capability,
    declared: str,
    evidence: Evidence | None,
    *,
    config_hash: str,
    now: datetime,
) -> Effective:
    if evidence is not None and evidence.valid(config_hash=config_hash, now=now):
        return Effective(
            capability,
            verdict_value(capability, evidence.qualified),
            CapabilityProvenance.QUALIFIED,
            expires_at=evidence.expires_at,
            qualified_at=evidence.qualified_at,
        )
    if declared != TriState.UNKNOWN:
        return Effective(capability, declared, CapabilityProvenance.DECLARED)
    return Effective(capability, TriState.UNKNOWN, CapabilityProvenance.UNKNOWN)


def effective_all(
    declared: Mapping[Capability, str],
    evidence: Mapping[Capability, Evidence],
    *,
    config_hash: str,
    now: datetime,
) -> tuple[Effective, ...]:
    """Every capability of one route, in the order of `Capability`."""
    return tuple(
        effective(c, declared.get(c, TriState.UNKNOWN), evidence.get(c), config_hash=config_hash, now=now)
        for c in Capability
    )


RouteKey = tuple[int, str]  # (assignment id, model)


def latest(rows: Iterable[tuple[RouteKey, Evidence]]) -> dict[RouteKey, dict[Capability, Evidence]]:
    """The latest verdict per route and capability, from rows ordered oldest first: a newer verdict
    (true or false) always replaces an older one."""
    found: dict[RouteKey, dict[Capability, Evidence]] = {}
    for key, item in rows:
        found.setdefault(key, {})[item.capability] = item
    return found


def valid_until(values: Iterable[Effective]) -> datetime | None:
    """When the first of these effective values taken from evidence expires (None: never by itself)."""
    expiries = [v.expires_at for v in values if v.expires_at is not None]
    return min(expiries) if expiries else None
