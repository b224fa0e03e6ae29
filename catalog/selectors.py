"""Reads of capability evidence (SPEC §8.1) for the router's configuration snapshot and the panel.

Both ask the same two things: the configuration hash of a route as it is configured now
(`route_hash`) and the latest verdict per route and capability while it has not expired
(`evidence_load`); both then call `routing.policy.capabilities.effective`, so what the panel shows is what
eligibility uses.
"""

import functools
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from datetime import datetime

from django.conf import settings
from django.db.models import Exists, OuterRef, Q, QuerySet

from catalog.models import CapabilityEvidence, CatalogEntry
from pools.credentials import credential_of
from pools.models import Assignment
from proxy.wire.providers.registry import provider
from routing.policy.capabilities import (
    Capability,
    Effective,
    Evidence,
    effective_all,
    latest,
    route_config_hash,
)
from routing.policy.eligibility import overlay
from routing.policy.types import TriState

RouteKey = tuple[int, str]  # (assignment id, model)


FINGERPRINT_SALT = "catalog.selectors.account_fingerprint"


@functools.lru_cache(maxsize=4)
def _fingerprint_key(secret: str) -> bytes:
    return hashlib.sha256(f"{FINGERPRINT_SALT}:{secret}".encode()).digest()


def account_fingerprint(credential: str) -> str:
    """Which account a credential is, without it: HMAC-SHA256 of the credential under a key derived
    from Django's SECRET_KEY (so it cannot be recomputed from a dump of the database alone). The same
    credential gives the same fingerprint in every process and under every GATEWAY_CREDENTIALS_KEY
    (re-encrypting a credential keeps its evidence); another credential another one. "" for none."""
    if not credential:
        return ""
    key = _fingerprint_key(settings.SECRET_KEY)
    return hmac.new(key, credential.encode(), hashlib.sha256).hexdigest()


def route_hash(*, adapter: str, base_url: str, model: str, credential: str = "") -> str:
    """The route's configuration hash: whatever changes what the upstream receives for the corpus
    (adapter, base_url, model, and the protocol settings its provider sends, such as an API version)
    or who answers it (the account whose `credential` is sent: its fingerprint, never the credential)
    invalidates its evidence."""
    return route_config_hash(
        adapter=adapter,
        base_url=base_url,
        model=model,
        settings=provider(adapter).protocol,
        account=account_fingerprint(credential),
    )


def assignment_route_hash(assignment: Assignment, model: str) -> str:
    """`route_hash` of one (assignment, model) as configured now, with the credential it sends (a
    stored one decrypted once per token and key set, `pools.credentials`; an env var's value as read
    now, stable while the variable is)."""
    a = assignment
    return route_hash(adapter=a.adapter, base_url=a.base_url, model=model, credential=credential_of(a))


def route_capabilities(
    assignment: Assignment,
    *,
    model: str,
    model_tools: str,
    model_vision: str,
    evidence: Mapping[Capability, Evidence],
    now: datetime,
) -> tuple[Effective, ...]:
    """The effective capabilities of one (assignment, model), in `Capability` order: its latest
    evidence while unexpired and about the route as configured now, else the declared value (the
    catalog's per-model tools/vision when known, else the assignment's), else unknown. The router's
    snapshot and the panel both call this, so the panel shows what eligibility uses."""
    a = assignment
    declared = {
        Capability.TOOLS: overlay(TriState(model_tools), TriState(a.tools)),
        Capability.WRITE_TOOLS: a.write_tools,
        Capability.VISION: overlay(TriState(model_vision), TriState(a.vision)),
        Capability.ROLE_SEPARATION: a.role_separation,
        Capability.TOOL_REPRESENTATION: a.tool_representation,
    }
    config_hash = assignment_route_hash(a, model)
    return effective_all(declared, evidence, config_hash=config_hash, now=now)


