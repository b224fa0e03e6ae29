"""Prometheus metrics (SPEC §10): `GET /metrics` in the text exposition format. Every metric, its labels
and its cardinality: docs/metrics.md (tests/ops/test_metrics_docs.py keeps the two in step).

Contract:
- One dedicated `REGISTRY`, never the client library's global default: only the gateway's own series
  are exposed, and tests read exact values from it.
- `observe_exchange` is called once per finished client request (from the ledger write). It only
  increments in-process counters and histograms: no I/O, no database. It takes each labelled child
  through `_child`, a per-process cache by metric and label values: prometheus-client's `.labels()`
  checks the names and converts every value on each call (a few microseconds each, eight or more per
  request), and hands back the same child for the same values anyway (multiprocess mode included:
  the child's value finds its process's file itself, also after a fork).
- What the database holds for every node alike is read at scrape time by `DatabaseCollector`, never
  maintained per request: the circuits not closed (`gateway_open_circuits`, by pool, assignment, model,
  route class and reason) and each budgeted key's budget and what is left of it. Two statements per
  scrape, however many circuits or keys; none on a request's path.
- Every label value comes from a bounded set: a fixed vocabulary (routes, transports, route classes,
  statuses, failure classes, reasons, outcomes, limits), or a name from the operators' configuration:
  a pool, an assignment, a model of the catalog (an attempt's model is its candidate's, which the
  router took from the catalog) and a gateway key's name (the key the request authenticated with,
  never its secret). A value outside its set is folded into `other` (or, for an outcome, into the
  final attempt's failure class), because the outcome of an upstream final failure is the provider's
  own error code and a provider can send any string. Nothing is ever labelled by the requested model
  (a client can send any string), a key's secret, a prompt or a provider message.

- Several worker processes (`python -m gatewaysite.server --workers N`, or any server started with
  `PROMETHEUS_MULTIPROC_DIR` set): each worker's counters live in files in that directory and a
  scrape, whichever worker answers it, sums every worker's files (prometheus-client's multiprocess
  mode), so counts never alternate between workers.

/metrics has no authentication, as is usual for Prometheus targets: operators should keep it on a
private network (or block `/metrics` at the ingress). It exposes counts and configured names only,
never content.
"""

import functools
import logging
import os
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime

from django.db import DatabaseError
from django.db.models import Count
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from pools.models import GatewayKey
from pools.selectors import budget_left
from proxy.ledger.exchange import Exchange
from routing.models import Circuit
from routing.policy.budget import MICROS
from routing.policy.errors import ErrorCode
from routing.policy.failures import FailureClass
from routing.policy.sanitize import CANONICAL
from routing.policy.types import ASSIGNMENT_WIDE
from routing.policy.vocabulary import (
    AttemptStatus,
    BudgetPeriod,
    CircuitReason,
    CircuitState,
    ClientRoute,
    Outcome,
    RouteClass,
)

log = logging.getLogger("gateway")

OTHER = "other"
WIDE_LABEL = "assignment"  # the route_class label of an assignment-wide circuit
NONE = "none"
LIFETIME = "lifetime"  # the period label of a budget that never resets

ROUTES = frozenset(ClientRoute)
TRANSPORTS = frozenset(RouteClass)
ROUTE_CLASSES = frozenset(RouteClass)
FAILURE_CLASSES = frozenset(FailureClass)
CIRCUIT_REASONS = frozenset(CircuitReason)
ATTEMPT_STATUSES = frozenset(AttemptStatus)
STATUS_CLASSES = frozenset({"1xx", "2xx", "3xx", "4xx", "5xx"})
# The key's own limits that refuse a request (proxy.limits; `budget`: SPEC §7.4).
KEY_LIMITS = frozenset({"rpm", "tpm", "concurrent", "budget"})
BUDGET_PERIODS = frozenset({*BudgetPeriod, LIFETIME})
# The gateway's own outcome codes: the relay's outcomes plus its typed errors (routing.policy.errors).
OUTCOMES = frozenset(
    {
        *Outcome,
        *ErrorCode,
        # An upstream final failure is recorded under its sanitized code, or its failure class when it
        # had none (proxy.relay); the common canonical codes keep that name here, the rest is `other`.
        *FailureClass,
        *(code for _, code, _ in CANONICAL.values()),
        "invalid_api_key",
        "server_error",
        ErrorCode.PREVIOUS_RESPONSE_NOT_FOUND,
    }
)
# Pool, assignment, model and key names come from the operators' configuration and catalog, so they are
# bounded by it; a name longer than this (never configured) is folded into `other` all the same.
NAME_LIMIT = 200

