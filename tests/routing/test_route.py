"""`decide`: one routing decision from plain values, as the proxy and routing_explain call it."""

import pytest

from routing.policy.auto import AutoError, AutoReason
from routing.policy.errors import ErrorCode
from routing.policy.plan import HardPin, PinKind, PlanError
from routing.policy.resolution import FallbackReason, ModelPolicy, ResolutionError
from routing.policy.route import (
    KeyPolicy,
    RequirementsHeaderError,
    RoutingView,
    decide,
    lease_candidate,
    models_decided,
    parse_requirements_header,
)
from routing.policy.types import Candidate, Health, Requirements, TriState

KEY = KeyPolicy(key_id=1, name="k", pool_ids=(1,), allowed_models=("*",), requirements=Requirements())


def cand(aid, model, **kw):
    return Candidate(assignment_id=aid, model=model, assignment=f"a{aid}", **kw)


def view(routes, **kw):
    return RoutingView(
        policy=kw.pop("policy", ModelPolicy()),
        max_attempts=kw.pop("max_attempts", 4),
        routes={m: tuple(cs) for m, cs in routes.items()},
        **kw,
    )


def test_a_configured_model_plans_its_own_candidates_then_its_family_fallback():
    v = view({"gpt-5.2": [cand(1, "gpt-5.2")], "gpt-5.1": [cand(2, "gpt-5.1")]})
    d = decide(v, KEY, "gpt-5.2", Requirements())
    assert d.served_model == "gpt-5.2"
    assert [(c.assignment_id, c.cross_model) for c in d.plan.order] == [(1, False), (2, True)]
    assert d.fallback.reason is FallbackReason.FAMILY


def test_an_unrouted_model_is_served_by_its_fallback_with_no_second_hop():
    v = view(
        {"claude-opus-4-8": [cand(1, "claude-opus-4-8")], "claude-opus-4-1": [cand(2, "claude-opus-4-1")]}
    )
    d = decide(v, KEY, "claude-opus-5", Requirements())
    assert (d.served_model, d.resolution.fallback) == ("claude-opus-4-8", FallbackReason.FAMILY)
    assert d.fallback is None
    assert [c.assignment_id for c in d.plan.order] == [1]


def test_a_key_allowed_only_the_requested_model_is_denied_not_downgraded():
    v = view({"claude-opus-4-8": [cand(1, "claude-opus-4-8")]})
    key = KeyPolicy(1, "k", (1,), ("claude-opus-5",), Requirements())
    d = decide(v, key, "claude-opus-5", Requirements())
    assert d.error == ResolutionError(ErrorCode.PERMISSION_DENIED, "claude-opus-4-8")
    assert d.plan is None


def test_auto_picks_the_ready_model_and_plans_it():
    v = view(
        {"gpt-5": [cand(1, "gpt-5", health=Health.COOLING)], "gpt-5-mini": [cand(2, "gpt-5-mini")]},
        auto_models=("gpt-5", "gpt-5-mini"),
    )
    d = decide(v, KEY, "auto", Requirements())
    assert (d.auto.model, d.auto.reason, d.served_model) == ("gpt-5-mini", AutoReason.READY, "gpt-5-mini")
    assert [c.assignment_id for c in d.plan.order] == [2]


def test_auto_keeps_a_session_when_nothing_is_ready():
    v = view(
        {
            "gpt-5": [cand(1, "gpt-5", health=Health.COOLING)],
            "gpt-5-mini": [cand(2, "gpt-5-mini", health=Health.COOLING)],
        },
        auto_models=("gpt-5", "gpt-5-mini"),
    )
    d = decide(v, KEY, "auto", Requirements(), session_model="gpt-5-mini")
    assert (d.served_model, d.auto.reason) == ("gpt-5-mini", AutoReason.SESSION_KEPT)


def test_auto_with_no_fitting_model_is_a_typed_error():
    v = view({"gpt-5": [cand(1, "gpt-5", vision=TriState.FALSE)]}, auto_models=("gpt-5",))
    d = decide(v, KEY, "auto", Requirements(vision=True))
    assert isinstance(d.error, AutoError) and d.error.code is ErrorCode.NO_ELIGIBLE_BACKEND


