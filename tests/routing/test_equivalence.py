"""The request path's fast routing (issue 49: precomputed, cached, incremental) against a straightforward
reference: the plan `build_plan` makes, with and without a draw, and the candidates `with_latency` builds
over time, must be exactly what the plain per-candidate rules make for the same inputs (SPEC §5.3, §5.4).

The reference below is the rules written once, candidate by candidate, with no cache and no shortcut."""

import math
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from routing.policy import eligibility
from routing.policy.eligibility import evaluate
from routing.policy.latency import load_now
from routing.policy.plan import HardPin, PinKind, Plan, PlanError, build_plan
from routing.policy.preference import CHOICES, preference_key, share_weights
from routing.policy.resolution import is_allowed
from routing.policy.types import Candidate, Health, Price, Requirements, TriState
from routing.selectors import _latency_built, with_latency
from tests.routing.test_properties import candidates, requirements

# ---- the reference ----------------------------------------------------------------------------------


def ref_order(cands, draw):
    ranked = sorted(cands, key=preference_key)
    if draw is None:
        return tuple(ranked)
    held = 0
    while held < len(ranked) and ranked[held].health is Health.HELD:
        held += 1
    rest = ranked[held:]
    if not rest:
        return tuple(ranked)
    first = (preference_key(rest[0])[1], rest[0].tier)
    leading = [c for c in rest if (preference_key(c)[1], c.tier) == first]
    leading = rest[: len(leading)]
    if len(leading) < 2:
        return tuple(ranked)
    weights = share_weights(leading)
    total = sum(weights)

    def drawn(u):
        if total <= 0:
            return 0
        point = min(max(u, 0.0), 1.0) * total
        running = 0.0
        for index, w in enumerate(weights):
            running += w
            if point < running:
                return index
        return max(i for i, w in enumerate(weights) if w > 0)

    draws = [math.modf(draw * 8_192.0**n)[0] if n else draw for n in range(CHOICES)]
    picks = [drawn(u) for u in draws]

    def busy(i):
        return (leading[i].load or 0.0) / weights[i] if weights[i] > 0 else float("inf")

    chosen = min(picks, key=busy)
    if chosen:
        ranked.insert(held, ranked.pop(held + chosen))
    return tuple(ranked)


def ref_plan(primary, fallback, reqs, allowed, max_attempts, pins, session, draw):
    from dataclasses import replace

    marked = [replace(c, cross_model=False) for c in primary] + [
        replace(c, cross_model=True) for c in fallback
    ]
    ok = [c for c in marked if is_allowed(c.model, allowed)]
    disallowed = tuple(c for c in marked if not is_allowed(c.model, allowed))
    for pin in pins:
        ok = [c for c in ok if c.assignment_id == pin.assignment_id]
        if not ok:
            return ("error", pin)
    verdicts = [evaluate(c, reqs) for c in ok]
    eligible = [v.candidate for v in verdicts if v.eligible]
    primary_order = ref_order([c for c in eligible if not c.cross_model], draw)
    prim_verdicts = [v for v in verdicts if not v.candidate.cross_model]
    cross_open = (
        not primary_order
        and bool(prim_verdicts)
        and all(v.reasons == ("circuit_open",) for v in prim_verdicts)
    )
    cross_order = ref_order([c for c in eligible if c.cross_model], draw)
    crossing = bool(primary_order) or cross_open
    order = list(primary_order) + (list(cross_order) if crossing else [])
    moved = False
    if not pins and session is not None:
        front = 1 if order and order[0].health is Health.HELD else 0
        for index, c in enumerate(order):
            if c.assignment_id == session and not c.cross_model:
                if not (index <= front or c.demoted or not c.health.closed):
                    order.insert(front, order.pop(index))
                    moved = True
                break
    cut = max(max_attempts, 0)
    return (
        tuple(order[:cut]),
        tuple((v.candidate, v.reasons, v.reservation_micros) for v in verdicts if not v.eligible),
        tuple(order[cut:]),
        disallowed,
        moved,
        cross_open,
        () if crossing else cross_order,
        next((c for c in order if c.health is Health.PROBE), None),
    )


def as_tuple(plan):
    if isinstance(plan, PlanError):
        return ("error", plan.pin)
    assert isinstance(plan, Plan)
    return (
        plan.order,
        tuple((v.candidate, v.reasons, v.reservation_micros) for v in plan.ineligible),
        plan.beyond_shortlist,
        plan.disallowed,
        plan.session_moved,
        plan.cross_open,
        plan.not_crossed,
        plan.probe,
    )


