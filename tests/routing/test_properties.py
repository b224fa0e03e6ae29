"""Properties of the gate and the plan over generated candidates and requirements (SPEC §5.2-§5.4).

The oracle below restates each §5.3 rule independently of `routing.policy.eligibility`, in the words of
the SPEC, so a rule dropped or weakened in the implementation shows up as a counterexample."""

import math
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from routing.policy.budget import reserved_output_tokens
from routing.policy.eligibility import evaluate
from routing.policy.plan import Plan, build_plan
from routing.policy.preference import group, order, preference_key
from routing.policy.types import (
    Candidate,
    DataCollection,
    Health,
    IneligibleReason,
    Price,
    Requirements,
    Router,
    ToolRepresentation,
    TriState,
)

R = IneligibleReason
tri = st.sampled_from(TriState)
maybe_price = st.none() | st.integers(min_value=0, max_value=5_000_000)


@st.composite
def candidates(draw, assignment_id=None, model=None) -> Candidate:
    return Candidate(
        assignment_id=draw(st.integers(1, 6)) if assignment_id is None else assignment_id,
        model=draw(st.sampled_from(["gpt-5", "gpt-5.1"])) if model is None else model,
        tier=draw(st.integers(0, 2)),
        weight=draw(st.integers(1, 4)),
        latency_ms=draw(st.none() | st.floats(0, 1000)),
        demoted=draw(st.booleans()),
        health=draw(st.sampled_from(Health)),
        region=draw(st.sampled_from(["", "eu", "us"])),
        router=draw(st.sampled_from(Router)),
        zero_retention=draw(tri),
        data_collection=draw(st.sampled_from(DataCollection)),
        tools=draw(tri),
        write_tools=draw(tri),
        vision=draw(tri),
        role_separation=draw(tri),
        tool_representation=draw(st.sampled_from(ToolRepresentation)),
        model_tools=draw(tri),
        model_vision=draw(tri),
        quality=draw(st.none() | st.floats(0, 1)),
        min_deadline_ms=draw(st.integers(0, 2000)),
        context_window=draw(st.none() | st.integers(0, 5000)),
        max_output_tokens=draw(st.none() | st.integers(1, 5000)),
        price=Price(draw(maybe_price), draw(maybe_price)),
    )


requirements = st.builds(
    Requirements,
    tools_offered=st.booleans(),
    write_tools=st.booleans(),
    untrusted_content=st.booleans(),
    vision=st.booleans(),
    zero_retention=st.booleans(),
    regions=st.none() | st.frozensets(st.sampled_from(["eu", "us", "ap"])),
    no_third_party_router=st.booleans(),
    min_quality=st.floats(0, 1),
    prompt_tokens=st.integers(0, 3000),
    max_output_tokens=st.integers(0, 3000),
    deadline_remaining_ms=st.none() | st.integers(0, 2000),
    budget_remaining_micros=st.none() | st.integers(0, 20_000),
)


def known(value: TriState, model_value: TriState = TriState.UNKNOWN) -> bool:
    """True only when declared true; the model-level value decides whenever it is declared."""
    return (model_value if model_value is not TriState.UNKNOWN else value) is TriState.TRUE


def violated(c: Candidate, r: Requirements) -> set[IneligibleReason]:
    native = c.tool_representation is ToolRepresentation.NATIVE
    out: set[IneligibleReason] = set()
    if r.tools_offered and not known(c.tools, c.model_tools):
        out.add(R.CAPABILITY)
    if r.write_tools and not (known(c.write_tools) and native):
        out.add(R.CAPABILITY)
    if (r.tools_offered or r.untrusted_content) and not (known(c.role_separation) and native):
        out.add(R.CAPABILITY)
    if r.vision and not known(c.vision, c.model_vision):
        out.add(R.CAPABILITY)
    if r.zero_retention and not (known(c.zero_retention) and c.data_collection is DataCollection.DENY):
        out.add(R.PRIVACY)
    if r.regions is not None and c.region not in r.regions:
        out.add(R.REGION)
    if r.no_third_party_router and c.router is Router.THIRD_PARTY:
        out.add(R.ROUTER)
    if r.min_quality > 0 and (c.quality is None or c.quality < r.min_quality):
        out.add(R.QUALITY)
    if r.budget_remaining_micros is not None:
        p = c.price
        if p.input_per_mtok_micros is None or p.output_per_mtok_micros is None:
            out.add(R.PRICE_UNKNOWN)
        else:
            # The output a request may be answered with: the one estimate of it (`routing.policy.budget`).
            output = reserved_output_tokens(r.max_output_tokens, c.max_output_tokens)
            exact = Fraction(
                p.input_per_mtok_micros * r.prompt_tokens + p.output_per_mtok_micros * output, 10**6
            )
            # The reservation is the exact cost rounded up to whole micros.
            if math.ceil(exact) > r.budget_remaining_micros:
                out.add(R.BUDGET)
    if r.deadline_remaining_ms is not None and r.deadline_remaining_ms < c.min_deadline_ms:
        out.add(R.DEADLINE)
    if c.context_window is not None and r.prompt_tokens + r.max_output_tokens > c.context_window:
        out.add(R.CONTEXT_WINDOW)
    if c.health is Health.BLOCKED:
        out.add(R.CIRCUIT_OPEN)
    return out


