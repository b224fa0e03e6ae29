"""The configuration reference (docs/configuration.md), generated from the declarations it describes.

Contract: `render_reference()` is the whole of docs/configuration.md: every YAML key of
`gatewayconfig.schema` (its path, the values it accepts, its default and its meaning, all read from the
schema's own `Field`, `Block` and `Kind` declarations), the example file `docs/gateway.example.yaml`, and
every environment variable the gateway reads (`ENVIRONMENT`, the one table of them). It reads no database
and no environment. `manage.py config_reference` prints it; tests/test_docs_configuration.py fails when
the file, the schema, the example or the variables the code reads disagree with it.
"""

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatewayconfig.checker import MISSING
from gatewayconfig.fields import Block, Entry, Field
from gatewayconfig.schema import ASSIGNMENT, KEY, MODEL, OPERATOR, POOL, TOP_LEVEL

REPO = Path(__file__).resolve().parent.parent
REFERENCE = REPO / "docs" / "configuration.md"
EXAMPLE = REPO / "docs" / "gateway.example.yaml"

# Each section of the file: its heading (the path of one of its entries, `[]` for each list item), the
# schema entries it holds, and what it is.
SECTIONS: tuple[tuple[str, tuple[Entry, ...], str], ...] = (
    ("top level", TOP_LEVEL, "The gateway-wide settings, and the lists of pools and keys."),
    ("pools[]", POOL, "A pool: upstream accounts that serve the same keys."),
    (
        "pools[].assignments[]",
        ASSIGNMENT,
        "An assignment: one credential on one provider endpoint. A credential is `api_key_env` or "
        "`api_key_from_env` (or typed into the admin); neither is ever shown, dumped or logged.",
    ),
    (
        "pools[].assignments[].models[]",
        MODEL,
        "A configured catalog entry of an assignment (provenance `configured`).",
    ),
    (
        "keys[]",
        KEY,
        "A gateway key. Its secret is stored as a hash only; a key without `allowed_models` may use every "
        "model of its pools, as `manage.py create_key` and the admin give it.",
    ),
    (
        "operators[]",
        OPERATOR,
        "A pool operator group: the staff in it see and operate only these pools in the admin (SPEC §9).",
    ),
)


@dataclass(frozen=True, slots=True)
class EnvVar:
    """One environment variable: `default` in words (a value in backticks where there is one)."""

    name: str
    default: str
    meaning: str


