"""The route plan: which candidates one client request may be dispatched to, in order (SPEC §5.2).

Contract: `build_plan` runs these steps, in this order, and reports what each step removed:

1. allow-list: every candidate's model is re-checked against the key's allow-list; the cross-model
   fallback's candidates are what this catches (the primary model was authorized by resolution).
   A disallowed candidate is dropped and reported, never dispatched.
2. hard pins (response continuity, file affinity, live websocket upstream) keep only the pinned
   assignment's candidates. A pin never escapes: when its assignment has no candidate left the
   result is a PlanError (`file_assignment_conflict` for a file pin), never a wider plan.
3. eligibility gate: every ineligible candidate is reported with its reasons, never dispatched.
4. preference: the primary model's eligible candidates in preference order, then the fallback
   model's (cross-model, marked `cross_model=True`). Cross-model candidates are reached only
   because upstreams said the primary model is not there (§5.2): a `model_not_found_cross` failure
   in this request (`next_candidate` with NEXT_MODEL), or every primary candidate excluded by a
   circuit open for `upstream_model_unavailable` (`cross_open`: the plan starts with them). A
   primary model that is merely ineligible (context window, capability, privacy, region, budget,
   deadline) or transiently unhealthy is never swapped for another model: the plan is empty and
   `exclusion_reason` names the primary's condition (`no_eligible_backend`).
5. soft session preference (cache affinity): the session's last assignment (primary model) moves to
   the front when its circuit is closed and it is not demoted (behind a probe this request holds:
   the probe comes first); everybody else keeps their place.
6. shortlist: the first `max_attempts` candidates are the dispatch order. Every gate (deadline
   included) ran before it, so an eligible candidate is never cut in favour of an ineligible one.

Why this order: the gate runs before any ordering so no preference or session signal can promote
an ineligible route, and every excluded candidate is reported once with its reason; pins run before
the gate so the reported reasons are the pinned route's own (the reason a pinned request fails);
the session move comes after preference because it is the one deliberate exception to it, and it
never outranks a known health signal; the cut comes last so it only drops routes that were both
eligible and least preferred.

`next_candidate` turns a failure disposition into the index of the next candidate to dispatch.
"""

import enum
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, replace

from routing.policy import eligibility, preference
from routing.policy.eligibility import Verdict, gate_reasons
from routing.policy.errors import ErrorCode
from routing.policy.failures import Disposition
from routing.policy.resolution import WILDCARD, is_allowed
from routing.policy.types import Candidate, Health, IneligibleReason, Requirements


class PinKind(enum.StrEnum):
    RESPONSE = "response"  # previous_response_id -> the assignment that created it
    FILE = "file"  # a referenced file -> the assignment that holds it
    WEBSOCKET = "websocket"  # the upstream of an already-live websocket


@dataclass(frozen=True, slots=True)
class HardPin:
    kind: PinKind
    assignment_id: int | None  # None: the assignment is gone (deleted, disabled or out of the pool)


@dataclass(frozen=True, slots=True)
class PlanError:
    code: ErrorCode
    pin: HardPin


@dataclass(frozen=True, slots=True)
class Plan:
    order: tuple[Candidate, ...]  # the dispatch order (shortlisted)
    ineligible: tuple[Verdict, ...]  # gated out, in input order (primary, then fallback)
    beyond_shortlist: tuple[Candidate, ...]  # eligible, cut by max_attempts
    disallowed: tuple[Candidate, ...]  # candidates whose model the key may not use
    pins: tuple[HardPin, ...] = ()
    session_moved: bool = False
    cross_open: bool = False  # every primary candidate is blocked by an upstream_model_unavailable circuit
    # Eligible candidates of the fallback model left out because nothing said the primary model is
    # missing and no primary candidate is eligible (§5.2): reported, never dispatched.
    not_crossed: tuple[Candidate, ...] = ()
    # The first candidate of the order, shortlisted or not, whose circuit admits a probe (Health.PROBE):
    # the one whose lease the request tries to take (`routing.policy.route.lease_candidate`).
    probe: Candidate | None = None

    @property
    def exclusion_reason(self) -> IneligibleReason | None:
        """The `no_eligible_backend` param: the condition that excluded the last primary candidate
        (the fallback model's conditions never name the primary model's failure)."""
        if self.order or not self.ineligible:
            return None
        primary = [v for v in self.ineligible if not v.candidate.cross_model]
        return (primary or list(self.ineligible))[-1].reason


