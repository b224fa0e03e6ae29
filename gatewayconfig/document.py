"""The gateway YAML configuration (SPEC §3): parse, validate, render.

Contract:
- `parse_yaml(text)` turns the file into plain Python data or raises `ConfigSyntaxError` (with the
  line and column). Duplicate mapping keys are a syntax error: PyYAML would silently keep the last.
- `validate_config(document, env=..., facts=..., prune=...)` is pure: it reads no database and no
  process environment, only what it is given. It checks *everything* and returns every error and
  warning, each with the path of the offending value (`pools[0].assignments[1].base_url`), plus a
  `GatewayConfig` when there is no error.
- `render_config(config)` is the inverse: the same schema, no secrets, unknown tri-states and unknown
  prices omitted (so they stay unknown on reload), stable ordering.
- `database_facts()` and `config_from_database()` are the two reads the loader and the dumper need.
  The write side is `gatewayconfig.services.gateway_config_apply`.

Each field is declared once, in `gatewayconfig.schema`: this module holds the rules between fields
(duplicates, references, secrets, one hop for aliases and fallbacks). Undeclared capability and privacy
values are unknown, never false; undeclared prices are unknown (NULL), never zero.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from django.contrib.auth.models import User

from catalog.models import CatalogEntry, Provenance
from gatewayconfig.checker import ROOT, Checker, join
from gatewayconfig.checker import ConfigIssue as ConfigIssue
from gatewayconfig.checker import ConfigSyntaxError as ConfigSyntaxError
from gatewayconfig.checker import IssueCode as IssueCode
from gatewayconfig.checker import parse_yaml as parse_yaml
from gatewayconfig.fields import Entry, columns, keys_of, read_fields, render_fields
from gatewayconfig.operators import OperatorSpec, operators_from_database, read_operators, render_operators
from gatewayconfig.schema import (
    ASSIGNMENT,
    AUTO_MODEL,
    ENV_NAME_MAX,
    KEY,
    MODEL,
    MODEL_MAX,
    NAME_MAX,
    POOL,
    SETTINGS,
    TOP_LEVEL,
    UPSTREAM_ENV_NAME,
)
from pools.models import (
    MIN_KEY_LENGTH,
    Assignment,
    GatewayKey,
    GatewaySettings,
    ModelAlias,
    ModelFallback,
    Pool,
    hash_key,
)

# --- what a valid file declares ------------------------------------------------------------------
# Each spec is a row's identity and its columns as the schema reads them (`values()` are the columns
# the write side stores, keyed by column name).


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One configured catalog entry: its model and its `CatalogEntry` columns."""

    model: str
    columns: Mapping[str, Any] = field(default_factory=dict)

    def values(self) -> dict[str, Any]:
        return dict(self.columns)


@dataclass(frozen=True, slots=True)
class AssignmentSpec:
    name: str
    columns: Mapping[str, Any] = field(default_factory=dict)  # `Assignment` columns but the name
    models: tuple[ModelSpec, ...] = ()
    api_key_from_env: str = ""  # read once at load, stored encrypted (GatewayConfig.credentials)

    @property
    def api_key_env(self) -> str:
        return self.columns.get("api_key_env", "")

    def values(self) -> dict[str, Any]:
        return dict(self.columns)