ENVIRONMENT: tuple[EnvVar, ...] = (
    EnvVar(
        "DATABASE_URL",
        "`sqlite:///<repo>/var/gateway.sqlite3`",
        "The database as a URL (`postgres://user:password@host:5432/gateway`); PostgreSQL for more than one "
        "node.",
    ),
    EnvVar("DATABASE_CONN_MAX_AGE", "`300`", "Seconds a database connection is kept (0: a new one per use)."),
    EnvVar(
        "REDIS_URL",
        "unset: an in-memory channel layer, and per-key limits counted in the database",
        "Redis for the channel layer of multi-node websocket features and for counting per-key `limits`.",
    ),
    EnvVar(
        "GATEWAY_REDIS_PREFIX",
        "`gateway`",
        "Prefix of the per-key limits' Redis keys (several gateways can share one Redis database).",
    ),
    EnvVar(
        "DJANGO_SECRET_KEY",
        "required unless `DJANGO_DEBUG` is true (then a development key)",
        "Django's secret: signs admin sessions and keys the fingerprints of qualified routes. The same on "
        "every node; changing it logs every admin out and sends qualified routes back to declared.",
    ),
    EnvVar(
        "DJANGO_DEBUG",
        "`false`",
        "Debug pages and the development secret: never in production. `make run` sets it for the processes "
        "it starts, and leaves it in `.env` for `manage.py` only (see `GATEWAY_ENV_FILE`).",
    ),
    EnvVar(
        "GATEWAY_ENV_FILE",
        "`.env` in the checkout for `manage.py`; none for the server",
        "A file of `NAME=value` lines read before the settings (a variable set in the environment wins). "
        "`manage.py` reads the checkout's `.env` (which `make run` writes) unless this names another file "
        "or is empty; the server (`gatewaysite.server`, any ASGI server of `gatewaysite.asgi`) reads a file "
        "only when this names one, so a development `.env` never turns debug on for a production start.",
    ),
    EnvVar(
        "DJANGO_ALLOWED_HOSTS", "`127.0.0.1,localhost`", "Comma list of the host names the gateway answers."
    ),
    EnvVar(
        "GATEWAY_CONFIG",
        "the demo configuration",
        "The YAML file `make run` loads instead of the demo (then it starts no demo upstream).",
    ),
    EnvVar(
        "GATEWAY_CREDENTIALS_KEY",
        "unset; required once a credential is stored",
        "Comma list of Fernet keys that encrypt stored upstream credentials: the first encrypts, all decrypt "
        "(`manage.py rotate_credentials --new-key` makes one). A malformed key stops the start, named by its "
        "position.",
    ),
    EnvVar(
        "GATEWAY_UPSTREAM_*",
        "",
        "The only variables an assignment's `api_key_env` or `api_key_from_env` may name (read at each use, "
        "or once at load).",
    ),
    EnvVar(
        "GATEWAY_UPSTREAM_TIMEOUT_S",
        "`10/600`",
        "`connect/read` seconds for upstream calls (one number for both); a timeout counts toward the "
        "account's circuit.",
    ),
    EnvVar(
        "GATEWAY_STREAM_IDLE_S",
        "`300`",
        "After a stream's first visible event, it ends after this many seconds without upstream bytes.",
    ),
    EnvVar(
        "GATEWAY_POOL_FEATURES",
        "`true`",
        "`false`: no load sharing among equal accounts, no headroom demotions, no affinity by the clients' "
        "own conversation keys (a priority list by tier and weight).",
    ),
    EnvVar(
        "GATEWAY_MAX_BODY_BYTES",
        "`8388608` (8 MiB)",
        "Largest accepted request body and websocket message (413, or close code 1009).",
    ),
    EnvVar("GATEWAY_MAX_UPLOAD_BYTES", "`536870912` (512 MiB)", "Largest file upload (`POST /v1/files`)."),
    EnvVar(
        "GATEWAY_MAX_RESPONSE_BYTES",
        "`67108864` (64 MiB)",
        "Largest plain upstream answer relayed (counted decoded); larger is a 502 "
        "`upstream_response_too_large`, never a truncated 200.",
    ),
    EnvVar(
        "GATEWAY_CLIENT_TIMEOUT_S",
        "`10`",
        "A client's headers, and each part of its body, must arrive within this many seconds (else 408).",
    ),
    EnvVar("GATEWAY_BODY_TIMEOUT_S", "`60`", "A whole request body must arrive within this many seconds."),
    EnvVar(
        "GATEWAY_LEDGER_SPOOL_DIR",
        "`var/spool` in the checkout",
        "Where ledger records wait while the database is unreachable, and each process's journal of records "
        "not yet saved (replayed by the next process on this directory). Keep it on a persistent disk.",
    ),
    EnvVar(
        "GATEWAY_LEDGER_RETENTION_DAYS",
        "`30`",
        "Days of request records `manage.py prune_ledger` keeps (at least 1).",
    ),
    EnvVar(
        "GATEWAY_LOG_LEVEL",
        "`INFO`",
        "Level of the `gateway` logger (`WARNING`: only failed attempts and errors).",
    ),
    EnvVar(
        "GATEWAY_LOG_FORMAT",
        "`json`; `text` when `DJANGO_DEBUG` is true",
        "`json`: every log line of every logger one JSON object (time, level, logger, fields); `text`: the "
        "message alone.",
    ),
    EnvVar(
        "GATEWAY_SHUTDOWN_GRACE_S",
        "`20`",
        "After SIGTERM, how long open streams run on before they end with a typed `gateway_shutting_down` "
        "event (keep it below the server's graceful-shutdown timeout).",
    ),
    EnvVar(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "unset: no tracing",
        "Send OpenTelemetry traces over OTLP/HTTP (needs `pip install 'gateway[otel]'`; the other standard "
        "`OTEL_*` variables apply): one span per request and per attempt, never a prompt or completion.",
    ),
    EnvVar("OTEL_SERVICE_NAME", "`gateway`", "The traces' `service.name`."),
    EnvVar(
        "WEB_CONCURRENCY",
        "`1`",
        "Worker processes of `gatewaysite.server` when no `--workers` is given (uvicorn's own rule).",
    ),
    EnvVar(
        "PROMETHEUS_MULTIPROC_DIR",
        "a fresh temporary directory when there are several workers",
        "Where several workers share their metrics, so that `/metrics` sums them; `gatewaysite.server` "
        "empties one you name at each start (a plain `uvicorn --workers N` needs it set to an empty "
        "directory).",
    ),
    EnvVar("PORT", "`8000`", "`make run` only: the port it serves on (127.0.0.1)."),
)


