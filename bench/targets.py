"""What `make bench` measures and how each is started: the paths and keys of the run, the request
body, readiness probes over the standard library, `Target` and `Scenario`, and the setup of the fast
upstreams (devkit/fast_upstream.py), the LiteLLM proxy and the gateways on PostgreSQL and SQLite
(their processes started and stopped by devkit/harness.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import accounting
from devkit.harness import HOST, Processes, free_port, run_logged, tail

ROOT = Path(__file__).resolve().parent.parent


BENCH = ROOT / "bench"
OUT = BENCH / "out"
LOGS = OUT / "logs"
VENV_BIN = Path(sys.prefix) / "bin"  # the project venv this script runs in
LITELLM_VENV = BENCH / ".venv-litellm"
LITELLM_REQUIREMENTS = BENCH / "requirements-litellm-proxy.txt"
GATEWAY_CONFIG = BENCH / "gateway_config.yaml"
RESULTS_MD = BENCH / "results.md"
PROFILE_MD = BENCH / "profile.md"
SOAK_MD = BENCH / "soak.md"  # written by the last full `make soak`
POOL_MD = BENCH / "pool.md"  # written by the last `make bench-pool`
SCALE_MD = BENCH / "scale.md"  # written by the last `make bench-scale`

DEFAULT_UPSTREAM_PORTS = (19101, 19102)  # as written in bench/gateway_config.yaml
GATEWAY_KEY = "sk-gw-bench-0000000000000000"
UPSTREAM_KEY_ENV = "GATEWAY_UPSTREAM_BENCH_KEY"
UPSTREAM_KEY = "sk-bench-upstream-0000000000"
LITELLM_KEY = "sk-bench-litellm-master-0000"
SLOW_DELAY_MS = 50

# A modest, realistic chat request (system + user turn, about 0.6 KB).
_SYSTEM = "You are a concise assistant. Answer in one short sentence. Do not use lists or markdown."
_USER = (
    "Summarise in one sentence why a reverse proxy in front of a model API should add as little "
    "latency as possible, considering that interactive tools stream tokens to a person who is "
    "waiting, that agents chain many calls in sequence so per-call overhead multiplies, and that "
    "failover between providers must stay cheap enough to be always on. Keep it under thirty words."
)


def chat_body(model: str, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": _USER}],
        "temperature": 0,
    }
    if stream:
        body["stream"] = True
    return body


CONTENT_RE = re.compile(rb'"content"\s*:\s*"[^"]')  # an SSE event that shows text to the user


# --- HTTP helpers (stdlib; only for readiness and pre-flight checks) -------------------------


@dataclass
class Probe:
    status: int
    headers: dict[str, str]
    body: bytes
    error: str = ""

    def summary(self) -> str:
        if self.error:
            return self.error
        text = re.sub(r"<[^>]*>", " ", self.body[:2000].decode(errors="replace"))
        text = " ".join(text.split()).replace("|", "/")
        ctype = self.headers.get("content-type", "no content-type").split(";")[0]
        return f"HTTP {self.status} ({ctype}): {text[:140]}"


def http_request(
    url: str, method: str = "GET", body: bytes | None = None, key: str | None = None, timeout: float = 10
) -> Probe:
    u = url.split("://", 1)[1]
    hostport, _, path = u.partition("/")
    host, _, port = hostport.partition(":")
    conn = http.client.HTTPConnection(host, int(port or 80), timeout=timeout)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        conn.request(method, "/" + path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        return Probe(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
    except (OSError, http.client.HTTPException) as exc:
        return Probe(0, {}, b"", f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


def wait_until(check, timeout: float, proc: subprocess.Popen | None = None, interval: float = 0.25) -> str:
    """Poll `check()` (returns "" when ready, else why not) until ready; the last reason otherwise."""
    deadline = time.monotonic() + timeout
    reason = "not checked"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return f"process exited with code {proc.returncode} ({reason})"
        reason = check()
        if not reason:
            return ""
        time.sleep(interval)
    return f"not ready after {timeout:.0f} s ({reason})"


# --- targets -----------------------------------------------------------------------------------


@dataclass
class Target:
    name: str  # short id used in results
    label: str  # what the report calls it
    kind: str  # direct | litellm | gateway
    base_url: str = ""  # ends with /v1
    key: str = ""
    unavailable: str = ""  # why this target could not be measured at all
    pid: int | None = None  # the server process this run started, if any (to wait until it is idle)
    database: str = ""  # a gateway's: postgres | sqlite
    workers: int = 1  # a gateway's uvicorn worker processes
    database_url: str = ""  # PostgreSQL: where to find the backends that serve it ...
    application: str = ""  # ... by the application_name it connects with
    keys_file: str = ""  # wrk sends each request with one of these keys (make bench-scale), else `key`

    @property
    def chat_url(self) -> str:
        return self.base_url + "/chat/completions"


# --- scenarios ---------------------------------------------------------------------------------


@dataclass
class Scenario:
    name: str
    title: str
    model: str
    stream: bool
    concurrency: int
    kinds: tuple[str, ...]  # which target kinds take part
    tool: str  # wrk | py
    count_header: str | None = None
    upstream_delay_ms: float = 0
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # target -> {reps, median|skipped}


# --- setup ---------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(msg, flush=True)


def ensure_wrk() -> str:
    """ "" when wrk is usable, else why not (the Python client is then used for every scenario)."""
    if shutil.which("wrk"):
        return ""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "wrk is not installed and this run cannot apt-get install it (not root or no apt-get)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    log("installing wrk with apt-get ...")
    rc, last = run_logged(["apt-get", "install", "-y", "-q", "wrk"], env, LOGS / "apt-wrk.log", 300)
    if rc != 0:
        run_logged(["apt-get", "update", "-q"], env, LOGS / "apt-update.log", 300)
        rc, last = run_logged(["apt-get", "install", "-y", "-q", "wrk"], env, LOGS / "apt-wrk.log", 300)
    if rc != 0 or not shutil.which("wrk"):
        return f"apt-get install wrk failed (exit {rc}): {last}"
    return ""


def ensure_litellm() -> str:
    """Install the LiteLLM proxy into bench/.venv-litellm when needed; "" when ready, else why not."""
    # The peer runs on the interpreter the gateway runs on (this venv's): a venv made from another is
    # made again.
    base_python = getattr(sys, "_base_executable", None) or shutil.which("python3") or sys.executable
    base_python = os.path.realpath(base_python)
    made_from = f"{base_python}\n".encode() + LITELLM_REQUIREMENTS.read_bytes()
    digest = hashlib.sha256(made_from).hexdigest()[:16]
    stamp = LITELLM_VENV / f".installed-{digest}"
    if stamp.exists() and (LITELLM_VENV / "bin" / "litellm").exists():
        return ""
    if LITELLM_VENV.exists():
        shutil.rmtree(LITELLM_VENV)
    log("installing the LiteLLM proxy into bench/.venv-litellm (about a minute) ...")
    if not (LITELLM_VENV / "bin" / "python").exists():
        venv = [base_python, "-m", "venv", str(LITELLM_VENV)]
        rc, last = run_logged(venv, None, LOGS / "litellm-venv.log", 120)
        if rc != 0:
            return f"could not create bench/.venv-litellm (exit {rc}): {last}"
    cmd = [
        str(LITELLM_VENV / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "-r",
        str(LITELLM_REQUIREMENTS),
    ]
    rc, last = run_logged(cmd, None, LOGS / "litellm-install.log", 900)
    if rc != 0:
        return f"pip install -r bench/requirements-litellm-proxy.txt failed (exit {rc}): {last}"
    for old in LITELLM_VENV.glob(".installed-*"):
        old.unlink()
    stamp.touch()
    return ""


def start_upstreams(procs: Processes, ports: list[int]) -> None:
    py = str(VENV_BIN / "python")
    script = [py, "-m", "devkit.fast_upstream"]
    procs.start(
        "upstream-fast-a", [*script, "--port", str(ports[0]), "--name", "fast-a", "--reject", "gpt-x"]
    )
    procs.start("upstream-fast-b", [*script, "--port", str(ports[1]), "--name", "fast-b"])
    for port in ports:
        why = wait_until(
            lambda p=port: (
                "" if http_request(f"http://{HOST}:{p}/v1/models", key="x").status == 200 else "no answer"
            ),
            20,
        )
        if why:
            raise RuntimeError(f"fast upstream on port {port} did not start: {why}")


def start_litellm(procs: Processes, ports: list[int], cpus: str | None) -> Target:
    t = Target("litellm", "LiteLLM proxy", "litellm", key=LITELLM_KEY)
    why = ensure_litellm()
    if why:
        t.unavailable = why
        return t
    port = free_port()
    t.base_url = f"http://{HOST}:{port}/v1"
    env = {
        **os.environ,
        "LITELLM_OFFLINE_MODE": "true",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
        "DISABLE_ADMIN_UI": "True",
        "NO_DOCS": "True",
        "NO_REDOC": "True",
        "HF_HUB_OFFLINE": "1",
        "LITELLM_MASTER_KEY": LITELLM_KEY,
        "FAKE_A_BASE": f"http://{HOST}:{ports[0]}/v1",
        "FAKE_B_BASE": f"http://{HOST}:{ports[1]}/v1",
    }
    cmd = [
        str(LITELLM_VENV / "bin" / "litellm"),
        "--config",
        str(BENCH / "litellm_config.yaml"),
        "--host",
        HOST,
        "--port",
        str(port),
    ]
    proc = procs.start("litellm", cmd, env, cpus)
    t.pid = proc.pid
    body = json.dumps(chat_body("gpt-5", False)).encode()
    log("waiting for LiteLLM's first routed answer ...")

    def ready() -> str:
        p = http_request(t.chat_url, "POST", body, LITELLM_KEY, timeout=5)
        return "" if p.status == 200 else p.summary()

    why = wait_until(ready, 180, proc, interval=0.5)
    if why:
        t.unavailable = f"LiteLLM did not answer: {why}; log: {tail(LOGS / 'litellm.log')}"
    return t


def gateway_config_file(ports: list[int]) -> Path:
    if list(ports) == list(DEFAULT_UPSTREAM_PORTS):
        return GATEWAY_CONFIG
    text = GATEWAY_CONFIG.read_text()
    for default, actual in zip(DEFAULT_UPSTREAM_PORTS, ports, strict=True):
        text = text.replace(f"{HOST}:{default}/", f"{HOST}:{actual}/")
    path = OUT / "gateway_config.yaml"
    path.write_text(text)
    return path


# The gateways measured side by side: PostgreSQL (production's database, the primary row) and SQLite
# (`make run`'s), served as production serves them (`python -m gatewaysite.server`: uvicorn with
# uvloop and httptools); and PostgreSQL with two workers on the same CPU as the one worker.
GATEWAYS = (
    ("gw-pg", "gateway (PostgreSQL)", "postgres", 1),
    ("gw-sqlite", "gateway (SQLite)", "sqlite", 1),
    ("gw-pg-2w", "gateway (PostgreSQL, 2 workers)", "postgres", 2),
)


def git_commit(tree: Path) -> str:
    """The short commit checked out in `tree`, and whether it has uncommitted changes."""
    git = shutil.which("git")
    run: dict[str, Any] = {"cwd": tree, "capture_output": True, "text": True, "check": True}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        if git:
            head = subprocess.run([git, "rev-parse", "--short", "HEAD"], **run).stdout.strip()  # noqa: S603
            dirty = subprocess.run([git, "status", "--porcelain"], **run).stdout.strip()  # noqa: S603
            return head + (" with uncommitted changes" if dirty else "")
    return "unknown"


def prepare_database(name: str, env: dict[str, str], config: Path, tree: Path) -> str:
    """migrate and load_gateway_config into env's DATABASE_URL with the code of `tree`; "" when done,
    else why not."""
    manage = [str(VENV_BIN / "python"), str(tree / "manage.py")]  # its directory first on sys.path
    steps = [
        (f"{name}-migrate", [*manage, "migrate", "--noinput"], "manage.py migrate"),
        (
            f"{name}-load-config",
            [*manage, "load_gateway_config", str(config)],
            f"manage.py load_gateway_config {config.relative_to(ROOT)}",
        ),
    ]
    for step, cmd, what in steps:
        rc, last = run_logged(cmd, env, LOGS / f"{step}.log", 300)
        if rc != 0:
            return f"`{what}` failed (exit {rc}): {last}"
    return ""


def start_gateways(
    procs: Processes, ports: list[int], cpus: str | None, database_url: str, baseline: Path | None
) -> list[Target]:
    """The gateways of GATEWAYS (without PostgreSQL when `database_url` is empty) and, with `baseline`
    (another checkout of the project), that code on PostgreSQL too, on a database of its own."""
    sqlite = OUT / "gateway.sqlite3"
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{sqlite}{suffix}").unlink(missing_ok=True)
    # target, database URL, source tree
    planned = [
        (
            Target(name, label, "gateway", key=GATEWAY_KEY, database=database, workers=workers),
            database_url if database == "postgres" else f"sqlite:///{sqlite}",
            ROOT,
        )
        for name, label, database, workers in GATEWAYS
        if database_url or database != "postgres"
    ]
    if baseline is not None and database_url:
        label = f"gateway (PostgreSQL, baseline {git_commit(baseline)})"
        base = Target("gw-pg-base", label, "gateway", key=GATEWAY_KEY, database="postgres")
        planned.append((base, accounting.baseline_database(database_url), baseline))
    base_env = {
        **os.environ,
        "DJANGO_DEBUG": "false",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        UPSTREAM_KEY_ENV: UPSTREAM_KEY,
    }
    for name in ("GATEWAY_CONFIG", "PROMETHEUS_MULTIPROC_DIR", "WEB_CONCURRENCY", "PGAPPNAME"):
        base_env.pop(name, None)
    config = gateway_config_file(ports)
    problems: dict[tuple[str, Path], str] = {}
    for t, url, tree in planned:
        if (url, tree) not in problems:
            why = accounting.fresh_database(url) if t.database == "postgres" else ""
            env = {**base_env, "DATABASE_URL": url}
            problems[url, tree] = why or prepare_database(f"{t.name}-{t.database}", env, config, tree)
    started: list[tuple[Target, subprocess.Popen]] = []
    for t, url, tree in planned:
        if problems[url, tree]:
            t.unavailable = f"gateway not started: {problems[url, tree]}"
            continue
        env = {**base_env, "DATABASE_URL": url}
        if t.database == "postgres":
            t.database_url, t.application = url, f"bench-{t.name}"
            env["PGAPPNAME"] = t.application
        port = free_port()
        t.base_url = f"http://{HOST}:{port}/v1"
        # `-m` puts the working directory first on sys.path: a baseline tree's code shadows this one's.
        cmd = [
            *(("env", "-C", str(tree)) if tree != ROOT else ()),
            str(VENV_BIN / "python"),
            *("-m", "gatewaysite.server", "--host", HOST, "--port", str(port), "--loop", "uvloop"),
            *(("--workers", str(t.workers)) if t.workers > 1 else ()),
        ]
        started.append((t, procs.start(t.name, cmd, env, cpus)))
    for t, proc in started:
        t.pid = proc.pid
        root = t.base_url.removesuffix("/v1")
        why = wait_until(
            lambda r=root: "" if http_request(f"{r}/healthz").status == 200 else "no /healthz yet", 60, proc
        )
        if why:
            t.unavailable = f"gateway did not come up: {why}; log: {tail(LOGS / f'{t.name}.log')}"
    return [t for t, _, _ in planned]
