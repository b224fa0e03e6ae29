"""Reads of capability evidence (SPEC §8.1) for the router's configuration snapshot and the panel.

Both ask the same two things: the configuration hash of a route as it is configured now
(`route_hash`) and the latest unexpired verdict per route and capability (`evidence_load`); both then
call `routing.capabilities.effective`, so what the panel shows is what eligibility uses.
"""

from collections.abc import Iterable
from datetime import datetime

from catalog.models import CapabilityEvidence, CatalogEntry
from pools.models import ANTHROPIC_VERSION, Adapter
from routing.capabilities import Capability, Evidence, latest, route_config_hash

RouteKey = tuple[int, str]  # (assignment id, model)


def route_hash(*, adapter: str, base_url: str, model: str) -> str:
    """The route's configuration hash: whatever changes what the upstream receives for the corpus
    (adapter, base_url, model, and the protocol version the adapter sends) invalidates its evidence."""
    settings = {"anthropic-version": ANTHROPIC_VERSION} if adapter == Adapter.ANTHROPIC else {}
    return route_config_hash(adapter=adapter, base_url=base_url, model=model, settings=settings)


def evidence_load(*, pool_ids: Iterable[int], now: datetime) -> dict[RouteKey, dict[Capability, Evidence]]:
    """The latest unexpired verdict of every route of these pools, per capability, in ONE query."""
    rows = (
        CapabilityEvidence.objects.filter(assignment__pool_id__in=list(pool_ids), expires_at__gt=now)
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
    assignment, optionally of one pool, one assignment and/or one model, in a stable order."""
    entries = CatalogEntry.objects.filter(assignment__enabled=True).select_related("assignment__pool")
    if pool is not None:
        entries = entries.filter(assignment__pool__name=pool)
    if assignment is not None:
        entries = entries.filter(assignment__name=assignment)
    if model is not None:
        entries = entries.filter(model=model)
    return list(entries.order_by("assignment__pool__name", "assignment__tier", "assignment__name", "model"))
