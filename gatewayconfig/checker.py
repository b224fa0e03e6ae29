"""Reading the YAML configuration's values (SPEC §3): the file's syntax, and one value at a time.

Contract: `parse_yaml(text)` turns the file into plain Python data or raises `ConfigSyntaxError` (with
the line and column); duplicate mapping keys are a syntax error (PyYAML would silently keep the last).
A `Checker` collects every error and warning of one validation, each a `ConfigIssue` with the path of
the offending value and an `IssueCode`; its readers return a usable value even when they record an
error, so the walk goes on (the half-read config is then discarded).
"""

import enum
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, TypeVar

import yaml

from pools.credentials import ENV_PREFIX, env_name_allowed
from pools.destinations import base_url_problem
from routing.policy.vocabulary import TriState

T = TypeVar("T")

INT32_MAX = 2**31 - 1  # PositiveIntegerField / IntegerField on PostgreSQL
INT64_MAX = 2**63 - 1  # BigIntegerField
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
ROOT = "(top level)"


class IssueCode(enum.StrEnum):
    """What is wrong, as a value: tests and callers branch on this, never on the message text."""

    SYNTAX = "syntax"
    REQUIRED = "required"
    UNKNOWN_FIELD = "unknown_field"
    INVALID = "invalid"  # wrong type, out of range, not one of the choices
    DUPLICATE = "duplicate"
    UNKNOWN_POOL = "unknown_pool"
    UNKNOWN_USER = "unknown_user"  # operators[].users names a user the database does not have
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


class _Missing:
    pass


MISSING: Any = _Missing()


def join(path: str, key: object) -> str:
    return f"{path}.{key}" if path and path != ROOT else str(key)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class ConfigSyntaxError(Exception):
    def __init__(self, issue: ConfigIssue) -> None:
        super().__init__(str(issue))
        self.issue = issue


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


class Checker:
    """Collects every error and warning of one validation (see the module docstring)."""

    def __init__(self) -> None:
        self.errors: list[ConfigIssue] = []
        self.warnings: list[ConfigIssue] = []

    def error(self, path: str, code: IssueCode, message: str) -> None:
        self.errors.append(ConfigIssue(path, code, message))

    def warn(self, path: str, code: IssueCode, message: str) -> None:
        self.warnings.append(ConfigIssue(path, code, message))

    def unique(self, seen: dict[str, str], name: str, path: str, at: str, what: str) -> bool:
        """Whether `name` (of the entry at `path`) is the first of its kind in `seen`; a second one is a
        DUPLICATE error at `at` naming where the first stands. An empty name is neither kept nor an error."""
        if name in seen:
            self.error(at, IssueCode.DUPLICATE, f"duplicate {what} {name!r} (also {seen[name]})")
            return False
        if name:
            seen[name] = path
        return True

    # structure

    def mapping(self, value: object, path: str, fields: Collection[str]) -> dict[Any, Any] | None:
        if not isinstance(value, dict):
            self.error(path, IssueCode.INVALID, "must be a mapping")
            return None
        for key in value:
            if key not in fields:
                self.error(join(path, key), IssueCode.UNKNOWN_FIELD, "unknown field")
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
        """Read `data[key]` with `read`; an absent field takes `default`, or is `required`."""
        path = join(path, key)
        if key not in data:
            if isinstance(default, _Missing):
                self.error(path, IssueCode.REQUIRED, "required")
                return None  # type: ignore[return-value]
            return default
        return read(data[key], path)

    # scalars

    def string(self, value: object, path: str, *, max_length: int) -> str:
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

    def env_name(self, value: object, path: str, *, max_length: int) -> str:
        name = self.string(value, path, max_length=max_length)
        if name and not ENV_NAME_RE.match(name):
            self.error(
                path, IssueCode.INVALID, "must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
            )
        return name

    def upstream_env_name(self, value: object, path: str, *, max_length: int) -> str:
        """A variable that may hold an upstream credential: only `GATEWAY_UPSTREAM_*` (SPEC §3)."""
        name = self.env_name(value, path, max_length=max_length)
        if name and ENV_NAME_RE.match(name) and not env_name_allowed(name):
            self.error(
                path,
                IssueCode.INVALID,
                f"must name a variable starting with {ENV_PREFIX} ({name!r} is not an upstream credential)",
            )
        return name

    def base_url(self, value: object, path: str, *, max_length: int) -> str:
        url = self.string(value, path, max_length=max_length)
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
