"""Reads of keys for the request path."""

import hmac

from pools.models import GatewayKey, hash_key
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


def key_authenticate(raw: str) -> KeyPolicy | None:
    """The enabled key whose secret is `raw`, or None. Two queries: the key, its pools."""
    if not raw:
        return None
    digest = hash_key(raw)
    key = GatewayKey.objects.filter(key_hash=digest, enabled=True).first()
    # The lookup is by an index on the digest; the final comparison is constant-time regardless.
    if key is None or not hmac.compare_digest(key.key_hash, digest):
        return None
    return key_policy(key, tuple(key.pools.order_by("name").values_list("pk", flat=True)))


def key_by_name(name: str) -> KeyPolicy | None:
    key = GatewayKey.objects.filter(name=name).first()
    if key is None:
        return None
    return key_policy(key, tuple(key.pools.order_by("name").values_list("pk", flat=True)))
