"""The YAML configuration's schema (SPEC §3), declared once.

Contract: each field of the file is one `Field` of a section below: its YAML key, the model column it
fills, how it is read and how it is dumped. A column's limits (length, integer range, null), its choices
and its default come from the model field's `_meta`, so a migration that changes a column changes what the
file accepts; only the policy the models do not state (a minimum stricter than the column's, a number
that is a fraction) is declared here. `read_fields` walks one mapping of the file through a section and
`render_fields` writes one back: the same declaration both ways, so the loader and the dumper cannot
drift apart. The rules between fields (duplicates, references between sections, secrets) are
`gatewayconfig.document`'s.
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.db import models

from catalog.models import CatalogEntry
from gatewayconfig.checker import INT32_MAX, INT64_MAX, MISSING, Checker, IssueCode, join
from pools.models import Adapter, Assignment, GatewayKey, GatewaySettings, Pool
from routing.budget import micros_from_usd, usd
from routing.vocabulary import Router, TriState

NAME_MAX = Pool._meta.get_field("name").max_length
MODEL_MAX = CatalogEntry._meta.get_field("model").max_length
REGION_MAX = Assignment._meta.get_field("region").max_length
ENV_NAME_MAX = Assignment._meta.get_field("api_key_env").max_length
AUTO_MODEL = "auto"  # model="auto" is resolved by the router (SPEC §5.5), never a model name
# A verdict older than ten years is no evidence of today's route.
QUALIFICATION_DAYS_MAX = 3650


# --- how one value is read and written -----------------------------------------------------------

Read = Callable[[Checker, object, str], Any]


@dataclass(frozen=True, slots=True)
class Kind:
    read: Read
    render: Callable[[Any], Any] = lambda value: value


def _tri_out(value: str) -> bool | None:
    return {TriState.TRUE: True, TriState.FALSE: False}.get(value)  # type: ignore[call-overload]


def _without_userinfo(url: str) -> str:
    """A base_url as the dump may print it: a row written before userinfo was refused (or around
    validation) keeps its credentials out of the output."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _nullable(read: Read) -> Read:
    """`null` means unknown (prices, context window, quality) or none (budget, limits, expiry)."""
    return lambda c, value, path: None if value is None else read(c, value, path)


TRI_STATE = Kind(Checker.tri_state, _tri_out)
BOOLEAN = Kind(Checker.boolean)
FRACTION = Kind(Checker.fraction)
DATETIME = Kind(Checker.optional_datetime, lambda value: None if value is None else value.isoformat())
UPSTREAM_ENV_NAME = Kind(lambda c, value, path: c.upstream_env_name(value, path, max_length=ENV_NAME_MAX))


def _dollars(c: Checker, value: object, path: str) -> int:
    try:
        return micros_from_usd(value)
    except ValueError as refused:
        c.error(path, IssueCode.INVALID, f"{refused}")
        return 0


# An amount in US dollars (`"50.00"`, `0.25`) stored as integer micros, dumped as a decimal string.
USD = Kind(_nullable(_dollars), lambda micros: None if micros is None else usd(micros).removeprefix("$"))


def integer(column: models.Field, minimum: int | None) -> Kind:
    """An integer column's range from its type (a positive column starts at 0), unless `minimum` is
    stricter policy of the file; a nullable column also takes `null`."""
    if minimum is None and isinstance(column, models.PositiveIntegerField):
        minimum = 0
    maximum = INT64_MAX if isinstance(column, models.BigIntegerField) else INT32_MAX
    read: Read = lambda c, value, path: c.integer(value, path, minimum=minimum, maximum=maximum)  # noqa: E731
    return Kind(_nullable(read) if column.null else read)


def choice(column: models.Field) -> Kind:
    """One of the column's choices; a column that may be blank also takes `null` (and dumps it)."""
    options = [value for value, _ in column.choices]  # type: ignore[union-attr]
    if options == list(TriState):
        return TRI_STATE
    if column.blank:
        return Kind(
            lambda c, value, path: "" if value is None else c.choice(value, path, options),
            lambda value: value or None,
        )
    return Kind(lambda c, value, path: c.choice(value, path, options))


def string(max_length: int, what: str = "") -> Kind:
    """A string of at most `max_length`; with `what`, a list of distinct such strings."""
    if what:
        return Kind(lambda c, value, path: c.strings(value, path, max_length=max_length, what=what), list)
    return Kind(lambda c, value, path: c.string(value, path, max_length=max_length))


# --- the schema ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Field:
    """One YAML key. `column` is the model column it fills (the key itself unless named); a field
    without `kind` is read and rendered by `gatewayconfig.document` (a list of sub-sections, a secret, a
    reference). `always`: dumped even at its default (else a default is left out, so an unknown stays
    unknown on reload). `default` may be a function of the values read before it."""

    key: str
    kind: Kind | None = None
    column: str = ""
    default: Any = MISSING
    always: bool = False
    legacy: tuple[str, Kind] | None = None  # an older key read into the same column, never dumped

    @property
    def name(self) -> str:
        return self.column or self.key