INTRO = """\
# Configuration reference

<!-- Generated by `manage.py config_reference` from gatewayconfig/schema.py and gatewayconfig/reference.py:
edit those, then `.venv/bin/python manage.py config_reference > docs/configuration.md`.
tests/test_docs_configuration.py fails when this file disagrees with them. -->

The gateway is configured by a YAML file (pools, accounts, keys, routing settings) and by environment
variables (the process: database, secrets, the server's limits). Everything in the file can also be edited
in the admin; the file is how to keep it in version control.

## The YAML file

`.venv/bin/python manage.py load_gateway_config PATH` applies a file in one transaction: it creates and
updates by name, and deletes what the file no longer names only with `--prune`. A file with any error
changes nothing and prints every error with its path (`pools[0].assignments[1].base_url: required`).
`--dry-run` prints what would change, each change that removes a client's access as a `warning: access
removed:` line, and changes nothing. A key's secret in the file creates the key; it replaces an existing
key's secret only with `--replace-secrets`, so reloading the same file never undoes `manage.py rotate_key`.
`manage.py dump_gateway_config` prints the current state in the same schema, without secrets. A key left
out takes its default; an undeclared capability, privacy promise or price stays unknown, never read as
true, false or zero. An unknown key anywhere is an error.

Below, the keys of a mapping are written `parent.child`, and `[]` marks the items of a list.
"""


def _cell(text: str) -> str:
    # A pipe, even inside backticks, ends a table cell (GitHub Flavored Markdown) unless escaped.
    return " ".join(text.split()).replace("|", "\\|")


def _default(field: Field) -> str:
    default = field.default
    if default is MISSING:
        return "required" if field.kind is not None else ""
    if callable(default):
        return (default.__doc__ or "").strip()
    rendered = field.kind.render(default) if field.kind is not None else default
    if rendered is None and default not in (None, ""):
        rendered = default  # a tri-state's `unknown` (the dump omits it, the file may say it)
    return "empty" if rendered == "" else f"`{_yaml(rendered)}`"


def _yaml(value: Any) -> str:
    """A default as it is written in the file."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, list | tuple):
        return "[" + ", ".join(json.dumps(item) for item in value) + "]"
    return str(value)


def _meaning(field: Field) -> str:
    meaning = field.doc
    if field.legacy is not None:
        name, kind = field.legacy
        meaning += f" The older `{name}` (micros: {kind.accepts}) is still read; never both."
    return meaning


def _rows(entries: Iterable[Entry], prefix: str = "") -> Iterable[tuple[str, str, str, str]]:
    for entry in entries:
        if isinstance(entry, Block):
            accepts = "mapping, or `null`" if entry.nullable else "mapping"
            yield f"{prefix}{entry.key}", accepts, "", entry.doc
            yield from _rows(entry.fields, f"{prefix}{entry.key}.")
        else:
            accepts = entry.kind.accepts if entry.kind is not None else entry.accepts
            yield f"{prefix}{entry.key}", accepts, _default(entry), _meaning(entry)


class UndocumentedField(Exception):
    """A schema entry without a meaning or without the values it accepts: say them in the schema."""


def _table(header: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]
    return lines


def yaml_rows() -> list[tuple[str, str, str, str, str]]:
    """(section, key, accepts, default, meaning) of every entry, in schema order; refuses an entry that
    does not say what it means or what it accepts."""
    rows = []
    for section, entries, _ in SECTIONS:
        for key, accepts, default, meaning in _rows(entries):
            if not meaning or not accepts:
                raise UndocumentedField(
                    f"{section} {key}: declare its doc and accepts in gatewayconfig/schema.py"
                )
            rows.append((section, key, accepts, default, meaning))
    return rows


def render_reference() -> str:
    by_section: dict[str, list[tuple[str, str, str, str]]] = {}
    for section, key, accepts, default, meaning in yaml_rows():
        by_section.setdefault(section, []).append((f"`{key}`", accepts, default, meaning))
    lines = [
        INTRO.rstrip("\n"),
        "",
        "### Example",
        "",
        "`docs/gateway.example.yaml` (checked by the tests to load without errors):",
        "",
        "```yaml",
        EXAMPLE.read_text().rstrip("\n"),
        "```",
    ]
    for section, _, about in SECTIONS:
        lines += ["", f"### {section}", "", about, ""]
        lines += _table(("key", "accepts", "default", "meaning"), by_section[section])
    lines += [
        "",
        "## Environment variables",
        "",
        "All optional except as said. They are read when a process starts (a change needs a restart), except",
        "`GATEWAY_UPSTREAM_*`, read at each use.",
        "",
    ]
    lines += _table(
        ("variable", "default", "meaning"), ((f"`{v.name}`", v.default, v.meaning) for v in ENVIRONMENT)
    )
    return "\n".join(lines) + "\n"
