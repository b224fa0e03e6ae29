"""How the ledger reads in admin (issue 20 point 6): the request list's columns and filters, and a
request's attempts as a timeline an operator reads at a glance.

The request list shows key, pool, model, outcome, attempts, latency, tokens and cost. A request's pool
is not a ledger column: it is the pool of the assignments its attempts went to (a key may reach several
pools, and a request that never reached a candidate has none). Reading it from the attempts keeps the hot
path's writes as they are (no new column for the ledger to fill, no migration of existing rows) and
says the truth for a request that crossed pools; the list pays one extra query per page (the page's
attempts, prefetched), whatever the number of rows.

Every choice a filter offers comes from the user's scoped queryset or from the pools granted to
them (`pools.selectors.pools_visible_to`), so no filter names another pool's key, pool or model.

The list stays as fast at ten million records as at ten (issue 49, `make bench-scale`): no query of the
page reads more than a page of the ledger. Its filters offer the known keys, models, outcomes and routes
(the configuration's and the vocabularies'), not a SELECT DISTINCT over the table, its dates are a filter
of fixed ranges rather than a date hierarchy (whose year and month lists are DISTINCT over the table),
and its paginator counts at most COUNT_CAP + 1 rows (`LedgerPaginator`).
"""

from dataclasses import dataclass
from datetime import timedelta

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db.models import Count, DurationField, ExpressionWrapper, F, Prefetch, Q
from django.utils.functional import cached_property

from catalog.models import CatalogEntry
from pools.selectors import keys_visible_to, pools_visible_to
from proxy.ledger.models import Attempt, AttemptStatus, DispatchState, cost_is_unknown
from routing.policy.errors import ErrorCode
from routing.policy.pricing import dollars
from routing.policy.vocabulary import ClientRoute, FailureClass, Outcome

STATUS_WORDS = {
    AttemptStatus.SUCCEEDED: "Succeeded",
    AttemptStatus.RETRYABLE_FAILED: "Failed, handed on to the next candidate",
    AttemptStatus.FAILED: "Failed",
    AttemptStatus.CANCELLED: "Cancelled",
    AttemptStatus.INELIGIBLE: "Not eligible, not sent",
}
DISPATCH_WORDS = {
    DispatchState.NOT_SENT: "not sent",
    DispatchState.REJECTED: "sent, refused before any work",
    DispatchState.UNKNOWN: "sent, outcome unknown (the upstream may have done the work)",
    DispatchState.COMPLETED: "sent, answer received",
}


ROUTE_CLASS_WORDS = {"http": "HTTP", "sse": "SSE stream", "websocket": "websocket"}


def words(code: str) -> str:
    """`upstream_model_unavailable` -> `upstream model unavailable`."""
    return code.replace("_", " ")


def latency(record) -> timedelta | None:
    if record.finished_at is None:
        return None
    return record.finished_at - record.started_at


def duration_text(value: timedelta | int | None) -> str:
    """A duration as people read it: `340 ms`, `1.2 s`, `2 min 5 s`; `unfinished` for None."""
    if value is None:
        return "unfinished"
    ms = value if isinstance(value, int) else round(value.total_seconds() * 1000)
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    minutes, seconds = divmod(round(ms / 1000), 60)
    return f"{minutes} min {seconds} s"


def dispatched(record) -> list[Attempt]:
    """The attempts that were sent (or tried to be): ineligible candidates never left the gateway."""
    return [a for a in record.attempts.all() if a.status != AttemptStatus.INELIGIBLE]


def pool_names(record) -> list[str]:
    names = {a.assignment.pool.name for a in record.attempts.all() if a.assignment is not None}
    return sorted(names)


def tokens_total(record) -> str:
    """`123,456 in, 7,890 out` over the record's attempts (those the user may see), or `-` when none
    reported usage."""
    attempts = [a for a in dispatched(record) if a.input_tokens is not None or a.output_tokens is not None]
    if not attempts:
        return "-"
    into = sum(a.input_tokens or 0 for a in attempts)
    out = sum(a.output_tokens or 0 for a in attempts)
    return f"{into:,} in, {out:,} out"


def cost_total(record) -> str:
    """What the record's attempts (those the user may see) cost: `$0.0123`; `unknown` when an attempt
    that was charged has no price (`proxy.ledger.models.cost_is_unknown`), `$0.0123 + unknown` beside known
    costs;
    `-` when nothing was charged."""
    attempts = dispatched(record)
    known = [a.cost_micros for a in attempts if a.cost_micros is not None]
    unknown = any(cost_is_unknown(a) for a in attempts)
    if unknown:
        return f"{dollars(sum(known))} + unknown" if known else "unknown"
    return dollars(sum(known)) if known else "-"