# ---- randomized pools -------------------------------------------------------------------------------


def _pool(rng: random.Random, size: int, model: str, profiles: list[dict]) -> list[Candidate]:
    """A pool as configurations make them: many accounts sharing a few contracts (what the gate's
    shortcut groups by), with their own tiers, weights, health, demotions, latencies, headroom and load."""
    out = []
    for i in range(size):
        out.append(
            Candidate(
                assignment_id=i + 1,
                model=model,
                tier=rng.choice([0, 0, 0, 1, 2]),
                weight=rng.choice([0, 1, 1, 1, 2, 5]),
                latency_ms=rng.choice([None, 40.0, 41.0, float(rng.randint(0, 900))]),
                headroom_left=rng.choice([None, None, 0.0, 0.02, 0.5, 1.0, rng.random()]),
                load=rng.choice([None, 0.0, 0.1, round(rng.random() * 50, 1), 3.0]),
                demoted=rng.random() < 0.15,
                health=rng.choice(
                    [Health.HEALTHY] * 6
                    + [Health.FAILING, Health.HELD, Health.PROBE, Health.COOLING, Health.BLOCKED]
                ),
                **rng.choice(profiles),
            )
        )
    return out


def _profiles(rng: random.Random) -> list[dict]:
    tri = list(TriState)
    return [
        {
            "tools": rng.choice(tri),
            "vision": rng.choice(tri),
            "role_separation": rng.choice(tri),
            "region": rng.choice(["", "eu", "us"]),
            "quality": rng.choice([None, 0.5, 0.9]),
            "min_deadline_ms": rng.choice([0, 500, 3000]),
            "context_window": rng.choice([None, 1000, 100_000]),
            "max_output_tokens": rng.choice([None, 1000]),
            "price": rng.choice([Price(), Price(1_000_000, 2_000_000), Price(3, 4)]),
        }
        for _ in range(rng.randint(1, 4))
    ]


def _requirements(rng: random.Random) -> Requirements:
    return Requirements(
        tools_offered=rng.random() < 0.2,
        vision=rng.random() < 0.2,
        regions=rng.choice([None, None, frozenset({"eu"}), frozenset({"", "us"})]),
        min_quality=rng.choice([0.0, 0.0, 0.6]),
        prompt_tokens=rng.randint(0, 2000),
        max_output_tokens=rng.choice([0, 500]),
        deadline_remaining_ms=rng.choice([None, 1000, 10_000]),
        budget_remaining_micros=rng.choice([None, None, 3_000, 10**9]),
    )


def test_the_plan_is_the_references_over_randomized_pools():
    rng = random.Random(49)
    for _ in range(120):
        profiles = _profiles(rng)
        primary = _pool(rng, rng.choice([0, 1, 2, 3, 20, 200]), "gpt-5", profiles)
        fallback = _pool(rng, rng.choice([0, 0, 2, 50]), "gpt-5.1", profiles)
        allowed = rng.choice([["*"], ["gpt-5"], ["gpt-5", "gpt-5.1"]])
        pins = rng.choice([(), (), (), (HardPin(PinKind.RESPONSE, rng.randint(1, 5)),)])
        session = rng.choice([None, rng.randint(1, 10)])
        reqs = _requirements(rng)
        # The same tuples for every call, as a routes tuple is for every request on the same rows: a
        # first call builds what the next ones reuse (`plan._routes`); and once as lists, which are not kept.
        routes = [(tuple(primary), tuple(fallback)), (primary, fallback)]
        for draw in (None, rng.random(), rng.random(), 0.0, 0.999999):
            for max_attempts in (3, 100):
                for first, second in routes:
                    got = build_plan(
                        primary=first,
                        fallback=second,
                        requirements=reqs,
                        allowed_models=allowed,
                        max_attempts=max_attempts,
                        pins=pins,
                        session_assignment_id=session,
                        draw=draw,
                    )
                    want = ref_plan(primary, fallback, reqs, allowed, max_attempts, pins, session, draw)
                    assert as_tuple(got) == want


def _plain_plan(primary, fallback, max_attempts, draw) -> Plan:
    """The plan of a request with no requirement, pin or session, asserted to be the reference's."""
    got = build_plan(
        primary=primary,
        fallback=fallback,
        requirements=Requirements(),
        allowed_models=["*"],
        max_attempts=max_attempts,
        draw=draw,
    )
    assert isinstance(got, Plan)
    assert as_tuple(got) == ref_plan(primary, fallback, Requirements(), ["*"], max_attempts, (), None, draw)
    return got


