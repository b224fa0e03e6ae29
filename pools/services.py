"""Writes to pools, assignments, keys and the gateway settings.

`gateway_config_load` reads what validation needs, validates, and applies, all in one transaction:
a file with any error writes nothing. `gateway_config_apply` upserts by name and saves only the rows
whose values differ, so applying the same configuration twice issues no INSERT, UPDATE or DELETE.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import connection, models, transaction

from catalog.models import CatalogEntry, Provenance
from pools import credentials
from pools.config import (
    ConfigIssue,
    GatewayConfig,
    IssueCode,
    database_facts,
    parse_config,
)
from pools.models import (
    Assignment,
    GatewayKey,
    GatewaySettings,
    ModelAlias,
    ModelFallback,
    Pool,
    hash_key,
    new_key_secret,
)
from routing.budget import period_start
from runtime import rawsql

M = TypeVar("M", bound=models.Model)

KINDS = ("settings", "model aliases", "model fallbacks", "pools", "assignments", "catalog entries", "keys")
# Django's delete() counts per model label, cascades included.
KIND_OF_LABEL = {
    "pools.ModelAlias": "model aliases",
    "pools.ModelFallback": "model fallbacks",
    "pools.Pool": "pools",
    "pools.Assignment": "assignments",
    "catalog.CatalogEntry": "catalog entries",
    "pools.GatewayKey": "keys",
}


@dataclass(slots=True)
class KindCounts:
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    deleted: int = 0


@dataclass(slots=True)
class ApplySummary:
    counts: dict[str, KindCounts] = field(default_factory=lambda: {kind: KindCounts() for kind in KINDS})

    @property
    def changed(self) -> bool:
        return any(c.created or c.updated or c.deleted for c in self.counts.values())

    def lines(self) -> list[str]:
        return [
            f"{kind}: {c.created} created, {c.updated} updated, {c.unchanged} unchanged, {c.deleted} deleted"
            for kind, c in self.counts.items()
        ]

    def record_deleted(self, result: tuple[int, dict[str, int]]) -> None:
        for label, count in result[1].items():
            kind = KIND_OF_LABEL.get(label)
            if kind:
                self.counts[kind].deleted += count


@dataclass(frozen=True, slots=True)
class LoadResult:
    errors: tuple[ConfigIssue, ...]
    warnings: tuple[ConfigIssue, ...]
    summary: ApplySummary | None  # None when there were errors and nothing was applied


def _sync(obj: models.Model, values: Mapping[str, Any]) -> list[str]:
    """Set the fields that differ; return their names (the `update_fields` of the save)."""
    changed = [name for name, value in values.items() if getattr(obj, name) != value]
    for name in changed:
        setattr(obj, name, values[name])
    return changed


def _upsert(
    counts: KindCounts,
    existing: M | None,
    model: type[M],
    identity: Mapping[str, Any],
    values: Mapping[str, Any],
) -> M:
    """Create the row, or save only the fields of `existing` that differ from `values`."""
    if existing is None:
        obj = model(**identity, **values)
        obj.save()
        counts.created += 1
        return obj
    changed = _sync(existing, values)
    if changed:
        existing.save(update_fields=changed)
        counts.updated += 1
    else:
        counts.unchanged += 1
    return existing


@transaction.atomic
def gateway_config_load(*, text: str, prune: bool, env: Mapping[str, str]) -> LoadResult:
    validation = parse_config(text, env=env, facts=database_facts(), prune=prune)
    if validation.config is None:
        return LoadResult(errors=validation.errors, warnings=validation.warnings, summary=None)
    if validation.config.credentials and not credentials.can_encrypt():
        missing = tuple(
            ConfigIssue(
                f"pools[{p}].assignments[{a}].api_key_from_env",
                IssueCode.ENV_UNSET,
                "GATEWAY_CREDENTIALS_KEY is not set: a credential cannot be stored encrypted",
            )
            for p, pool in enumerate(validation.config.pools)
            for a, spec in enumerate(pool.assignments)
            if spec.name in validation.config.credentials
        )
        return LoadResult(errors=missing, warnings=validation.warnings, summary=None)
    summary = gateway_config_apply(config=validation.config, prune=prune)
    return LoadResult(errors=(), warnings=validation.warnings, summary=summary)


def _credential_values(existing: Assignment | None, api_key_env: str, plain: str | None) -> dict[str, str]:
    """The credential columns a file's assignment asks for: `api_key_from_env` stores its value
    (re-encrypted only when it differs from the stored one, so a reload writes nothing), `api_key_env`
    clears a stored credential, neither keeps what is stored (a dump, which has no secret, reloads
    without losing it)."""
    if plain is not None:
        if existing is not None and existing.credential:
            try:
                if credentials.credential_decrypt(existing.credential) == plain:
                    return {}
            except credentials.CredentialUnreadable:
                pass
        return {
            "credential": credentials.credential_encrypt(plain),
            "credential_hint": credentials.credential_hint(plain),
        }
    if api_key_env:
        return {"credential": "", "credential_hint": ""}
    return {}


@transaction.atomic
def gateway_config_apply(*, config: GatewayConfig, prune: bool) -> ApplySummary:
    """Upsert everything `config` names; with `prune`, delete what it does not name.

    Observed and preserved catalog entries belong to discovery: they are only ever deleted along
    with their assignment. A declared model that discovery already saw becomes `configured` and
    takes the declared values."""
    summary = ApplySummary()
    counts = summary.counts

    keys = {k.name: k for k in GatewayKey.objects.prefetch_related("pools")}
    if prune:
        # First, so a key hash that moves to another name never meets its old row.
        stale = set(keys) - {k.name for k in config.keys}
        summary.record_deleted(GatewayKey.objects.filter(name__in=stale).delete())

    settings = GatewaySettings.objects.filter(pk=1).first()
    _upsert(counts["settings"], settings, GatewaySettings, {"pk": 1}, config.settings.values())

    for model, name_field, target_field, kind, entries in (
        (ModelAlias, "alias", "canonical", "model aliases", config.aliases),
        (ModelFallback, "requested", "served", "model fallbacks", config.fallbacks),
    ):
        existing = {getattr(row, name_field): row for row in model.objects.all()}
        for name, target in entries:
            _upsert(counts[kind], existing.get(name), model, {name_field: name}, {target_field: target})
        if prune:
            stale = set(existing) - {name for name, _ in entries}
            summary.record_deleted(model.objects.filter(**{f"{name_field}__in": stale}).delete())

    pools = {p.name: p for p in Pool.objects.all()}
    for spec in config.pools:
        pools[spec.name] = _upsert(
            counts["pools"],
            pools.get(spec.name),
            Pool,
            {"name": spec.name},
            {"auto_models": list(spec.auto_models)},
        )

    assignments = {a.name: a for a in Assignment.objects.all()}
    for pool_spec, spec in config.assignments():
        existing = assignments.get(spec.name)
        assignments[spec.name] = _upsert(
            counts["assignments"],
            existing,
            Assignment,
            {"name": spec.name},
            {
                "pool_id": pools[pool_spec.name].pk,
                **spec.values(),
                **_credential_values(existing, spec.api_key_env, config.credentials.get(spec.name)),
            },
        )

    named_assignments = [assignments[spec.name] for _, spec in config.assignments()]
    entries = {
        (e.assignment_id, e.model): e
        for e in CatalogEntry.objects.filter(assignment__in=[a.pk for a in named_assignments])
    }
    declared: set[tuple[int, str]] = set()
    for _, spec in config.assignments():
        assignment_id = assignments[spec.name].pk
        for model_spec in spec.models:
            declared.add((assignment_id, model_spec.model))
            _upsert(
                counts["catalog entries"],
                entries.get((assignment_id, model_spec.model)),
                CatalogEntry,
                {"assignment_id": assignment_id, "model": model_spec.model},
                {"provenance": Provenance.CONFIGURED, **model_spec.values()},
            )

    for spec in config.keys:
        key = keys.get(spec.name)
        pool_ids = {pools[name].pk for name in spec.pools}
        if key is None:
            key = GatewayKey(name=spec.name, **spec.values())
            assert spec.secret is not None  # validation requires a secret for a new key
            key.set_key(spec.secret)
            key.save()
            key.pools.set(pool_ids)
            counts["keys"].created += 1
            continue
        changed = _sync(key, spec.values())
        if spec.secret is not None and hash_key(spec.secret) != key.key_hash:
            key.set_key(spec.secret)
            changed += ["key_hash", "prefix"]
        if changed:
            key.save(update_fields=changed)
        pools_changed = {p.pk for p in key.pools.all()} != pool_ids
        if pools_changed:
            key.pools.set(pool_ids)
        if changed or pools_changed:
            counts["keys"].updated += 1
        else:
            counts["keys"].unchanged += 1

    if prune:
        stale_entries = [
            e.pk for k, e in entries.items() if e.provenance == Provenance.CONFIGURED and k not in declared
        ]
        summary.record_deleted(CatalogEntry.objects.filter(pk__in=stale_entries).delete())
        # Assignments before pools: an assignment that moved to a pool the file names must not be
        # cascaded away with its old pool (it was already moved above).
        named = {spec.name for _, spec in config.assignments()}
        summary.record_deleted(Assignment.objects.exclude(name__in=named).delete())
        summary.record_deleted(Pool.objects.exclude(name__in=[p.name for p in config.pools]).delete())
    return summary


class KeyRefused(ValueError):
    """A key operation refused, with the operator-facing reason (nothing was written)."""


def parse_overlap(text: str) -> timedelta:
    """`0`, or a whole number with a unit: `90s`, `30m`, `24h`, `7d`."""
    match = re.fullmatch(r"(\d{1,6})([smhd]?)", text.strip())
    if match is None or (match[2] == "" and match[1] != "0"):
        raise KeyRefused(f"overlap {text!r}: expected 0 or a number with s, m, h or d (e.g. 24h)")
    return timedelta(seconds=int(match[1]) * {"": 0, "s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]])


@transaction.atomic
def gateway_key_create(
    *, name: str, pool_names: list[str], allowed_models: list[str], expires_at: datetime | None
) -> tuple[GatewayKey, str]:
    """A new key with a generated secret; the secret is returned once and only its hash is stored."""
    if not name or len(name) > GatewayKey._meta.get_field("name").max_length:
        raise KeyRefused("a key name is 1 to 100 characters")
    if GatewayKey.objects.filter(name=name).exists():
        raise KeyRefused(f"a key named {name!r} exists (rotate_key replaces its secret)")
    pools = {p.name: p for p in Pool.objects.filter(name__in=pool_names)}
    missing = [p for p in pool_names if p not in pools]
    if missing or not pool_names:
        raise KeyRefused(f"unknown pool(s): {', '.join(missing)}" if missing else "name at least one pool")
    secret = new_key_secret()
    key = GatewayKey(name=name, allowed_models=allowed_models or ["*"], expires_at=expires_at)
    key.set_key(secret)
    key.save()
    key.pools.set(pools.values())
    return key, secret


@transaction.atomic
def gateway_key_rotate(*, name: str, overlap: timedelta, now: datetime) -> tuple[GatewayKey, str]:
    """A new generated secret for the key; the replaced one stays valid for `overlap` (0: not at all)."""
    key = GatewayKey.objects.select_for_update().filter(name=name).first()
    if key is None:
        raise KeyRefused(f"no key named {name!r}")
    secret = new_key_secret()
    key.rotate(secret, valid_until=now + overlap if overlap else None)
    key.save(
        update_fields=["key_hash", "prefix", "previous_key_hash", "previous_prefix", "previous_valid_until"]
    )
    return key, secret


# -- budgets (SPEC §7.4): hand-written conditional UPDATEs, one statement each ---------------------


def _period_sql(start: datetime | None) -> tuple[str, str, list[object]]:
    """(this period's spend, the period start to store, their params) as SQL over the key's row."""
    if start is None:
        return "spent_micros", "period_start", []
    at = rawsql.as_param(start)
    current = "(CASE WHEN period_start IS NOT NULL AND period_start >= %s THEN spent_micros ELSE 0 END)"
    stored = "(CASE WHEN period_start IS NOT NULL AND period_start >= %s THEN period_start ELSE %s END)"
    return current, stored, [at]


def key_budget_reserve(*, key_id: int, amount: int, period: str, now: datetime) -> bool:
    """Hold `amount` micros of the key's budget for a request in flight, if this period's spend plus
    what is held plus `amount` stays within the budget: one conditional UPDATE, so requests on any
    number of nodes can together pass the budget by at most one reservation's estimate error.
    False: the budget cannot cover it (nothing changed)."""
    table = GatewayKey._meta.db_table
    current, stored, at = _period_sql(period_start(period, now))
    sql = (
        f"UPDATE {table} SET spent_micros = {current}, period_start = {stored}, "  # noqa: S608
        "reserved_micros = reserved_micros + %s "
        f"WHERE id = %s AND budget_micros IS NOT NULL AND {current} + reserved_micros + %s <= budget_micros"
    )
    params = [*at, *(at * 2), amount, key_id, *at, amount]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount == 1


def key_budget_settle(*, key_id: int, released: int, charged: int, period: str, now: datetime) -> None:
    """Release what requests held and add what they cost (in the current period): one UPDATE."""
    table = GatewayKey._meta.db_table
    current, stored, at = _period_sql(period_start(period, now))
    sql = (
        f"UPDATE {table} SET "  # noqa: S608
        "reserved_micros = CASE WHEN reserved_micros > %s THEN reserved_micros - %s ELSE 0 END, "
        f"spent_micros = {current} + %s, period_start = {stored} WHERE id = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [released, released, *at, charged, *(at * 2), key_id])


@dataclass(frozen=True, slots=True)
class CredentialRotation:
    rotated: int = 0
    unreadable: tuple[str, ...] = ()  # assignment names
    key_missing: bool = False


def credentials_rotate() -> CredentialRotation:
    """Every stored credential re-encrypted under the first key. Each row is a compare-and-swap on the
    token read, so a credential set in admin meanwhile is never overwritten with the old one."""
    if not credentials.can_encrypt():
        return CredentialRotation(key_missing=True)
    rotated, unreadable = 0, []
    for pk, name, token in Assignment.objects.exclude(credential="").values_list("pk", "name", "credential"):
        try:
            fresh = credentials.credential_rotate(token)
        except credentials.CredentialUnreadable:
            unreadable.append(name)
            continue
        rotated += Assignment.objects.filter(pk=pk, credential=token).update(credential=fresh)
    return CredentialRotation(rotated=rotated, unreadable=tuple(unreadable))