class LedgerChangeList(ChangeList):
    """The request list's rows come with their attempts (assignment and pool), one query per page."""

    def get_queryset(self, request, exclude_parameters=None):
        queryset = super().get_queryset(request, exclude_parameters)
        attempts = Attempt.objects.select_related("assignment__pool").only(
            "request_id",
            "status",
            "input_tokens",
            "output_tokens",
            "cost_micros",
            "assignment__name",
            "assignment__pool__name",
        )
        if not request.user.is_superuser:  # as the request page's inline: only the user's pools
            attempts = attempts.filter(assignment__pool__in=pools_visible_to(request.user))
        return queryset.select_related("key").prefetch_related(Prefetch("attempts", queryset=attempts))


class LedgerPaginator(Paginator):
    """Counts at most COUNT_CAP + 1 of the list's rows (`SELECT count(*) FROM (... LIMIT n)`), never the
    whole ledger: a count of ten million records took longer than the rest of the page. The list says
    "more than COUNT_CAP" beyond it (templates/admin/proxy/requestrecord/pagination.html); its filters
    narrow it down."""

    COUNT_CAP = 10_000

    @cached_property
    def count(self) -> int:
        return self.object_list[: self.COUNT_CAP + 1].count()

    @property
    def capped(self) -> bool:
        return self.count > self.COUNT_CAP


class ValueFilter(admin.SimpleListFilter):
    """A column's filter whose choices are known without reading the ledger; any value of the column
    still filters by its parameter (a requested model nobody configured, an upstream's own code)."""

    def has_output(self) -> bool:
        return True  # Django applies only the filters it shows: the chosen value filters, known or not

    def queryset(self, request, queryset):
        value = self.value()
        return queryset if value is None else queryset.filter(**{self.parameter_name: value})


def _pool_models(request) -> list[tuple[str, str]]:
    pools = pools_visible_to(request.user)
    models = CatalogEntry.objects.filter(assignment__pool__in=pools).values_list("model", flat=True)
    return [(m, m) for m in sorted(set(models))]


class ServedModelFilter(ValueFilter):
    title = "served model"
    parameter_name = "served_model"

    def lookups(self, request, model_admin):
        return _pool_models(request)


class RequestedModelFilter(ServedModelFilter):
    title = "requested model"
    parameter_name = "requested_model"


class OutcomeFilter(ValueFilter):
    """The relay's outcomes, the gateway's typed errors and the failure classes an upstream's final
    failure is recorded by."""

    title = "outcome"
    parameter_name = "outcome"

    def lookups(self, request, model_admin):
        codes = {*Outcome, *ErrorCode, *FailureClass}
        return [(str(code), str(code)) for code in sorted(codes, key=lambda c: (c != Outcome.OK, str(c)))]


class RouteFilter(ValueFilter):
    title = "route"
    parameter_name = "route"

    def lookups(self, request, model_admin):
        return [(str(route), str(route)) for route in ClientRoute]


class KeyFilter(admin.SimpleListFilter):
    """The keys the user may see (`keys_visible_to`), as the request list scopes its records."""

    title = "key"
    parameter_name = "key__id__exact"

    def lookups(self, request, model_admin):
        return [(str(pk), name) for pk, name in keys_visible_to(request.user).values_list("pk", "name")]

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(key_id=int(value)) if value.isdigit() else queryset.none()


class PoolFilter(admin.SimpleListFilter):
    """Requests with an attempt on an assignment of the pool (choices: the pools granted to the user)."""

    title = "pool"
    parameter_name = "pool"

    def lookups(self, request, model_admin):
        pools = pools_visible_to(request.user).order_by("name").values_list("pk", "name")
        return [(str(pk), name) for pk, name in pools]

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        if not value.isdigit() or not pools_visible_to(request.user).filter(pk=int(value)).exists():
            return queryset.none()
        pool_requests = Attempt.objects.filter(assignment__pool_id=int(value)).values("request_id")
        return queryset.filter(pk__in=pool_requests)


class AttemptsFilter(admin.SimpleListFilter):
    """By the number of attempts sent: none (no candidate was eligible), one, or a handoff."""

    title = "attempts sent"
    parameter_name = "attempts"
    BUCKETS = {"0": Q(n_sent=0), "1": Q(n_sent=1), "2": Q(n_sent=2), "3+": Q(n_sent__gte=3)}

    def lookups(self, request, model_admin):
        return [("0", "none"), ("1", "one"), ("2", "two"), ("3+", "three or more")]

    def queryset(self, request, queryset):
        condition = self.BUCKETS.get(self.value() or "")
        if condition is None:
            return queryset
        sent = Count("attempts", filter=~Q(attempts__status=AttemptStatus.INELIGIBLE))
        matching = queryset.model.objects.annotate(n_sent=sent).filter(condition).values("pk")
        return queryset.filter(pk__in=matching)


