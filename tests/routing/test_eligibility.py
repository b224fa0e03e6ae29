"""SPEC §5.3: eligibility is a gate; each rule at and just past its boundary. Also the one cost
function (reservation and recorded cost)."""

import pytest

from routing.policy.budget import DEFAULT_MAX_OUTPUT_TOKENS
from routing.policy.eligibility import evaluate, fit_reasons, gate, overlay, tighten
from routing.policy.pricing import cost_micros
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

T, F, U = TriState.TRUE, TriState.FALSE, TriState.UNKNOWN
NATIVE, EMULATED = ToolRepresentation.NATIVE, ToolRepresentation.EMULATED
R = IneligibleReason


def capable(**overrides) -> Candidate:
    """A candidate that meets every requirement these tests ask for, unless overridden."""
    fields = {
        "assignment_id": 1,
        "model": "gpt-5",
        "tools": T,
        "write_tools": T,
        "vision": T,
        "role_separation": T,
        "tool_representation": NATIVE,
        "zero_retention": T,
        "data_collection": DataCollection.DENY,
        "region": "eu",
        "quality": 0.9,
        "min_deadline_ms": 500,
        "context_window": 10_000,
        "price": Price(1_000_000, 2_000_000),
    }
    fields.update(overrides)
    return Candidate(**fields)


def reasons(candidate: Candidate, **requirements) -> tuple[IneligibleReason, ...]:
    return evaluate(candidate, Requirements(**requirements)).reasons


def test_no_requirements_admit_a_candidate_with_nothing_declared():
    verdict = evaluate(Candidate(assignment_id=1, model="m"), Requirements())
    assert verdict.eligible
    assert verdict.reason is None
    assert verdict.reservation_micros is None


