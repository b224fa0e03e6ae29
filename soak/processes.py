"""Real processes for the soak run and the fault tests: a gateway as production runs it, its own
database, and what the harness can see of a process from outside (/proc).

- `Database.create(workdir)`: a fresh SQLite file, or, when `DATABASE_URL` is PostgreSQL, a fresh
  database on that server (dropped by `drop`).
- `GatewayProcess`: `manage.py migrate` + `load_gateway_config` of a generated YAML, then
  `uvicorn gatewaysite.asgi:application` with DJANGO_DEBUG=false and a generated secret, in its own
  process group; `terminate` sends SIGTERM and waits for the graceful exit (the ledger is flushed at
  interpreter exit).
- `PostgresCluster`: a PostgreSQL server of the run's own (initdb in a temporary directory, its own
  free port on 127.0.0.1, trust on loopback), which the multi-node soak restarts and stalls.
- `GatewayNode`: one node of several, `python -m gatewaysite.server --workers N` (uvicorn's
  supervisor and its workers), which can be killed with SIGKILL and started again on its port.
- `inventory(pid)`: the process's file descriptors, sockets by kind and TCP state, threads and RSS;
  `tree_inventory(pid)` sums it over the process and its children (a node's supervisor and workers).
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the harness dies, even by SIGKILL (Linux prctl)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn(cmd: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """A child in its own session (so a signal to the harness's group does not reach it first)."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(  # noqa: S603 - argv built by the harness
            cmd,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> int | None:
    """SIGTERM, wait up to `timeout`, then SIGKILL the group. The exit code (None if killed)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    else:
        return proc.returncode
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(5)
    return None


# --- the database ------------------------------------------------------------------------------


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
            with psycopg.connect(_libpq(server_url), autocommit=True) as conn:
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

        with psycopg.connect(_libpq(self.url)) as conn:
            return conn.execute(sql, params).fetchall()

    def drop(self) -> None:
        if self.vendor != "postgresql":
            return
        import psycopg

        with psycopg.connect(_libpq(self._admin_url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def _libpq(url: str) -> str:
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
        options = (
            f"-c listen_addresses={HOST} -c port={self.port} -c unix_socket_directories={self.datadir} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 "
            "-c shared_buffers=32MB"
        )
        server_log = self._root / "server.log"
        self._run(
            "pg_ctl", "start", "-w", "-t", "60", "-D", str(self.datadir), "-l", str(server_log), "-o", options
        )

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

            self._conn = psycopg.connect(_libpq(self.database.url))
            self._conn.execute("LOCK TABLE proxy_requestrecord IN SHARE ROW EXCLUSIVE MODE")

    def release(self) -> None:
        if self._conn is not None:
            self._conn.rollback()
            self._conn.close()
            self._conn = None


# --- the gateway -------------------------------------------------------------------------------


def gateway_config(
    upstream_urls: dict[str, str],
    *,
    key: str,
    key_env: str,
    circuit: dict | None = None,
    retry: dict | None = None,
    models: tuple[str, ...] = ("gpt-5",),
) -> dict:
    """A SPEC §3 configuration: one pool `soak` with one assignment per upstream, all for `models`,
    and one key for the pool."""
    assignments = [
        {
            "name": f"acct-{name}",
            "adapter": "openai",
            "base_url": url,
            "api_key_env": key_env,
            "tier": 0,
            "weight": 1,
            "discovery": False,
            "models": [{"id": m} for m in models],
        }
        for name, url in upstream_urls.items()
    ]
    config: dict = {
        "model_fallback_family": False,
        "pools": [{"name": "soak", "assignments": assignments}],
        "keys": [{"name": "soak", "key": key, "pools": ["soak"], "allowed_models": ["*"]}],
    }
    if circuit:
        config["circuit"] = circuit
    if retry:
        config["retry"] = retry
    return config


@dataclass
class GatewayProcess:
    """One gateway served by uvicorn as production runs it."""

    database: Database
    workdir: Path
    env_extra: dict[str, str] = field(default_factory=dict)
    database_url: str = ""  # what the server connects to, when not `database.url` (e.g. via a proxy)
    uvicorn_args: list[str] = field(default_factory=list)
    # How the server is started: plain uvicorn, or e.g. ["-m", "gatewaysite.server"] (what `make run` runs).
    launcher: list[str] = field(default_factory=lambda: ["-m", "uvicorn", "gatewaysite.asgi:application"])
    port: int = 0
    proc: subprocess.Popen | None = None
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(50))

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def log_path(self) -> Path:
        return self.workdir / "gateway.log"

    def env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DJANGO_", "GATEWAY_", "DATABASE_", "PYTEST_"))
            or k.startswith("GATEWAY_UPSTREAM_")
        }
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "gatewaysite.settings",
                "DJANGO_DEBUG": "false",
                "DJANGO_SECRET_KEY": self.secret,
                "DATABASE_URL": self.database.url,
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.env_extra)
        return env

    def prepare(self, config: dict) -> None:
        """Migrate the fresh database and load `config` (raises with the log tail on failure)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "gateway_config.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        env = self.env()
        for step in (["migrate", "--noinput"], ["load_gateway_config", str(config_path)]):
            log_path = self.workdir / f"manage-{step[0]}.log"
            with open(log_path, "wb") as log:
                rc = subprocess.run(  # noqa: S603
                    [PYTHON, "manage.py", *step],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    timeout=300,
                    check=False,
                ).returncode
            if rc != 0:
                raise RuntimeError(f"manage.py {step[0]} failed ({rc}): {tail(log_path)}")

    def start(self, ready_timeout: float = 60.0) -> None:
        self.launch()
        self.wait_ready(ready_timeout)

    def launch(self) -> None:
        """Start the server process (returns at once; `wait_ready` waits for /readyz). Call it from a
        thread that outlives the server: the child's parent-death signal fires when the thread that
        started it ends."""
        self.port = self.port or free_port()
        # Django logs an unhandled view exception only to `django.request` (mail_admins when DEBUG is
        # off); a root handler for errors puts those tracebacks into the gateway's log.
        log_config = self.workdir / "uvicorn-logging.json"
        log_config.write_text(json.dumps(LOG_CONFIG))
        cmd = [
            PYTHON,
            *self.launcher,
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--no-access-log",
            "--log-config",
            str(log_config),
            *self.uvicorn_args,
        ]
        if self.launcher[:2] == ["-m", "daphne"]:  # daphne's own flags
            cmd = [PYTHON, *self.launcher, "-b", HOST, "-p", str(self.port), "gatewaysite.asgi:application"]
        env = self.env()
        if self.database_url:
            env["DATABASE_URL"] = self.database_url
        self.proc = spawn(cmd, env, self.log_path)

    def wait_ready(self, ready_timeout: float = 60.0) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + ready_timeout
        last = "not asked"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}: {tail(self.log_path)}")
            try:
                answer = httpx.get(f"{self.url}/readyz", timeout=2)
                if answer.status_code == 200:
                    return
                last = f"/readyz {answer.status_code}"
            except httpx.TransportError as exc:
                last = type(exc).__name__
            time.sleep(0.1)
        raise RuntimeError(f"gateway not ready after {ready_timeout:.0f} s ({last}): {tail(self.log_path)}")

    def terminate(self, timeout: float = 60.0) -> tuple[int | None, float]:
        """SIGTERM and wait for the graceful exit: (exit code or None if it had to be killed, seconds)."""
        assert self.proc is not None
        started = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = stop(self.proc, 1)
            code = None
        return code, time.monotonic() - started

    def wait(self, timeout: float) -> int | None:
        """The exit code once the process exits by itself; None (and killed) after `timeout`."""
        assert self.proc is not None
        try:
            return self.proc.wait(max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            stop(self.proc, 1)
            return None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop(self.proc, 5)


@dataclass
class GatewayNode(GatewayProcess):
    """One of several gateway nodes on one database: `python -m gatewaysite.server --workers N` (what
    `make run` runs; the server module prepares prometheus-client's multiprocess directory for its
    workers). Its port stays the same across restarts, as a node behind a load balancer keeps its
    address; every start appends to the node's own log."""

    index: int = 0
    workers: int = 2
    incarnation: int = 0

    def __post_init__(self) -> None:
        self.launcher = ["-m", "gatewaysite.server"]
        self.uvicorn_args = ["--workers", str(self.workers), *self.uvicorn_args]

    @property
    def log_path(self) -> Path:
        return self.workdir / f"gateway-{self.index}.log"

    def launch(self) -> None:
        self.incarnation += 1
        with open(self.log_path, "a") as log:
            log.write(f"--- soak: start #{self.incarnation} of node {self.index}\n")
        super().launch()

    def sigkill(self) -> None:
        """The node dies at once, supervisor and workers (a host or container lost): SIGKILL to its
        process group, no graceful anything."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


LOG_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(levelname)s %(name)s: %(message)s"}},
    "handlers": {
        "stderr": {"class": "logging.StreamHandler", "formatter": "plain", "stream": "ext://sys.stderr"},
        "errors": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "stream": "ext://sys.stderr",
            "level": "ERROR",
        },
    },
    "loggers": {"uvicorn": {"handlers": ["stderr"], "level": "INFO", "propagate": False}},
    "root": {"handlers": ["errors"], "level": "WARNING"},
}


def tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])[-800:]


# --- what /proc shows of a process -------------------------------------------------------------

TCP_STATES = {
    "01": "ESTABLISHED",
    "02": "SYN_SENT",
    "03": "SYN_RECV",
    "04": "FIN_WAIT1",
    "05": "FIN_WAIT2",
    "06": "TIME_WAIT",
    "07": "CLOSE",
    "08": "CLOSE_WAIT",
    "09": "LAST_ACK",
    "0A": "LISTEN",
    "0B": "CLOSING",
}


@dataclass(frozen=True)
class TcpSocket:
    local_port: int
    remote_port: int
    state: str


@dataclass(frozen=True)
class Inventory:
    fds: int
    sockets: int  # every socket fd (TCP, unix, netlink...)
    tcp: tuple[TcpSocket, ...]
    threads: int
    rss_kb: int

    def tcp_excluding(self, db_port: int | None) -> list[TcpSocket]:
        """TCP sockets that are not listening and not to the database server."""
        return [s for s in self.tcp if s.state != "LISTEN" and (db_port is None or s.remote_port != db_port)]

    def non_db_sockets(self, db_port: int | None) -> int:
        return self.sockets - sum(1 for s in self.tcp if db_port is not None and s.remote_port == db_port)


def _tcp_table(pid: int) -> dict[str, TcpSocket]:
    table: dict[str, TcpSocket] = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            local_port, remote_port = int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16)
            table[inode] = TcpSocket(local_port, remote_port, TCP_STATES.get(state, state))
    return table


def rss_kb(pid: int) -> int:
    return _status_field(pid, "VmRSS")


def peak_rss_reset(pid: int) -> None:
    """Start a new peak: the kernel's high-water mark of the resident set (VmHWM) is set back to the
    current RSS (Linux, clear_refs 5)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def peak_rss_kb(pid: int) -> int:
    """The largest resident set since the process started or since `peak_rss_reset`."""
    return _status_field(pid, "VmHWM")


def _status_field(pid: int, name: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{name}:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    """The process's descendants, from /proc (children before grandchildren)."""
    parents: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(stat).read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        parents.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(0), [])
        found += kids
        todo += kids
    return found


def tree_inventory(pid: int) -> Inventory:
    """`inventory` summed over the process and its descendants (a node's supervisor and workers)."""
    parts = []
    for one in [pid, *children(pid)]:
        with contextlib.suppress(OSError):
            parts.append(inventory(one))
    return Inventory(
        sum(i.fds for i in parts),
        sum(i.sockets for i in parts),
        tuple(s for i in parts for s in i.tcp),
        sum(i.threads for i in parts),
        sum(i.rss_kb for i in parts),
    )


def inventory(pid: int) -> Inventory:
    table = _tcp_table(pid)
    fds = sockets = 0
    tcp = []
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(entry)
        except OSError:
            continue  # closed meanwhile
        fds += 1
        if target.startswith("socket:["):
            sockets += 1
            found = table.get(target[8:-1])
            if found is not None:
                tcp.append(found)
    return Inventory(fds, sockets, tuple(tcp), _status_field(pid, "Threads"), rss_kb(pid))
