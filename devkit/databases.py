"""Databases for real gateway processes (the soak, bench and the process tests).

- `Database.create(workdir)`: a fresh SQLite file, or, when `DATABASE_URL` is PostgreSQL, a fresh
  database on that server (dropped by `drop`).
- `PostgresCluster`: a PostgreSQL server of the run's own (initdb in a temporary directory, its own
  free port on 127.0.0.1, trust on loopback), which the multi-node soak restarts and stalls.
- `LedgerStall`: a lock on the ledger table from another connection (a database slow at the wrong
  moment).
"""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from devkit.harness import HOST, free_port, tail
from devkit.procfs import children


def _is_postgres(url: str) -> bool:
    return urlsplit(url).scheme in ("postgres", "postgresql", "pgsql", "postgis")


@dataclass
class Database:
    url: str
    vendor: str  # sqlite | postgresql
    name: str  # file path or database name
    _admin_url: str = ""

    @classmethod
    def create(cls, workdir: Path, server_url: str | None = None) -> Database:
        """A fresh database for one run: on the PostgreSQL server of `server_url` (default:
        $DATABASE_URL) when it is one, else an SQLite file in `workdir`."""
        server_url = server_url if server_url is not None else os.environ.get("DATABASE_URL", "")
        if server_url and _is_postgres(server_url):
            import psycopg

            name = f"soak_{secrets.token_hex(6)}"
            with psycopg.connect(libpq_url(server_url), autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            parts = urlsplit(server_url)
            return cls(urlunsplit(parts._replace(path=f"/{name}")), "postgresql", name, server_url)
        path = workdir / "gateway.sqlite3"
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        return cls(f"sqlite:///{path}", "sqlite", str(path))

    @property
    def port(self) -> int | None:
        """The TCP port of the database server (its sockets are not the gateway's leaks)."""
        return (urlsplit(self.url).port or 5432) if self.vendor == "postgresql" else None

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Rows of one read, on a connection of its own (`%s` placeholders on both databases)."""
        if self.vendor == "sqlite":
            import sqlite3

            conn = sqlite3.connect(self.name, timeout=30)
            try:
                return conn.execute(sql.replace("%s", "?"), params).fetchall()
            finally:
                conn.close()
        import psycopg

        with psycopg.connect(libpq_url(self.url)) as conn:
            return conn.execute(sql, params).fetchall()

    def copy_from(self, template: Database) -> None:
        """Make this database, fresh from `create`, a copy of `template` (of the same vendor and
        server, and in use by nobody): SQLite's online backup, PostgreSQL's CREATE DATABASE ...
        TEMPLATE under this database's name."""
        if self.vendor == "sqlite":
            import sqlite3

            source, target = sqlite3.connect(template.name), sqlite3.connect(self.name)
            try:
                source.backup(target)
            finally:
                source.close()
                target.close()
            return
        import psycopg

        with psycopg.connect(libpq_url(self._admin_url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}"')
            conn.execute(f'CREATE DATABASE "{self.name}" TEMPLATE "{template.name}"')

    def drop(self) -> None:
        if self.vendor != "postgresql":
            return
        import psycopg

        with psycopg.connect(libpq_url(self._admin_url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def libpq_url(url: str) -> str:
    """A django-environ style URL as libpq accepts it (`postgres://` and `postgresql://` both work;
    environ's other aliases do not)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(scheme="postgresql"))


class PostgresCluster:
    """A PostgreSQL server of the run's own: `initdb` into a temporary directory, the server on a
    free port of 127.0.0.1 (and a unix socket in its data directory only), trust authentication on
    loopback, fsync off (a soak needs no durability across a power cut). Run as the `postgres` user
    when the harness is root (PostgreSQL refuses root). `restart` is `pg_ctl restart -m fast`;
    `stall` stops the postmaster and every backend with SIGSTOP for a while, then SIGCONT."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.bin = _postgres_bin()
        self.port = 0
        self.datadir: Path | None = None
        self._root: Path | None = None

    @property
    def url(self) -> str:
        return f"postgres://postgres@{HOST}:{self.port}/postgres"

    def _run(self, *argv: str, timeout: float = 120) -> None:
        cmd = [str(self.bin / argv[0]), *argv[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        with open(self.log_path, "ab") as log:
            rc = subprocess.run(  # noqa: S603 - argv built here
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
                check=False,
            ).returncode
        if rc != 0:
            raise RuntimeError(
                f"{argv[0]} {argv[1] if len(argv) > 1 else ''} failed ({rc}): {tail(self.log_path)}"
            )

    def start(self) -> None:
        self._root = Path(tempfile.mkdtemp(prefix="soak-pg-"))
        self.datadir = self._root / "data"
        if os.geteuid() == 0:
            shutil.chown(self._root, "postgres", "postgres")
        self.port = free_port()
        self._run(
            "initdb", "-D", str(self.datadir), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"
        )
        self.bring_up()

    def bring_up(self) -> None:
        """`pg_ctl start` on the cluster's port (again, after `take_down`)."""
        assert self._root is not None and self.datadir is not None
        options = (
            f"-c listen_addresses={HOST} -c port={self.port} -c unix_socket_directories={self.datadir} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 "
            "-c shared_buffers=32MB"
        )
        server_log = self._root / "server.log"
        self._run(
            "pg_ctl", "start", "-w", "-t", "60", "-D", str(self.datadir), "-l", str(server_log), "-o", options
        )

    def take_down(self) -> None:
        """`pg_ctl stop -m fast`: an outage, every connection cut and new ones refused until `bring_up`."""
        assert self.datadir is not None
        self._run("pg_ctl", "stop", "-w", "-t", "60", "-m", "fast", "-D", str(self.datadir))

    def restart(self) -> float:
        """`pg_ctl restart -m fast`: every connection is cut; seconds until the server accepts again."""
        assert self.datadir is not None
        started = time.monotonic()
        self._run("pg_ctl", "restart", "-w", "-t", "60", "-m", "fast", "-D", str(self.datadir))
        return time.monotonic() - started

    def pids(self) -> list[int]:
        """The postmaster first, then its children (backends and auxiliary processes)."""
        assert self.datadir is not None
        postmaster = int((self.datadir / "postmaster.pid").read_text().split()[0])
        return [postmaster, *children(postmaster)]

    def stall(self, seconds: float) -> list[int]:
        """SIGSTOP the postmaster and its backends for `seconds`, then SIGCONT (a frozen database
        host: connections stay open, nothing answers). The pids stopped."""
        stopped = []
        try:
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
            time.sleep(seconds)
        finally:
            for pid in reversed(stopped):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        return stopped

    def stop(self) -> None:
        if self.datadir is None:
            return
        with contextlib.suppress(Exception):
            for pid in self.pids():  # never leave it stopped
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        with contextlib.suppress(Exception):
            self._run("pg_ctl", "stop", "-w", "-t", "30", "-m", "immediate", "-D", str(self.datadir))
        if self._root is not None:
            with contextlib.suppress(OSError):
                (self._root / "server.log").replace(self.log_path.with_name("postgres-server.log"))
            shutil.rmtree(self._root, ignore_errors=True)
        self.datadir = None


def _postgres_bin() -> Path:
    """The newest server binaries of /usr/lib/postgresql/*/bin (Debian's layout)."""
    found = sorted(
        (Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin") if (Path(p) / "pg_ctl").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if not found:
        raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")
    return found[-1]


def postgres_available() -> bool:
    try:
        _postgres_bin()
    except RuntimeError:
        return False
    return True


class LedgerStall:
    """Holds a write lock on the ledger table from another connection: the gateway's ledger writer
    then cannot commit until `release` (a database that is slow at the wrong moment). SQLite: the
    database's write lock; PostgreSQL: a lock on proxy_requestrecord that blocks only INSERTs."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._conn: Any = None

    def acquire(self) -> None:
        if self.database.vendor == "sqlite":
            import sqlite3

            self._conn = sqlite3.connect(self.database.name, timeout=30, isolation_level=None)
            self._conn.execute("BEGIN IMMEDIATE")
        else:
            import psycopg

            self._conn = psycopg.connect(libpq_url(self.database.url))
            self._conn.execute("LOCK TABLE proxy_requestrecord IN SHARE ROW EXCLUSIVE MODE")

    def release(self) -> None:
        if self._conn is not None:
            self._conn.rollback()
            self._conn.close()
            self._conn = None