class LatencyFilter(admin.SimpleListFilter):
    """By the request's wall-clock time, first byte in to last byte out."""

    title = "latency"
    parameter_name = "latency"
    SECOND = timedelta(seconds=1)
    BUCKETS = {
        "lt1s": Q(took__lt=SECOND),
        "1-10s": Q(took__gte=SECOND, took__lt=10 * SECOND),
        "10-60s": Q(took__gte=10 * SECOND, took__lt=60 * SECOND),
        "ge60s": Q(took__gte=60 * SECOND),
    }

    def lookups(self, request, model_admin):
        return [
            ("lt1s", "under 1 s"),
            ("1-10s", "1 to 10 s"),
            ("10-60s", "10 to 60 s"),
            ("ge60s", "1 min or more"),
            ("unfinished", "unfinished"),
        ]

    def queryset(self, request, queryset):
        value = self.value()
        if value == "unfinished":
            return queryset.filter(finished_at__isnull=True)
        condition = self.BUCKETS.get(value or "")
        if condition is None:
            return queryset
        took = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
        return queryset.alias(took=took).filter(condition)


# -- a request's attempts as a timeline -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TimelineBar:
    ordinal: int
    assignment: str
    model: str
    route_class: str
    status: str  # the ledger's status, for the colour (a class name, never shown as text)
    status_text: str
    cause_text: str  # failure class or ineligible reason in words, or ""
    dispatch_text: str
    upstream_text: str
    elapsed_ms: int
    elapsed_text: str
    offset_pct: float  # where the bar starts on the request's time axis
    width_pct: float
    tokens_text: str
    cost_micros: int | None

    @property
    def cost_text(self) -> str:
        return "unknown" if self.cost_micros is None else dollars(self.cost_micros)


def tokens_text(a) -> str:
    """`130 in (100 cached read, 20 cached write), 5 out`: the cached parts where the provider
    reported them (they are part of the input, SPEC §7.3)."""
    if a.input_tokens is None and a.output_tokens is None:
        return "usage not reported"
    cached = [
        f"{count} cached {what}"
        for count, what in ((a.cached_read_tokens, "read"), (a.cached_write_tokens, "write"))
        if count is not None
    ]
    tokens = f"{a.input_tokens if a.input_tokens is not None else '?'} in"
    tokens += f" ({', '.join(cached)}), " if cached else ", "
    return tokens + f"{a.output_tokens if a.output_tokens is not None else '?'} out"


def timeline(attempts) -> list[TimelineBar]:
    """One bar per attempt, in order, laid end to end on one axis: each starts where the previous
    ended and is as wide as its elapsed time, relative to the sum (backoff between hops is not
    recorded, so the axis is the attempts' own time). An ineligible candidate took no time: it
    gets a sliver so it is still seen."""
    attempts = sorted(attempts, key=lambda a: a.ordinal)
    total = sum(a.elapsed_ms for a in attempts) or 1
    bars: list[TimelineBar] = []
    start = 0
    for a in attempts:
        if a.status == AttemptStatus.INELIGIBLE:
            cause = f"not eligible: {words(a.ineligible_reason)}" if a.ineligible_reason else ""
        else:
            cause = words(a.failure_class) if a.failure_class else ""
        tokens = tokens_text(a)
        bars.append(
            TimelineBar(
                ordinal=a.ordinal,
                assignment=a.assignment.name if a.assignment is not None else "(deleted assignment)",
                model=a.model,
                route_class=ROUTE_CLASS_WORDS.get(a.route_class, a.route_class),
                status=a.status,
                status_text=STATUS_WORDS.get(a.status, words(a.status)),
                cause_text=cause,
                dispatch_text=DISPATCH_WORDS.get(a.dispatch_state, words(a.dispatch_state)),
                upstream_text=f"upstream answered HTTP {a.upstream_status}"
                if a.upstream_status is not None
                else "no upstream status",
                elapsed_ms=a.elapsed_ms,
                elapsed_text=duration_text(a.elapsed_ms),
                offset_pct=min(round(100 * start / total, 2), 100.0),
                width_pct=min(round(100 * a.elapsed_ms / total, 2), round(100 - 100 * start / total, 2)),
                tokens_text=tokens,
                cost_micros=a.cost_micros,
            )
        )
        start += a.elapsed_ms
    return bars