def _apply_pins(
    candidates: list[Candidate], pins: Sequence[HardPin]
) -> tuple[list[Candidate], PlanError | None]:
    for pin in pins:
        candidates = [c for c in candidates if c.assignment_id == pin.assignment_id]
        if not candidates:
            code = (
                ErrorCode.FILE_ASSIGNMENT_CONFLICT if pin.kind is PinKind.FILE else ErrorCode.PIN_UNAVAILABLE
            )
            return [], PlanError(code, pin)
    return candidates, None


def _move_session(order: list[Candidate], session_assignment_id: int | None) -> bool:
    if session_assignment_id is None:
        return False
    front = 1 if order and order[0].health is Health.HELD else 0  # a probe this request holds stays first
    for index, c in enumerate(order):
        if c.assignment_id == session_assignment_id and not c.cross_model:
            if index <= front or c.demoted or not c.health.closed:
                return False
            order.insert(front, order.pop(index))
            return True
    return False


_CIRCUIT_OPEN_ONLY = (IneligibleReason.CIRCUIT_OPEN,)


def _all_circuit_open(
    candidates: Sequence[Candidate], reasons: Sequence[tuple[tuple[IneligibleReason, ...], int | None]]
) -> bool:
    """Whether the primary model has candidates and every one is blocked by an
    upstream_model_unavailable circuit alone (`Plan.cross_open`)."""
    primary = [why for c, (why, _) in zip(candidates, reasons, strict=True) if not c.cross_model]
    return bool(primary) and all(why == _CIRCUIT_OPEN_ONLY for why in primary)


@dataclass(frozen=True, slots=True)
class _Routes:
    """What the plan works out of one routes tuple whatever the request (issue 49): its candidates marked
    as the primary's or the fallback's (`cross_model`), their models, one candidate of each contract the
    gate reads (`eligibility.contract`: the gate's verdict is the same for every candidate of one), and
    their preference ranking. A routes tuple is the same object for every request while its rows stay
    the same (`routing.selectors.with_latency`), so a pool of 200 accounts is sorted and weighed once,
    not once a request."""

    source: tuple[Candidate, ...]  # held, so its id stays its own while the entry lives
    marked: tuple[Candidate, ...]
    models: frozenset[str]
    contracts: tuple[Candidate, ...]
    ranking: preference.Ranking
    probes: bool  # whether any of them admits a probe (a plan without any need not look for one)


_prepared: dict[tuple[int, bool], _Routes] = {}
_PREPARED_LIMIT = 256


def _routes(candidates: Sequence[Candidate], cross: bool) -> _Routes | None:
    """`candidates`' prepared routes when they are a tuple (an immutable routes tuple, never a list a
    caller may change), as `cross` marks them."""
    if not isinstance(candidates, tuple):
        return None
    key = (id(candidates), cross)
    hit = _prepared.get(key)
    if hit is not None and hit.source is candidates:
        return hit
    marked = tuple(_mark(candidates, cross))
    contracts = tuple({eligibility.contract(c): c for c in reversed(marked)}.values())
    routes = _Routes(
        candidates,
        marked,
        frozenset(c.model for c in marked),
        contracts,
        preference.ranking(marked),
        any(c.health is Health.PROBE for c in marked),
    )
    if len(_prepared) >= _PREPARED_LIMIT:
        _prepared.clear()
    _prepared[key] = routes
    return routes


def _mark(candidates: Sequence[Candidate], cross: bool) -> Iterator[Candidate]:
    """`candidates` as the primary model's (`cross` False) or the fallback's: copied only when their
    mark changes."""
    return (c if c.cross_model == cross else replace(c, cross_model=cross) for c in candidates)


def _marked(candidates: Sequence[Candidate], cross: bool) -> Sequence[Candidate]:
    routes = _routes(candidates, cross)
    return routes.marked if routes is not None else list(_mark(candidates, cross))


