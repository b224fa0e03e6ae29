"""The YAML configuration's writes (SPEC §3).

`gateway_config_load` reads what validation needs, validates, and applies, all in one transaction:
a file with any error writes nothing. `gateway_config_apply` upserts by name and saves only the rows
whose values differ, so applying the same configuration twice issues no INSERT, UPDATE or DELETE.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.contrib.auth.models import Group, Permission, User
from django.db import models, transaction

from catalog.models import CatalogEntry, Provenance
from gatewayconfig.document import (
    ConfigIssue,
    GatewayConfig,
    IssueCode,
    KeySpec,
    database_facts,
    parse_config,
)
from gatewayconfig.operators import OperatorSpec, group_permissions
from pools import credentials
from pools.models import (
    Assignment,
    GatewayKey,
    GatewaySettings,
    ModelAlias,
    ModelFallback,
    Pool,
    hash_key,
)
from pools.scoping import OPERATOR_PERMISSIONS

M = TypeVar("M", bound=models.Model)

KINDS = (
    "settings",
    "model aliases",
    "model fallbacks",
    "pools",
    "assignments",
    "catalog entries",
    "keys",
    "operator groups",
)
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
    # Every change that takes access away from a client, in words (never a secret): printed as warnings.
    access_removed: list[str] = field(default_factory=list)
    # Existing keys whose secret in the file differs from the stored one, kept (no `replace_secrets`).
    secrets_kept: list[str] = field(default_factory=list)

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
def gateway_config_load(
    *, text: str, prune: bool, env: Mapping[str, str], replace_secrets: bool = False, dry_run: bool = False
) -> LoadResult:
    """Validate and apply `text`. `replace_secrets`: a key's secret in the file replaces an existing
    key's (else it only creates keys, so a reload never undoes a `rotate_key`). `dry_run`: the same
    summary and warnings, and everything rolled back."""
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
    summary = gateway_config_apply(config=validation.config, prune=prune, replace_secrets=replace_secrets)
    if dry_run:
        transaction.set_rollback(True)
    return LoadResult(errors=(), warnings=validation.warnings, summary=summary)


def _access_removed(key: GatewayKey, values: Mapping[str, Any], pools_lost: list[str]) -> list[str]:
    """What applying `values` (and losing `pools_lost`) takes away from the key's clients, in words."""
    removed = []
    if key.enabled and values.get("enabled") is False:
        removed.append(f"key {key.name!r} disabled: its clients get 401")
    if pools_lost:
        removed.append(f"key {key.name!r} loses pool(s) {', '.join(sorted(pools_lost))}")
    old, new = set(key.allowed_models), set(values.get("allowed_models", key.allowed_models))
    if "*" in old and "*" not in new:
        removed.append(f"key {key.name!r} narrowed from every model to {sorted(new) or 'no model'}")
    elif "*" not in new and old - new:
        removed.append(f"key {key.name!r} may no longer use {', '.join(sorted(old - new))}")
    return removed


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
def gateway_config_apply(
    *, config: GatewayConfig, prune: bool, replace_secrets: bool = False
) -> ApplySummary:
    """Upsert everything `config` names; with `prune`, delete what it does not name. A key's secret in
    `config` is set on a new key, and on an existing one only with `replace_secrets` (a secret
    `rotate_key` gave it stays until the file is loaded so); every change that removes a client's
    access is listed in the summary's `access_removed`.

    Observed and preserved catalog entries belong to discovery: they are only ever deleted along
    with their assignment. A declared model that discovery already saw becomes `configured` and
    takes the declared values."""
    summary = ApplySummary()
    counts = summary.counts

    keys = {k.name: k for k in GatewayKey.objects.prefetch_related("pools")}
    if prune:
        # First, so a key hash that moves to another name never meets its old row.
        stale = set(keys) - {k.name for k in config.keys}
        summary.access_removed += [f"key {name!r} removed: its clients get 401" for name in sorted(stale)]
        summary.record_deleted(GatewayKey.objects.filter(name__in=stale).delete())

    settings = GatewaySettings.objects.filter(pk=1).first()
    _upsert(counts["settings"], settings, GatewaySettings, {"pk": 1}, config.settings.values())
    _apply_model_names(summary, config, prune=prune)
    pools = _apply_pools(counts["pools"], config)
    assignments = _apply_assignments(counts["assignments"], config, pools)
    entries, declared = _apply_catalog(counts["catalog entries"], config, assignments)
    for spec in config.keys:
        _apply_key(summary, spec, keys.get(spec.name), pools, replace_secrets=replace_secrets)
    _apply_operators(summary, config.operators, pools, prune=prune)
    if prune:
        _prune_unnamed(summary, config, entries, declared)
    return summary


