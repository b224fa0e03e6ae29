"""What the operator Routing panel shows (SPEC §9), data in, data out.

Contract: the loader (`proxy.console.upstreams.upstreams_panel_load`) reads rows and hands this module plain
values (circuit snapshots, catalog facts, demotions, latency averages, usage counts) and a fixed `now`;
this module returns frozen values that the template renders. A serving signal comes from
`breaker.health`, the function the router itself calls, so what an operator sees is what the router
does. Nothing is inferred: a capability that was not declared stays UNKNOWN, a token count that was not
reported stays None, and a model that is not in the catalog but still has circuit or demotion rows is
shown with no provenance rather than hidden.
No value here is a credential, a key or a provider message: none is ever passed in.
"""

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from routing.policy import breaker
from routing.policy.breaker import BreakerSettings, CircuitSnapshot
from routing.policy.capabilities import Effective
from routing.policy.types import CircuitReason, CircuitState, Health, Price, RouteClass, TriState

USAGE_WINDOW = timedelta(minutes=5)
LEADERBOARD_SIZE = 25
ROUTE_CLASSES = (RouteClass.HTTP, RouteClass.SSE, RouteClass.WEBSOCKET)
ROUTE_CLASS_LABELS = {RouteClass.HTTP: "HTTP", RouteClass.SSE: "SSE", RouteClass.WEBSOCKET: "Websocket"}
NOT_ADVERTISED = "not advertised"
STATE_TEXT = {
    CircuitState.CLOSED: "closed",
    CircuitState.OPEN: "open until",
    CircuitState.HALF_OPEN: "half-open",
}


def reason_text(reason: CircuitReason) -> str:
    """The canonical reason in words (`upstream_model_unavailable` -> `upstream model unavailable`), so
    it wraps on a phone; the code itself stays greppable in the page's data attributes."""
    return str(reason).replace("_", " ")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


@dataclass(frozen=True, slots=True)
class Signal:
    """One route class's serving signal for an (assignment, model)."""

    route_class: RouteClass | None  # None: the assignment-wide circuit (credential_rejected)
    state: CircuitState
    health: Health
    reason: CircuitReason | None = None
    until: datetime | None = None  # open_until, while the circuit is open
    seconds_left: int | None = None  # until `until`, rounded up; 0 once it has passed
    failures: int = 0
    probes_in_flight: int = 0

    @property
    def label(self) -> str:
        return ROUTE_CLASS_LABELS[self.route_class] if self.route_class else "Whole assignment"

    @property
    def state_text(self) -> str:
        """The words of the state; the template adds `until` as a <time> element."""
        return STATE_TEXT[self.state]

    @property
    def reason_text(self) -> str:
        return reason_text(self.reason) if self.reason else ""

    @property
    def detail(self) -> str:
        parts: list[str] = []
        if self.state is CircuitState.CLOSED and self.failures:
            parts.append(_count(self.failures, "recent failure"))
        if self.state is CircuitState.HALF_OPEN:
            parts.append(_count(self.probes_in_flight, "probe") + " in flight")
        if self.state is CircuitState.OPEN and self.health is Health.PROBE:
            parts.append("cooldown over, next request probes")
        return ", ".join(parts)


def signal(
    route_class: RouteClass | None, snapshot: CircuitSnapshot | None, settings: BreakerSettings, now: datetime
) -> Signal:
    """No row is a closed, clean circuit (a healthy pair has no row)."""
    health = breaker.health(snapshot, settings, now)
    if snapshot is None:
        return Signal(route_class=route_class, state=CircuitState.CLOSED, health=health)
    # Only an open circuit has a meaningful deadline; a half-open one is waiting on its probe.
    until = snapshot.open_until if snapshot.state is CircuitState.OPEN else None
    seconds_left = None
    if until is not None:
        seconds_left = max(0, math.ceil((until - now).total_seconds()))
    return Signal(
        route_class=route_class,
        state=snapshot.state,
        health=health,
        reason=snapshot.reason,
        until=until,
        seconds_left=seconds_left,
        failures=snapshot.consecutive_failures,
        probes_in_flight=snapshot.probes_in_flight,
    )


