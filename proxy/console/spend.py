"""/admin/spend/ (issue 20 point 2): what each key and each model cost, per UTC day over the last 30
days, as charts people look at and tables people can read.

Spend is the ledger's attempts' `cost_micros` (what each dispatched attempt cost at its route's price,
configured or bundled; a failed attempt that reported usage included), by the day its request started.
An attempt whose price was unknown has no cost (NULL): it is counted apart as "unpriced", never as $0.
Beside the spend, each key and model shows its input tokens and the share of them read from the
providers' prompt caches (SPEC §7.3: cached reads are part of the input and priced at the cached rate),
from the same aggregate.

The figures are read from the ledger's daily totals (`proxy.ledger.models.DailySpend`, issue 49), which the
ledger writer adds each batch's attempts to in the batch's own transaction: the page reads 30 days x
keys x routes rows, not the attempts (22 s at ten million records when it aggregated them). So the page
shows the spend of records `prune_ledger` has since deleted, for as long as it shows their day.

Scoping is the request list's (the one admin scoping mechanism, `pools.scoping.PoolScopedAdmin`, as
`RequestRecordAdmin.scope` applies it): a pool operator sees the attempts on their pools' assignments
(a request that reached their pools, and of it their attempts only, as a request's page shows them),
nothing of another pool; a superuser sees every attempt. The same three queries whatever the number of
keys, models and days; reads only.
"""

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Sum
from django.http import HttpResponseNotAllowed
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone

from pools.models import Assignment, GatewayKey
from pools.selectors import pools_visible_to
from proxy.ledger.models import DailySpend, RequestRecord
from routing.policy.pricing import dollars

DAYS = 30


TOP_SERIES = 6  # the most expensive keys (models) get a colour each; the rest are one "other" series
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00")
OTHER_COLOUR = "#8c8c8c"
NO_KEY = "(no key)"

# Chart geometry (SVG user units; the SVG scales to its container's width). On a phone the chart is
# about 340 px wide, half its units, so its labels are drawn at PHONE_LABEL_UNITS (proxy/static/proxy/
# spend.css; 11 px labels there were drawn at about 6 px): the plot leaves them that much room whatever the
# width, the y axis as much as its longest amount needs (LABEL_EM: the width of a digit or `$` in ems).
CHART_WIDTH, CHART_HEIGHT = 640, 220
PHONE_LABEL_UNITS = 22
LABEL_EM = 0.62
PLOT_RIGHT, PLOT_TOP, PLOT_BOTTOM = 8, PHONE_LABEL_UNITS // 2 + 4, PHONE_LABEL_UNITS + 10


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    colour: str
    total_micros: int
    attempts: int
    unpriced: int  # attempts whose cost is unknown (no price): not counted as zero
    by_day: tuple[int, ...]  # micros per day, oldest first
    input_tokens: int = 0  # every input token its attempts reported, cached ones included
    cached_read_tokens: int = 0  # the part of them read from a prompt cache

    @property
    def total_text(self) -> str:
        return dollars(self.total_micros)

    @property
    def cached_text(self) -> str:
        """`1,200 of 4,000 input tokens (30%)`: its prompt caches' share of its input."""
        if not self.input_tokens:
            return "no input reported"
        share = 100 * self.cached_read_tokens // self.input_tokens
        return f"{self.cached_read_tokens:,} of {self.input_tokens:,} input tokens ({share}%)"


@dataclass(frozen=True, slots=True)
class Rect:
    x: float
    y: float
    width: float
    height: float
    colour: str
    label: str  # <title> of the rectangle: day, series and amount


@dataclass(frozen=True, slots=True)
class Tick:
    y: float
    label: str