def _apply_model_names(summary: ApplySummary, config: GatewayConfig, *, prune: bool) -> None:
    """The model aliases and fallbacks: each is a name mapped to another, upserted by the name."""
    for model, name_field, target_field, kind, entries in (
        (ModelAlias, "alias", "canonical", "model aliases", config.aliases),
        (ModelFallback, "requested", "served", "model fallbacks", config.fallbacks),
    ):
        existing = {getattr(row, name_field): row for row in model.objects.all()}
        for name, target in entries:
            _upsert(
                summary.counts[kind], existing.get(name), model, {name_field: name}, {target_field: target}
            )
        if prune:
            stale = set(existing) - {name for name, _ in entries}
            summary.record_deleted(model.objects.filter(**{f"{name_field}__in": stale}).delete())


def _apply_pools(counts: KindCounts, config: GatewayConfig) -> dict[str, Pool]:
    """Every pool by name, the file's upserted (the others still there until pruned)."""
    pools = {p.name: p for p in Pool.objects.all()}
    for spec in config.pools:
        pools[spec.name] = _upsert(
            counts,
            pools.get(spec.name),
            Pool,
            {"name": spec.name},
            {"auto_models": list(spec.auto_models)},
        )
    return pools


def _apply_assignments(
    counts: KindCounts, config: GatewayConfig, pools: Mapping[str, Pool]
) -> dict[str, Assignment]:
    """Every assignment by name, the file's upserted into their pools with their credential columns."""
    assignments = {a.name: a for a in Assignment.objects.all()}
    for pool_spec, spec in config.assignments():
        existing = assignments.get(spec.name)
        assignments[spec.name] = _upsert(
            counts,
            existing,
            Assignment,
            {"name": spec.name},
            {
                "pool_id": pools[pool_spec.name].pk,
                **spec.values(),
                **_credential_values(existing, spec.api_key_env, config.credentials.get(spec.name)),
            },
        )
    return assignments


def _apply_catalog(
    counts: KindCounts, config: GatewayConfig, assignments: Mapping[str, Assignment]
) -> tuple[dict[tuple[int, str], CatalogEntry], set[tuple[int, str]]]:
    """Upsert the declared models as `configured` entries; return the named assignments' entries as
    they were (by assignment id and model) and the (assignment id, model) pairs the file declares."""
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
                counts,
                entries.get((assignment_id, model_spec.model)),
                CatalogEntry,
                {"assignment_id": assignment_id, "model": model_spec.model},
                {"provenance": Provenance.CONFIGURED, **model_spec.values()},
            )
    return entries, declared


def _apply_key(
    summary: ApplySummary,
    spec: KeySpec,
    key: GatewayKey | None,
    pools: Mapping[str, Pool],
    *,
    replace_secrets: bool,
) -> None:
    """Create the key, or update its columns, pools and (with `replace_secrets`) its secret, saying
    what that takes from its clients; a differing secret kept is listed in `secrets_kept`."""
    counts = summary.counts["keys"]
    pool_ids = {pools[name].pk for name in spec.pools}
    if key is None:
        key = GatewayKey(name=spec.name, **spec.values())
        assert spec.secret is not None  # validation requires a secret for a new key
        key.set_key(spec.secret)
        key.save()
        key.pools.set(pool_ids)
        counts.created += 1
        return
    before = {p.pk: p.name for p in key.pools.all()}
    summary.access_removed += _access_removed(
        key, spec.values(), [n for pk, n in before.items() if pk not in pool_ids]
    )
    changed = _sync(key, spec.values())
    if spec.secret is not None and hash_key(spec.secret) != key.key_hash:
        if replace_secrets:
            key.set_key(spec.secret)
            changed += ["key_hash", "prefix"]
            summary.access_removed.append(
                f"key {key.name!r}: secret replaced, clients using the old one get 401"
            )
        else:
            summary.secrets_kept.append(key.name)
    if changed:
        key.save(update_fields=changed)
    pools_changed = set(before) != pool_ids
    if pools_changed:
        key.pools.set(pool_ids)
    if changed or pools_changed:
        counts.updated += 1
    else:
        counts.unchanged += 1