UNKNOWN_PRICE = Price()


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """One catalog entry of an assignment."""

    model: str
    provenance: str  # configured | observed | preserved
    tools: TriState = TriState.UNKNOWN
    vision: TriState = TriState.UNKNOWN
    context_window: int | None = None
    # The route's effective capabilities with their provenance (`routing.policy.capabilities.effective`,
    # computed by the loader exactly as the router's snapshot does), in `Capability` order.
    capabilities: tuple[Effective, ...] = ()
    price: Price = UNKNOWN_PRICE  # priced as the router does, with its provenance


@dataclass(frozen=True, slots=True)
class DemotionFacts:
    reason: CircuitReason
    until: datetime

    @property
    def reason_text(self) -> str:
        return reason_text(self.reason)


@dataclass(frozen=True, slots=True)
class LatencyFacts:
    """A route's moving average of upstream time to first byte (`routing.policy.latency`), as the router
    reads it."""

    ewma_ms: float
    samples: int

    @property
    def text(self) -> str:
        return f"{self.ewma_ms:.0f} ms, {_count(self.samples, 'answer')}"


@dataclass(frozen=True, slots=True)
class ModelRow:
    model: str
    provenance: str  # a catalog provenance, or NOT_ADVERTISED
    tools: TriState
    vision: TriState
    context_window: int | None
    signals: tuple[Signal, ...]  # one per ROUTE_CLASSES, in that order
    demotion: DemotionFacts | None
    capabilities: tuple[Effective, ...] = ()  # empty for a model that is not advertised
    price: Price = UNKNOWN_PRICE
    latency: LatencyFacts | None = None  # None: it has not answered yet (the router ranks it unknown)

    @property
    def advertised(self) -> bool:
        return self.provenance != NOT_ADVERTISED

    @property
    def troubled(self) -> bool:
        return self.demotion is not None or any(not s.health.closed for s in self.signals)


def model_rows(
    entries: Iterable[ModelFacts],
    circuits: Mapping[tuple[str, RouteClass], CircuitSnapshot],
    demotions: Mapping[str, DemotionFacts],
    settings: BreakerSettings,
    now: datetime,
    wide: CircuitSnapshot | None = None,
    latencies: Mapping[str, LatencyFacts] | None = None,
) -> tuple[ModelRow, ...]:
    """Every advertised model of one assignment, plus any model that has circuit, live demotion or
    latency rows without being advertised (state outlives a catalog entry), sorted by model id. While the
    assignment-wide circuit (`wide`, credential_rejected) is not closed it governs every signal, as it
    does for the router (`breaker.governing`)."""
    facts = {e.model: e for e in entries}
    latencies = latencies or {}
    models = set(facts) | {model for model, _ in circuits} | set(demotions) | set(latencies)
    rows: list[ModelRow] = []
    for model in sorted(models):
        entry = facts.get(model)
        demotion = demotions.get(model)
        rows.append(
            ModelRow(
                model=model,
                provenance=entry.provenance if entry else NOT_ADVERTISED,
                tools=entry.tools if entry else TriState.UNKNOWN,
                vision=entry.vision if entry else TriState.UNKNOWN,
                context_window=entry.context_window if entry else None,
                signals=tuple(
                    signal(rc, breaker.governing(circuits.get((model, rc)), wide)[0], settings, now)
                    for rc in ROUTE_CLASSES
                ),
                demotion=demotion if demotion is not None and demotion.until > now else None,
                capabilities=entry.capabilities if entry else (),
                price=entry.price if entry else UNKNOWN_PRICE,
                latency=latencies.get(model),
            )
        )
    return tuple(rows)


@dataclass(frozen=True, slots=True)
class Capability:
    label: str
    value: str  # true | false | unknown, or an enum word (native, emulated, allow, deny, unknown)

    @property
    def unknown(self) -> bool:
        return self.value == TriState.UNKNOWN


