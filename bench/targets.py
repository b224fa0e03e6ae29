"""What `make bench` measures and how each is started: the paths and keys of the run, the request
body, readiness probes over the standard library, `Target` and `Scenario`, and the setup of the fast
upstreams (devkit/fast_upstream.py), the LiteLLM proxy and the gateway (their processes started and
stopped by devkit/harness.py).
"""

from __future__ import annotations

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
    digest = hashlib.sha256(LITELLM_REQUIREMENTS.read_bytes()).hexdigest()[:16]
    stamp = LITELLM_VENV / f".installed-{digest}"
    if stamp.exists() and (LITELLM_VENV / "bin" / "litellm").exists():
        return ""
    log("installing the LiteLLM proxy into bench/.venv-litellm (about a minute) ...")
    base_python = getattr(sys, "_base_executable", None) or shutil.which("python3") or sys.executable
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


def start_gateways(procs: Processes, ports: list[int], cpus: str | None) -> list[Target]:
    daphne = Target("gw-daphne", "gateway (daphne)", "gateway", key=GATEWAY_KEY)
    uvicorn = Target("gw-uvicorn", "gateway (uvicorn, uvloop+httptools)", "gateway", key=GATEWAY_KEY)
    targets = [daphne, uvicorn]
    db = OUT / "gateway.sqlite3"
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    env = {
        **os.environ,
        "DJANGO_DEBUG": "false",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DATABASE_URL": f"sqlite:///{db}",
        UPSTREAM_KEY_ENV: UPSTREAM_KEY,
    }
    env.pop("GATEWAY_CONFIG", None)
    py = str(VENV_BIN / "python")
    config = gateway_config_file(ports)
    steps = [
        ("gateway-migrate", [py, "manage.py", "migrate", "--noinput"], "manage.py migrate"),
        (
            "gateway-load-config",
            [py, "manage.py", "load_gateway_config", str(config)],
            f"manage.py load_gateway_config {config.relative_to(ROOT)}",
        ),
    ]
    for name, cmd, what in steps:
        rc, last = run_logged(cmd, env, LOGS / f"{name}.log", 300)
        if rc != 0:
            for t in targets:
                t.unavailable = f"gateway not started: `{what}` failed (exit {rc}): {last}"
            return targets
    d_port, u_port = free_port(), free_port()
    while u_port == d_port:
        u_port = free_port()
    daphne.base_url = f"http://{HOST}:{d_port}/v1"
    uvicorn.base_url = f"http://{HOST}:{u_port}/v1"
    # As scripts/run.sh serves it (daphne's defaults, access log to stdout -> the log file) ...
    d_proc = procs.start(
        "gateway-daphne",
        [str(VENV_BIN / "daphne"), "-b", HOST, "-p", str(d_port), "gatewaysite.asgi:application"],
        env,
        cpus,
    )
    # ... and as `uvicorn gatewaysite.asgi:application` with its fast loop and parser (SPEC §2).
    u_proc = procs.start(
        "gateway-uvicorn",
        [
            str(VENV_BIN / "uvicorn"),
            "gatewaysite.asgi:application",
            "--host",
            HOST,
            "--port",
            str(u_port),
            "--loop",
            "uvloop",
            "--http",
            "httptools",
        ],
        env,
        cpus,
    )
    for t, proc, logname in ((daphne, d_proc, "gateway-daphne"), (uvicorn, u_proc, "gateway-uvicorn")):
        t.pid = proc.pid
        root = t.base_url.removesuffix("/v1")
        why = wait_until(
            lambda r=root: "" if http_request(f"{r}/healthz").status == 200 else "no /healthz yet", 60, proc
        )
        if why:
            t.unavailable = f"gateway did not come up: {why}; log: {tail(LOGS / f'{logname}.log')}"
    return targets
