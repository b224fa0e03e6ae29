"""One routing decision for one request, from plain values (SPEC §5).

Contract: `decide` is what the proxy, `manage.py routing_explain` and the admin panel all call, so
what operators are shown is what the router does. It takes a RoutingView (everything the selector
loaded for the key's pools and the request's route class) and the request's model, requirements,
hard pins and session, and returns a Decision: the resolution (or auto choice), the cross-model
fallback, and the plan; or the typed error that ends the request before any dispatch.

Probe leases (§5.4): a candidate whose circuit admits a probe (`Health.PROBE`) sorts last until
this request holds its lease. `lease_candidate(decision)` names the one candidate whose lease the
caller should try to take (the first probe-admissible one of the plan, beyond the shortlist too); the
caller takes it with one conditional UPDATE and, if it won, decides again with `held={candidate.key}`:
the holder then tries it first, whatever its tier or weight, and every other request orders it last.

`parse_requirements_header` reads `x-gateway-requirements`, which can only tighten the key's
contract (the caller merges with `eligibility.tighten`).
"""

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from routing.policy.auto import AutoChoice, AutoError, choose_model
from routing.policy.breaker import CircuitSnapshot
from routing.policy.headroom import DEFAULT_FLOOR
from routing.policy.plan import HardPin, Plan, PlanError, build_plan
from routing.policy.resolution import (
    Fallback,
    FallbackReason,
    ModelPolicy,
    Resolution,
    ResolutionError,
    canonicalize,
    cross_model_fallback,
    fallback_for,
    resolve,
)
from routing.policy.types import AUTO_MODEL, Candidate, Health, Requirements, TriState


@dataclass(frozen=True, slots=True)
class KeyPolicy:
    """A gateway key as routing sees it: never the secret or its hash."""

    key_id: int
    name: str
    pool_ids: tuple[int, ...]
    allowed_models: tuple[str, ...]
    requirements: Requirements  # the key's own contract, budget included


@dataclass(frozen=True, slots=True)
class Target:
    """Where and how to dispatch to an assignment. The credential is here only encrypted (`credential`,
    decrypted at dispatch) or as the name of the variable that holds it (read at dispatch)."""

    assignment_id: int
    name: str
    pool_id: int
    adapter: str
    base_url: str
    api_key_env: str
    credential: str = field(default="", repr=False)
    region: str = ""  # where the account's data is processed (Bedrock signs requests for it)
    stream_options: TriState = TriState.UNKNOWN  # whether the server accepts Chat's `stream_options`
    # The share of a rate limit below which the account's answers demote it (`routing.policy.headroom`): its
    # own
    # `headroom_floor`, else the gateway-wide one.
    headroom_floor: float = DEFAULT_FLOOR


@dataclass(frozen=True, slots=True)
class RoutingView:
    policy: ModelPolicy
    max_attempts: int
    routes: Mapping[str, tuple[Candidate, ...]]  # model -> every enabled (assignment, model) of the pools
    auto_models: tuple[str, ...] = ()
    circuits: Mapping[tuple[int, str], CircuitSnapshot] = field(default_factory=dict)
    # assignment id -> its assignment-wide circuit (credential_rejected), when it has one
    wide: Mapping[int, CircuitSnapshot] = field(default_factory=dict)
    targets: Mapping[int, Target] = field(default_factory=dict)  # assignment id -> dispatch target
    # One candidate per enabled assignment, with model "": what a route without a model (the Files
    # API) plans over.
    accounts: tuple[Candidate, ...] = ()


@dataclass(frozen=True, slots=True)
class Decision:
    resolution: Resolution | None = None
    auto: AutoChoice | None = None
    fallback: Fallback | None = None
    plan: Plan | None = None
    error: ResolutionError | AutoError | PlanError | None = None

    @property
    def served_model(self) -> str | None:
        return self.resolution.served if self.resolution else None