def test_a_hard_pin_never_escapes_and_a_gone_file_is_a_conflict():
    v = view({"gpt-5": [cand(1, "gpt-5"), cand(2, "gpt-5")]})
    d = decide(v, KEY, "gpt-5", Requirements(), pins=[HardPin(PinKind.RESPONSE, 2)])
    assert [c.assignment_id for c in d.plan.order] == [2]
    d = decide(v, KEY, "gpt-5", Requirements(), pins=[HardPin(PinKind.FILE, None)])
    assert isinstance(d.error, PlanError) and d.error.code == "file_assignment_conflict"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("", Requirements()),
        ("write_tools, vision", Requirements(write_tools=True, vision=True)),
        (
            "zero_retention,no_third_party_router",
            Requirements(zero_retention=True, no_third_party_router=True),
        ),
        ("region=eu,region=us", Requirements(regions=frozenset({"eu", "us"}))),
        ("min_quality=0.8", Requirements(min_quality=0.8)),
        (" , vision ,", Requirements(vision=True)),
    ],
)
def test_the_requirements_header(header, expected):
    assert parse_requirements_header(header) == expected


@pytest.mark.parametrize(
    "header", ["teleport", "vision=yes", "region=", "min_quality=high", "min_quality=1.5", "min_quality=nan"]
)
def test_a_malformed_requirements_header_names_the_item(header):
    with pytest.raises(RequirementsHeaderError) as info:
        parse_requirements_header(header)
    assert info.value.item == header.strip()


@pytest.mark.parametrize("size", [2, 5, 50])
def test_a_cooled_assignment_is_probed_first_whatever_the_pool_size_and_the_shortlist(size):
    # SPEC §5.4 (2026-12-05): with more accounts than max_attempts, a cooled account fell past the cut
    # and no request ever took its lease. The last, lowest-priority account is the cooled one.
    cands = [cand(i, "gpt-5") for i in range(1, size)] + [cand(size, "gpt-5", tier=3, health=Health.PROBE)]
    v = view({"gpt-5": cands}, max_attempts=2)
    d = decide(v, KEY, "gpt-5", Requirements(), draw=0.5)
    assert lease_candidate(d).assignment_id == size
    held = decide(v, KEY, "gpt-5", Requirements(), draw=0.5, held={(size, "gpt-5")})
    assert held.plan.order[0].assignment_id == size  # the lease holder tries it first
    assert held.plan.order[0].health is Health.HELD
    assert len(held.plan.order) == 2


def test_a_request_decided_again_keeps_its_draw():
    v = view({"gpt-5": [cand(1, "gpt-5"), cand(2, "gpt-5"), cand(3, "gpt-5", health=Health.PROBE)]})
    for draw in (0.1, 0.9):
        first = decide(v, KEY, "gpt-5", Requirements(), draw=draw).plan.order[0].assignment_id
        again = decide(v, KEY, "gpt-5", Requirements(), draw=draw, held={(3, "gpt-5")}).plan.order
        assert [c.assignment_id for c in again][:2] == [3, first]


class _Looked(dict):
    """Routes that note every model whose candidates are taken from them."""

    def __init__(self, routes):
        super().__init__(routes)
        self.looked: set[str] = set()

    def __getitem__(self, model):
        self.looked.add(model)
        return super().__getitem__(model)

    def get(self, model, default=None):
        self.looked.add(model)
        return super().get(model, default)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("gpt-5.2", ("gpt-5.2", "gpt-5.1")),  # routed, with its family fallback
        ("latest", ("gpt-5.2", "gpt-5.1")),  # an alias: its target's
        ("gpt-6", ("gpt-6", "gpt-5.2")),  # unrouted: the family's highest below serves
        ("claude-opus-5", ("claude-opus-5", "o3")),  # unrouted, explicit fallback
        ("o3", ("o3",)),
        ("nothing", ("nothing",)),
        ("auto", ("gpt-5.2", "o3", "gpt-5.1")),  # each auto model and its fallback
    ],
)
def test_models_decided_names_every_model_decide_plans_over(model, expected):
    """The request's read takes only these models' latency rows (routing.selectors.Narrowing): a model
    decide looks up that is missing here would be ordered without its latency."""
    names = ("gpt-5.2", "gpt-5.1", "gpt-5-mini", "o3", "gpt-4o", "text-embedding-3")
    policy = ModelPolicy(aliases={"latest": "gpt-5.2"}, fallbacks={"claude-opus-5": "o3"})
    routes = _Looked({m: (cand(i, m),) for i, m in enumerate(names, 1)})
    v = RoutingView(policy=policy, max_attempts=4, routes=routes, auto_models=("gpt-5.2", "o3"))

    decide(v, KEY, model, Requirements())

    found = models_decided(model, policy=policy, routable=routes.keys(), auto_models=v.auto_models)
    assert found == expected
    assert routes.looked <= set(found)