def _newest(rows: QuerySet[CapabilityEvidence]) -> QuerySet[CapabilityEvidence]:
    """The rows no later verdict of the same route and capability replaced (whether it has expired)."""
    newer = CapabilityEvidence.objects.filter(
        assignment_id=OuterRef("assignment_id"), model=OuterRef("model"), capability=OuterRef("capability")
    ).filter(
        Q(qualified_at__gt=OuterRef("qualified_at"))
        | Q(qualified_at=OuterRef("qualified_at"), pk__gt=OuterRef("pk"))
    )
    return rows.filter(~Exists(newer))


def latest_verdicts(*, assignment_id: int, model: str) -> dict[Capability, bool]:
    """What the route's latest verdict per capability said, expired or not and about whichever
    configuration: the previous `qualify` run, which this one is compared with."""
    rows = _newest(CapabilityEvidence.objects.filter(assignment_id=assignment_id, model=model))
    return {Capability(c): q for c, q in rows.values_list("capability", "qualified")}


def evidence_load(*, pool_ids: Iterable[int], now: datetime) -> dict[RouteKey, dict[Capability, Evidence]]:
    """The latest verdict of every route of these pools, per capability, when it has not expired, in
    ONE query. The latest is chosen among every verdict, expired or not: once it expires the route has
    no evidence (its declared value, else unknown), never an older verdict it replaced."""
    rows = (
        _newest(CapabilityEvidence.objects.filter(assignment__pool_id__in=list(pool_ids), expires_at__gt=now))
        .order_by("qualified_at", "pk")
        .values_list(
            "assignment_id",
            "model",
            "capability",
            "qualified",
            "qualified_at",
            "expires_at",
            "corpus_version",
            "config_hash",
        )
    )
    return latest(((row[0], row[1]), Evidence(Capability(row[2]), *row[3:])) for row in rows)


def qualification_routes(
    *, pool: str | None = None, assignment: str | None = None, model: str | None = None
) -> list[CatalogEntry]:
    """The routes `manage.py qualify` replays its corpus through: every catalog entry of an enabled
    assignment, optionally of one pool, one assignment and/or one model, in a stable order. An
    assignment named explicitly is qualified even while disabled, so it can be qualified before it
    takes traffic."""
    entries = CatalogEntry.objects.select_related("assignment__pool")
    if assignment is not None:
        entries = entries.filter(assignment__name=assignment)
    else:
        entries = entries.filter(assignment__enabled=True)
    if pool is not None:
        entries = entries.filter(assignment__pool__name=pool)
    if model is not None:
        entries = entries.filter(model=model)
    return list(entries.order_by("assignment__pool__name", "assignment__tier", "assignment__name", "model"))


def capabilities_explained(
    routes: Iterable[RouteKey], *, now: datetime
) -> dict[RouteKey, tuple[Effective, ...]]:
    """The effective capabilities of these routes with their provenance (for `routing_explain`), in three
    queries: the same reads and the same function as the router's snapshot."""
    wanted = set(routes)
    if not wanted:
        return {}
    entries = CatalogEntry.objects.filter(
        assignment_id__in={aid for aid, _ in wanted}, model__in={m for _, m in wanted}
    ).select_related("assignment")
    entries = [e for e in entries if (e.assignment_id, e.model) in wanted]
    evidence = evidence_load(pool_ids={e.assignment.pool_id for e in entries}, now=now)
    return {
        (e.assignment_id, e.model): route_capabilities(
            e.assignment,
            model=e.model,
            model_tools=e.tools,
            model_vision=e.vision,
            evidence=evidence.get((e.assignment_id, e.model), {}),
            now=now,
        )
        for e in entries
    }


def provenance_text(value: Effective) -> str:
    """`tools=true (qualified until 2027-01-01T12:00:00+00:00)`, `vision=unknown (unknown)`."""
    note = str(value.provenance)
    if value.expires_at is not None:
        note += f" until {value.expires_at.isoformat(timespec='seconds')}"
    return f"{value.capability}={value.value} ({note})"