@settings(max_examples=300, deadline=None)
@given(candidates(), requirements)
def test_eligibility_admits_exactly_the_candidates_that_violate_nothing(candidate, reqs):
    verdict = evaluate(candidate, reqs)
    expected = violated(candidate, reqs)
    assert set(verdict.reasons) == expected
    assert verdict.eligible is (not expected)


@settings(max_examples=100, deadline=None)
@given(candidates(), requirements, st.data())
def test_relaxing_a_requirement_never_excludes_more(candidate, reqs, data):
    # Removing any one requirement can only shrink the set of failed conditions.
    looser = data.draw(
        st.sampled_from(
            [
                Requirements(**{**_fields(reqs), "tools_offered": False}),
                Requirements(**{**_fields(reqs), "zero_retention": False}),
                Requirements(**{**_fields(reqs), "regions": None}),
                Requirements(**{**_fields(reqs), "min_quality": 0.0}),
                Requirements(**{**_fields(reqs), "deadline_remaining_ms": None}),
                Requirements(**{**_fields(reqs), "budget_remaining_micros": None}),
            ]
        )
    )
    assert set(evaluate(candidate, looser).reasons) <= set(evaluate(candidate, reqs).reasons)


def _fields(reqs: Requirements) -> dict:
    return {name: getattr(reqs, name) for name in Requirements.__slots__}


def _unique(cands: list[Candidate]) -> list[Candidate]:
    seen: dict[tuple[int, str], Candidate] = {}
    for c in cands:
        seen.setdefault(c.key, c)
    return list(seen.values())


primary_lists = st.lists(candidates(model="gpt-5"), max_size=6).map(_unique)
fallback_lists = st.lists(candidates(model="gpt-5.1"), max_size=6).map(_unique)
allow_lists = st.sampled_from([["*"], ["gpt-5"], ["gpt-5", "gpt-5.1"]])


@settings(max_examples=150, deadline=None)
@given(primary_lists, fallback_lists, requirements, allow_lists, st.none() | st.integers(1, 6))
def test_plan_dispatches_every_eligible_candidate_and_nothing_else_before_the_cut(
    primary, fallback, reqs, allowed, session
):
    result = build_plan(
        primary=primary,
        fallback=fallback,
        requirements=reqs,
        allowed_models=allowed,
        max_attempts=100,
        session_assignment_id=session,
    )
    assert isinstance(result, Plan)

    def ok(c):
        return ("*" in allowed or c.model in allowed) and not violated(c, reqs)

    dispatchable = {c.key for c in primary if ok(c)}
    # SPEC §5.2: the fallback model only after the primary's, or when every primary is blocked by
    # an upstream_model_unavailable circuit; never for a merely ineligible primary.
    cross_open = (
        not dispatchable
        and bool(primary)
        and all(violated(c, reqs) == {IneligibleReason.CIRCUIT_OPEN} for c in primary)
    )
    assert result.cross_open is cross_open
    if dispatchable or cross_open:
        dispatchable |= {c.key for c in fallback if ok(c)}
    ordered = [c.key for c in result.order]
    assert len(ordered) == len(set(ordered))
    assert set(ordered) == dispatchable
    assert result.beyond_shortlist == ()
    # Nothing disappears silently: every candidate is ordered, reported ineligible, disallowed or
    # held back at the model boundary.
    accounted = (
        ordered
        + [v.candidate.key for v in result.ineligible]
        + [c.key for c in result.disallowed]
        + [c.key for c in result.not_crossed]
    )
    assert sorted(accounted) == sorted(c.key for c in [*primary, *fallback])
    for verdict in result.ineligible:
        assert verdict.reasons and set(verdict.reasons) == violated(verdict.candidate, reqs)
    # Every primary candidate comes before every cross-model one.
    flags = [c.cross_model for c in result.order]
    assert flags == sorted(flags)


@settings(max_examples=100, deadline=None)
@given(primary_lists, fallback_lists, requirements, st.integers(1, 5), st.none() | st.integers(1, 6))
def test_the_shortlist_is_a_prefix_of_the_full_order(primary, fallback, reqs, max_attempts, session):
    common = {"primary": primary, "fallback": fallback, "requirements": reqs, "allowed_models": ["*"]}
    full = build_plan(**common, max_attempts=100, session_assignment_id=session)
    cut = build_plan(**common, max_attempts=max_attempts, session_assignment_id=session)
    assert isinstance(full, Plan) and isinstance(cut, Plan)
    assert cut.order == full.order[:max_attempts]
    assert cut.order + cut.beyond_shortlist == full.order


@settings(max_examples=100, deadline=None)
@given(st.lists(candidates(), max_size=8))
def test_preference_is_a_sorted_permutation(cands):
    result = order(cands)
    assert sorted(map(repr, result)) == sorted(map(repr, cands))
    keys = [preference_key(c) for c in result]
    assert keys == sorted(keys)
    held = [c.health is Health.HELD for c in result]
    assert held == sorted(held, reverse=True)  # the probe this request holds first (SPEC §5.4)
    rest = [c for c in result if c.health is not Health.HELD]
    groups = [group(c) for c in rest]
    assert groups == sorted(groups)  # then health groups (SPEC §5.4)
    for g in (1, 2, 3):
        tiers = [c.tier for c in rest if group(c) == g]
        assert tiers == sorted(tiers)
