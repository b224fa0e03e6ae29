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
  The write side is `pools.services.gateway_config_apply`.

Undeclared capability and privacy values are unknown, never false; undeclared prices are unknown
(NULL), never zero.
"""

import dataclasses
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from enum import StrEnum
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import yaml

from catalog.models import CatalogEntry, Provenance
from pools.credentials import ENV_PREFIX, env_name_allowed
from pools.destinations import base_url_problem
from pools.models import (
    MIN_KEY_LENGTH,
    Adapter,
    Assignment,
    GatewayKey,
    GatewaySettings,
    ModelAlias,
    ModelFallback,
    Pool,
    hash_key,
)
from routing.vocabulary import BudgetPeriod, DataCollection, Router, ToolRepresentation, TriState

T = TypeVar("T")

INT32_MAX = 2**31 - 1  # PositiveIntegerField / IntegerField on PostgreSQL
INT64_MAX = 2**63 - 1  # BigIntegerField
NAME_MAX = 100
MODEL_MAX = 200
URL_MAX = 500
REGION_MAX = 50
ENV_NAME_MAX = 200
# The admin shows a 10-character prefix of every key, so a key must be long enough that what stays
# hidden is still a secret (and a key of 10 characters or fewer would sit in the table in full).
AUTO_MODEL = "auto"  # model="auto" is resolved by the router (SPEC §5.5), never a model name
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

CIRCUIT_FIELDS = {
    "failure_threshold": 1,  # field -> minimum
    "cooldown_seconds": 1,
    "max_cooldown_seconds": 1,
    "half_open_probes": 1,
    "probe_lease_seconds": 1,
    "demotion_seconds": 0,
}
RETRY_FIELDS = {"max_attempts": 1, "backoff_base_ms": 0, "min_attempt_ms": 0, "default_deadline_ms": 1}
TOP_LEVEL_FIELDS = (
    "circuit",
    "retry",
    "model_aliases",
    "model_fallbacks",
    "model_fallback_family",
    "qualification_days",
    "pools",
    "keys",
)
POOL_FIELDS = ("name", "auto_models", "assignments")
ASSIGNMENT_FIELDS = (
    "name",
    "adapter",
    "base_url",
    "api_key_env",
    "api_key_from_env",
    "tier",
    "weight",
    "region",
    "router",
    "privacy",
    "capabilities",
    "quality",
    "min_deadline_ms",
    "discovery",
    "models",
    "enabled",
)
PRIVACY_FIELDS = ("zero_retention", "data_collection")
CAPABILITY_FIELDS = ("tools", "write_tools", "vision", "role_separation", "tool_representation")
TRI_CAPABILITIES = ("tools", "write_tools", "vision", "role_separation")
MODEL_FIELDS = ("id", "context_window", "capabilities", "price")
MODEL_CAPABILITY_FIELDS = ("tools", "vision")
PRICE_FIELDS = ("input_per_mtok_micros", "output_per_mtok_micros")
KEY_FIELDS = (
    "name",
    "key",
    "key_env",
    "pools",
    "allowed_models",
    "requirements",
    "budget_micros",
    "budget_period",
    "enabled",
    "expires_at",
    "limits",
)
LIMIT_FIELDS = ("rpm", "tpm", "concurrent")  # YAML `limits:`; stored as GatewayKey.limit_<name>

REQUIREMENT_FIELDS = ("zero_retention", "regions", "allow_third_party_router", "min_quality")


# --- results -------------------------------------------------------------------------------------


class IssueCode(StrEnum):
    """What is wrong, as a value: tests and callers branch on this, never on the message text."""

    SYNTAX = "syntax"
    REQUIRED = "required"
    UNKNOWN_FIELD = "unknown_field"
    INVALID = "invalid"  # wrong type, out of range, not one of the choices
    DUPLICATE = "duplicate"
    UNKNOWN_POOL = "unknown_pool"
    SELF_MAPPING = "self_mapping"
    CHAINED = "chained"  # an alias or fallback whose target is itself mapped (one hop only)
    ALIAS_CONFLICT = "alias_conflict"  # an alias also used as a fallback name, or a fallback to an alias
    RESERVED = "reserved"
    CONFLICT = "conflict"  # `key` and `key_env` both given
    KEY_IN_USE = "key_in_use"
    ENV_UNSET = "env_unset"
    UNCONFIGURED_MODEL = "unconfigured_model"  # warning


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    path: str
    code: IssueCode
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ConfigSyntaxError(Exception):
    def __init__(self, issue: ConfigIssue) -> None:
        super().__init__(str(issue))
        self.issue = issue


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One configured catalog entry. Field names are `CatalogEntry` columns."""

    model: str
    context_window: int | None = None
    tools: str = TriState.UNKNOWN
    vision: str = TriState.UNKNOWN
    input_per_mtok_micros: int | None = None
    output_per_mtok_micros: int | None = None

    def values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in MODEL_VALUE_FIELDS}


