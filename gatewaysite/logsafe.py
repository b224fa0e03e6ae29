"""No row data in the log (issue 45 finding 9): a database error is logged as its class and SQLSTATE,
never its message. PostgreSQL's messages carry data (`DETAIL: Failing row contains (...)`, `Key
(key_hash)=(...) already exists`, `invalid input syntax for type integer: "..."`): a `gatewaykey` row
with its hash and prefix, a ledger row.

`configure` is Django's LOGGING_CONFIG: it installs a log record factory, then configures logging from
LOGGING as Django would. A factory, not a handler's filter, so every record of the process is covered
whoever formats it (the gateway's handler, `django.request`'s, uvicorn's own, a test's): a record whose
exception (or one it was raised from or during) is a database error carries a traceback in which each
such exception reads `module.Class (sqlstate XXXXX)`, and an argument that is one is replaced by that
line.
"""

import logging
import logging.config
import sqlite3
import traceback

import psycopg
from django.db import Error as DjangoDatabaseError

DATABASE_ERRORS = (DjangoDatabaseError, psycopg.Error, sqlite3.Error)
_CAUSED = "\nThe above exception was the direct cause of the following exception:\n\n"
_DURING = "\nDuring handling of the above exception, another exception occurred:\n\n"


def _chain(exc: BaseException | None) -> list[tuple[BaseException, str]]:
    """`exc` and what it was raised from or during, outermost first, each with how the next one (the
    one it came from) links to it."""
    chain: list[tuple[BaseException, str]] = []
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if exc.__cause__ is not None:
            chain.append((exc, _CAUSED))
            exc = exc.__cause__
        elif exc.__context__ is not None and not exc.__suppress_context__:
            chain.append((exc, _DURING))
            exc = exc.__context__
        else:
            chain.append((exc, ""))
            exc = None
    return chain


def described(exc: BaseException) -> str:
    """A database error as its class and SQLSTATE (PostgreSQL's code, SQLite's error name): no data."""
    code = getattr(exc, "sqlstate", None) or getattr(exc, "sqlite_errorname", None)
    cause = exc.__cause__
    if code is None and cause is not None:  # Django's wrapper: the driver's error is its cause
        code = getattr(cause, "sqlstate", None) or getattr(cause, "sqlite_errorname", None)
    return f"{type(exc).__module__}.{type(exc).__qualname__} (sqlstate {code or 'unknown'})"


def traceback_text(exc: BaseException) -> str:
    """The traceback `logging` would print for `exc`, each database error in it `described`."""
    parts: list[str] = []
    for one, link in _chain(exc):
        tb = traceback.format_tb(one.__traceback__)
        head = "Traceback (most recent call last):\n" if tb else ""
        if isinstance(one, DATABASE_ERRORS):
            line = described(one) + "\n"
        else:
            line = "".join(traceback.format_exception_only(type(one), one))
        parts.append(head + "".join(tb) + line)
        if link:
            parts.append(link)
    return "".join(reversed(parts)).rstrip("\n")


def _safe(value: object) -> object:
    return described(value) if isinstance(value, DATABASE_ERRORS) else value


def _record_factory(default):
    def make(*args, **kwargs) -> logging.LogRecord:
        record = default(*args, **kwargs)
        # Most records (the per-request line: a dict, no arguments, no exception) have nothing to look
        # at: each test below runs only when its field is set.
        if record.exc_info:
            exc = record.exc_info[1]
            if exc is not None and any(isinstance(one, DATABASE_ERRORS) for one, _ in _chain(exc)):
                record.exc_text = traceback_text(exc)  # what every Formatter prints for exc_info
        if isinstance(record.msg, DATABASE_ERRORS):
            record.msg = described(record.msg)
        args = record.args
        if args and isinstance(args, tuple) and any(isinstance(a, DATABASE_ERRORS) for a in args):
            record.args = tuple(_safe(a) for a in record.args)
        return record

    make.logsafe = True  # type: ignore[attr-defined]
    return make


def install() -> None:
    """Install the factory once (a second configuration keeps the first)."""
    current = logging.getLogRecordFactory()
    if not getattr(current, "logsafe", False):
        logging.setLogRecordFactory(_record_factory(current))


def configure(config: dict) -> None:
    """Django's LOGGING_CONFIG: the factory, then `dictConfig(LOGGING)`."""
    install()
    logging.config.dictConfig(config)
