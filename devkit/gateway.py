"""The gateway as production runs it, started by the soak, the bench and the process tests.

- `GatewayProcess`: `manage.py migrate` + `load_gateway_config` of a generated YAML, then
  `python -m gatewaysite.server` (uvicorn with the gateway's HTTP protocol, as `make run` starts it)
  with DJANGO_DEBUG=false and a generated secret, in its own process group; `terminate` sends SIGTERM
  and waits for the graceful exit (the ledger is flushed at interpreter exit).
- `GatewayNode`: one node of several, `python -m gatewaysite.server --workers N` (uvicorn's
  supervisor and its workers), which can be killed with SIGKILL and started again on its port.
- `gateway_config(...)`: a SPEC §3 configuration of one pool over the given upstreams.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from devkit.databases import Database
from devkit.harness import HOST, PYTHON, free_port, run_logged, spawn, stop, tail


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


def manage(command: list[str], env: dict[str, str], workdir: Path) -> None:
    """`manage.py COMMAND` to completion, its output in workdir/manage-NAME.log (raises with the log's
    tail on failure)."""
    log_path = workdir / f"manage-{command[0]}.log"
    rc, last = run_logged([PYTHON, "manage.py", *command], env, log_path, 300)
    if rc != 0:
        raise RuntimeError(f"manage.py {command[0]} failed ({rc}): {last}")


_migrated: dict[str, Database] = {}  # per database server ("" for SQLite files): one this process migrated


def migrated(database: Database, env: dict[str, str]) -> Database:
    """A database of `database`'s kind (and server) with every migration applied, made by `manage.py
    migrate` the first time this process asks and kept until it exits, to be copied by `prepare`."""
    server = database._admin_url if database.vendor == "postgresql" else ""
    if server in _migrated:
        return _migrated[server]
    workdir = Path(tempfile.mkdtemp(prefix="devkit-migrated-"))
    template = Database.create(workdir, server_url=server)
    manage(["migrate", "--noinput"], {**env, "DATABASE_URL": template.url}, workdir)
    _migrated[server] = template

    def remove() -> None:
        with contextlib.suppress(Exception):  # e.g. the run's own PostgreSQL is already stopped
            template.drop()
        shutil.rmtree(workdir, ignore_errors=True)

    atexit.register(remove)
    return template


@dataclass
class GatewayProcess:
    """One gateway served by uvicorn as production runs it."""

    database: Database
    workdir: Path
    env_extra: dict[str, str] = field(default_factory=dict)
    database_url: str = ""  # what the server connects to, when not `database.url` (e.g. via a proxy)
    uvicorn_args: list[str] = field(default_factory=list)
    # How the server is started: as `make run` and production start it, unless a test names another
    # server (e.g. daphne).
    launcher: list[str] = field(default_factory=lambda: ["-m", "gatewaysite.server"])
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
                # The soak finds tracebacks in the log by their lines (soak/nodes.py `tracebacks`).
                "GATEWAY_LOG_FORMAT": "text",
            }
        )
        env.update(self.env_extra)
        return env

    def prepare(self, config: dict) -> None:
        """Bring the fresh database to the current schema and load `config` (raises with the log
        tail on failure). The schema is a copy of a database this process migrated once (`migrated`):
        the migrations run once per test session or harness run, not once per gateway."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "gateway_config.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.database.copy_from(migrated(self.database, self.env()))
        manage(["load_gateway_config", str(config_path)], self.env(), self.workdir)

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
        """Stop it now (cleanup, nothing left to flush that anyone reads): SIGTERM, a second's grace,
        then SIGKILL of its group. A server holding stalled streams would use all of a longer one."""
        if self.proc is not None and self.proc.poll() is None:
            stop(self.proc, 1)


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