@dataclass(frozen=True, slots=True)
class Block:
    """A nested mapping (`privacy:`, `limits:`) whose fields are columns of the same row. `whole`: dumped
    with every field when any is set (`limits`); `nullable`: `null` stands for the empty mapping."""

    key: str
    fields: tuple[Field, ...]
    whole: bool = False
    nullable: bool = False


Entry = Field | Block


def column(
    model: type[models.Model], name: str, *, key: str = "", always: bool = False, **policy: Any
) -> Field:
    """The field of `model.name`: its kind, limits and default from `_meta`; `policy` is what the
    column does not say (`minimum`, `kind`, `required`)."""
    db_field = model._meta.get_field(name)
    kind: Kind = policy.get("kind") or _kind_of(db_field, policy.get("minimum"))
    if policy.get("required"):
        default = MISSING
    elif "default" in policy:
        default = policy["default"]
    elif db_field.has_default():
        default = db_field.get_default()
    else:
        default = None if db_field.null else ""
    return Field(key=key or name, kind=kind, column=name if key else "", default=default, always=always)


def money(model: type[models.Model], name: str, *, key: str, always: bool = False) -> Field:
    """A micros column written in dollars under `key`; its micros name is still read (never dumped)."""
    micros = column(model, name, minimum=0)
    return replace(column(model, name, key=key, always=always, kind=USD), legacy=(name, micros.kind))


def _kind_of(db_field: Any, minimum: int | None) -> Kind:
    if db_field.choices:
        return choice(db_field)
    if isinstance(db_field, models.BooleanField):
        return BOOLEAN
    if isinstance(db_field, models.IntegerField):
        return integer(db_field, minimum)
    if isinstance(db_field, models.DateTimeField):
        return DATETIME
    if isinstance(db_field, models.CharField):
        return string(db_field.max_length)
    raise TypeError(f"no YAML kind for {db_field!r}: name it in the schema")


def _router_default(values: Mapping[str, Any]) -> str:
    # An OpenRouter endpoint is a third-party router whatever the file forgets to say: defaulting it to
    # `direct` would let it past a key that forbids third-party routers.
    return (Router.THIRD_PARTY if values.get("adapter") == Adapter.OPENROUTER else Router.DIRECT).value


def _settings(name: str, minimum: int | None = None, **policy: Any) -> Field:
    return column(GatewaySettings, name, always=True, minimum=minimum, **policy)


TOP_LEVEL: tuple[Entry, ...] = (
    Block(
        "circuit",
        (
            _settings("failure_threshold", 1),
            _settings("cooldown_seconds", 1),
            _settings("max_cooldown_seconds", 1),
            _settings("half_open_probes", 1),
            _settings("probe_lease_seconds", 1),
            _settings("demotion_seconds"),
            _settings("headroom_floor", kind=FRACTION),
        ),
    ),
    Block(
        "retry",
        (
            _settings("max_attempts", 1),
            _settings("backoff_base_ms"),
            _settings("min_attempt_ms"),
            _settings("default_deadline_ms", 1),
        ),
    ),
    Field("model_aliases", always=True),
    Field("model_fallbacks", always=True),
    _settings("model_fallback_family"),
    _settings(
        "qualification_days",
        kind=Kind(lambda c, value, path: c.integer(value, path, minimum=1, maximum=QUALIFICATION_DAYS_MAX)),
    ),
    Field("pools", always=True),
    Field("keys", always=True),
)

# The `GatewaySettings` columns: the top level's blocks and scalars that are not sections of their own.
SETTINGS: tuple[Entry, ...] = tuple(e for e in TOP_LEVEL if isinstance(e, Block) or e.kind is not None)

POOL: tuple[Entry, ...] = (
    column(Pool, "name", always=True, required=True),
    Field("auto_models", string(MODEL_MAX, what="model"), default=(), always=True),
    Field("assignments", always=True),
)


def _a(name: str, **policy: Any) -> Field:
    return column(Assignment, name, **policy)


ASSIGNMENT: tuple[Entry, ...] = (
    _a("name", always=True, required=True),
    _a("adapter", always=True, required=True),
    _a(
        "base_url",
        always=True,
        required=True,
        kind=Kind(
            lambda c, value, path: c.base_url(
                value, path, max_length=Assignment._meta.get_field("base_url").max_length
            ),
            _without_userinfo,
        ),
    ),
    _a("api_key_env", kind=UPSTREAM_ENV_NAME),
    # Read once at load and stored encrypted (GatewayConfig.credentials); never a column, never dumped.
    Field("api_key_from_env"),
    _a("tier", always=True),
    _a("weight", always=True, minimum=1),
    _a("region"),
    _a("router", always=True, default=_router_default),
    Block("privacy", (_a("zero_retention"), _a("data_collection"))),
    Block(
        "capabilities",
        (
            _a("tools"),
            _a("write_tools"),
            _a("vision"),
            _a("role_separation"),
            _a("tool_representation"),
            _a("stream_options"),
        ),
    ),
    _a("quality", kind=Kind(_nullable(Checker.fraction))),
    _a("headroom_floor", kind=Kind(_nullable(Checker.fraction))),  # null: the gateway-wide one
    _a("min_deadline_ms", always=True),
    _a("discovery", always=True),
    _a("enabled"),
    Field("models"),
)

