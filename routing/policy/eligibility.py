"""Eligibility: a gate, not a weight (SPEC §5.3).

Contract: `evaluate(candidate, requirements)` returns a Verdict listing every requirement the
candidate fails, as IneligibleReason values (the `no_eligible_backend` params), in the enum's
declared order; an empty list is eligible. Rules:

- an unknown capability or privacy fact never meets a requirement;
- tools offered: `tools` true (the catalog's per-model value overrides the assignment's when known);
- write_tools: `write_tools` true and native tool representation;
- tools offered or untrusted content: `role_separation` true and native tool representation;
- vision: `vision` true (per-model value overrides when known);
- zero_retention: `zero_retention` true and `data_collection` deny;
- regions: the candidate's region is in the allowed set (None: any);
- no third-party router; quality known and >= min_quality (min_quality 0: no requirement);
- budget: with a budget, both prices known (else price_unknown) and the reservation
  (`budget.reservation_micros`: estimated prompt + the request's max output tokens, else the model's
  output limit) <= remaining budget;
  without a budget an unknown price is fine;
- deadline: remaining ms >= max(min_deadline_ms, min_attempt_ms) (equal is eligible): no attempt is
  dispatched with less of the one deadline left than that floor;
- context: estimated tokens <= context_window (unknown window: eligible);
- circuit: a BLOCKED candidate (open for upstream_model_unavailable, no probe admissible).

`tighten` merges two requirement sets so that the result is at least as strict as both: request
headers can only tighten the key's contract.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter

from routing.policy.budget import reservation_micros
from routing.policy.types import (
    Candidate,
    DataCollection,
    Health,
    IneligibleReason,
    Requirements,
    Router,
    ToolRepresentation,
    TriState,
)


@dataclass(frozen=True, slots=True)
class Verdict:
    candidate: Candidate
    reasons: tuple[IneligibleReason, ...]
    reservation_micros: int | None  # None: unknown price

    @property
    def eligible(self) -> bool:
        return not self.reasons

    @property
    def reason(self) -> IneligibleReason | None:
        """The one reason reported for this candidate (the first in the declared order)."""
        return self.reasons[0] if self.reasons else None


def overlay(model_value: TriState, assignment_value: TriState) -> TriState:
    """The catalog's per-model value when it is known, else the assignment's."""
    return model_value if model_value is not TriState.UNKNOWN else assignment_value


def _carries(c: Candidate, r: Requirements) -> bool:
    return r.adapters is None or c.adapter in r.adapters


def _capability_ok(c: Candidate, r: Requirements) -> bool:
    if not _carries(c, r):
        return False
    native = c.tool_representation is ToolRepresentation.NATIVE
    if r.tools_offered and overlay(c.model_tools, c.tools) is not TriState.TRUE:
        return False
    if r.write_tools and not (c.write_tools is TriState.TRUE and native):
        return False
    if (r.tools_offered or r.untrusted_content) and not (c.role_separation is TriState.TRUE and native):
        return False
    return not (r.vision and overlay(c.model_vision, c.vision) is not TriState.TRUE)


def _privacy_ok(c: Candidate, r: Requirements) -> bool:
    if not r.zero_retention:
        return True
    return c.zero_retention is TriState.TRUE and c.data_collection is DataCollection.DENY


def _quality_ok(c: Candidate, r: Requirements) -> bool:
    if r.min_quality <= 0:
        return True
    return c.quality is not None and c.quality >= r.min_quality


def _context_ok(c: Candidate, r: Requirements) -> bool:
    return c.context_window is None or r.estimated_tokens <= c.context_window


def fit_reasons(candidate: Candidate, requirements: Requirements) -> tuple[IneligibleReason, ...]:
    """Whether the request can fit this candidate at all, by media and context (§5.5)."""
    reasons = []
    vision = overlay(candidate.model_vision, candidate.vision)
    if not _carries(candidate, requirements) or (requirements.vision and vision is not TriState.TRUE):
        reasons.append(IneligibleReason.CAPABILITY)
    if not _context_ok(candidate, requirements):
        reasons.append(IneligibleReason.CONTEXT_WINDOW)
    return tuple(reasons)


_REASONS = tuple(IneligibleReason)  # in their declared order; iterating the enum itself is slow


def evaluate(candidate: Candidate, requirements: Requirements) -> Verdict:
    c, r = candidate, requirements
    reservation = reservation_micros(c, r)
    failed: set[IneligibleReason] = set()
    if not _capability_ok(c, r):
        failed.add(IneligibleReason.CAPABILITY)
    if not _privacy_ok(c, r):
        failed.add(IneligibleReason.PRIVACY)
    if r.regions is not None and c.region not in r.regions:
        failed.add(IneligibleReason.REGION)
    if r.no_third_party_router and c.router is Router.THIRD_PARTY:
        failed.add(IneligibleReason.ROUTER)
    if not _quality_ok(c, r):
        failed.add(IneligibleReason.QUALITY)
    if r.budget_remaining_micros is not None:
        if reservation is None:
            failed.add(IneligibleReason.PRICE_UNKNOWN)
        elif reservation > r.budget_remaining_micros:
            failed.add(IneligibleReason.BUDGET)
    if r.deadline_remaining_ms is not None and r.deadline_remaining_ms < max(
        c.min_deadline_ms, r.min_attempt_ms
    ):
        failed.add(IneligibleReason.DEADLINE)
    if not _context_ok(c, r):
        failed.add(IneligibleReason.CONTEXT_WINDOW)
    if c.health is Health.BLOCKED:
        failed.add(IneligibleReason.CIRCUIT_OPEN)
    reasons = tuple(reason for reason in _REASONS if reason in failed) if failed else ()
    return Verdict(candidate=c, reasons=reasons, reservation_micros=reservation)


# Every field of a candidate that `evaluate` reads (its reservation's included): two candidates equal on
# these get the same verdict for the same requirements. A pool's accounts share a few contracts, so the
# gate evaluates each contract once per request rather than each of its candidates (issue 49). A new rule
# that reads another field lists it here (tests/routing/test_equivalence.py fails until it does).
GATED_FIELDS = (
    "adapter",
    "tool_representation",
    "model_tools",
    "tools",
    "write_tools",
    "role_separation",
    "model_vision",
    "vision",
    "zero_retention",
    "data_collection",
    "region",
    "router",
    "quality",
    "min_deadline_ms",
    "context_window",
    "max_output_tokens",
    "health",
    "price.input_per_mtok_micros",
    "price.output_per_mtok_micros",
    "price.cached_input_per_mtok_micros",
    "price.cache_write_per_mtok_micros",
)
# A candidate's contract as the gate reads it: two candidates equal on it get the same verdict.
contract = attrgetter(*GATED_FIELDS)


def gate_reasons(
    candidates: Sequence[Candidate], requirements: Requirements
) -> list[tuple[tuple[IneligibleReason, ...], int | None]]:
    """Each candidate's (reasons, reservation) as `evaluate` finds them, without a Verdict apiece: what
    the plan needs of the eligible ones is only that they are."""
    found: dict[tuple[object, ...], tuple[tuple[IneligibleReason, ...], int | None]] = {}
    out = []
    for c in candidates:
        profile = contract(c)
        hit = found.get(profile)
        if hit is None:
            verdict = evaluate(c, requirements)
            hit = found[profile] = (verdict.reasons, verdict.reservation_micros)
        out.append(hit)
    return out


def gate(candidates: Iterable[Candidate], requirements: Requirements) -> tuple[Verdict, ...]:
    listed = candidates if isinstance(candidates, list | tuple) else list(candidates)
    return tuple(
        Verdict(candidate=c, reasons=reasons, reservation_micros=reservation)
        for c, (reasons, reservation) in zip(listed, gate_reasons(listed, requirements), strict=True)
    )


def _min_optional(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _both(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
    """Two restrictions to a set at once (None: unrestricted)."""
    if a is None:
        return b
    if b is None:
        return a
    return a & b


def tighten(base: Requirements, extra: Requirements) -> Requirements:
    """The strictest combination of two requirement sets (headers never loosen the key)."""
    return Requirements(
        tools_offered=base.tools_offered or extra.tools_offered,
        write_tools=base.write_tools or extra.write_tools,
        untrusted_content=base.untrusted_content or extra.untrusted_content,
        vision=base.vision or extra.vision,
        zero_retention=base.zero_retention or extra.zero_retention,
        regions=_both(base.regions, extra.regions),
        no_third_party_router=base.no_third_party_router or extra.no_third_party_router,
        min_quality=max(base.min_quality, extra.min_quality),
        prompt_tokens=max(base.prompt_tokens, extra.prompt_tokens),
        max_output_tokens=max(base.max_output_tokens, extra.max_output_tokens),
        deadline_remaining_ms=_min_optional(base.deadline_remaining_ms, extra.deadline_remaining_ms),
        min_attempt_ms=max(base.min_attempt_ms, extra.min_attempt_ms),
        budget_remaining_micros=_min_optional(base.budget_remaining_micros, extra.budget_remaining_micros),
        adapters=_both(base.adapters, extra.adapters),
    )
