"""Loads everything a routing decision needs, in a constant number of queries (no per-candidate
query), and hands the pure core plain values (SPEC §5, §7)."""

from datetime import datetime

from catalog.models import CatalogEntry
from pools.models import GatewaySettings, ModelAlias, ModelFallback, Pool
from routing import breaker
from routing.breaker import BreakerSettings, CircuitSnapshot
from routing.models import Affinity, AffinityKind, Circuit, Demotion
from routing.resolution import ModelPolicy
from routing.route import RoutingView, Target
from routing.services import breaker_settings, circuit_snapshot
from routing.types import (
    Candidate,
    DataCollection,
    Health,
    Price,
    RouteClass,
    Router,
    ToolRepresentation,
    TriState,
)


def _candidate(entry: CatalogEntry, health: Health, demoted: bool) -> Candidate:
    a = entry.assignment
    return Candidate(
        assignment_id=a.pk,
        model=entry.model,
        assignment=a.name,
        tier=a.tier,
        weight=a.weight,
        demoted=demoted,
        health=health,
        region=a.region,
        router=Router(a.router),
        zero_retention=TriState(a.zero_retention),
        data_collection=DataCollection(a.data_collection),
        tools=TriState(a.tools),
        write_tools=TriState(a.write_tools),
        vision=TriState(a.vision),
        role_separation=TriState(a.role_separation),
        tool_representation=ToolRepresentation(a.tool_representation),
        model_tools=TriState(entry.tools),
        model_vision=TriState(entry.vision),
        quality=a.quality,
        min_deadline_ms=a.min_deadline_ms,
        context_window=entry.context_window,
        price=Price(entry.input_per_mtok_micros, entry.output_per_mtok_micros),
    )


def routing_view_load(
    *, pool_ids: tuple[int, ...], route_class: RouteClass, now: datetime
) -> tuple[RoutingView, GatewaySettings, BreakerSettings]:
    """Six queries whatever the number of pools, assignments and models."""
    settings = GatewaySettings.load()
    bsettings = breaker_settings(settings)
    policy = ModelPolicy(
        aliases=dict(ModelAlias.objects.values_list("alias", "canonical")),
        fallbacks=dict(ModelFallback.objects.values_list("requested", "served")),
        family=settings.model_fallback_family,
    )
    entries = list(
        CatalogEntry.objects.filter(assignment__pool_id__in=pool_ids, assignment__enabled=True)
        .select_related("assignment", "assignment__pool")
        .order_by("assignment__pool__name", "assignment__tier", "assignment__name", "model")
    )
    assignment_ids = {e.assignment_id for e in entries}
    circuits: dict[tuple[int, str], CircuitSnapshot] = {
        (row.assignment_id, row.model): circuit_snapshot(row)
        for row in Circuit.objects.filter(assignment_id__in=assignment_ids, route_class=route_class)
    }
    demoted = set(
        Demotion.objects.filter(assignment_id__in=assignment_ids, until__gt=now).values_list(
            "assignment_id", "model"
        )
    )
    routes: dict[str, list[Candidate]] = {}
    auto_models: list[str] = []
    targets: dict[int, Target] = {}
    seen_pools: set[int] = set()
    for entry in entries:
        key = (entry.assignment_id, entry.model)
        health = breaker.health(circuits.get(key), bsettings, now)
        routes.setdefault(entry.model, []).append(_candidate(entry, health, key in demoted))
        a = entry.assignment
        targets[a.pk] = Target(a.pk, a.name, a.pool_id, a.adapter, a.base_url, a.api_key_env)
        if entry.assignment.pool_id not in seen_pools:
            seen_pools.add(entry.assignment.pool_id)
            auto_models.extend(m for m in entry.assignment.pool.auto_models if m not in auto_models)
    view = RoutingView(
        policy=policy,
        max_attempts=settings.max_attempts,
        routes={model: tuple(candidates) for model, candidates in routes.items()},
        auto_models=tuple(auto_models),
        circuits=circuits,
        targets=targets,
    )
    return view, settings, bsettings


def pool_names(pool_ids: tuple[int, ...]) -> list[str]:
    return list(Pool.objects.filter(pk__in=pool_ids).order_by("name").values_list("name", flat=True))


def affinity_get(*, kind: AffinityKind, key: str, now: datetime) -> Affinity | None:
    """The live affinity for (kind, key), or None when there is none or it expired."""
    return Affinity.objects.filter(kind=kind, key=key, expires_at__gt=now).first()
