"""The operator page /admin/upstreams/ (SPEC §9): pools, their assignments and the read-only Routing
panel, with the ledger's usage leaderboard.

The page's loader lives here, beside its only caller, rather than in routing/selectors.py (the request
path's reads): it is an admin read, scoped by user, and the router never calls it. Both call the same
pure functions (`routing.policy.breaker.health` through `routing.policy.panel`), so the panel shows what the
router does.
It sits in proxy, as the Spend page does, because it reads the ledger (`proxy.ledger.models`) beside the
routing
state: routing, a layer below, may not import it (tests/test_imports.py).
"""

from datetime import datetime

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q, Sum
from django.http import HttpResponseNotAllowed
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone

from catalog.models import CatalogEntry
from catalog.prices import route_price
from catalog.selectors import evidence_load, route_capabilities
from pools.models import Assignment, GatewaySettings
from pools.selectors import pools_visible_to
from proxy.ledger.models import Attempt, AttemptStatus
from routing.models import Circuit, Demotion, Latency
from routing.policy import panel
from routing.policy.breaker import CircuitSnapshot
from routing.policy.types import ASSIGNMENT_WIDE, CircuitReason, RouteClass, TriState
from routing.services import breaker_settings, circuit_snapshot

# Only these assignment columns are read for the panel: base_url, credential and api_key_env only to
# compute the route's configuration hash (`catalog.selectors.route_capabilities`: the account's keyed
# fingerprint, never the credential); no row object reaches the template, only `routing.policy.panel` values,
# so none of them can appear on the page.
PANEL_ASSIGNMENT_FIELDS = (
    "pk",
    "base_url",
    "credential",
    "api_key_env",
    "pool_id",
    "name",
    "adapter",
    "tier",
    "region",
    "router",
    "enabled",
    "quality",
    "zero_retention",
    "data_collection",
    "tools",
    "write_tools",
    "vision",
    "role_separation",
    "tool_representation",
)
PANEL_CAPABILITIES = (
    ("tools", "Tools"),
    ("write_tools", "Write tools"),
    ("vision", "Vision"),
    ("role_separation", "Role separation"),
    ("tool_representation", "Tool representation"),
    ("zero_retention", "Zero retention"),
    ("data_collection", "Data collection"),
)


def _dispatched(now: datetime):
    """The ledger's attempts in the usage window. Ineligible candidates were never dispatched, so they
    are not usage."""
    return Attempt.objects.filter(
        request__started_at__gt=now - panel.USAGE_WINDOW, request__started_at__lte=now
    ).exclude(status=AttemptStatus.INELIGIBLE)


def _attempts_by_assignment(*, pool_ids: list[int], now: datetime) -> dict[int, int]:
    """One aggregate: each assignment of these pools -> its attempts in the window (none: absent)."""
    rows = (
        _dispatched(now)
        .filter(assignment__pool_id__in=pool_ids)
        .values_list("assignment_id")
        .annotate(n=Count("pk"))
        .order_by()
    )
    return dict(rows)


def _usage(*, pool_ids: list[int] | None, now: datetime) -> list[panel.UsageRow]:
    """One aggregate over the ledger's attempts in the window. `pool_ids` None: every attempt
    (superusers)."""
    attempts = _dispatched(now)
    if pool_ids is not None:
        attempts = attempts.filter(assignment__pool_id__in=pool_ids)
    rows = (
        attempts.values("model")
        .annotate(
            requests=Count("request", distinct=True),
            successes=Count("pk", filter=Q(status=AttemptStatus.SUCCEEDED)),
            handoffs=Count("pk", filter=Q(status=AttemptStatus.RETRYABLE_FAILED)),
            input_tokens=Sum("input_tokens"),
            output_tokens=Sum("output_tokens"),
        )
        .order_by("-requests", "model")[: panel.LEADERBOARD_SIZE * 4]
    )
    return [panel.UsageRow(**row) for row in rows]


def _model_facts(
    assignments: list[Assignment], *, pool_ids: list[int], now: datetime
) -> dict[int, list[panel.ModelFacts]]:
    """Each assignment's catalog entries with the capabilities its route has (declared, or as qualified
    by the evidence of `now`) and its price, by assignment id."""
    by_id = {a.pk: a for a in assignments}
    evidence = evidence_load(pool_ids=pool_ids, now=now)
    entries: dict[int, list[panel.ModelFacts]] = {}
    for (
        assignment_id,
        model,
        provenance,
        tools,
        vision,
        window,
        input_price,
        output_price,
    ) in CatalogEntry.objects.filter(assignment__pool_id__in=pool_ids).values_list(
        "assignment_id",
        "model",
        "provenance",
        "tools",
        "vision",
        "context_window",
        "input_per_mtok_micros",
        "output_per_mtok_micros",
    ):
        capabilities = route_capabilities(
            by_id[assignment_id],
            model=model,
            model_tools=tools,
            model_vision=vision,
            evidence=evidence.get((assignment_id, model), {}),
            now=now,
        )
        entries.setdefault(assignment_id, []).append(
            panel.ModelFacts(
                model,
                provenance,
                TriState(tools),
                TriState(vision),
                window,
                capabilities,
                price=route_price(model, input_price, output_price),
            )
        )
    return entries