@dataclass(frozen=True, slots=True)
class AssignmentSpec:
    """Field names, apart from `models`, are `Assignment` columns."""

    name: str
    adapter: str
    base_url: str
    api_key_env: str = ""
    api_key_from_env: str = ""  # read once at load, stored encrypted (GatewayConfig.credentials)
    tier: int = 0
    weight: int = 1
    region: str = ""
    router: str = Router.DIRECT
    zero_retention: str = TriState.UNKNOWN
    data_collection: str = DataCollection.UNKNOWN
    tools: str = TriState.UNKNOWN
    write_tools: str = TriState.UNKNOWN
    vision: str = TriState.UNKNOWN
    role_separation: str = TriState.UNKNOWN
    tool_representation: str = ToolRepresentation.UNKNOWN
    quality: float | None = None
    min_deadline_ms: int = 0
    discovery: bool = False
    enabled: bool = True
    models: tuple[ModelSpec, ...] = ()

    def values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ASSIGNMENT_VALUE_FIELDS}


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
    allowed_models: tuple[str, ...] = ()
    require_zero_retention: bool = False
    regions: tuple[str, ...] = ()
    allow_third_party_router: bool = True
    min_quality: float = 0.0
    budget_micros: int | None = None
    budget_period: str = ""  # day | week | month (UTC); empty: lifetime
    enabled: bool = True
    expires_at: datetime | None = None
    limit_rpm: int | None = None
    limit_tpm: int | None = None
    limit_concurrent: int | None = None

    def values(self) -> dict[str, Any]:
        """The `GatewayKey` columns this spec declares (not the hash, not the pools)."""
        return {
            "allowed_models": list(self.allowed_models),
            "require_zero_retention": self.require_zero_retention,
            "regions": list(self.regions),
            "allow_third_party_router": self.allow_third_party_router,
            "min_quality": self.min_quality,
            "budget_micros": self.budget_micros,
            "budget_period": self.budget_period,
            "enabled": self.enabled,
            "expires_at": self.expires_at,
            **{f"limit_{name}": getattr(self, f"limit_{name}") for name in LIMIT_FIELDS},
        }


MODEL_VALUE_FIELDS = tuple(f.name for f in dataclasses.fields(ModelSpec) if f.name != "model")
ASSIGNMENT_VALUE_FIELDS = tuple(
    f.name for f in dataclasses.fields(AssignmentSpec) if f.name not in ("name", "models", "api_key_from_env")
)


def _settings_default(name: str) -> Any:
    return GatewaySettings._meta.get_field(name).default