@dataclass(frozen=True, slots=True)
class Chart:
    rects: tuple[Rect, ...]
    ticks: tuple[Tick, ...]
    day_labels: tuple[tuple[float, str], ...]  # (x, "MM-DD") every few days
    plot_left: int
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT
    plot_bottom_y: int = CHART_HEIGHT - PLOT_BOTTOM
    plot_right_x: int = CHART_WIDTH - PLOT_RIGHT


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Spend by one dimension (key or model): its series, the daily totals, and the chart."""

    title: str
    series: tuple[Series, ...]  # the top ones, then "other" when there are more
    all_rows: tuple[Series, ...]  # every key (model) for the table, most expensive first
    chart: Chart
    summary: str  # the chart's text alternative


@dataclass(frozen=True, slots=True)
class SpendReport:
    days: tuple[date, ...]
    daily_totals: tuple[int, ...]
    total_micros: int
    unpriced: int
    by_key: Breakdown
    by_model: Breakdown

    @property
    def total_text(self) -> str:
        return dollars(self.total_micros)

    @property
    def breakdowns(self) -> tuple[Breakdown, Breakdown]:
        return (self.by_key, self.by_model)

    @property
    def daily_rows(self) -> list[tuple[date, str]]:
        return [(d, dollars(m)) for d, m in zip(self.days, self.daily_totals, strict=True)]


def _series(cells: dict[str, dict[date, list[int]]], days: tuple[date, ...]) -> list[Series]:
    """Every name's daily micros, most expensive first (then by name)."""
    out = []
    for name, per_day in cells.items():
        by_day = tuple(per_day[d][0] if d in per_day else 0 for d in days)
        attempts, unpriced, tokens, cached = (sum(v[i] for v in per_day.values()) for i in range(1, 5))
        out.append(Series(name, "", sum(by_day), attempts, unpriced, by_day, tokens, cached))
    out.sort(key=lambda s: (-s.total_micros, s.name))
    return [
        Series(s.name, PALETTE[i] if i < TOP_SERIES else OTHER_COLOUR, *_rest(s)) for i, s in enumerate(out)
    ]


def _rest(s: Series) -> tuple:
    return (s.total_micros, s.attempts, s.unpriced, s.by_day, s.input_tokens, s.cached_read_tokens)


def _top(rows: list[Series], days: tuple[date, ...]) -> list[Series]:
    top = list(rows[:TOP_SERIES])
    rest = rows[TOP_SERIES:]
    if rest:
        by_day = tuple(sum(s.by_day[i] for s in rest) for i in range(len(days)))
        top.append(
            Series(
                f"{len(rest)} others",
                OTHER_COLOUR,
                sum(by_day),
                sum(s.attempts for s in rest),
                sum(s.unpriced for s in rest),
                by_day,
                sum(s.input_tokens for s in rest),
                sum(s.cached_read_tokens for s in rest),
            )
        )
    return top