def test_a_routes_tuple_is_ranked_once_for_every_request_on_it(monkeypatch):
    """A pool's routes tuple, the same object for every request while its rows stay the same, is sorted
    and weighed once: each request draws from that ranking (and the plans are still the reference's);
    a new tuple (new rows) is ranked again."""
    from routing.policy import plan, preference

    rng = random.Random(11)
    ranked = []
    ranking = preference.ranking

    def counted(candidates):
        ranked.append(len(tuple(candidates)))
        return ranking(tuple(candidates))

    monkeypatch.setattr(preference, "ranking", counted)
    plan._prepared.clear()
    primary = tuple(
        Candidate(assignment_id=i, model="gpt-5", weight=rng.choice([1, 2]), load=float(rng.randint(0, 9)))
        for i in range(200)
    )
    fallback = tuple(Candidate(assignment_id=i, model="gpt-5.1") for i in range(3))
    for draws in range(2):
        for _ in range(50):
            _plain_plan(primary, fallback, 3, rng.random())
        assert ranked == [200, 3] + [200] * draws  # the fallback's tuple stays the same
        primary = (*primary[:199], primary[199])  # the same candidates in a new tuple: new rows


def test_a_plan_names_its_first_probe_wherever_it_is():
    """The lease a request tries to take is the plan's first probe-admissible candidate, in the primary
    model's order or, once the plan reaches it, the fallback model's."""
    healthy = tuple(Candidate(assignment_id=i, model="gpt-5") for i in (1, 2))
    cooled = (Candidate(assignment_id=3, model="gpt-5.1", health=Health.PROBE),)
    for primary, fallback, probe in (
        (healthy, cooled, 3),
        ((*healthy, replace(cooled[0], model="gpt-5")), (), 3),
        (healthy, (), None),
    ):
        for draw in (None, 0.3):
            got = _plain_plan(primary, fallback, 1, draw)
            assert (got.probe.assignment_id if got.probe else None) == probe


@settings(max_examples=150, deadline=None)
@given(
    st.lists(candidates(model="gpt-5"), max_size=8),
    st.lists(candidates(model="gpt-5.1"), max_size=4),
    requirements,
    st.none() | st.floats(0, 1, exclude_max=True),
    st.integers(1, 4),
)
def test_the_plan_is_the_references_for_generated_candidates(primary, fallback, reqs, draw, max_attempts):
    got = build_plan(
        primary=primary,
        fallback=fallback,
        requirements=reqs,
        allowed_models=["*"],
        max_attempts=max_attempts,
        draw=draw,
    )
    assert as_tuple(got) == ref_plan(primary, fallback, reqs, ["*"], max_attempts, (), None, draw)


# ---- with_latency over time -------------------------------------------------------------------------


def ref_with_latency(cands, latency, headroom, now, load, built):
    """`built`: when these rows were first built on (their loads decayed to then)."""
    from dataclasses import replace

    out = []
    for c in cands:
        left = headroom.get(c.key)
        served = load.get(c.key)
        out.append(
            replace(
                c,
                latency_ms=latency.get(c.key),
                headroom_left=left[0] if left is not None and now < left[1] else None,
                load=round(load_now(served[0], served[1], built), 1) if served is not None else None,
            )
        )
    return tuple(out)


def test_the_measured_candidates_are_the_references_as_time_goes_on():
    rng = random.Random(7)
    t0 = datetime(2026, 12, 5, 18, 0, tzinfo=UTC)
    for _ in range(16):
        _latency_built.clear()
        base = tuple(Candidate(assignment_id=i, model="gpt-5") for i in range(rng.choice([1, 5, 200])))
        latency = {c.key: float(rng.randint(1, 500)) for c in base if rng.random() < 0.8}
        headroom = {
            c.key: (rng.random(), t0 + timedelta(seconds=rng.uniform(-5, 60)))
            for c in base
            if rng.random() < 0.3
        }
        load = {
            c.key: (
                rng.choice([0.001, 0.05, 0.049, 0.15, rng.uniform(0, 500)]),
                t0 + timedelta(seconds=rng.uniform(-60, 5)),
            )
            for c in base
            if rng.random() < 0.7
        }
        now = latest = t0
        built = None
        for _ in range(200):
            # Mostly forward, by a microsecond to seconds; now and then back (requests decided out of order).
            step = rng.choice([0, 1e-6, 0.0005, 0.003, 0.05, 1.0, 7.0, -0.002])
            now = now + timedelta(seconds=step)
            latest = max(latest, now)
            got = with_latency(base, latency, headroom, now, load)
            # The loads are decayed to when the rows were built on: a request's time, moved only by a
            # request decided earlier than one before it (which may build them again).
            was, built = built, _latency_built[id(base)].built
            assert built <= latest and (was is None or step < 0 or built == was)
            want = ref_with_latency(base, latency, headroom, now, load, built)
            assert got == want
            # Unchanged candidates are never copied.
            for g, b in zip(got, base, strict=True):
                if (b.latency_ms, b.headroom_left, b.load) == (g.latency_ms, g.headroom_left, g.load):
                    assert g is b