@pytest.mark.parametrize(
    ("requirement", "overrides", "expected"),
    [
        # tools offered: tools true, plus role separation and native representation
        ({"tools_offered": True}, {}, ()),
        ({"tools_offered": True}, {"tools": U}, (R.CAPABILITY,)),
        ({"tools_offered": True}, {"tools": F}, (R.CAPABILITY,)),
        ({"tools_offered": True}, {"role_separation": U}, (R.CAPABILITY,)),
        ({"tools_offered": True}, {"tool_representation": EMULATED}, (R.CAPABILITY,)),
        ({"tools_offered": True}, {"tool_representation": ToolRepresentation.UNKNOWN}, (R.CAPABILITY,)),
        # the catalog's per-model value overrides the assignment's when known
        ({"tools_offered": True}, {"tools": U, "model_tools": T}, ()),
        ({"tools_offered": True}, {"tools": T, "model_tools": F}, (R.CAPABILITY,)),
        # write tools: write_tools true and native; an emulated route is out however good its text
        ({"write_tools": True}, {}, ()),
        ({"write_tools": True}, {"write_tools": U}, (R.CAPABILITY,)),
        ({"write_tools": True}, {"write_tools": F}, (R.CAPABILITY,)),
        ({"write_tools": True}, {"tool_representation": EMULATED}, (R.CAPABILITY,)),
        # untrusted content (tool results present): role separation and native representation
        ({"untrusted_content": True}, {"tools": U, "write_tools": U}, ()),
        ({"untrusted_content": True}, {"role_separation": U}, (R.CAPABILITY,)),
        ({"untrusted_content": True}, {"role_separation": F}, (R.CAPABILITY,)),
        ({"untrusted_content": True}, {"tool_representation": EMULATED}, (R.CAPABILITY,)),
        # without tools or untrusted content, role separation is not required
        ({}, {"role_separation": U, "tool_representation": EMULATED}, ()),
        # vision
        ({"vision": True}, {}, ()),
        ({"vision": True}, {"vision": U}, (R.CAPABILITY,)),
        ({"vision": True}, {"vision": F}, (R.CAPABILITY,)),
        ({"vision": True}, {"vision": U, "model_vision": T}, ()),
        ({"vision": True}, {"vision": T, "model_vision": F}, (R.CAPABILITY,)),
        ({"vision": True}, {"vision": F, "model_vision": U}, (R.CAPABILITY,)),
        # privacy: zero retention and data collection denied, both known
        ({"zero_retention": True}, {}, ()),
        ({"zero_retention": True}, {"zero_retention": U}, (R.PRIVACY,)),
        ({"zero_retention": True}, {"zero_retention": F}, (R.PRIVACY,)),
        ({"zero_retention": True}, {"data_collection": DataCollection.UNKNOWN}, (R.PRIVACY,)),
        ({"zero_retention": True}, {"data_collection": DataCollection.ALLOW}, (R.PRIVACY,)),
        ({}, {"zero_retention": U, "data_collection": DataCollection.ALLOW}, ()),
        # region: None is any; a set is exact; an undeclared region is in no set
        ({"regions": None}, {"region": ""}, ()),
        ({"regions": frozenset({"eu"})}, {}, ()),
        ({"regions": frozenset({"eu", "us"})}, {"region": "us"}, ()),
        ({"regions": frozenset({"us"})}, {}, (R.REGION,)),
        ({"regions": frozenset({"eu"})}, {"region": ""}, (R.REGION,)),
        ({"regions": frozenset()}, {}, (R.REGION,)),
        # router
        ({"no_third_party_router": True}, {"router": Router.DIRECT}, ()),
        ({"no_third_party_router": True}, {"router": Router.THIRD_PARTY}, (R.ROUTER,)),
        ({}, {"router": Router.THIRD_PARTY}, ()),
        # quality: equal is enough, unknown never is
        ({"min_quality": 0.9}, {"quality": 0.9}, ()),
        ({"min_quality": 0.9}, {"quality": 0.89}, (R.QUALITY,)),
        ({"min_quality": 0.1}, {"quality": None}, (R.QUALITY,)),
        ({"min_quality": 0}, {"quality": None}, ()),
        # circuit: only a blocked route is out; cooling and probing routes stay eligible
        ({}, {"health": Health.BLOCKED}, (R.CIRCUIT_OPEN,)),
        ({}, {"health": Health.COOLING}, ()),
        ({}, {"health": Health.PROBE}, ()),
        ({}, {"health": Health.FAILING}, ()),
    ],
)
def test_rule(requirement, overrides, expected):
    assert reasons(capable(**overrides), **requirement) == expected


@pytest.mark.parametrize(
    ("remaining", "expected"),
    [(501, ()), (500, ()), (499, (R.DEADLINE,)), (0, (R.DEADLINE,)), (None, ())],
)
def test_deadline_boundary(remaining, expected):
    assert reasons(capable(min_deadline_ms=500), deadline_remaining_ms=remaining) == expected


def test_zero_min_deadline_admits_an_exhausted_deadline_only_at_zero():
    assert reasons(capable(min_deadline_ms=0), deadline_remaining_ms=0) == ()
    assert reasons(capable(min_deadline_ms=0), deadline_remaining_ms=-1) == (R.DEADLINE,)


@pytest.mark.parametrize(
    ("prompt", "output", "expected"),
    [(600, 400, ()), (600, 401, (R.CONTEXT_WINDOW,)), (1001, 0, (R.CONTEXT_WINDOW,)), (0, 0, ())],
)
def test_context_window_boundary(prompt, output, expected):
    candidate = capable(context_window=1000)
    assert reasons(candidate, prompt_tokens=prompt, max_output_tokens=output) == expected


def test_unknown_context_window_is_eligible():
    assert reasons(capable(context_window=None), prompt_tokens=10**9) == ()


# Reservation for 1000 prompt + 500 output tokens at 1 micro/token in, 2 micros/token out:
# 1_000_000*1000/1e6 + 2_000_000*500/1e6 = 1000 + 1000 = 2000 micros.
BUDGET_CASE = {"prompt_tokens": 1000, "max_output_tokens": 500}


