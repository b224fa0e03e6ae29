"""model="auto": choosing the model before the plan is built (SPEC §5.5).

Contract: `choose_model` takes the pools' `auto_models` in preference order and each model's
candidates (with their health for the request's route class), and returns an AutoChoice or a typed
AutoError.

- candidates: the auto models that have a route, that the key may use, and that the request can
  fit (media and context: at least one route passes `eligibility.fit_reasons`);
- ready pool: candidates with at least one fully eligible route whose circuit is closed;
- pick the ready pool's first model, else the first candidate (availability: an all-cooling pool
  still serves, through the explicit-model plan that keeps cooling routes last);
- with a session's cached model: keep it unless it is missing from the candidates (gone, not
  allowed, or unable to fit the media/context) or a NON-EMPTY ready pool excludes it. An empty ready
  pool (everything cooling) never moves a session: switching would buy no healthier route and
  would break the agent's cache locality.

The chosen model then goes through the ordinary plan (`routing.policy.plan.build_plan`).
"""

import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from routing.policy.eligibility import evaluate, fit_reasons
from routing.policy.errors import ErrorCode
from routing.policy.resolution import is_allowed
from routing.policy.types import Candidate, IneligibleReason, Requirements


class AutoReason(enum.StrEnum):
    READY = "ready"  # the ready pool's first model
    AVAILABILITY = "availability"  # no ready model: the first candidate
    SESSION_KEPT = "session_kept"
    SESSION_MOVED = "session_moved"  # a non-empty ready pool excludes the cached model
    SESSION_RECLASSIFIED = "session_reclassified"  # the cached model is missing or cannot fit


@dataclass(frozen=True, slots=True)
class AutoChoice:
    model: str
    reason: AutoReason
    candidates: tuple[str, ...]
    ready: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AutoError:
    code: ErrorCode
    reason: IneligibleReason | None = None  # for no_eligible_backend: capability or context_window


def _fits(routes: Sequence[Candidate], requirements: Requirements) -> tuple[bool, IneligibleReason | None]:
    last: IneligibleReason | None = None
    for candidate in routes:
        reasons = fit_reasons(candidate, requirements)
        if not reasons:
            return True, None
        last = reasons[0]
    return False, last


def _ready(routes: Sequence[Candidate], requirements: Requirements) -> bool:
    return any(c.health.closed and evaluate(c, requirements).eligible for c in routes)


def choose_model(
    *,
    auto_models: Sequence[str],
    allowed_models: Collection[str],
    routes: Mapping[str, Sequence[Candidate]],
    requirements: Requirements,
    session_model: str | None = None,
) -> AutoChoice | AutoError:
    routed = [m for m in dict.fromkeys(auto_models) if routes.get(m)]
    if not routed:
        return AutoError(ErrorCode.MODEL_NOT_FOUND)
    usable = [m for m in routed if is_allowed(m, allowed_models)]
    if not usable:
        return AutoError(ErrorCode.PERMISSION_DENIED)

    candidates: list[str] = []
    last_reason: IneligibleReason | None = None
    for model in usable:
        fits, reason = _fits(routes[model], requirements)
        if fits:
            candidates.append(model)
        else:
            last_reason = reason
    if not candidates:
        return AutoError(ErrorCode.NO_ELIGIBLE_BACKEND, last_reason)
    ready = [m for m in candidates if _ready(routes[m], requirements)]

    def choice(model: str, reason: AutoReason) -> AutoChoice:
        return AutoChoice(model=model, reason=reason, candidates=tuple(candidates), ready=tuple(ready))

    if session_model is not None:
        if session_model in candidates:
            if not ready or session_model in ready:
                return choice(session_model, AutoReason.SESSION_KEPT)
            return choice(ready[0], AutoReason.SESSION_MOVED)
        return choice(ready[0] if ready else candidates[0], AutoReason.SESSION_RECLASSIFIED)
    if ready:
        return choice(ready[0], AutoReason.READY)
    return choice(candidates[0], AutoReason.AVAILABILITY)