def test_a_request_decided_out_of_order_gets_the_same_candidates():
    """Concurrent requests are decided out of the order of their times: an earlier one gets the tuple a
    later one built (what the plan keeps by it stays warm) unless a limit's reset it must not see was
    applied since, and then its own candidates, with the headroom it still had."""
    _latency_built.clear()
    t0 = datetime(2026, 12, 5, 18, 0, tzinfo=UTC)
    base = tuple(Candidate(assignment_id=i, model="gpt-5") for i in range(3))
    latency = {c.key: 40.0 for c in base}
    headroom = {base[0].key: (0.5, t0 + timedelta(seconds=2))}
    load = {c.key: (float(c.assignment_id), t0) for c in base}
    later = with_latency(base, latency, headroom, t0 + timedelta(seconds=1), load)
    assert with_latency(base, latency, headroom, t0 + timedelta(seconds=0.5), load) is later
    assert _latency_built[id(base)].built == t0 + timedelta(seconds=1)  # not built again for it
    reset = with_latency(base, latency, headroom, t0 + timedelta(seconds=3), load)
    assert reset[0].headroom_left is None
    earlier = with_latency(base, latency, headroom, t0 + timedelta(seconds=1.5), load)
    assert earlier[0].headroom_left == 0.5


def test_rows_without_loads_are_built_once():
    """No load rows (an empty mapping, or none): the candidates are built once for the rows, not again
    for each request."""
    _latency_built.clear()
    t0 = datetime(2026, 12, 5, 18, 0, tzinfo=UTC)
    base = tuple(Candidate(assignment_id=i, model="gpt-5") for i in range(3))
    latency = {c.key: 40.0 for c in base}
    for load in (None, {}):
        first = with_latency(base, latency, {}, t0, load)
        assert with_latency(base, latency, {}, t0 + timedelta(seconds=5), load) is first


class _Reading:
    """A candidate that notes every field read of it (`evaluate` takes it for a Candidate)."""

    def __init__(self, candidate: Candidate, read: set[str]) -> None:
        self._candidate, self._read = candidate, read

    def __getattr__(self, name: str) -> object:
        self._read.add(name)
        return getattr(self._candidate, name)


def test_the_gate_caches_verdicts_by_every_field_evaluate_reads():
    """`gate_reasons` gives a candidate the verdict of an earlier one equal on `_GATED`: a rule of
    `evaluate` that reads a field not listed there would hand one account's verdict to another (the
    README's walkthrough for a new gate says to list it). Every requirement that makes `evaluate` read
    more is set here, so any field any of its rules reads is seen."""
    gated = {name.split(".")[0] for name in eligibility.GATED_FIELDS}
    demanding = [
        Requirements(),
        Requirements(
            tools_offered=True,
            write_tools=True,
            untrusted_content=True,
            vision=True,
            zero_retention=True,
            regions=frozenset({"eu"}),
            no_third_party_router=True,
            min_quality=0.5,
            prompt_tokens=1000,
            max_output_tokens=100,
            deadline_remaining_ms=50,
            min_attempt_ms=100,
            budget_remaining_micros=1,
            adapters=frozenset({"openai"}),
        ),
    ]
    read: set[str] = set()
    prices = [Price(), Price(1, 2, cached_input_per_mtok_micros=1, cache_write_per_mtok_micros=3)]
    for asked in demanding:
        for price in prices:
            candidate = Candidate(assignment_id=1, model="m", price=price)
            eligibility.evaluate(_Reading(candidate, read), asked)  # type: ignore[arg-type]
    assert read - {"price"} <= gated, f"read by evaluate, missing from _GATED: {read - gated}"
    price_fields = {name.split(".")[1] for name in eligibility.GATED_FIELDS if name.startswith("price.")}
    assert price_fields == set(Price.__slots__) - {"source"}  # every rate a reservation may price by