def decide(
    view: RoutingView,
    key: KeyPolicy,
    model: str,
    requirements: Requirements,
    *,
    pins: Sequence[HardPin] = (),
    session_assignment_id: int | None = None,
    session_model: str | None = None,
    held: Collection[tuple[int, str]] = (),
    draw: float | None = None,
) -> Decision:
    """`held`: the (assignment, model) whose probe lease this request holds (Health.HELD); `draw`: the
    request's uniform number in [0, 1) that spreads it among equal candidates (`preference.order`),
    None for the deterministic order. A request decided again (after taking a lease) keeps its draw."""
    if held:
        view = replace(
            view,
            routes={
                model: tuple(replace(c, health=Health.HELD) if c.key in held else c for c in candidates)
                for model, candidates in view.routes.items()
            },
        )
    auto: AutoChoice | None = None
    if model == AUTO_MODEL:
        chosen = choose_model(
            auto_models=view.auto_models,
            allowed_models=key.allowed_models,
            routes=view.routes,
            requirements=requirements,
            session_model=session_model,
        )
        if isinstance(chosen, AutoError):
            return Decision(error=chosen)
        auto = chosen
        resolution: Resolution | ResolutionError = Resolution(
            requested=model, canonical=chosen.model, served=chosen.model, fallback=FallbackReason.NONE
        )
    else:
        resolution = resolve(
            model, policy=view.policy, routable=view.routes.keys(), allowed_models=key.allowed_models
        )
    if isinstance(resolution, ResolutionError):
        return Decision(error=resolution)

    fallback = cross_model_fallback(resolution, policy=view.policy, routable=view.routes.keys())
    plan = build_plan(
        primary=view.routes.get(resolution.served, ()),
        fallback=view.routes.get(fallback.model, ()) if fallback else (),
        requirements=requirements,
        allowed_models=key.allowed_models,
        max_attempts=view.max_attempts,
        pins=pins,
        session_assignment_id=session_assignment_id,
        draw=draw,
    )
    if isinstance(plan, PlanError):
        return Decision(resolution=resolution, auto=auto, fallback=fallback, error=plan)
    return Decision(resolution=resolution, auto=auto, fallback=fallback, plan=plan)


def models_decided(
    model: str, *, policy: ModelPolicy, routable: Collection[str], auto_models: Sequence[str]
) -> tuple[str, ...]:
    """Every model whose routes `decide` may plan over for a request of `model` in pools of this
    policy, routes and auto models: the model it canonicalizes to (or each auto model) and that
    model's one fallback, which serves in its place or extends its plan. The request's read takes
    the latency rows of these models only (routing.selectors.Narrowing)."""
    served = auto_models if model == AUTO_MODEL else (canonicalize(model, policy),)
    found = dict.fromkeys(served)
    for name in served:
        fallback = fallback_for(name, policy=policy, routable=routable)
        if fallback is not None:
            found[fallback.model] = None
    return tuple(found)


def lease_candidate(decision: Decision) -> Candidate | None:
    """The candidate whose probe lease this request should try to take: the first probe-admissible
    one of the plan, shortlisted or not (at most one lease per request, so one request cannot hold
    every probe). Beyond the shortlist too: a cooled assignment of a pool larger than
    `retry.max_attempts` is still probed (§5.4), since holding the lease puts it first."""
    return None if decision.plan is None else decision.plan.probe


class RequirementsHeaderError(ValueError):
    """A malformed `x-gateway-requirements` item; `item` is the offending token."""

    def __init__(self, item: str) -> None:
        super().__init__(item)
        self.item = item


def parse_requirements_header(value: str) -> Requirements:
    """`write_tools, vision, zero_retention, region=eu, no_third_party_router, min_quality=0.8`."""
    flags: dict[str, bool] = {}
    regions: set[str] = set()
    min_quality = 0.0
    for raw in value.split(","):
        item = raw.strip()
        if not item:
            continue
        name, _, argument = item.partition("=")
        name = name.strip()
        argument = argument.strip()
        if name in {"write_tools", "vision", "zero_retention", "no_third_party_router"} and not argument:
            flags[name] = True
        elif name == "region" and argument:
            regions.add(argument)
        elif name == "min_quality" and argument:
            try:
                min_quality = float(argument)
            except ValueError:
                raise RequirementsHeaderError(item) from None
            if not 0 <= min_quality <= 1:
                raise RequirementsHeaderError(item)
        else:
            raise RequirementsHeaderError(item)
    return Requirements(
        write_tools=flags.get("write_tools", False),
        vision=flags.get("vision", False),
        zero_retention=flags.get("zero_retention", False),
        no_third_party_router=flags.get("no_third_party_router", False),
        regions=frozenset(regions) if regions else None,
        min_quality=min_quality,
    )
