"""Reads of keys for the request path, and the one operator access rule for pools."""

import functools
import hmac
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db.models import QuerySet
from django.utils import timezone

from pools.models import ConfigVersion, GatewayKey, Pool, hash_key
from routing.policy.budget import period_start, refusal_message, spent_in_period
from routing.policy.route import KeyPolicy
from routing.policy.types import Requirements
from runtime import rawsql


@dataclass(frozen=True, slots=True)
class KeyRow:
    """A key's columns as the request path reads them (`key_sql`), under the model's field names: the
    request path builds no model instance (a GatewayKey cost about 25 us of the read's thread)."""

    pk: int
    name: str
    allowed_models: list[str]
    require_zero_retention: bool
    regions: list[str]
    allow_third_party_router: bool
    min_quality: float
    budget_micros: int | None
    spent_micros: int
    budget_period: str
    reserved_micros: int
    period_start: datetime | None


Key = GatewayKey | KeyRow


def budget_left(key: Key, now: datetime) -> int | None:
    """What the key may still reserve now (SPEC §7.4): its budget less this period's spend and what
    requests in flight hold; None without a budget."""
    if key.budget_micros is None:
        return None
    spent = spent_in_period(key.spent_micros, key.period_start, period_start(key.budget_period, now))
    return max(key.budget_micros - spent - key.reserved_micros, 0)


def budget_refusal(key_id: int, now: datetime) -> str:
    """Why the key's budget refused a request, with its amounts as they are now (a refusal's answer,
    off the served requests' path: one read)."""
    key = GatewayKey.objects.get(pk=key_id)
    spent = spent_in_period(key.spent_micros, key.period_start, period_start(key.budget_period, now))
    return refusal_message(
        budget=key.budget_micros or 0,
        spent=spent,
        held=key.reserved_micros,
        period=key.budget_period,
        now=now,
    )


def key_requirements(key: Key, now: datetime | None = None) -> Requirements:
    """The key's own contract; request headers can only tighten it."""
    budget = budget_left(key, now or datetime.now(UTC))
    return Requirements(
        zero_retention=key.require_zero_retention,
        regions=frozenset(key.regions) if key.regions else None,
        no_third_party_router=not key.allow_third_party_router,
        min_quality=key.min_quality,
        budget_remaining_micros=budget,
    )