@pytest.mark.parametrize(
    ("budget", "expected"),
    [(2001, ()), (2000, ()), (1999, (R.BUDGET,)), (0, (R.BUDGET,)), (None, ())],
)
def test_budget_boundary(budget, expected):
    verdict = evaluate(capable(), Requirements(budget_remaining_micros=budget, **BUDGET_CASE))
    assert verdict.reasons == expected
    assert verdict.reservation_micros == 2000


@pytest.mark.parametrize(
    ("asked", "model_limit", "output"),
    [(500, 64_000, 500), (0, 64_000, 64_000), (0, None, DEFAULT_MAX_OUTPUT_TOKENS)],
    ids=["its-own-limit", "the-models-limit", "the-default"],
)
def test_a_request_without_an_output_limit_reserves_for_its_models(asked, model_limit, output):
    """Issue 45 finding 6: a reservation that covered the prompt alone let concurrent requests pass a
    budget by their whole output. It covers the most output the request can be answered with; the
    context-window check still reads the request's own limit only."""
    candidate = capable(max_output_tokens=model_limit, context_window=2000)
    verdict = evaluate(candidate, Requirements(prompt_tokens=1000, max_output_tokens=asked))
    assert verdict.reservation_micros == 1000 + 2 * output
    assert verdict.eligible  # 1000 + 64,000 would not fit the window: it reads the request's own limit


@pytest.mark.parametrize(
    "price",
    [Price(None, None), Price(1_000_000, None), Price(None, 2_000_000)],
)
def test_unknown_price_with_a_budget_is_price_unknown_never_zero(price):
    verdict = evaluate(capable(price=price), Requirements(budget_remaining_micros=10**12, **BUDGET_CASE))
    assert verdict.reasons == (R.PRICE_UNKNOWN,)
    assert verdict.reservation_micros is None


def test_unknown_price_without_a_budget_is_eligible():
    verdict = evaluate(capable(price=Price()), Requirements(**BUDGET_CASE))
    assert verdict.eligible
    assert verdict.reservation_micros is None


def test_explicit_zero_price_fits_an_exhausted_budget():
    verdict = evaluate(capable(price=Price(0, 0)), Requirements(budget_remaining_micros=0, **BUDGET_CASE))
    assert verdict.eligible
    assert verdict.reservation_micros == 0


def test_every_failed_requirement_is_reported_in_declared_order():
    candidate = capable(
        tools=U,
        zero_retention=U,
        region="us",
        router=Router.THIRD_PARTY,
        quality=None,
        price=Price(),
        min_deadline_ms=1000,
        context_window=10,
        health=Health.BLOCKED,
    )
    verdict = evaluate(
        candidate,
        Requirements(
            tools_offered=True,
            zero_retention=True,
            regions=frozenset({"eu"}),
            no_third_party_router=True,
            min_quality=0.5,
            prompt_tokens=100,
            deadline_remaining_ms=999,
            budget_remaining_micros=5,
        ),
    )
    assert verdict.reasons == (
        R.CAPABILITY,
        R.PRIVACY,
        R.REGION,
        R.ROUTER,
        R.QUALITY,
        R.PRICE_UNKNOWN,
        R.DEADLINE,
        R.CONTEXT_WINDOW,
        R.CIRCUIT_OPEN,
    )
    assert verdict.reason is R.CAPABILITY


def test_reason_values_are_the_no_eligible_backend_params():
    assert [r.value for r in IneligibleReason] == [
        "capability",
        "privacy",
        "region",
        "router",
        "quality",
        "budget",
        "price_unknown",
        "deadline",
        "context_window",
        "circuit_open",
    ]


def test_gate_keeps_input_order_and_one_verdict_per_candidate():
    a, b, c = capable(assignment_id=1), capable(assignment_id=2, vision=U), capable(assignment_id=3)
    verdicts = gate([a, b, c], Requirements(vision=True))
    assert [v.candidate.assignment_id for v in verdicts] == [1, 2, 3]
    assert [v.eligible for v in verdicts] == [True, False, True]


