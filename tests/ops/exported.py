"""What `/metrics` can expose, read from the code's own registry (proxy.ledger.metrics), for the tests that
hold
the dashboard, the alert rules and docs/metrics.md to it: every family with its type and label names,
and every sample name a scrape can carry with the labels it has."""

import re
from dataclasses import dataclass

from prometheus_client.metrics import MetricWrapperBase

from proxy.ledger import metrics

# Labels Prometheus adds to every scraped series.
TARGET_LABELS = frozenset({"job", "instance"})
# The labels whose values are a fixed vocabulary (the others are names from the configuration).
VOCABULARIES: dict[str, frozenset[str]] = {
    "route": metrics.ROUTES,
    "transport": metrics.TRANSPORTS,
    "outcome": metrics.OUTCOMES,
    "status_class": metrics.STATUS_CLASSES | {metrics.NONE},
    "route_class": metrics.ROUTE_CLASSES | {metrics.WIDE_LABEL},
    "status": metrics.ATTEMPT_STATUSES,
    "failure_class": metrics.FAILURE_CLASSES | {metrics.NONE},
    "reason": metrics.CIRCUIT_REASONS | metrics.FALLBACK_REASONS | {"model_not_found", metrics.NONE},
    "direction": frozenset({"input", "output"}),
    "limit": metrics.KEY_LIMITS,
    "period": metrics.BUDGET_PERIODS,
}


def vocabulary_problems(values: dict[str, set[str]]) -> list[str]:
    """Each value of a vocabulary label that the gateway never exports (`other` aside)."""
    return [
        f"{label} is never {value!r}"
        for label, given in sorted(values.items())
        for value in sorted(given)
        if label in VOCABULARIES and value not in VOCABULARIES[label] | {metrics.OTHER}
    ]


@dataclass(frozen=True)
class Family:
    name: str  # as documented and queried: a counter's with `_total`
    type: str
    labels: tuple[str, ...]


def families() -> list[Family]:
    """Every metric family of the registry. The counters and histograms are proxy.ledger.metrics' module-level
    objects; the database gauges are DatabaseCollector's `describe()` (no database read)."""
    found = []
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            suffix = "_total" if value._type == "counter" else ""
            found.append(Family(value._name + suffix, value._type, tuple(value._labelnames)))
    for family in metrics.DatabaseCollector().describe():
        found.append(Family(family.name, family.type, tuple(family._labelnames)))
    return found


def samples() -> dict[str, frozenset[str]]:
    """Every sample name a scrape can carry -> its label names (without the target's)."""
    out: dict[str, frozenset[str]] = {}
    for family in families():
        labels = frozenset(family.labels)
        if family.type == "histogram":
            out[f"{family.name}_bucket"] = labels | {"le"}
            out[f"{family.name}_sum"] = out[f"{family.name}_count"] = labels
        else:
            out[family.name] = labels
    return out


def problems(expr: str, legend_labels: frozenset[str] = frozenset()) -> list[str]:
    """What in `expr` the gateway does not export: a metric name, a label a selector matches on, a label
    it groups or joins by, an unknown function; and a label the legend (or an alert's template) shows
    that none of its metrics has. Empty when every name is the code's."""
    from tests.ops.promql import names

    exported = samples()
    found = names(expr)
    wrong = [f"unknown function {f}" for f in sorted(found.unknown)]
    if not found.metrics:
        wrong.append("names no metric")
    available = set(TARGET_LABELS)
    for metric, labels in sorted(found.metrics.items()):
        if metric not in exported:
            wrong.append(f"metric {metric} is not exported")
            continue
        available |= exported[metric]
        unknown = labels - exported[metric] - TARGET_LABELS
        wrong += [f"{metric} has no label {label}" for label in sorted(unknown)]
    wrong += [f"no metric of it has the label {label}" for label in sorted(found.grouping - available)]
    wrong += [f"shows the label {label}, not its metrics'" for label in sorted(legend_labels - available)]
    return wrong + vocabulary_problems(found.values)


# Read from the shared database: every node reports the same value, so a sum over nodes multiplies it.
DATABASE_GAUGES = frozenset(family.name for family in metrics.DatabaseCollector().describe())
SUMMED = re.compile(r"\bsum\s*(?:(?:by|without)\s*\([^)]*\)\s*)?\(\s*(\w+)")


def summed_database_gauges(expr: str) -> list[str]:
    """The database gauges `expr` sums directly (they must be aggregated with max)."""
    return [metric for metric in SUMMED.findall(expr) if metric in DATABASE_GAUGES]