@dataclass(frozen=True, slots=True)
class SettingsSpec:
    """The `GatewaySettings` singleton; field names are its columns, defaults are its defaults."""

    failure_threshold: int = _settings_default("failure_threshold")
    cooldown_seconds: int = _settings_default("cooldown_seconds")
    max_cooldown_seconds: int = _settings_default("max_cooldown_seconds")
    half_open_probes: int = _settings_default("half_open_probes")
    probe_lease_seconds: int = _settings_default("probe_lease_seconds")
    demotion_seconds: int = _settings_default("demotion_seconds")
    max_attempts: int = _settings_default("max_attempts")
    backoff_base_ms: int = _settings_default("backoff_base_ms")
    min_attempt_ms: int = _settings_default("min_attempt_ms")
    default_deadline_ms: int = _settings_default("default_deadline_ms")
    model_fallback_family: bool = _settings_default("model_fallback_family")
    qualification_days: int = _settings_default("qualification_days")

    def values(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    settings: SettingsSpec = SettingsSpec()
    aliases: tuple[tuple[str, str], ...] = ()  # (alias, canonical)
    fallbacks: tuple[tuple[str, str], ...] = ()  # (requested, served)
    pools: tuple[PoolSpec, ...] = ()
    keys: tuple[KeySpec, ...] = ()
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


@dataclass(frozen=True, slots=True)
class Validation:
    config: GatewayConfig | None
    errors: tuple[ConfigIssue, ...]
    warnings: tuple[ConfigIssue, ...]


# --- YAML ----------------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys in a mapping (merge keys `<<` may still be overridden)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str) -> object:
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        path = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(file)"
        raise ConfigSyntaxError(ConfigIssue(path, IssueCode.SYNTAX, f"invalid YAML: {exc.problem}")) from exc
    except yaml.YAMLError as exc:
        raise ConfigSyntaxError(ConfigIssue("(file)", IssueCode.SYNTAX, f"invalid YAML: {exc}")) from exc


# --- validation ----------------------------------------------------------------------------------


class _Missing:
    pass


MISSING: Any = _Missing()
ROOT = "(top level)"


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path and path != ROOT else str(key)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class _Checker:
    def __init__(self) -> None:
        self.errors: list[ConfigIssue] = []
        self.warnings: list[ConfigIssue] = []

    def error(self, path: str, code: IssueCode, message: str) -> None:
        self.errors.append(ConfigIssue(path, code, message))

    def warn(self, path: str, code: IssueCode, message: str) -> None:
        self.warnings.append(ConfigIssue(path, code, message))

    # structure

    def mapping(self, value: object, path: str, fields: Collection[str]) -> dict[Any, Any] | None:
        if not isinstance(value, dict):
            self.error(path, IssueCode.INVALID, "must be a mapping")
            return None
        for key in value:
            if key not in fields:
                self.error(_join(path, key), IssueCode.UNKNOWN_FIELD, "unknown field")
        return value

    def sequence(self, value: object, path: str) -> list[Any]:
        if not isinstance(value, list):
            self.error(path, IssueCode.INVALID, "must be a list")
            return []
        return value

    def take(
        self,
        data: Mapping[Any, Any],
        key: str,
        path: str,
        read: Callable[[object, str], T],
        default: T | _Missing = MISSING,
    ) -> T:
        """Read `data[key]` with `read`; an absent field takes `default`, or is `required`.

        A failed read records its error and returns the default, so the walk goes on and every
        error is collected (the half-read config is discarded when there is any)."""
        path = _join(path, key)
        if key not in data:
            if isinstance(default, _Missing):
                self.error(path, IssueCode.REQUIRED, "required")
                return None  # type: ignore[return-value]
            return default
        return read(data[key], path)

    # scalars

    def string(self, value: object, path: str, *, max_length: int = NAME_MAX) -> str:
        if not isinstance(value, str) or not value.strip():
            self.error(path, IssueCode.INVALID, "must be a non-empty string")
            return ""
        if value != value.strip():
            self.error(path, IssueCode.INVALID, "must not start or end with whitespace")
        if len(value) > max_length:
            self.error(path, IssueCode.INVALID, f"must be at most {max_length} characters")
        return value

    def integer(self, value: object, path: str, *, minimum: int | None, maximum: int = INT32_MAX) -> int:
        floor = -INT32_MAX - 1 if minimum is None else minimum
        if not _is_int(value) or value < floor:  # type: ignore[operator]
            self.error(
                path,
                IssueCode.INVALID,
                "must be an integer" + (f" >= {minimum}" if minimum is not None else ""),
            )
            return floor
        if value > maximum:  # type: ignore[operator]
            self.error(path, IssueCode.INVALID, f"must be an integer <= {maximum}")
        return value  # type: ignore[return-value]

    def optional_integer(self, value: object, path: str, *, minimum: int, maximum: int) -> int | None:
        """`null` means unknown (prices, context window) or none (budget)."""
        if value is None:
            return None
        return self.integer(value, path, minimum=minimum, maximum=maximum)

    def optional_datetime(self, value: object, path: str) -> datetime | None:
        """ISO 8601 with a time zone (`2027-01-31T00:00:00Z`); YAML may already have parsed it."""
        if value is None:
            return None
        parsed = value if isinstance(value, datetime) else None
        if isinstance(value, str):
            try:
                parsed = datetime.fromisoformat(value)
            except ValueError:
                parsed = None
        if parsed is None or (isinstance(value, date) and not isinstance(value, datetime)):
            self.error(
                path, IssueCode.INVALID, "must be an ISO 8601 date and time, e.g. 2027-01-31T00:00:00Z"
            )
            return None
        if parsed.tzinfo is None:
            self.error(path, IssueCode.INVALID, "must name its time zone, e.g. 2027-01-31T00:00:00Z")
            return None
        return parsed

    def fraction(self, value: object, path: str) -> float:
        if not _is_number(value) or not 0 <= value <= 1:  # type: ignore[operator]
            self.error(path, IssueCode.INVALID, "must be a number between 0 and 1")
            return 0.0
        return float(value)  # type: ignore[arg-type]

    def boolean(self, value: object, path: str) -> bool:
        if not isinstance(value, bool):
            self.error(path, IssueCode.INVALID, "must be true or false")
            return False
        return value

    def tri_state(self, value: object, path: str) -> str:
        if value is True:
            return TriState.TRUE
        if value is False:
            return TriState.FALSE
        if value == TriState.UNKNOWN:
            return TriState.UNKNOWN
        self.error(path, IssueCode.INVALID, "must be true, false or unknown")
        return TriState.UNKNOWN

    def choice(self, value: object, path: str, choices: Iterable[str]) -> str:
        options = list(choices)
        if value not in options:
            self.error(path, IssueCode.INVALID, f"must be one of {', '.join(options)}")
            return options[0]
        return value  # type: ignore[return-value]

    def env_name(self, value: object, path: str) -> str:
        name = self.string(value, path, max_length=ENV_NAME_MAX)
        if name and not ENV_NAME_RE.match(name):
            self.error(
                path, IssueCode.INVALID, "must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
            )
        return name

    def upstream_env_name(self, value: object, path: str) -> str:
        """A variable that may hold an upstream credential: only `GATEWAY_UPSTREAM_*` (SPEC §3)."""
        name = self.env_name(value, path)
        if name and ENV_NAME_RE.match(name) and not env_name_allowed(name):
            self.error(
                path,
                IssueCode.INVALID,
                f"must name a variable starting with {ENV_PREFIX} ({name!r} is not an upstream credential)",
            )
        return name

    def base_url(self, value: object, path: str) -> str:
        url = self.string(value, path, max_length=URL_MAX)
        if not url:
            return url
        problem = base_url_problem(url)
        if problem is not None:
            self.error(path, IssueCode.INVALID, problem)
        return url

    def strings(self, value: object, path: str, *, max_length: int, what: str = "entry") -> tuple[str, ...]:
        """A list of distinct non-empty strings."""
        seen: dict[str, int] = {}
        for i, item in enumerate(self.sequence(value, path)):
            item_path = f"{path}[{i}]"
            text = self.string(item, item_path, max_length=max_length)
            if not text:
                continue
            if text in seen:
                self.error(
                    item_path, IssueCode.DUPLICATE, f"duplicate {what} {text!r} (also {path}[{seen[text]}])"
                )
            else:
                seen[text] = i
        return tuple(seen)

    def model_map(self, value: object, path: str) -> dict[str, tuple[str, str]]:
        """`model_aliases` / `model_fallbacks`: name -> (target, path of the entry)."""
        if not isinstance(value, dict):
            self.error(path, IssueCode.INVALID, "must be a mapping")
            return {}
        result: dict[str, tuple[str, str]] = {}
        for name, target in value.items():
            entry_path = _join(path, name)
            if not isinstance(name, str) or not name.strip() or len(name) > MODEL_MAX:
                self.error(
                    entry_path,
                    IssueCode.INVALID,
                    f"model name must be a non-empty string of at most {MODEL_MAX} characters",
                )
                continue
            target_name = self.string(target, entry_path, max_length=MODEL_MAX)
            if not target_name:
                continue
            if name == AUTO_MODEL:
                self.error(entry_path, IssueCode.RESERVED, f"{AUTO_MODEL!r} is reserved for model=auto")
            result[name] = (target_name, entry_path)
        return result


def validate_config(
    document: object, *, env: Mapping[str, str], facts: DatabaseFacts = DatabaseFacts(), prune: bool = False
) -> Validation:
    """Check a parsed YAML document; see the module docstring. Pure: reads only its arguments."""
    c = _Checker()
    root: dict[Any, Any] = {} if document is None else (c.mapping(document, ROOT, TOP_LEVEL_FIELDS) or {})

    settings = _settings(c, root)
    aliases = c.take(root, "model_aliases", "", c.model_map, {})
    fallbacks = c.take(root, "model_fallbacks", "", c.model_map, {})
    pools = _pools(c, root)
    keys = _keys(c, root, {p.name for p in pools}, env=env, facts=facts, prune=prune)
    _check_model_maps(c, aliases, fallbacks, pools, facts=facts, prune=prune)
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
                    f"pools[{pool_index}].assignments[{i}].api_key_env",
                    IssueCode.ENV_UNSET,
                    f"environment variable {assignment.api_key_env!r} is not set (no credential is sent)",
                )

    config = None
    if not c.errors:
        config = GatewayConfig(
            settings=settings,
            aliases=tuple((k, v[0]) for k, v in aliases.items()),
            fallbacks=tuple((k, v[0]) for k, v in fallbacks.items()),
            pools=tuple(pools),
            keys=tuple(keys),
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


def _settings(c: _Checker, root: Mapping[Any, Any]) -> SettingsSpec:
    values: dict[str, Any] = {}
    for block, fields in (("circuit", CIRCUIT_FIELDS), ("retry", RETRY_FIELDS)):
        if block not in root:
            continue
        data = c.mapping(root[block], block, fields) or {}
        for name, minimum in fields.items():
            if name in data:
                values[name] = c.integer(data[name], _join(block, name), minimum=minimum)
    spec = SettingsSpec(**values)
    if spec.max_cooldown_seconds < spec.cooldown_seconds:
        c.error(
            "circuit.max_cooldown_seconds",
            IssueCode.INVALID,
            f"must be >= cooldown_seconds ({spec.cooldown_seconds})",
        )
    family = c.take(root, "model_fallback_family", "", c.boolean, spec.model_fallback_family)
    days = c.take(root, "qualification_days", "", _qualification_days(c), spec.qualification_days)
    return dataclasses.replace(spec, model_fallback_family=family, qualification_days=days)


# A verdict older than ten years is no evidence of today's route.
QUALIFICATION_DAYS_MAX = 3650


def _qualification_days(c: _Checker) -> Callable[[object, str], int]:
    return lambda value, path: c.integer(value, path, minimum=1, maximum=QUALIFICATION_DAYS_MAX)


def _pools(c: _Checker, root: Mapping[Any, Any]) -> list[PoolSpec]:
    pools: list[PoolSpec] = []
    pool_names: dict[str, str] = {}
    assignment_names: dict[str, str] = {}
    for p, raw in enumerate(c.take(root, "pools", "", c.sequence, [])):
        path = f"pools[{p}]"
        data = c.mapping(raw, path, POOL_FIELDS)
        if data is None:
            continue
        name = c.take(data, "name", path, c.string) or ""
        if name in pool_names:
            c.error(
                f"{path}.name", IssueCode.DUPLICATE, f"duplicate pool name {name!r} (also {pool_names[name]})"
            )
        elif name:
            pool_names[name] = path
        auto_models = c.take(
            data, "auto_models", path, lambda v, q: c.strings(v, q, max_length=MODEL_MAX, what="model"), ()
        )
        if AUTO_MODEL in auto_models:
            c.error(f"{path}.auto_models", IssueCode.RESERVED, f"{AUTO_MODEL!r} cannot be an auto model")
        assignments = []
        for a, raw_assignment in enumerate(c.take(data, "assignments", path, c.sequence, [])):
            assignment = _assignment(c, raw_assignment, f"{path}.assignments[{a}]")
            if assignment is None:
                continue
            first = assignment_names.get(assignment.name)
            if first is not None:
                c.error(
                    f"{path}.assignments[{a}].name",
                    IssueCode.DUPLICATE,
                    f"duplicate assignment name {assignment.name!r} (also {first})",
                )
            elif assignment.name:
                assignment_names[assignment.name] = f"{path}.assignments[{a}]"
            assignments.append(assignment)
        pools.append(PoolSpec(name=name, auto_models=auto_models, assignments=tuple(assignments)))
    return pools


def _assignment(c: _Checker, raw: object, path: str) -> AssignmentSpec | None:
    data = c.mapping(raw, path, ASSIGNMENT_FIELDS)
    if data is None:
        return None
    adapter = c.take(data, "adapter", path, lambda v, q: c.choice(v, q, Adapter.values))
    values: dict[str, Any] = {
        "name": c.take(data, "name", path, c.string) or "",
        "adapter": adapter,
        "base_url": c.take(data, "base_url", path, c.base_url),
        "api_key_env": c.take(data, "api_key_env", path, c.upstream_env_name, ""),
        "api_key_from_env": c.take(data, "api_key_from_env", path, c.upstream_env_name, ""),
        "tier": c.take(data, "tier", path, lambda v, q: c.integer(v, q, minimum=None), 0),
        "weight": c.take(data, "weight", path, lambda v, q: c.integer(v, q, minimum=1), 1),
        "region": c.take(data, "region", path, lambda v, q: c.string(v, q, max_length=REGION_MAX), ""),
        # An OpenRouter endpoint is a third-party router whatever the file forgets to say: defaulting
        # it to `direct` would let it past a key that forbids third-party routers.
        "router": c.take(
            data,
            "router",
            path,
            lambda v, q: c.choice(v, q, Router),
            Router.THIRD_PARTY if adapter == Adapter.OPENROUTER else Router.DIRECT,
        ),
        "quality": c.take(data, "quality", path, lambda v, q: None if v is None else c.fraction(v, q), None),
        "min_deadline_ms": c.take(data, "min_deadline_ms", path, lambda v, q: c.integer(v, q, minimum=0), 0),
        "discovery": c.take(data, "discovery", path, c.boolean, False),
        "enabled": c.take(data, "enabled", path, c.boolean, True),
    }
    if "privacy" in data:
        privacy = c.mapping(data["privacy"], f"{path}.privacy", PRIVACY_FIELDS) or {}
        values["zero_retention"] = c.take(
            privacy, "zero_retention", f"{path}.privacy", c.tri_state, TriState.UNKNOWN
        )
        values["data_collection"] = c.take(
            privacy,
            "data_collection",
            f"{path}.privacy",
            lambda v, q: c.choice(v, q, DataCollection),
            DataCollection.UNKNOWN,
        )
    if "capabilities" in data:
        caps_path = f"{path}.capabilities"
        caps = c.mapping(data["capabilities"], caps_path, CAPABILITY_FIELDS) or {}
        for name in TRI_CAPABILITIES:
            values[name] = c.take(caps, name, caps_path, c.tri_state, TriState.UNKNOWN)
        values["tool_representation"] = c.take(
            caps,
            "tool_representation",
            caps_path,
            lambda v, q: c.choice(v, q, ToolRepresentation),
            ToolRepresentation.UNKNOWN,
        )
    models: list[ModelSpec] = []
    seen: dict[str, int] = {}
    for m, raw_model in enumerate(c.take(data, "models", path, c.sequence, [])):
        model = _model(c, raw_model, f"{path}.models[{m}]")
        if model is None or not model.model:
            continue
        if model.model in seen:
            c.error(
                f"{path}.models[{m}].id",
                IssueCode.DUPLICATE,
                f"duplicate model {model.model!r} (also {path}.models[{seen[model.model]}])",
            )
            continue
        seen[model.model] = m
        models.append(model)
    return AssignmentSpec(**values, models=tuple(models))


def _model(c: _Checker, raw: object, path: str) -> ModelSpec | None:
    data = c.mapping(raw, path, MODEL_FIELDS)
    if data is None:
        return None
    model_id = c.take(data, "id", path, lambda v, q: c.string(v, q, max_length=MODEL_MAX)) or ""
    if model_id == AUTO_MODEL:
        c.error(f"{path}.id", IssueCode.RESERVED, f"{AUTO_MODEL!r} is reserved for model=auto")
    values: dict[str, Any] = {
        "model": model_id,
        "context_window": c.take(
            data,
            "context_window",
            path,
            lambda v, q: c.optional_integer(v, q, minimum=1, maximum=INT32_MAX),
            None,
        ),
    }
    if "capabilities" in data:
        caps = c.mapping(data["capabilities"], f"{path}.capabilities", MODEL_CAPABILITY_FIELDS) or {}
        for name in MODEL_CAPABILITY_FIELDS:
            values[name] = c.take(caps, name, f"{path}.capabilities", c.tri_state, TriState.UNKNOWN)
    if "price" in data:
        price = c.mapping(data["price"], f"{path}.price", PRICE_FIELDS) or {}
        for name in PRICE_FIELDS:
            values[name] = c.take(
                price,
                name,
                f"{path}.price",
                lambda v, q: c.optional_integer(v, q, minimum=0, maximum=INT64_MAX),
                None,
            )
    return ModelSpec(**values)


def _keys(
    c: _Checker,
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
        data = c.mapping(raw, path, KEY_FIELDS)
        if data is None:
            continue
        name = c.take(data, "name", path, c.string) or ""
        if name in names:
            c.error(f"{path}.name", IssueCode.DUPLICATE, f"duplicate key name {name!r} (also {names[name]})")
        elif name:
            names[name] = path

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
        allowed = c.take(
            data,
            "allowed_models",
            path,
            lambda v, q: c.strings(v, q, max_length=MODEL_MAX, what="model"),
            (),
        )
        limits = _limits(c, data, path)
        req_path = f"{path}.requirements"
        req = (
            (c.mapping(data["requirements"], req_path, REQUIREMENT_FIELDS) or {})
            if "requirements" in data
            else {}
        )
        keys.append(
            KeySpec(
                name=name,
                secret=secret,
                pools=key_pools or (),
                allowed_models=allowed,
                require_zero_retention=c.take(req, "zero_retention", req_path, c.boolean, False),
                regions=c.take(
                    req,
                    "regions",
                    req_path,
                    lambda v, q: c.strings(v, q, max_length=REGION_MAX, what="region"),
                    (),
                ),
                allow_third_party_router=c.take(req, "allow_third_party_router", req_path, c.boolean, True),
                min_quality=c.take(req, "min_quality", req_path, c.fraction, 0.0),
                budget_micros=c.take(
                    data,
                    "budget_micros",
                    path,
                    lambda v, q: c.optional_integer(v, q, minimum=0, maximum=INT64_MAX),
                    None,
                ),
                budget_period=c.take(
                    data,
                    "budget_period",
                    path,
                    lambda v, q: "" if v is None else c.choice(v, q, BudgetPeriod),
                    "",
                ),
                enabled=c.take(data, "enabled", path, c.boolean, True),
                expires_at=c.take(data, "expires_at", path, c.optional_datetime, None),
                **limits,
            )
        )
    return keys


def _limits(c: _Checker, data: Mapping[Any, Any], path: str) -> dict[str, int | None]:
    """`limits: {rpm, tpm, concurrent}`: each a whole number of at least 1, or null (no limit);
    `limits: null` or no `limits` is no limit at all. Zero is refused: `enabled: false` stops a key."""
    limits_path = f"{path}.limits"
    raw = data.get("limits")
    given = (c.mapping(raw, limits_path, LIMIT_FIELDS) or {}) if raw is not None else {}
    return {
        f"limit_{name}": c.take(
            given,
            name,
            limits_path,
            lambda v, q: c.optional_integer(v, q, minimum=1, maximum=INT32_MAX),
            None,
        )
        for name in LIMIT_FIELDS
    }


def _index_of(raw_list: list[Any], value: str, fallback: int) -> int:
    try:
        return raw_list.index(value)
    except ValueError:
        return fallback


def _key_secret(
    c: _Checker,
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
        variable = c.env_name(data["key_env"], secret_path)
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


def _check_model_maps(
    c: _Checker,
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


def _tri_out(value: str) -> bool | None:
    return {TriState.TRUE: True, TriState.FALSE: False}.get(value)  # type: ignore[call-overload]


def _compact(items: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """Drop unknowns: a value that is absent on reload stays unknown."""
    return {k: v for k, v in items if v is not None}


def _without_userinfo(url: str) -> str:
    """A base_url as the dump may print it: a row written before userinfo was refused (or around
    validation) keeps its credentials out of the output."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def render_document(config: GatewayConfig) -> dict[str, Any]:
    s = config.settings
    document: dict[str, Any] = {
        "circuit": {name: getattr(s, name) for name in CIRCUIT_FIELDS},
        "retry": {name: getattr(s, name) for name in RETRY_FIELDS},
        "model_aliases": dict(sorted(config.aliases)),
        "model_fallbacks": dict(sorted(config.fallbacks)),
        "model_fallback_family": s.model_fallback_family,
        "qualification_days": s.qualification_days,
        "pools": [],
        "keys": [],
    }
    for pool in sorted(config.pools, key=lambda p: p.name):
        assignments = []
        for a in sorted(pool.assignments, key=lambda a: (a.tier, a.name)):
            item: dict[str, Any] = {
                "name": a.name,
                "adapter": a.adapter,
                "base_url": _without_userinfo(a.base_url),
            }
            if a.api_key_env:
                item["api_key_env"] = a.api_key_env
            item.update(tier=a.tier, weight=a.weight)
            if a.region:
                item["region"] = a.region
            item["router"] = a.router
            privacy = _compact(
                [
                    ("zero_retention", _tri_out(a.zero_retention)),
                    (
                        "data_collection",
                        None if a.data_collection == DataCollection.UNKNOWN else a.data_collection,
                    ),
                ]
            )
            if privacy:
                item["privacy"] = privacy
            capabilities = _compact(
                [
                    *((name, _tri_out(getattr(a, name))) for name in TRI_CAPABILITIES),
                    (
                        "tool_representation",
                        None
                        if a.tool_representation == ToolRepresentation.UNKNOWN
                        else a.tool_representation,
                    ),
                ]
            )
            if capabilities:
                item["capabilities"] = capabilities
            if a.quality is not None:
                item["quality"] = a.quality
            item.update(min_deadline_ms=a.min_deadline_ms, discovery=a.discovery)
            if not a.enabled:
                item["enabled"] = False
            models = []
            for m in sorted(a.models, key=lambda m: m.model):
                model: dict[str, Any] = {"id": m.model}
                if m.context_window is not None:
                    model["context_window"] = m.context_window
                caps = _compact((name, _tri_out(getattr(m, name))) for name in MODEL_CAPABILITY_FIELDS)
                if caps:
                    model["capabilities"] = caps
                price = _compact((name, getattr(m, name)) for name in PRICE_FIELDS)
                if price:
                    model["price"] = price
                models.append(model)
            if models:
                item["models"] = models
            assignments.append(item)
        document["pools"].append(
            {"name": pool.name, "auto_models": list(pool.auto_models), "assignments": assignments}
        )
    for key in sorted(config.keys, key=lambda k: k.name):
        item = {
            "name": key.name,
            "pools": sorted(key.pools),
            "allowed_models": list(key.allowed_models),
            "requirements": {
                "zero_retention": key.require_zero_retention,
                "regions": list(key.regions),
                "allow_third_party_router": key.allow_third_party_router,
                "min_quality": key.min_quality,
            },
            "budget_micros": key.budget_micros,
            "budget_period": key.budget_period or None,
        }
        if not key.enabled:
            item["enabled"] = False
        if key.expires_at is not None:
            item["expires_at"] = key.expires_at.isoformat()
        limits = {name: getattr(key, f"limit_{name}") for name in LIMIT_FIELDS}
        if any(value is not None for value in limits.values()):
            item["limits"] = limits
        document["keys"].append(item)
    return document


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
    )


def config_from_database() -> GatewayConfig:
    """The current state as a `GatewayConfig` (keys without secrets). Writes nothing: the settings
    row is not created when it does not exist yet, its defaults are reported instead."""
    settings = GatewaySettings.objects.filter(pk=1).first() or GatewaySettings()
    configured: dict[int, list[ModelSpec]] = {}
    entries = CatalogEntry.objects.filter(provenance=Provenance.CONFIGURED).order_by("model")
    for entry in entries:
        configured.setdefault(entry.assignment_id, []).append(
            ModelSpec(model=entry.model, **{name: getattr(entry, name) for name in MODEL_VALUE_FIELDS})
        )
    assignments: dict[int, list[AssignmentSpec]] = {}
    for a in Assignment.objects.order_by("name"):
        values = {name: getattr(a, name) for name in ASSIGNMENT_VALUE_FIELDS}
        assignments.setdefault(a.pool_id, []).append(
            AssignmentSpec(name=a.name, **values, models=tuple(configured.get(a.pk, ())))
        )
    pools = [
        PoolSpec(name=p.name, auto_models=tuple(p.auto_models), assignments=tuple(assignments.get(p.pk, ())))
        for p in Pool.objects.order_by("name")
    ]
    keys = [
        KeySpec(
            name=k.name,
            pools=tuple(sorted(p.name for p in k.pools.all())),
            allowed_models=tuple(k.allowed_models),
            require_zero_retention=k.require_zero_retention,
            regions=tuple(k.regions),
            allow_third_party_router=k.allow_third_party_router,
            min_quality=k.min_quality,
            budget_micros=k.budget_micros,
            budget_period=k.budget_period,
            enabled=k.enabled,
            expires_at=k.expires_at,
            **{f"limit_{name}": getattr(k, f"limit_{name}") for name in LIMIT_FIELDS},
        )
        for k in GatewayKey.objects.order_by("name").prefetch_related("pools")
    ]
    return GatewayConfig(
        settings=SettingsSpec(
            **{f.name: getattr(settings, f.name) for f in dataclasses.fields(SettingsSpec)}
        ),
        aliases=tuple(ModelAlias.objects.order_by("alias").values_list("alias", "canonical")),
        fallbacks=tuple(ModelFallback.objects.order_by("requested").values_list("requested", "served")),
        pools=tuple(pools),
        keys=tuple(keys),
    )


def dump_config() -> str:
    return render_config(config_from_database())
