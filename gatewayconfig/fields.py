"""How the YAML configuration is declared, read and dumped: the machinery `gatewayconfig.schema`'s
sections are written with.

Contract: a `Kind` says how one value is read (through the `Checker`, which records each issue) and how it
is dumped; a `Field` is one YAML key and the model column it fills, a `Block` a nested mapping of the same
row's columns. `column` builds a field from the model column's `_meta` (its limits, choices, default), so a
migration that changes a column changes what the file accepts. `read_fields` walks one mapping of the file
through a section and `render_fields` writes one back: the same declaration both ways, so the loader and
the dumper cannot drift apart.
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from django.db import models

from gatewayconfig.checker import INT32_MAX, INT64_MAX, MISSING, Checker, IssueCode, join
from routing.policy.budget import micros_from_usd, usd
from routing.policy.vocabulary import TriState

# --- how one value is read and written -----------------------------------------------------------

Read = Callable[[Checker, object, str], Any]


@dataclass(frozen=True, slots=True)
class Kind:
    """`accepts`: the values the file takes, in words, for the configuration reference."""

    read: Read
    render: Callable[[Any], Any] = lambda value: value
    accepts: str = ""


def _tri_out(value: str) -> bool | None:
    return {TriState.TRUE: True, TriState.FALSE: False}.get(value)  # type: ignore[call-overload]


def nullable(read: Read) -> Read:
    """`null` means unknown (prices, context window, quality) or none (budget, limits, expiry)."""
    return lambda c, value, path: None if value is None else read(c, value, path)


TRI_STATE = Kind(Checker.tri_state, _tri_out, "`true`, `false` or `unknown`")
BOOLEAN = Kind(Checker.boolean, accepts="`true` or `false`")
FRACTION = Kind(Checker.fraction, accepts="number from 0 to 1")
DATETIME = Kind(
    Checker.optional_datetime,
    lambda value: None if value is None else value.isoformat(),
    "ISO 8601 date and time with its zone (`2027-01-31T00:00:00Z`), or `null`",
)


def _dollars(c: Checker, value: object, path: str) -> int:
    try:
        return micros_from_usd(value)
    except ValueError as refused:
        c.error(path, IssueCode.INVALID, f"{refused}")
        return 0


# An amount in US dollars (`"50.00"`, `0.25`) stored as integer micros, dumped as a decimal string.
USD = Kind(
    nullable(_dollars),
    lambda micros: None if micros is None else usd(micros).removeprefix("$"),
    'dollars, a decimal string or number with at most 6 decimals (`"50.00"`), or `null`',
)


def integer(column: models.Field, minimum: int | None) -> Kind:
    """An integer column's range from its type (a positive column starts at 0), unless `minimum` is
    stricter policy of the file; a nullable column also takes `null`."""
    if minimum is None and isinstance(column, models.PositiveIntegerField):
        minimum = 0
    maximum = INT64_MAX if isinstance(column, models.BigIntegerField) else INT32_MAX
    read: Read = lambda c, value, path: c.integer(value, path, minimum=minimum, maximum=maximum)  # noqa: E731
    accepts = "integer" + (f" >= {minimum}" if minimum is not None else "")
    if column.null:
        return Kind(nullable(read), accepts=f"{accepts}, or `null`")
    return Kind(read, accepts=accepts)


def choice(column: models.Field) -> Kind:
    """One of the column's choices; a column that may be blank also takes `null` (and dumps it)."""
    options = [value for value, _ in column.choices]  # type: ignore[union-attr]
    if options == list(TriState):
        return TRI_STATE
    accepts = " | ".join(f"`{option}`" for option in options if option)
    if column.blank:
        return Kind(
            lambda c, value, path: "" if value is None else c.choice(value, path, options),
            lambda value: value or None,
            f"{accepts}, or `null`",
        )
    return Kind(lambda c, value, path: c.choice(value, path, options), accepts=accepts)


def string(max_length: int, what: str = "") -> Kind:
    """A string of at most `max_length`; with `what`, a list of distinct such strings."""
    if what:
        return Kind(
            lambda c, value, path: c.strings(value, path, max_length=max_length, what=what),
            list,
            f"list of distinct {what} names (each at most {max_length} characters)",
        )
    return Kind(
        lambda c, value, path: c.string(value, path, max_length=max_length),
        accepts=f"string of at most {max_length} characters",
    )


# --- a key of the file and the column it fills ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Field:
    """One YAML key. `column` is the model column it fills (the key itself unless named); a field
    without `kind` is read and rendered by `gatewayconfig.document` (a list of sub-sections, a secret, a
    reference). `always`: dumped even at its default (else a default is left out, so an unknown stays
    unknown on reload). `default` may be a function of the values read before it (its docstring says
    which). `doc` is its meaning and `accepts` (a field without `kind`) its values, for the configuration
    reference (docs/configuration.md, scripts/config_reference.py)."""

    key: str
    kind: Kind | None = None
    column: str = ""
    default: Any = MISSING
    always: bool = False
    legacy: tuple[str, Kind] | None = None  # an older key read into the same column, never dumped
    doc: str = ""
    accepts: str = ""

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
    doc: str = ""


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
    return Field(
        key=key or name,
        kind=kind,
        column=name if key else "",
        default=default,
        always=always,
        doc=policy.get("doc", ""),
    )


def money(model: type[models.Model], name: str, *, key: str, doc: str, always: bool = False) -> Field:
    """A micros column written in dollars under `key`; its micros name is still read (never dumped)."""
    micros = column(model, name, minimum=0)
    return replace(column(model, name, key=key, always=always, kind=USD, doc=doc), legacy=(name, micros.kind))


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


# --- walking a section ---------------------------------------------------------------------------


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