def key_policy(key: Key, pool_ids: tuple[int, ...]) -> KeyPolicy:
    return KeyPolicy(
        key_id=key.pk,
        name=key.name,
        pool_ids=pool_ids,
        allowed_models=tuple(key.allowed_models),
        requirements=key_requirements(key),
    )


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """A key's `limits` (SPEC §3); None: no such limit. Enforced by proxy.limits."""

    rpm: int | None = None
    tpm: int | None = None
    concurrent: int | None = None

    def __bool__(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.concurrent is not None


@dataclass(frozen=True, slots=True)
class Authenticated:
    key: KeyPolicy
    config_version: int  # what the routing config cache must match (see ConfigVersion)
    budget_period: str = ""  # the key's budget period (day | week | month; empty: lifetime)
    limits: KeyLimits = KeyLimits()  # read by the same statement as the key: no round trip of their own


def key_match_sql() -> str:
    """The condition a usable key meets, on the key table as `k` (params: `key_params`)."""
    return (
        "(k.key_hash = %s OR (k.previous_key_hash = %s AND k.previous_valid_until > %s)) "
        "AND k.enabled = %s AND (k.expires_at IS NULL OR k.expires_at > %s)"
    )


def key_params(digest: str) -> list[object]:
    now = rawsql.as_param(timezone.now())
    return [digest, digest, now, True, now]


KEY_COLUMNS = 20  # what `key_sql` selects, a row per pool of the key


def key_sql() -> str:
    """The usable key with its pools and the config version (params: `key_params`), unordered: a
    caller orders the rows by the pool's name (the last column)."""
    key, version = GatewayKey._meta, ConfigVersion._meta
    through, pool = GatewayKey.pools.through._meta, Pool._meta
    return (
        "SELECT k.id, k.name, k.key_hash, k.allowed_models, k.require_zero_retention, k.regions, "  # noqa: S608
        "k.allow_third_party_router, k.min_quality, k.budget_micros, k.spent_micros, "
        f"(SELECT v.value FROM {version.db_table} v WHERE v.id = 1), k.previous_key_hash, "
        "k.budget_period, k.reserved_micros, k.period_start, "
        "k.limit_rpm, k.limit_tpm, k.limit_concurrent, kp.pool_id, p.name "
        f"FROM {key.db_table} k "
        f"LEFT JOIN {through.db_table} kp ON kp.gatewaykey_id = k.id "
        f"LEFT JOIN {pool.db_table} p ON p.id = kp.pool_id "
        f"WHERE {key_match_sql()}"
    )


def key_authenticate(raw: str) -> Authenticated | None:
    """The enabled key whose secret is `raw` with its pools and the config version, in ONE query
    (a row per pool; hand-written SQL, see runtime.rawsql); None for a missing, wrong or
    disabled key."""
    if not raw:
        return None
    digest = hash_key(raw)
    return authenticated_from_rows(rawsql.fetch(f"{key_sql()} ORDER BY p.name", key_params(digest)), digest)


def authenticated_from_rows(rows: list[tuple], digest: str) -> Authenticated | None:
    """The key `key_sql`'s rows (in the order of its pools' names) describe, if its secret's digest is
    `digest`."""
    # The lookup is by an index on the digest; the final comparison is constant-time regardless.
    if not rows or not (
        hmac.compare_digest(rows[0][2], digest) | hmac.compare_digest(rows[0][11] or "", digest)
    ):
        return None
    pk, name, _, allowed, zero_retention, regions, third_party, min_quality, budget, spent = rows[0][:10]
    key = KeyRow(
        pk=pk,
        name=name,
        allowed_models=rawsql.as_json(allowed),
        require_zero_retention=bool(zero_retention),
        regions=rawsql.as_json(regions),
        allow_third_party_router=bool(third_party),
        min_quality=min_quality,
        budget_micros=budget,
        spent_micros=spent,
        budget_period=rows[0][12] or "",
        reserved_micros=rows[0][13] or 0,
        period_start=rawsql.as_datetime(rows[0][14]),
    )
    return Authenticated(
        key=key_policy(key, tuple(row[18] for row in rows if row[18] is not None)),
        config_version=rows[0][10] or 0,
        budget_period=key.budget_period,
        limits=KeyLimits(*rows[0][15:18]),
    )


@functools.cache  # table and column names only
def key_known_sql() -> str:
    """The statement that finds a usable key by its digest (params: `key_params`), as its current
    secret or as a replaced one still in its overlap: the API's check before it reads a body, run on
    the event loop as the request's own read (runtime.loopdb). The same condition as the request's read
    (`key_match_sql`), on the same two unique indexes."""
    return (
        f"SELECT k.key_hash, k.previous_key_hash FROM {GatewayKey._meta.db_table} k WHERE {key_match_sql()}"  # noqa: S608
    )


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


def keys_visible_to(user) -> QuerySet[GatewayKey]:
    """The gateway keys an admin user may see (SPEC §9): every key for a superuser, otherwise the keys
    that have pools, all of them granted to the user's groups (a key that also reaches another
    pool belongs to that pool's operators too, so only a superuser sees it). Lazy, like
    `pools_visible_to`."""
    if not user.is_active:
        return GatewayKey.objects.none()
    if user.is_superuser:
        return GatewayKey.objects.all()
    hidden = Pool.objects.exclude(pk__in=pools_visible_to(user))
    return GatewayKey.objects.filter(pools__isnull=False).exclude(pools__in=hidden).distinct()