def _prune_unnamed(
    summary: ApplySummary,
    config: GatewayConfig,
    entries: Mapping[tuple[int, str], CatalogEntry],
    declared: set[tuple[int, str]],
) -> None:
    """Delete the configured catalog entries, assignments and pools the file no longer names."""
    stale_entries = [
        e.pk for k, e in entries.items() if e.provenance == Provenance.CONFIGURED and k not in declared
    ]
    summary.record_deleted(CatalogEntry.objects.filter(pk__in=stale_entries).delete())
    # Assignments before pools: an assignment that moved to a pool the file names must not be
    # cascaded away with its old pool (it was already moved above).
    named = {spec.name for _, spec in config.assignments()}
    summary.record_deleted(Assignment.objects.exclude(name__in=named).delete())
    gone = Pool.objects.exclude(name__in=[p.name for p in config.pools])
    summary.access_removed += [
        f"pool {name!r} removed: keys lose its models" for name in gone.values_list("name", flat=True)
    ]
    summary.record_deleted(gone.delete())


def _apply_operators(
    summary: ApplySummary, specs: tuple[OperatorSpec, ...], pools: Mapping[str, Pool], *, prune: bool
) -> None:
    """Each group of the file operates exactly its pools, with its access level's permissions and its
    members when the file gives them; with `prune`, a group the file does not name operates no pool.
    Whatever this takes away from someone is a warning line (`access_removed`)."""
    counts = summary.counts["operator groups"]
    permissions = {
        (p.content_type.app_label, p.codename): p for p in Permission.objects.select_related("content_type")
    }
    named = {spec.group for spec in specs}
    for spec in specs:
        group, created = Group.objects.get_or_create(name=spec.group)
        changed = created
        before = {p.pk: p.name for p in group.operated_pools.all()}
        wanted = {pools[name].pk for name in spec.pools}
        if set(before) != wanted:
            group.operated_pools.set(wanted)
            changed = True
            lost = sorted(name for pk, name in before.items() if pk not in wanted)
            if lost:
                summary.access_removed.append(_pools_taken(spec.group, lost))
        if spec.access is not None:
            held = group_permissions(group)
            level = OPERATOR_PERMISSIONS[spec.access]
            if held != level:
                group.permissions.set([permissions[code] for code in sorted(level)])
                changed = True
                if held - level:
                    dropped = ", ".join(sorted(codename for _, codename in held - level))
                    summary.access_removed.append(f"group {spec.group!r} loses permission(s) {dropped}")
        if spec.users is not None:
            members = {u.username: u for u in group.user_set.all()}
            if set(members) != set(spec.users):
                group.user_set.set(User.objects.filter(username__in=spec.users))
                changed = True
                for username in sorted(set(members) - set(spec.users)):
                    summary.access_removed.append(f"user {username!r} leaves group {spec.group!r}")
        if created:
            counts.created += 1
        elif changed:
            counts.updated += 1
        else:
            counts.unchanged += 1
    if prune:
        for group in Group.objects.filter(operated_pools__isnull=False).exclude(name__in=named).distinct():
            lost = sorted(group.operated_pools.values_list("name", flat=True))
            group.operated_pools.clear()
            counts.updated += 1
            summary.access_removed.append(_pools_taken(group.name, lost))


def _pools_taken(group: str, pools: list[str]) -> str:
    return f"group {group!r} no longer operates pool(s) {', '.join(pools)}"
