"""Model resolution before authorization (SPEC §5.1) and the cross-model fallback (§5.2).

Contract:
- `resolve` canonicalizes through `aliases` (one hop). When the canonical model has no route in
  the key's pools (`routable`), it substitutes the explicit `fallbacks` entry, else (when
  `family` is on) the highest routable version strictly below it in the same name family. An
  explicit entry always wins over the family, and an explicit entry whose target has no route
  gives model_not_found (the operator chose that target; we do not guess another). One hop.
  Then the SERVED model is authorized against the key's allow-list: a key allowed only the
  unrouted requested model is denied, never downgraded. The result is a Resolution or a typed
  ResolutionError, never a message.
- `fallback_for` names the cross-model fallback of a routable model (explicit entry first, else
  family), and `cross_model_fallback` applies it to a Resolution: none when the resolution
  already used its one hop.
- `split_version` splits `claude-opus-4-8` into (`claude-opus`, (4, 8)) and `gpt-5.2` into
  (`gpt`, (5, 2)); a name whose tail is not numeric (`claude-sonnet-4-6-bedrock`) has no
  version and never takes part in family fallback, as requester or as candidate.
- `is_allowed` is the one allow-list predicate (`["*"]` or an explicit list).

`model="auto"` is not resolved here (see `routing.policy.auto`).
"""

import enum
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from routing.policy.errors import ErrorCode

WILDCARD = "*"

_SEPARATOR = re.compile(r"[-.]")


class FallbackReason(enum.StrEnum):
    NONE = "none"
    EXPLICIT = "explicit"
    FAMILY = "family"


@dataclass(frozen=True, slots=True)
class ModelPolicy:
    """`model_aliases`, `model_fallbacks` and `model_fallback_family` (SPEC §3)."""

    aliases: Mapping[str, str] = field(default_factory=dict)
    fallbacks: Mapping[str, str] = field(default_factory=dict)
    family: bool = True


@dataclass(frozen=True, slots=True)
class Fallback:
    model: str
    reason: FallbackReason


@dataclass(frozen=True, slots=True)
class Resolution:
    requested: str
    canonical: str
    served: str
    fallback: FallbackReason

    @property
    def is_fallback(self) -> bool:
        return self.fallback is not FallbackReason.NONE


@dataclass(frozen=True, slots=True)
class ResolutionError:
    code: ErrorCode
    model: str  # the model the error is about: the canonical one (404) or the served one (403)


def split_version(name: str) -> tuple[str, tuple[int, ...]] | None:
    """(family prefix, numeric version tail), or None when the name has no numeric tail."""
    parts = _SEPARATOR.split(name)
    numeric = 0
    for part in reversed(parts):
        if not (part.isascii() and part.isdigit()):
            break
        numeric += 1
    if numeric == 0 or numeric == len(parts):
        return None
    version = parts[-numeric:]
    tail_length = sum(len(part) for part in version) + numeric - 1
    return name[: len(name) - tail_length - 1], tuple(int(part) for part in version)


def family_fallback(model: str, routable: Collection[str]) -> str | None:
    """The highest routable version strictly below `model` in its family, if any."""
    split = split_version(model)
    if split is None:
        return None
    family, version = split
    best: tuple[tuple[int, ...], str] | None = None
    for other in routable:
        other_split = split_version(other)
        if other_split is None or other_split[0] != family or other_split[1] >= version:
            continue
        # Ties on the version (`gpt-5.1` vs `gpt-5-1`) fall to the name so the choice is stable.
        if best is None or (other_split[1], other) > best:
            best = (other_split[1], other)
    return best[1] if best is not None else None


def fallback_for(model: str, *, policy: ModelPolicy, routable: Collection[str]) -> Fallback | None:
    explicit = policy.fallbacks.get(model)
    if explicit is not None:
        return Fallback(explicit, FallbackReason.EXPLICIT) if explicit in routable else None
    if policy.family:
        family = family_fallback(model, routable)
        if family is not None:
            return Fallback(family, FallbackReason.FAMILY)
    return None


def is_allowed(model: str, allowed_models: Collection[str]) -> bool:
    return WILDCARD in allowed_models or model in allowed_models


def canonicalize(model: str, policy: ModelPolicy) -> str:
    return policy.aliases.get(model, model)


def resolve(
    requested: str,
    *,
    policy: ModelPolicy,
    routable: Collection[str],
    allowed_models: Collection[str],
) -> Resolution | ResolutionError:
    canonical = canonicalize(requested, policy)
    if canonical in routable:
        served, reason = canonical, FallbackReason.NONE
    else:
        fallback = fallback_for(canonical, policy=policy, routable=routable)
        if fallback is None:
            return ResolutionError(ErrorCode.MODEL_NOT_FOUND, canonical)
        served, reason = fallback.model, fallback.reason
    if not is_allowed(served, allowed_models):
        return ResolutionError(ErrorCode.PERMISSION_DENIED, served)
    return Resolution(requested=requested, canonical=canonical, served=served, fallback=reason)


def cross_model_fallback(
    resolution: Resolution, *, policy: ModelPolicy, routable: Collection[str]
) -> Fallback | None:
    """The model whose candidates extend the plan, or None: one hop only, so a resolution that
    already substituted a model gets no second one."""
    if resolution.is_fallback:
        return None
    return fallback_for(resolution.served, policy=policy, routable=routable)