@dataclass(frozen=True, slots=True)
class PoolSpec:
    name: str
    auto_models: tuple[str, ...] = ()
    assignments: tuple[AssignmentSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class KeySpec:
    """`secret` is the raw key from `key`/`key_env`, or None to keep the stored hash. It is never
    rendered, logged or stored; only its hash and prefix are (`GatewayKey.set_key`)."""

    name: str
    secret: str | None = field(default=None, repr=False)
    pools: tuple[str, ...] = ()
    columns: Mapping[str, Any] = field(default_factory=dict)  # `GatewayKey` columns (not hash, pools)

    def values(self) -> dict[str, Any]:
        """The `GatewayKey` columns this spec declares (not the hash, not the pools)."""
        return {
            name: list(value) if isinstance(value, tuple) else value for name, value in self.columns.items()
        }


@dataclass(frozen=True, slots=True)
class SettingsSpec:
    """The `GatewaySettings` singleton's columns; absent from the file, their model defaults."""

    columns: Mapping[str, Any] = field(default_factory=lambda: read_fields(Checker(), {}, ROOT, SETTINGS))

    def values(self) -> dict[str, Any]:
        return dict(self.columns)


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    settings: SettingsSpec = SettingsSpec()
    aliases: tuple[tuple[str, str], ...] = ()  # (alias, canonical)
    fallbacks: tuple[tuple[str, str], ...] = ()  # (requested, served)
    pools: tuple[PoolSpec, ...] = ()
    keys: tuple[KeySpec, ...] = ()
    operators: tuple[OperatorSpec, ...] = ()
    # assignment name -> the credential its `api_key_from_env` held at load time; stored encrypted
    credentials: Mapping[str, str] = field(default_factory=dict, repr=False)

    def assignments(self) -> Iterable[tuple[PoolSpec, AssignmentSpec]]:
        for pool in self.pools:
            for assignment in pool.assignments:
                yield pool, assignment


@dataclass(frozen=True, slots=True)
class DatabaseFacts:
    """What validation needs to know about the current database, read by `database_facts()`."""

    key_names: frozenset[str] = frozenset()
    key_hashes: Mapping[str, str] = field(default_factory=dict)  # key hash -> key name
    catalog_models: Mapping[str, frozenset[str]] = field(default_factory=dict)  # assignment -> models
    user_names: frozenset[str] = frozenset()  # the admin's users, whom `operators[].users` may name


@dataclass(frozen=True, slots=True)
class Validation:
    config: GatewayConfig | None
    errors: tuple[ConfigIssue, ...]
    warnings: tuple[ConfigIssue, ...]


# --- validation ----------------------------------------------------------------------------------


def validate_config(
    document: object, *, env: Mapping[str, str], facts: DatabaseFacts = DatabaseFacts(), prune: bool = False
) -> Validation:
    """Check a parsed YAML document; see the module docstring. Pure: reads only its arguments."""
    c = Checker()
    root: dict[Any, Any] = {} if document is None else (c.mapping(document, ROOT, keys_of(TOP_LEVEL)) or {})

    settings = _settings(c, root)
    aliases = c.take(root, "model_aliases", "", lambda v, q: _model_map(c, v, q), {})
    fallbacks = c.take(root, "model_fallbacks", "", lambda v, q: _model_map(c, v, q), {})
    pools = _pools(c, root)
    keys = _keys(c, root, {p.name for p in pools}, env=env, facts=facts, prune=prune)
    _check_model_maps(c, aliases, fallbacks, pools, facts=facts, prune=prune)
    operators = read_operators(c, root, {p.name for p in pools}, facts.user_names)
    credentials = _credentials(c, pools, env)

    config = None
    if not c.errors:
        config = GatewayConfig(
            settings=settings,
            aliases=tuple((k, v[0]) for k, v in aliases.items()),
            fallbacks=tuple((k, v[0]) for k, v in fallbacks.items()),
            pools=tuple(pools),
            keys=tuple(keys),
            operators=tuple(operators),
            credentials=credentials,
        )
    return Validation(config=config, errors=tuple(c.errors), warnings=tuple(c.warnings))


def parse_config(
    text: str, *, env: Mapping[str, str], facts: DatabaseFacts = DatabaseFacts(), prune: bool = False
) -> Validation:
    try:
        document = parse_yaml(text)
    except ConfigSyntaxError as exc:
        return Validation(config=None, errors=(exc.issue,), warnings=())
    return validate_config(document, env=env, facts=facts, prune=prune)


def _settings(c: Checker, root: Mapping[Any, Any]) -> SettingsSpec:
    values = read_fields(c, root, ROOT, SETTINGS)
    if values["max_cooldown_seconds"] < values["cooldown_seconds"]:
        c.error(
            "circuit.max_cooldown_seconds",
            IssueCode.INVALID,
            f"must be >= cooldown_seconds ({values['cooldown_seconds']})",
        )
    return SettingsSpec(values)


def _model_map(c: Checker, value: object, path: str) -> dict[str, tuple[str, str]]:
    """`model_aliases` / `model_fallbacks`: name -> (target, path of the entry)."""
    if not isinstance(value, dict):
        c.error(path, IssueCode.INVALID, "must be a mapping")
        return {}
    result: dict[str, tuple[str, str]] = {}
    for name, target in value.items():
        entry_path = join(path, name)
        if not isinstance(name, str) or not name.strip() or len(name) > MODEL_MAX:
            c.error(
                entry_path,
                IssueCode.INVALID,
                f"model name must be a non-empty string of at most {MODEL_MAX} characters",
            )
            continue
        target_name = c.string(target, entry_path, max_length=MODEL_MAX)
        if not target_name:
            continue
        if name == AUTO_MODEL:
            c.error(entry_path, IssueCode.RESERVED, f"{AUTO_MODEL!r} is reserved for model=auto")
        result[name] = (target_name, entry_path)
    return result


def _pools(c: Checker, root: Mapping[Any, Any]) -> list[PoolSpec]:
    pools: list[PoolSpec] = []
    pool_names: dict[str, str] = {}
    assignment_names: dict[str, str] = {}
    for p, raw in enumerate(c.take(root, "pools", "", c.sequence, [])):
        path = f"pools[{p}]"
        data = c.mapping(raw, path, keys_of(POOL))
        if data is None:
            continue
        values = read_fields(c, data, path, POOL)
        name = values["name"] or ""
        c.unique(pool_names, name, path, f"{path}.name", "pool name")
        if AUTO_MODEL in values["auto_models"]:
            c.error(f"{path}.auto_models", IssueCode.RESERVED, f"{AUTO_MODEL!r} cannot be an auto model")
        assignments = []
        for a, raw_assignment in enumerate(c.take(data, "assignments", path, c.sequence, [])):
            assignment = _assignment(c, raw_assignment, f"{path}.assignments[{a}]")
            if assignment is None:
                continue
            at = f"{path}.assignments[{a}]"
            c.unique(assignment_names, assignment.name, at, f"{at}.name", "assignment name")
            assignments.append(assignment)
        pools.append(PoolSpec(name=name, auto_models=values["auto_models"], assignments=tuple(assignments)))
    return pools


def _assignment(c: Checker, raw: object, path: str) -> AssignmentSpec | None:
    data = c.mapping(raw, path, keys_of(ASSIGNMENT))
    if data is None:
        return None
    values = read_fields(c, data, path, ASSIGNMENT)
    api_key_from_env = c.take(
        data, "api_key_from_env", path, lambda v, q: UPSTREAM_ENV_NAME.read(c, v, q), ""
    )
    models: list[ModelSpec] = []
    seen: dict[str, str] = {}
    for m, raw_model in enumerate(c.take(data, "models", path, c.sequence, [])):
        model = _model(c, raw_model, f"{path}.models[{m}]")
        if model is None or not model.model:
            continue
        at = f"{path}.models[{m}]"
        if not c.unique(seen, model.model, at, f"{at}.id", "model"):
            continue
        models.append(model)
    name = values.pop("name") or ""
    return AssignmentSpec(name=name, columns=values, models=tuple(models), api_key_from_env=api_key_from_env)


def _model(c: Checker, raw: object, path: str) -> ModelSpec | None:
    data = c.mapping(raw, path, keys_of(MODEL))
    if data is None:
        return None
    values = read_fields(c, data, path, MODEL)
    model_id = values.pop("model") or ""
    if model_id == AUTO_MODEL:
        c.error(f"{path}.id", IssueCode.RESERVED, f"{AUTO_MODEL!r} is reserved for model=auto")
    return ModelSpec(model=model_id, columns=values)


def _keys(
    c: Checker,
    root: Mapping[Any, Any],
    pool_names: set[str],
    *,
    env: Mapping[str, str],
    facts: DatabaseFacts,
    prune: bool,
) -> list[KeySpec]:
    keys: list[KeySpec] = []
    names: dict[str, str] = {}
    hashes: dict[str, str] = {}  # hash -> path of the key that declares it
    raw_keys = c.take(root, "keys", "", c.sequence, [])
    file_key_names = {k.get("name") for k in raw_keys if isinstance(k, dict)}
    for k, raw in enumerate(raw_keys):
        path = f"keys[{k}]"
        data = c.mapping(raw, path, keys_of(KEY))
        if data is None:
            continue
        values = read_fields(c, data, path, KEY)
        name = values.pop("name") or ""
        c.unique(names, name, path, f"{path}.name", "key name")

        secret, secret_path = _key_secret(c, data, path, name, env=env, facts=facts)
        if secret is not None:
            digest = hash_key(secret)
            owner = facts.key_hashes.get(digest)
            if digest in hashes:
                c.error(secret_path, IssueCode.DUPLICATE, f"same key as {hashes[digest]}")
            elif owner is not None and owner != name and (owner in file_key_names or not prune):
                c.error(secret_path, IssueCode.KEY_IN_USE, f"already the key of {owner!r}")
            hashes[digest] = path

        key_pools = c.take(
            data, "pools", path, lambda v, q: c.strings(v, q, max_length=NAME_MAX, what="pool")
        )
        for i, pool in enumerate(key_pools or ()):
            if pool not in pool_names:
                # Report at the pool's own index in the file, which `strings` kept in order.
                index = _index_of(data["pools"], pool, i)
                c.error(f"{path}.pools[{index}]", IssueCode.UNKNOWN_POOL, f"unknown pool {pool!r}")
        keys.append(KeySpec(name=name, secret=secret, pools=key_pools or (), columns=values))
    return keys


def _index_of(raw_list: list[Any], value: str, fallback: int) -> int:
    try:
        return raw_list.index(value)
    except ValueError:
        return fallback


def _key_secret(
    c: Checker,
    data: Mapping[Any, Any],
    path: str,
    name: str,
    *,
    env: Mapping[str, str],
    facts: DatabaseFacts,
) -> tuple[str | None, str]:
    """The raw key of one `keys[]` entry and the path it came from; None keeps the stored hash."""
    if "key" in data and "key_env" in data:
        c.error(f"{path}.key_env", IssueCode.CONFLICT, "give either key or key_env, not both")
        return None, path
    if "key" in data:
        secret_path = f"{path}.key"
        secret = data["key"]
    elif "key_env" in data:
        secret_path = f"{path}.key_env"
        variable = c.env_name(data["key_env"], secret_path, max_length=ENV_NAME_MAX)
        if not variable:
            return None, secret_path
        secret = env.get(variable)
        if not secret:
            c.error(secret_path, IssueCode.ENV_UNSET, f"environment variable {variable!r} is not set")
            return None, secret_path
    else:
        # A dumped key carries no secret: it keeps the hash it already has. A new key needs one.
        if name and name not in facts.key_names:
            c.error(f"{path}.key", IssueCode.REQUIRED, "required")
        return None, path
    # Never echo the value: it is a secret, and the error output may be logged.
    if not isinstance(secret, str) or not secret:
        c.error(secret_path, IssueCode.INVALID, "must be a non-empty string")
        return None, secret_path
    if any(ch.isspace() for ch in secret):
        c.error(secret_path, IssueCode.INVALID, "must not contain whitespace")
        return None, secret_path
    if len(secret) < MIN_KEY_LENGTH:
        c.error(secret_path, IssueCode.INVALID, f"must be at least {MIN_KEY_LENGTH} characters")
        return None, secret_path
    return secret, secret_path


def _credentials(c: Checker, pools: list[PoolSpec], env: Mapping[str, str]) -> dict[str, str]:
    """assignment name -> the credential its `api_key_from_env` names, read once now."""
    credentials: dict[str, str] = {}
    for pool_index, pool in enumerate(pools):
        for i, assignment in enumerate(pool.assignments):
            path = f"pools[{pool_index}].assignments[{i}]"
            if assignment.api_key_from_env:
                if assignment.api_key_env:
                    c.error(
                        f"{path}.api_key_from_env",
                        IssueCode.CONFLICT,
                        "give api_key_env or api_key_from_env, not both",
                    )
                elif not env.get(assignment.api_key_from_env):
                    c.error(
                        f"{path}.api_key_from_env",
                        IssueCode.ENV_UNSET,
                        f"environment variable {assignment.api_key_from_env!r} is not set (nothing to store)",
                    )
                else:
                    credentials[assignment.name] = env[assignment.api_key_from_env]
            if assignment.api_key_env and not env.get(assignment.api_key_env):
                c.warn(
                    f"{path}.api_key_env",
                    IssueCode.ENV_UNSET,
                    f"environment variable {assignment.api_key_env!r} is not set (no credential is sent)",
                )
    return credentials


def _check_model_maps(
    c: Checker,
    aliases: Mapping[str, tuple[str, str]],
    fallbacks: Mapping[str, tuple[str, str]],
    pools: list[PoolSpec],
    *,
    facts: DatabaseFacts,
    prune: bool,
) -> None:
    """One hop only, in both maps. Resolution canonicalizes through aliases *before* looking up a
    fallback (SPEC §5.1), so a fallback named after an alias could never fire, and a fallback that
    serves an alias would serve a name no route has: both are refused."""
    for alias, (canonical, path) in aliases.items():
        if canonical == alias:
            c.error(path, IssueCode.SELF_MAPPING, "maps to itself")
        elif canonical in aliases:
            c.error(path, IssueCode.CHAINED, f"{canonical!r} is itself an alias (one hop only)")
    for requested, (served, path) in fallbacks.items():
        if served == requested:
            c.error(path, IssueCode.SELF_MAPPING, "falls back to itself")
        elif served in fallbacks:
            c.error(
                path,
                IssueCode.CHAINED,
                f"{served!r} itself falls back to {fallbacks[served][0]!r} (one hop only)",
            )
        elif served in aliases:
            c.error(path, IssueCode.ALIAS_CONFLICT, f"{served!r} is an alias; name its canonical model")
        if requested in aliases:
            c.error(
                path,
                IssueCode.ALIAS_CONFLICT,
                f"{requested!r} is an alias, resolved before fallbacks; name its canonical model",
            )

    # A target that nothing configures yet may appear after `sync_catalog` (SPEC §3): a warning.
    named = {a.name for p in pools for a in p.assignments}
    known = {m.model for p in pools for a in p.assignments for m in a.models}
    for assignment, models in facts.catalog_models.items():
        if assignment in named or not prune:
            known |= models
    for label, entries in (("alias", aliases), ("fallback", fallbacks)):
        for target, path in entries.values():
            if target not in known and target not in aliases and target not in fallbacks:
                c.warn(
                    path,
                    IssueCode.UNCONFIGURED_MODEL,
                    f"{label} target {target!r} is not configured by any pool nor in the catalog yet",
                )


# --- rendering (dump) ----------------------------------------------------------------------------


def render_document(config: GatewayConfig) -> dict[str, Any]:
    pools = []
    for pool in sorted(config.pools, key=lambda p: p.name):
        assignments = []
        for a in sorted(pool.assignments, key=lambda a: (a.columns["tier"], a.name)):
            models = [
                render_fields({"model": m.model, **m.columns}, MODEL)
                for m in sorted(a.models, key=lambda m: m.model)
            ]
            assignments.append(
                render_fields(
                    {"name": a.name, **a.columns, **({"models": models} if models else {})}, ASSIGNMENT
                )
            )
        values = {"name": pool.name, "auto_models": pool.auto_models, "assignments": assignments}
        pools.append(render_fields(values, POOL))
    keys = [
        render_fields({"name": key.name, "pools": sorted(key.pools), **key.columns}, KEY)
        for key in sorted(config.keys, key=lambda k: k.name)
    ]
    return render_fields(
        {
            **config.settings.columns,
            "model_aliases": dict(sorted(config.aliases)),
            "model_fallbacks": dict(sorted(config.fallbacks)),
            "pools": pools,
            "keys": keys,
            **({"operators": render_operators(config.operators)} if config.operators else {}),
        },
        TOP_LEVEL,
    )


def render_config(config: GatewayConfig) -> str:
    # Block style throughout: one value per line, so two dumps diff line by line.
    return yaml.safe_dump(
        render_document(config), sort_keys=False, allow_unicode=True, default_flow_style=False
    )


# --- database reads ------------------------------------------------------------------------------


def database_facts() -> DatabaseFacts:
    catalog: dict[str, set[str]] = {}
    for assignment, model in CatalogEntry.objects.values_list("assignment__name", "model"):
        catalog.setdefault(assignment, set()).add(model)
    key_rows = list(GatewayKey.objects.values_list("name", "key_hash", "previous_key_hash"))
    return DatabaseFacts(
        key_names=frozenset(name for name, _, _ in key_rows),
        # A secret replaced in a rotation is still valid during its overlap: no other key may take it.
        key_hashes={digest: name for name, *digests in key_rows for digest in digests if digest is not None},
        catalog_models={name: frozenset(models) for name, models in catalog.items()},
        user_names=frozenset(User.objects.values_list("username", flat=True)),
    )


def _row(row: Any, entries: Iterable[Entry]) -> dict[str, Any]:
    return {name: getattr(row, name) for name in columns(entries)}


def config_from_database() -> GatewayConfig:
    """The current state as a `GatewayConfig` (keys without secrets). Writes nothing: the settings
    row is not created when it does not exist yet, its defaults are reported instead."""
    settings = GatewaySettings.objects.filter(pk=1).first() or GatewaySettings()
    configured: dict[int, list[ModelSpec]] = {}
    entries = CatalogEntry.objects.filter(provenance=Provenance.CONFIGURED).order_by("model")
    for entry in entries:
        values = _row(entry, MODEL)
        configured.setdefault(entry.assignment_id, []).append(ModelSpec(values.pop("model"), values))
    assignments: dict[int, list[AssignmentSpec]] = {}
    for a in Assignment.objects.order_by("name"):
        values = _row(a, ASSIGNMENT)
        assignments.setdefault(a.pool_id, []).append(
            AssignmentSpec(name=values.pop("name"), columns=values, models=tuple(configured.get(a.pk, ())))
        )
    pools = [
        PoolSpec(name=p.name, auto_models=tuple(p.auto_models), assignments=tuple(assignments.get(p.pk, ())))
        for p in Pool.objects.order_by("name")
    ]
    keys = []
    for k in GatewayKey.objects.order_by("name").prefetch_related("pools"):
        values = _row(k, KEY)
        values["allowed_models"], values["regions"] = tuple(k.allowed_models), tuple(k.regions)
        keys.append(
            KeySpec(
                name=values.pop("name"), pools=tuple(sorted(p.name for p in k.pools.all())), columns=values
            )
        )
    return GatewayConfig(
        settings=SettingsSpec(_row(settings, SETTINGS)),
        aliases=tuple(ModelAlias.objects.order_by("alias").values_list("alias", "canonical")),
        fallbacks=tuple(ModelFallback.objects.order_by("requested").values_list("requested", "served")),
        pools=tuple(pools),
        keys=tuple(keys),
        operators=operators_from_database(),
    )


def dump_config() -> str:
    return render_config(config_from_database())