MODEL: tuple[Entry, ...] = (
    column(CatalogEntry, "model", key="id", always=True, required=True),
    column(CatalogEntry, "context_window", minimum=1),
    Block("capabilities", (column(CatalogEntry, "tools"), column(CatalogEntry, "vision"))),
    Block(
        "price",
        (
            # Dollars per million tokens; the `*_per_mtok_micros` names are still read.
            money(CatalogEntry, "input_per_mtok_micros", key="input_usd"),
            money(CatalogEntry, "output_per_mtok_micros", key="output_usd"),
            money(CatalogEntry, "cached_input_per_mtok_micros", key="cached_input_usd"),
            money(CatalogEntry, "cache_write_per_mtok_micros", key="cache_write_usd"),
        ),
    ),
)


def _k(name: str, **policy: Any) -> Field:
    return column(GatewayKey, name, **policy)


KEY: tuple[Entry, ...] = (
    _k("name", always=True, required=True),
    Field("key"),
    Field("key_env"),
    Field("pools", always=True),
    # A key without an allow-list may use every model of its pools, as create_key and admin give it.
    _k("allowed_models", always=True, kind=string(MODEL_MAX, what="model"), default=("*",)),
    Block(
        "requirements",
        (
            _k("require_zero_retention", key="zero_retention", always=True),
            _k("regions", always=True, kind=string(REGION_MAX, what="region"), default=()),
            _k("allow_third_party_router", always=True),
            _k("min_quality", always=True, kind=FRACTION),
        ),
    ),
    money(GatewayKey, "budget_micros", key="budget_usd", always=True),  # `budget_micros` still read
    _k("budget_period", always=True),
    _k("enabled"),
    _k("expires_at"),
    Block(
        "limits",
        (
            # Zero is refused: `enabled: false` stops a key.
            _k("limit_rpm", key="rpm", minimum=1),
            _k("limit_tpm", key="tpm", minimum=1),
            _k("limit_concurrent", key="concurrent", minimum=1),
        ),
        whole=True,
        nullable=True,
    ),
)


def keys_of(entries: Iterable[Entry]) -> tuple[str, ...]:
    keys: list[str] = []
    for entry in entries:
        keys.append(entry.key)
        if isinstance(entry, Field) and entry.legacy is not None:
            keys.append(entry.legacy[0])
    return tuple(keys)


def columns(entries: Iterable[Entry]) -> tuple[str, ...]:
    """The model columns a section fills, in schema order."""
    names: list[str] = []
    for entry in entries:
        if isinstance(entry, Block):
            names.extend(columns(entry.fields))
        elif entry.kind is not None:
            names.append(entry.name)
    return tuple(names)


def read_fields(c: Checker, data: Mapping[Any, Any], path: str, entries: Iterable[Entry]) -> dict[str, Any]:
    """The columns `entries` declare, read from `data` (a mapping of the file already checked for
    unknown keys): an absent field takes its default, an absent block its fields' defaults."""
    values: dict[str, Any] = {}
    for entry in entries:
        if isinstance(entry, Block):
            block_path = join(path, entry.key)
            raw = data.get(entry.key)
            given: Mapping[Any, Any] = {}
            if entry.key in data and not (entry.nullable and raw is None):
                given = c.mapping(raw, block_path, keys_of(entry.fields)) or {}
            values.update(read_fields(c, given, block_path, entry.fields))
        elif entry.kind is not None:
            default = entry.default(values) if callable(entry.default) else entry.default
            key, kind = entry.key, entry.kind
            if entry.legacy is not None and entry.legacy[0] in data:
                if key in data:
                    message = f"give either {key} or {entry.legacy[0]}, not both"
                    c.error(join(path, entry.legacy[0]), IssueCode.CONFLICT, message)
                key, kind = entry.legacy
            values[entry.name] = c.take(data, key, path, partial(kind.read, c), default)
    return values


def render_fields(values: Mapping[str, Any], entries: Iterable[Entry]) -> dict[str, Any]:
    """The mapping the dump writes for one row: `values` holds its columns, and what a field without
    `kind` renders to under that field's key (a field absent from `values` is not written)."""
    document: dict[str, Any] = {}
    for entry in entries:
        if isinstance(entry, Block):
            if not entry.whole:
                block = render_fields(values, entry.fields)
            elif any(values[f.name] != f.default for f in entry.fields):
                block = {f.key: entry_value(values, f) for f in entry.fields}
            else:
                block = {}
            if block:
                document[entry.key] = block
        elif entry.name in values and (entry.always or values[entry.name] != entry.default):
            document[entry.key] = entry_value(values, entry)
    return document


def entry_value(values: Mapping[str, Any], field: Field) -> Any:
    value = values[field.name]
    return field.kind.render(value) if field.kind is not None else value
