"""What a measured run costs in CPU, read from /proc, and the PostgreSQL database the gateway runs on.

A gateway on PostgreSQL spends CPU in two places: its own processes (uvicorn's master and, with
`--workers N`, the workers) and the PostgreSQL backends serving its connections. The backends are
found by the `application_name` each gateway connects with (libpq reads `PGAPPNAME`), so two
gateways on one database, or other clients of the same server, are told apart.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
from psycopg import sql

from devkit.procfs import children, cpu_seconds


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU time of `pid` and its live descendants (uvicorn's workers); None when `pid` is gone."""
    own = cpu_seconds(pid)
    if own is None:
        return None
    return own + sum(cpu_seconds(child) or 0.0 for child in children(pid))


def backend_cpu(url: str, application: str) -> dict[int, float] | None:
    """CPU seconds of each PostgreSQL backend connected as `application` (pid -> seconds); None when
    the database cannot be asked or its backends are not on this machine."""
    try:
        with psycopg.connect(url, connect_timeout=3, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", [application]
            ).fetchall()
    except psycopg.Error:
        return None
    found = {pid: cpu_seconds(pid) for (pid,) in rows}
    if any(seconds is None for seconds in found.values()) and rows:
        return None  # another machine's (or an unreadable) backend: no honest figure
    return {pid: seconds for pid, seconds in found.items() if seconds is not None}


def backend_cpu_spent(before: dict[int, float] | None, after: dict[int, float] | None) -> float | None:
    """CPU the backends spent between two readings; a backend that connected in between counts whole
    (it started within the run). A backend that left in between is lost: the gateway's persistent
    connections make that rare."""
    if before is None or after is None:
        return None
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def fresh_database(url: str) -> str:
    """Drop and create the database `url` names (through the server's `postgres` database); "" when
    done, else why not."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    name = info.get("dbname")
    if not name:
        return f"{url} names no database"
    admin = psycopg.conninfo.make_conninfo(url, dbname="postgres")
    try:
        with psycopg.connect(admin, connect_timeout=3, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.Error as exc:
        return f"could not create the database {name}: {type(exc).__name__}: {str(exc).strip()[:200]}"
    return ""


def baseline_database(url: str) -> str:
    """The database URL a baseline gateway runs on, beside `url`'s: its name with `_baseline`."""
    parts = urlsplit(url)
    return parts._replace(path=f"{parts.path.rstrip('/')}_baseline").geturl()


def server_version(url: str) -> str | None:
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            return conn.execute("SHOW server_version").fetchone()[0]
    except psycopg.Error:
        return None


def server_pids(url: str) -> list[int] | None:
    """The PostgreSQL server's processes (its postmaster, then every child: backends, writers), when
    the server runs on this machine; None when it cannot be asked or is elsewhere. Asked through the
    server's `postgres` database: the run's own may not exist yet."""
    admin = psycopg.conninfo.make_conninfo(url, dbname="postgres")
    try:
        with psycopg.connect(admin, connect_timeout=3, autocommit=True) as conn:
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            stat = Path(f"/proc/{backend}/stat").read_text()
    except (psycopg.Error, OSError):
        return None
    postmaster = int(stat.rsplit(")", 1)[1].split()[1])
    return [postmaster, *children(postmaster)]


def place_server(url: str, cpus: set[int]) -> dict[int, set[int]]:
    """Move the PostgreSQL server (existing processes, and new backends, which its postmaster forks
    with its own affinity) onto `cpus`; the previous affinity of each process moved, to restore
    (`restore_placement`). Empty when the server is not on this machine or may not be moved."""
    moved: dict[int, set[int]] = {}
    for pid in server_pids(url) or []:
        try:
            before = os.sched_getaffinity(pid)
            os.sched_setaffinity(pid, cpus)
        except OSError:  # gone, or not ours to move
            continue
        moved[pid] = before
    return moved


def restore_placement(moved: dict[int, set[int]]) -> None:
    for pid, cpus in moved.items():
        with contextlib.suppress(OSError):
            os.sched_setaffinity(pid, cpus)
    # Backends forked while it was moved inherited the postmaster's affinity: give them its old one.
    postmaster = next(iter(moved), None)
    if postmaster is not None:
        for pid in children(postmaster):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(pid, moved[postmaster])