# LLM calls span a cached 5 ms answer to a two-minute reasoning stream.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120)

REGISTRY = CollectorRegistry()

REQUESTS = Counter(
    "gateway_requests",
    "Finished client requests by route, transport, outcome and the class of the HTTP status answered.",
    ["route", "transport", "outcome", "status_class"],
    registry=REGISTRY,
)
ATTEMPTS = Counter(
    "gateway_attempts",
    "Candidates considered per request (ineligible ones included) by route class, status and failure class.",
    ["route_class", "status", "failure_class"],
    registry=REGISTRY,
)
HANDOFFS = Counter(
    "gateway_handoffs",
    "Failed attempts handed on to the next candidate, by failure class.",
    ["failure_class"],
    registry=REGISTRY,
)
FALLBACKS = Counter(
    "gateway_fallbacks",
    "Requests served by another model than the one resolved, by reason.",
    ["reason"],
    registry=REGISTRY,
)
FALLBACKS.labels(reason=ErrorCode.MODEL_NOT_FOUND)
UPSTREAM_LATENCY = Histogram(
    "gateway_upstream_latency_seconds",
    "Time of each dispatched attempt, from send to the end of the response (a whole stream), by pool, "
    "assignment, model and route class.",
    ["pool", "assignment", "model", "route_class"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
REQUEST_DURATION = Histogram(
    "gateway_request_duration_seconds",
    "Time of each client request, from arrival to the ledger write.",
    ["route", "transport"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)


UPSTREAM_ATTEMPTS = Counter(
    "gateway_upstream_attempts",
    "Dispatched attempts by pool, assignment, served model and status.",
    ["pool", "assignment", "model", "status"],
    registry=REGISTRY,
)
TOKENS = Counter(
    "gateway_tokens",
    "Tokens the upstreams reported, by pool, assignment, model and direction (input, output).",
    ["pool", "assignment", "model", "direction"],
    registry=REGISTRY,
)
COST = Counter(
    "gateway_cost_micros",
    "Known cost of the attempts in micro-units of the price table's currency (unknown prices add nothing).",
    ["pool", "assignment", "model"],
    registry=REGISTRY,
)
TIME_TO_FIRST_TOKEN = Histogram(
    "gateway_time_to_first_token_seconds",
    "Streams: time from the request's arrival to the first visible output released to the client.",
    ["route", "transport"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
UPSTREAM_TIME_TO_FIRST_TOKEN = Histogram(
    "gateway_upstream_time_to_first_token_seconds",
    "Streams: time from the serving attempt's dispatch to the first visible output released to the "
    "client, by pool, assignment and model.",
    ["pool", "assignment", "model"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
KEY_THROTTLED = Counter(
    "gateway_key_throttled",
    "Requests refused by their key's own limit (rpm, tpm, concurrent) or budget, by key name and limit.",
    ["key", "limit"],
    registry=REGISTRY,
)


def _bounded(value: str, allowed: frozenset[str]) -> str:
    return value if value in allowed else OTHER


def _failure_class(value: str) -> str:
    return _bounded(value, FAILURE_CLASSES) if value else NONE


def _outcome(exchange: Exchange) -> str:
    """The ledger's own outcome code whenever it is in the bounded set (so /metrics and the ledger
    name an upstream's 429 `rate_limit_exceeded` alike); a code outside it (a provider can send any
    string) is counted under the final attempt's failure class."""
    if exchange.outcome in OUTCOMES:
        return exchange.outcome
    for attempt in reversed(exchange.attempts):
        if attempt.failure_class in FAILURE_CLASSES:
            return attempt.failure_class
    return OTHER


def _status_class(status: int | None) -> str:
    """`2xx`, `4xx`, `5xx`...: what an alert on the share of server errors needs, in five values."""
    return _bounded(f"{status // 100}xx", STATUS_CLASSES) if status is not None else NONE


def _name(value: str) -> str:
    return value if value and len(value) <= NAME_LIMIT else OTHER


def _throttled_by(exchange: Exchange) -> str | None:
    """The key's own limit that refused the request (`budget` for its budget), else None. An upstream's
    relayed 429 is also `rate_limit_exceeded`, but names no limit of the key: not counted here."""
    if exchange.outcome == ErrorCode.BUDGET_EXCEEDED:
        return "budget"
    if exchange.outcome == ErrorCode.RATE_LIMIT_EXCEEDED and exchange.limit:
        return _bounded(exchange.limit, KEY_LIMITS)
    return None


# Substitutions before routing (SPEC §5.1): an unrouted model served by its explicit or family fallback.
FALLBACK_REASONS = frozenset({"explicit", "family"})


# Every label value is bounded (above), so this holds every child the process uses; the bound only
# keeps a misconfiguration from growing it without end.
@functools.lru_cache(maxsize=4096)
def _child(metric: MetricWrapperBase, *values: str) -> MetricWrapperBase:
    """`metric.labels(*values)` (the values in the order of its label names), once per process."""
    return metric.labels(*values)


def observe_exchange(exchange: Exchange) -> None:
    route = _bounded(exchange.route, ROUTES)
    transport = _bounded(exchange.transport, TRANSPORTS)
    _child(REQUESTS, route, transport, _outcome(exchange), _status_class(exchange.status_code)).inc()
    if exchange.finished_at is not None:
        duration = (exchange.finished_at - exchange.started_at).total_seconds()
        _child(REQUEST_DURATION, route, transport).observe(max(duration, 0.0))
    if exchange.model_fallback:
        _child(FALLBACKS, ErrorCode.MODEL_NOT_FOUND).inc()
    if exchange.fallback_reason in FALLBACK_REASONS:
        _child(FALLBACKS, exchange.fallback_reason).inc()
    limit = _throttled_by(exchange)
    if limit is not None:
        _child(KEY_THROTTLED, _name(exchange.key_name), limit).inc()
    served = None  # (pool, assignment, model) and start of the last attempt dispatched
    for attempt in exchange.attempts:
        route_class = _bounded(attempt.route_class, ROUTE_CLASSES)
        failure_class = _failure_class(attempt.failure_class)
        status = _bounded(attempt.status, ATTEMPT_STATUSES)
        _child(ATTEMPTS, route_class, status, failure_class).inc()
        if status == AttemptStatus.RETRYABLE_FAILED:
            _child(HANDOFFS, failure_class).inc()
        if status == AttemptStatus.INELIGIBLE:
            continue
        where = (_name(attempt.pool), _name(attempt.assignment), _name(attempt.model))
        served = where, attempt.offset_ms
        _child(UPSTREAM_LATENCY, *where, route_class).observe(attempt.elapsed_ms / 1000)
        _child(UPSTREAM_ATTEMPTS, *where, status).inc()
        # A counter raises on a negative amount: whatever an attempt holds, only a positive one counts.
        for direction, tokens in (("input", attempt.input_tokens), ("output", attempt.output_tokens)):
            if tokens is not None and tokens > 0:
                _child(TOKENS, *where, direction).inc(tokens)
        if attempt.cost_micros is not None and attempt.cost_micros > 0:
            _child(COST, *where).inc(attempt.cost_micros)
    if exchange.first_output_at is not None:
        ttft = (exchange.first_output_at - exchange.started_at).total_seconds()
        _child(TIME_TO_FIRST_TOKEN, route, transport).observe(max(ttft, 0.0))
        if served is not None:
            # Output becomes visible from one attempt only, the last dispatched (no handoff after it).
            where, offset_ms = served
            _child(UPSTREAM_TIME_TO_FIRST_TOKEN, *where).observe(max(ttft - offset_ms / 1000, 0.0))


# -- read at scrape time from the shared database ----------------------------------------------------

CIRCUIT_LABELS = ["pool", "assignment", "model", "route_class", "reason"]


def open_circuit_counts() -> list[tuple[str, str, str, str, str, int]]:
    """(pool, assignment, model, route class, reason, count) of the circuits not closed: one GROUP BY
    over the circuit rows (a row exists only for a pair that failed, SPEC §7.1), however many."""
    rows = (
        Circuit.objects.exclude(state=CircuitState.CLOSED)
        .values_list("pool__name", "assignment__name", "model", "route_class", "reason")
        .annotate(n=Count("id"))
        .order_by()
    )
    return list(rows)


def budgeted_keys() -> list[GatewayKey]:
    """Every enabled key with a budget, with the columns `budget_left` reads: one statement."""
    return list(
        GatewayKey.objects.filter(enabled=True, budget_micros__isnull=False).only(
            "name", "budget_micros", "budget_period", "spent_micros", "reserved_micros", "period_start"
        )
    )


class DatabaseCollector(Collector):
    """What every node reads alike from the database, at scrape time (not per process: with several
    workers it is registered once beside their summed files)."""

    CIRCUITS = (
        "gateway_open_circuits",
        "Circuits currently open or half-open (all nodes), by pool, assignment, model, route class "
        "(`assignment` and model `*`: an assignment-wide circuit) and reason.",
    )
    BUDGET = ("gateway_key_budget_usd", "The budget of each enabled key that has one, in US dollars.")
    REMAINING = (
        "gateway_key_budget_remaining_usd",
        "What each budgeted key may still spend this period, in US dollars: its budget less this period's "
        "spend and what its requests in flight hold.",
    )

    def describe(self) -> Iterable[GaugeMetricFamily]:
        # Without describe, registering would call collect() and query the database at import.
        return [
            GaugeMetricFamily(*self.CIRCUITS, labels=CIRCUIT_LABELS),
            GaugeMetricFamily(*self.BUDGET, labels=["key", "period"]),
            GaugeMetricFamily(*self.REMAINING, labels=["key", "period"]),
        ]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            circuits, keys = open_circuit_counts(), budgeted_keys()
        except DatabaseError:
            # The process counters matter most during an outage: serve them without these gauges.
            # Django drops the unusable connection itself when the request finishes.
            log.warning("metrics: open circuits and budgets unavailable (database error)")
            return
        yield self._circuits(circuits)
        yield from self._budgets(keys, datetime.now(UTC))

    def _circuits(self, counts: list[tuple[str, str, str, str, str, int]]) -> GaugeMetricFamily:
        gauge = GaugeMetricFamily(*self.CIRCUITS, labels=CIRCUIT_LABELS)
        values: dict[tuple[str, ...], int] = {}
        for pool, assignment, model, route_class, reason, n in counts:
            labels = (
                _name(pool),
                _name(assignment),
                _name(model),
                # An assignment-wide circuit (credential_rejected) covers every route class.
                WIDE_LABEL if route_class == ASSIGNMENT_WIDE else _bounded(route_class, ROUTE_CLASSES),
                _bounded(reason, CIRCUIT_REASONS) if reason else NONE,
            )
            values[labels] = values.get(labels, 0) + n
        for labels, n in sorted(values.items()):
            gauge.add_metric(list(labels), n)
        return gauge

    def _budgets(self, keys: list[GatewayKey], now: datetime) -> Iterator[GaugeMetricFamily]:
        budget = GaugeMetricFamily(*self.BUDGET, labels=["key", "period"])
        remaining = GaugeMetricFamily(*self.REMAINING, labels=["key", "period"])
        for key in keys:
            labels = [_name(key.name), _bounded(key.budget_period or LIFETIME, BUDGET_PERIODS)]
            budget.add_metric(labels, (key.budget_micros or 0) / MICROS)
            remaining.add_metric(labels, (budget_left(key, now) or 0) / MICROS)
        yield budget
        yield remaining


REGISTRY.register(DatabaseCollector())


def scrape_registry() -> CollectorRegistry:
    """What a scrape exposes: this process's REGISTRY, or with several workers the sum of every
    worker's files plus the database gauges (counted once: they are not per process)."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    registry.register(DatabaseCollector())
    return registry