class HeadroomState(enum.StrEnum):
    LOW = "low"  # a headroom demotion runs: the account said it is nearly spent
    AMPLE = "ample"  # it answered in the usage window and none of its answers said so
    UNKNOWN = "unknown"  # it did not answer in the window: nothing says either way


@dataclass(frozen=True, slots=True)
class Headroom:
    """An account's rate-limit headroom as the router knows it (SPEC §5.4). An account whose answers
    report less than `headroom_floor` of a limit left is demoted (reason `headroom`) until that limit's
    reset, and nothing is written while headroom is ample: so a live headroom demotion of any of its
    models is `low` until its end, an account that answered in the window without one is `ample`."""

    state: HeadroomState
    until: datetime | None = None  # while low: when the last of its headroom demotions ends


def headroom(demotions: Iterable[DemotionFacts], *, answered: bool, now: datetime) -> Headroom:
    """`demotions`: the account's demotions of every model; `answered`: it had attempts in the window."""
    ends = [d.until for d in demotions if d.reason is CircuitReason.HEADROOM and d.until > now]
    if ends:
        return Headroom(HeadroomState.LOW, max(ends))
    return Headroom(HeadroomState.AMPLE if answered else HeadroomState.UNKNOWN)


def shares(attempts: Mapping[int, int], pool_of: Mapping[int, int]) -> dict[int, float | None]:
    """Each assignment of `pool_of` (assignment -> pool): its attempts over all its pool's attempts in
    the window (`attempts`: assignment -> attempts), None when its pool had none."""
    totals: dict[int, int] = {}
    for assignment_id, pool_id in pool_of.items():
        totals[pool_id] = totals.get(pool_id, 0) + attempts.get(assignment_id, 0)
    return {
        assignment_id: attempts.get(assignment_id, 0) / totals[pool_id] if totals[pool_id] else None
        for assignment_id, pool_id in pool_of.items()
    }


@dataclass(frozen=True, slots=True)
class AssignmentRow:
    assignment_id: int
    name: str
    adapter: str
    tier: int
    region: str
    router: str
    enabled: bool
    quality: float | None
    capabilities: tuple[Capability, ...]
    models: tuple[ModelRow, ...]
    credential: Signal | None = None  # the assignment-wide circuit (credential_rejected), when one exists
    attempts: int = 0  # attempts sent to it in the usage window
    share: float | None = None  # of its pool's attempts in the window (`shares`); None: the pool had none
    headroom: Headroom = Headroom(HeadroomState.UNKNOWN)

    @property
    def troubled_models(self) -> int:
        return sum(1 for m in self.models if m.troubled)

    @property
    def share_text(self) -> str:
        if self.share is None:
            return "no traffic"
        return f"{self.share:.0%} ({_count(self.attempts, 'attempt')})"


@dataclass(frozen=True, slots=True)
class PoolRow:
    pool_id: int
    name: str
    assignments: tuple[AssignmentRow, ...]

    @property
    def troubled_models(self) -> int:
        return sum(a.troubled_models for a in self.assignments)


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One model's ledger over the usage window. Token sums are None when no attempt reported any."""

    model: str
    requests: int
    successes: int
    handoffs: int
    input_tokens: int | None
    output_tokens: int | None

    @property
    def tokens(self) -> int | None:
        if self.input_tokens is None and self.output_tokens is None:
            return None
        return (self.input_tokens or 0) + (self.output_tokens or 0)


def leaderboard(rows: Iterable[UsageRow], size: int = LEADERBOARD_SIZE) -> tuple[UsageRow, ...]:
    """Busiest first; ties by tokens, then by model id, so the order is stable."""
    return tuple(sorted(rows, key=lambda r: (-r.requests, -(r.tokens or 0), r.model))[:size])


@dataclass(frozen=True, slots=True)
class Panel:
    now: datetime
    window: timedelta
    pools: tuple[PoolRow, ...]
    usage: tuple[UsageRow, ...]

    @property
    def route_labels(self) -> tuple[str, ...]:
        return tuple(ROUTE_CLASS_LABELS[rc] for rc in ROUTE_CLASSES)

    @property
    def window_minutes(self) -> int:
        return int(self.window.total_seconds() // 60)