def _nice_max(value: int) -> int:
    """The axis maximum: four gridline steps of 1, 2, 2.5 or 5 times a power of ten (in micros), at
    least `value` (4 when nothing was spent), so every gridline reads as a round amount."""
    need = max(-(-value // 4), 1)
    magnitude = 1
    while magnitude * 10 < need:
        magnitude *= 10
    steps = [magnitude, 2 * magnitude, 5 * magnitude, 10 * magnitude]
    if magnitude >= 10:
        steps.insert(2, magnitude * 5 // 2)
    return 4 * next(step for step in steps if step >= need)


def chart(series: list[Series], days: tuple[date, ...]) -> Chart:
    """Stacked bars, one per day, each series a colour; y in dollars from 0; every fifth day labelled."""
    totals = [sum(s.by_day[i] for s in series) for i in range(len(days))]
    top = _nice_max(max(totals, default=0))
    amounts = [dollars(top * quarter // 4) for quarter in (0, 1, 2, 3, 4)]
    plot_left = math.ceil(max(len(a) for a in amounts) * LABEL_EM * PHONE_LABEL_UNITS) + 10
    plot_w = CHART_WIDTH - plot_left - PLOT_RIGHT
    plot_h = CHART_HEIGHT - PLOT_TOP - PLOT_BOTTOM
    slot = plot_w / max(len(days), 1)
    bar_w = slot * 0.75
    rects = []
    for i, day in enumerate(days):
        x = plot_left + i * slot + (slot - bar_w) / 2
        y = CHART_HEIGHT - PLOT_BOTTOM
        for s in series:
            micros = s.by_day[i]
            if micros <= 0:
                continue
            h = plot_h * micros / top
            y -= h
            rects.append(
                Rect(
                    round(x, 2),
                    round(y, 2),
                    round(bar_w, 2),
                    round(h, 2),
                    s.colour,
                    f"{day.isoformat()}: {s.name} {dollars(micros)}",
                )
            )
    ticks = tuple(
        Tick(round(CHART_HEIGHT - PLOT_BOTTOM - plot_h * quarter / 4, 2), amount)
        for quarter, amount in enumerate(amounts)
    )
    labels = tuple(
        (round(plot_left + i * slot + slot / 2, 2), d.strftime("%m-%d"))
        for i, d in enumerate(days)
        if i % 5 == 2  # none at either edge, where half of it would be outside the chart
    )
    return Chart(tuple(rects), ticks, labels, plot_left=plot_left)


def _summary(what: str, series: list[Series], total: int) -> str:
    if total == 0:
        return f"No known spend by {what} in the last {DAYS} days."
    parts = ", ".join(f"{s.name} {s.total_text}" for s in series)
    return f"Spend per day by {what} over the last {DAYS} days, {dollars(total)} in all: {parts}."


def spend_report(*, now: datetime, pools=None) -> SpendReport:
    """The last DAYS UTC days (today included) of the ledger's daily totals (`DailySpend`, never the
    attempts): two aggregates over them, per day and key and per day and model (days x (keys + models)
    rows for Python, where one per day, key and model would be days x keys x models), and the keys'
    names; with `pools` (a queryset of Pool), only their assignments'
    attempts: a pool operator sees a request that crossed into another pool, never what that pool's
    attempts cost. Those are exactly the attempts of the request list's scope that its pages show an
    operator (`RequestRecordAdmin.scope`: a request is theirs when it reached their pools)."""
    today = now.astimezone(UTC).date()
    days = tuple(today - timedelta(days=DAYS - 1 - i) for i in range(DAYS))
    # A day after today (a request started in the future of `now`: clock skew between nodes) is left out.
    totals = DailySpend.objects.filter(day__gte=days[0], day__lte=today)
    if pools is not None:
        totals = totals.filter(assignment_id__in=Assignment.objects.filter(pool__in=pools).values("pk"))
    sums = {
        "cost": Sum("cost_micros"),
        "attempts": Sum("attempts"),
        "unpriced": Sum("unpriced"),
        "tokens": Sum("input_tokens"),
        "cached": Sum("cached_read_tokens"),
    }
    per_key = list(totals.values("day", "key_id").annotate(**sums).order_by())
    per_model = list(totals.values("day", "model").annotate(**sums).order_by())
    ids = {row["key_id"] for row in per_key}
    # A key deleted since (or none, id 0) has no name: "(no key)", as the request list shows it.
    names = dict(GatewayKey.objects.filter(pk__in=ids).values_list("pk", "name")) if ids else {}
    by_key: dict[str, dict[date, list[int]]] = defaultdict(dict)
    by_model: dict[str, dict[date, list[int]]] = defaultdict(dict)
    for cells, rows, name in (
        (by_key, per_key, lambda row: names.get(row["key_id"], NO_KEY)),
        (by_model, per_model, lambda row: row["model"]),
    ):
        for row in rows:
            cell = cells[name(row)].setdefault(row["day"], [0] * len(sums))
            for i, field in enumerate(sums):
                cell[i] += int(row[field])
    daily = dict.fromkeys(days, 0)
    unpriced = 0
    for row in per_model:  # every attempt is in one model's row (and in one key's)
        daily[row["day"]] += int(row["cost"])
        unpriced += int(row["unpriced"])
    total = sum(daily.values())
    breakdowns = []
    for what, cells in (("key", by_key), ("model", by_model)):
        rows_all = _series(cells, days)
        top = _top(rows_all, days)
        breakdowns.append(
            Breakdown(
                title=f"By {what}",
                series=tuple(top),
                all_rows=tuple(rows_all),
                chart=chart(top, days),
                summary=_summary(what, top, total),
            )
        )
    return SpendReport(
        days=days,
        daily_totals=tuple(daily[d] for d in days),
        total_micros=total,
        unpriced=unpriced,
        by_key=breakdowns[0],
        by_model=breakdowns[1],
    )


class SpendPage:
    """/admin/spend/: read-only (GET and HEAD only, no form). Needs active staff (`admin_view`) with the
    view permission on request records (403 without it); shows only what that user's request list
    shows."""

    name = "Spend"
    url_name = "spend"
    model = RequestRecord
    template_name = "admin/spend/index.html"

    def __init__(self, admin_site: admin.AdminSite) -> None:
        self.admin_site = admin_site

    def get_urls(self):
        return [path("spend/", self.admin_site.admin_view(self.view), name=self.url_name)]

    def records_admin(self):
        return self.admin_site._registry.get(RequestRecord)

    def has_permission(self, request) -> bool:
        records = self.records_admin()
        return records is not None and records.has_view_permission(request)

    def view(self, request):
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        if not self.has_permission(request):
            raise PermissionDenied
        user = request.user
        report = spend_report(now=timezone.now(), pools=None if user.is_superuser else pools_visible_to(user))
        context = {**self.admin_site.each_context(request), "title": "Spend", "report": report}
        return TemplateResponse(request, self.template_name, context)