def _whole_plan(
    primary: Sequence[Candidate],
    fallback: Sequence[Candidate],
    requirements: Requirements,
    allowed_models: Collection[str],
    max_attempts: int,
    session_assignment_id: int | None,
    draw: float | None,
) -> Plan | None:
    """The plan when nothing is taken out of the routes: no pin, every model allowed, every contract
    eligible (the common request), from the routes' prepared ranking; None when something is."""
    p, f = _routes(primary, False), _routes(fallback, True)
    if p is None or f is None:
        return None
    if WILDCARD not in allowed_models and not all(is_allowed(m, allowed_models) for m in p.models | f.models):
        return None
    if not all(eligibility.evaluate(c, requirements).eligible for c in (*p.contracts, *f.contracts)):
        return None
    primary_order = preference.ordered(p.ranking, draw)
    cross_order = preference.ordered(f.ranking, draw)
    order = [*primary_order, *cross_order] if primary_order else []
    moved = _move_session(order, session_assignment_id)
    cut = max(max_attempts, 0)
    return Plan(
        order=tuple(order[:cut]),
        ineligible=(),
        beyond_shortlist=tuple(order[cut:]),
        disallowed=(),
        session_moved=moved,
        not_crossed=() if primary_order else cross_order,
        probe=_first_probe(order) if p.probes or (f.probes and order) else None,
    )


def _first_probe(order: Sequence[Candidate]) -> Candidate | None:
    return next((c for c in order if c.health is Health.PROBE), None)


def build_plan(
    *,
    primary: Sequence[Candidate],
    fallback: Sequence[Candidate] = (),
    requirements: Requirements,
    allowed_models: Collection[str],
    max_attempts: int,
    pins: Sequence[HardPin] = (),
    session_assignment_id: int | None = None,
    draw: float | None = None,
) -> Plan | PlanError:
    """`draw`: a uniform number in [0, 1) that picks the first of equal candidates (`preference.order`);
    None keeps the deterministic order."""
    if not pins:
        whole = _whole_plan(
            primary, fallback, requirements, allowed_models, max_attempts, session_assignment_id, draw
        )
        if whole is not None:
            return whole
    # A candidate is a frozen dataclass of some twenty fields: copied only when its mark changes
    # (`replace` of every candidate was over 1 % of a request's CPU), and a routes tuple's marked copies
    # are kept for the next request over the same routes (`_routes`).
    marked = [*_marked(primary, False), *_marked(fallback, True)]
    disallowed: tuple[Candidate, ...] = ()
    if WILDCARD in allowed_models:
        allowed = marked
    else:
        allowed = [c for c in marked if is_allowed(c.model, allowed_models)]
        disallowed = tuple(c for c in marked if not is_allowed(c.model, allowed_models))

    pinned, error = _apply_pins(allowed, pins)
    if error is not None:
        return error

    # The gate's reasons per candidate; a Verdict is built only for the ineligible, which the plan reports.
    reasons = gate_reasons(pinned, requirements)
    ineligible = tuple(
        Verdict(candidate=c, reasons=why, reservation_micros=reservation)
        for c, (why, reservation) in zip(pinned, reasons, strict=True)
        if why
    )
    eligible = [c for c, (why, _) in zip(pinned, reasons, strict=True) if not why]
    primary_order = preference.order([c for c in eligible if not c.cross_model], draw)
    cross_open = not primary_order and _all_circuit_open(pinned, reasons)
    order = list(primary_order)
    cross_order = preference.order([c for c in eligible if c.cross_model], draw)
    crossing = bool(primary_order) or cross_open
    if crossing:
        order += cross_order
    moved = False if pins else _move_session(order, session_assignment_id)

    cut = max(max_attempts, 0)
    return Plan(
        order=tuple(order[:cut]),
        ineligible=ineligible,
        beyond_shortlist=tuple(order[cut:]),
        disallowed=disallowed,
        pins=tuple(pins),
        session_moved=moved,
        cross_open=cross_open,
        not_crossed=() if crossing else cross_order,
        probe=_first_probe(order),
    )


def next_candidate(order: Sequence[Candidate], current: int, disposition: Disposition) -> int | None:
    """The index of the candidate to hand the request to after `order[current]` failed (or was
    passed over at its turn), or None. NEXT_CANDIDATE never crosses the model boundary: it stays
    among the primary model's candidates, or among the fallback model's once the plan has crossed."""
    if disposition is Disposition.NEXT_CANDIDATE:
        crossed = order[current].cross_model
        for index in range(current + 1, len(order)):
            if order[index].cross_model == crossed:
                return index
        return None
    if disposition is Disposition.NEXT_MODEL:
        failed_model = order[current].model
        for index in range(current + 1, len(order)):
            if order[index].model != failed_model:
                return index
    return None