def _circuits(
    pool_ids: list[int],
) -> tuple[dict[int, dict[tuple[str, RouteClass], CircuitSnapshot]], dict[int, CircuitSnapshot]]:
    """The circuits of each assignment by (model, route class), and apart its assignment-wide one
    (credential_rejected), by assignment id."""
    circuits: dict[int, dict[tuple[str, RouteClass], CircuitSnapshot]] = {}
    wide: dict[int, CircuitSnapshot] = {}
    for row in Circuit.objects.filter(assignment__pool_id__in=pool_ids):
        if row.route_class == ASSIGNMENT_WIDE:
            wide[row.assignment_id] = circuit_snapshot(row)
            continue
        key = (row.model, RouteClass(row.route_class))
        circuits.setdefault(row.assignment_id, {})[key] = circuit_snapshot(row)
    return circuits, wide


def _demotions(pool_ids: list[int], now: datetime) -> dict[int, dict[str, panel.DemotionFacts]]:
    """The demotions still running at `now`, by assignment id and model."""
    demotions: dict[int, dict[str, panel.DemotionFacts]] = {}
    for assignment_id, model, reason, until in Demotion.objects.filter(
        assignment__pool_id__in=pool_ids, until__gt=now
    ).values_list("assignment_id", "model", "reason", "until"):
        demotions.setdefault(assignment_id, {})[model] = panel.DemotionFacts(CircuitReason(reason), until)
    return demotions


def _latencies(pool_ids: list[int]) -> dict[int, dict[str, panel.LatencyFacts]]:
    """The latency averages, by assignment id and model."""
    latencies: dict[int, dict[str, panel.LatencyFacts]] = {}
    for assignment_id, model, ewma_ms, samples in Latency.objects.filter(
        assignment__pool_id__in=pool_ids
    ).values_list("assignment_id", "model", "ewma_ms", "samples"):
        latencies.setdefault(assignment_id, {})[model] = panel.LatencyFacts(ewma_ms, samples)
    return latencies


def upstreams_panel_load(*, user, now: datetime) -> panel.Panel:
    """Everything /admin/upstreams/ shows `user`, in ten queries whatever the number of pools,
    assignments and models: settings, pools, assignments, capability evidence, catalog entries, circuits,
    live demotions, latency averages, and two aggregates of the ledger's window (attempts per assignment,
    for each one's share of its pool and whether it answered; usage per model). Reads only: a missing
    settings row is not created on a GET."""
    stored = GatewaySettings.objects.filter(pk=1).first()
    bsettings = breaker_settings(stored if stored is not None else GatewaySettings())
    pools = list(pools_visible_to(user).order_by("name").values_list("pk", "name"))
    pool_ids = [pk for pk, _ in pools]
    assignments = list(
        Assignment.objects.filter(pool_id__in=pool_ids)
        .only(*PANEL_ASSIGNMENT_FIELDS)
        .order_by("tier", "name")
    )
    entries = _model_facts(assignments, pool_ids=pool_ids, now=now)
    circuits, wide = _circuits(pool_ids)
    demotions = _demotions(pool_ids, now)
    latencies = _latencies(pool_ids)
    attempts = _attempts_by_assignment(pool_ids=pool_ids, now=now)
    shares = panel.shares(attempts, {a.pk: a.pool_id for a in assignments})

    by_pool: dict[int, list[panel.AssignmentRow]] = {pk: [] for pk in pool_ids}
    for a in assignments:
        by_pool[a.pool_id].append(
            panel.AssignmentRow(
                assignment_id=a.pk,
                name=a.name,
                adapter=a.adapter,
                tier=a.tier,
                region=a.region,
                router=a.router,
                enabled=a.enabled,
                quality=a.quality,
                capabilities=tuple(panel.Capability(label, getattr(a, f)) for f, label in PANEL_CAPABILITIES),
                models=panel.model_rows(
                    entries.get(a.pk, ()),
                    circuits.get(a.pk, {}),
                    demotions.get(a.pk, {}),
                    bsettings,
                    now,
                    wide=wide.get(a.pk),
                    latencies=latencies.get(a.pk),
                ),
                credential=panel.signal(None, wide.get(a.pk), bsettings, now) if a.pk in wide else None,
                attempts=attempts.get(a.pk, 0),
                share=shares[a.pk],
                headroom=panel.headroom(demotions.get(a.pk, {}).values(), answered=a.pk in attempts, now=now),
            )
        )
    usage = _usage(pool_ids=None if user.is_superuser else pool_ids, now=now)
    return panel.Panel(
        now=now,
        window=panel.USAGE_WINDOW,
        pools=tuple(panel.PoolRow(pk, name, tuple(by_pool[pk])) for pk, name in pools),
        usage=panel.leaderboard(usage),
    )


class UpstreamsPanel:
    """/admin/upstreams/ (SPEC §9): pools, their assignments, and per pool a read-only Routing panel
    plus the usage leaderboard. Read-only by construction: it answers GET and HEAD only, renders no
    form, and its selector writes nothing.

    `admin_view` only checks that the user is active staff (anonymous and non-staff users get the
    login page); the view itself requires the view permission on assignments (403 without it), and
    the selector shows a non-superuser only the pools granted to one of their groups."""

    name = "Upstreams"
    url_name = "upstreams"
    model = Assignment
    template_name = "admin/upstreams/index.html"

    def __init__(self, admin_site: admin.AdminSite) -> None:
        self.admin_site = admin_site

    def get_urls(self):
        return [path("upstreams/", self.admin_site.admin_view(self.view), name=self.url_name)]

    def has_permission(self, request) -> bool:
        assignments = self.admin_site._registry.get(Assignment)
        return assignments is not None and assignments.has_view_permission(request)

    def view(self, request):
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        if not self.has_permission(request):
            raise PermissionDenied
        panel = upstreams_panel_load(user=request.user, now=timezone.now())
        context = {
            **self.admin_site.each_context(request),
            "title": "Upstreams",
            "panel": panel,
        }
        return TemplateResponse(request, self.template_name, context)
