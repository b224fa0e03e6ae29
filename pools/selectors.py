"""Reads of keys for the request path, and the one operator access rule for pools."""

import hmac
from dataclasses import dataclass

from django.db.models import QuerySet, Subquery

from pools.models import ConfigVersion, GatewayKey, Pool, hash_key
from routing.route import KeyPolicy
from routing.types import Requirements


def key_requirements(key: GatewayKey) -> Requirements:
    """The key's own contract; request headers can only tighten it."""
    budget_left = None if key.budget_micros is None else max(key.budget_micros - key.spent_micros, 0)
    return Requirements(
        zero_retention=key.require_zero_retention,
        regions=frozenset(key.regions) if key.regions else None,
        no_third_party_router=not key.allow_third_party_router,
        min_quality=key.min_quality,
        budget_remaining_micros=budget_left,
    )


def key_policy(key: GatewayKey, pool_ids: tuple[int, ...]) -> KeyPolicy:
    return KeyPolicy(
        key_id=key.pk,
        name=key.name,
        pool_ids=pool_ids,
        allowed_models=tuple(key.allowed_models),
        requirements=key_requirements(key),
    )


@dataclass(frozen=True, slots=True)
class Authenticated:
    key: KeyPolicy
    config_version: int  # what the routing config cache must match (see ConfigVersion)


_KEY_FIELDS = (
    "pk",
    "name",
    "key_hash",
    "allowed_models",
    "require_zero_retention",
    "regions",
    "allow_third_party_router",
    "min_quality",
    "budget_micros",
    "spent_micros",
)


def key_authenticate(raw: str) -> Authenticated | None:
    """The enabled key whose secret is `raw` with its pools and the config version, in ONE query
    (a row per pool); None for a missing, wrong or disabled key."""
    if not raw:
        return None
    digest = hash_key(raw)
    version = ConfigVersion.objects.filter(pk=1).values("value")[:1]
    rows = list(
        GatewayKey.objects.filter(key_hash=digest, enabled=True)
        .annotate(config_version=Subquery(version))
        .order_by("pools__name")
        .values_list(*_KEY_FIELDS, "pools__id", "config_version")
    )
    # The lookup is by an index on the digest; the final comparison is constant-time regardless.
    if not rows or not hmac.compare_digest(rows[0][2], digest):
        return None
    key = GatewayKey(**dict(zip(("id", *_KEY_FIELDS[1:]), rows[0][: len(_KEY_FIELDS)], strict=True)))
    pool_ids = tuple(row[-2] for row in rows if row[-2] is not None)
    return Authenticated(key=key_policy(key, pool_ids), config_version=rows[0][-1] or 0)


def key_by_name(name: str) -> KeyPolicy | None:
    key = GatewayKey.objects.filter(name=name).first()
    if key is None:
        return None
    return key_policy(key, tuple(key.pools.order_by("name").values_list("pk", flat=True)))


def pools_visible_to(user) -> QuerySet[Pool]:
    """The pools an admin user may see: every pool for a superuser, otherwise the pools granted to one
    of the user's groups (`Pool.operator_groups`). Lazy: used as a subquery it adds no query."""
    if not user.is_active:
        return Pool.objects.none()
    if user.is_superuser:
        return Pool.objects.all()
    return Pool.objects.filter(operator_groups__user=user).distinct()