@pytest.mark.parametrize(
    ("overrides", "requirement", "expected"),
    [
        ({}, {"vision": True, "prompt_tokens": 10_000}, ()),
        ({"vision": U}, {"vision": True}, (R.CAPABILITY,)),
        ({}, {"prompt_tokens": 10_001}, (R.CONTEXT_WINDOW,)),
        # fit is media and context only: the rest of the contract is not its business
        ({"tools": U, "health": Health.BLOCKED, "region": "us"}, {"tools_offered": True}, ()),
    ],
)
def test_fit_reasons(overrides, requirement, expected):
    assert fit_reasons(capable(**overrides), Requirements(**requirement)) == expected


@pytest.mark.parametrize(
    ("model", "assignment", "expected"),
    [(T, F, T), (F, T, F), (U, T, T), (U, F, F), (U, U, U)],
)
def test_overlay(model, assignment, expected):
    assert overlay(model, assignment) is expected


def test_tighten_only_ever_adds_strictness():
    key = Requirements(
        zero_retention=False,
        regions=frozenset({"eu", "us"}),
        min_quality=0.5,
        deadline_remaining_ms=10_000,
        budget_remaining_micros=None,
    )
    header = Requirements(
        write_tools=True,
        zero_retention=True,
        regions=frozenset({"eu", "ap"}),
        no_third_party_router=True,
        min_quality=0.3,
        deadline_remaining_ms=20_000,
    )
    merged = tighten(key, header)
    assert merged.write_tools and merged.zero_retention and merged.no_third_party_router
    assert merged.regions == frozenset({"eu"})
    assert merged.min_quality == 0.5
    assert merged.deadline_remaining_ms == 10_000
    assert merged.budget_remaining_micros is None


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (None, None, None),
        (None, frozenset({"eu"}), frozenset({"eu"})),
        (frozenset({"eu"}), None, frozenset({"eu"})),
        (frozenset({"eu"}), frozenset({"us"}), frozenset()),  # disjoint: nothing is allowed, not anything
    ],
)
def test_tighten_regions(a, b, expected):
    assert tighten(Requirements(regions=a), Requirements(regions=b)).regions == expected


def test_tighten_budget_and_deadline_take_the_smaller_known_value():
    merged = tighten(Requirements(budget_remaining_micros=7), Requirements(deadline_remaining_ms=3))
    assert (merged.budget_remaining_micros, merged.deadline_remaining_ms) == (7, 3)
    merged = tighten(Requirements(budget_remaining_micros=7), Requirements(budget_remaining_micros=5))
    assert merged.budget_remaining_micros == 5


@pytest.mark.parametrize(
    ("price", "tokens_in", "tokens_out", "expected"),
    [
        (Price(1_250_000, 10_000_000), 1000, 100, 1250 + 1000),
        (Price(1, 0), 1, 0, 1),  # 1e-6 micro rounds up to one whole micro
        (Price(1, 1), 0, 0, 0),
        (Price(3, 0), 999_999, 0, 3),  # 2.999997 -> 3
        (Price(3, 0), 1_000_000, 0, 3),  # exact: not rounded past
        (Price(0, 0), 10**9, 10**9, 0),
        (Price(None, 1), 0, 0, None),
        (Price(1, None), 0, 0, None),
        (Price(), 10, 10, None),
    ],
)
def test_cost_micros(price, tokens_in, tokens_out, expected):
    assert cost_micros(price, input_tokens=tokens_in, output_tokens=tokens_out) == expected


def test_cost_is_exact_for_large_integers():
    # Float arithmetic would lose the final micro here.
    price = Price(10**15 + 1, 0)
    assert cost_micros(price, input_tokens=10**6, output_tokens=0) == 10**15 + 1
