"""What a request costs the gateway in instructions: callgrind (valgrind) counts every user-space
instruction the PostgreSQL gateway's process executes, in all its threads, over COUNTED non-streaming
requests sent one after another, after WARMUP that are not counted.

CPU milliseconds per request vary between the machines of one class, and within one machine's hour, by
more than a code change moves them (bench/profile.md); an instruction count does not follow the
machine's speed: the same code counted the same within 0.5-1.5 % from run to run (2026-12-03, on a
machine whose speed varied by half meanwhile). It is the figure to compare two trees by (`--baseline`
counts both), the milliseconds the ones the targets are stated in. It leaves out what the kernel does
for the process (system calls, about a sixth of its CPU time) and the cost of cache misses.

Under valgrind the gateway runs some fifty times slower, so the ledger writer's batches (one per linger)
hold a few records instead of a hundred: the ledger's share of the count is larger than at full speed.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.targets import (
    LOGS,
    OUT,
    ROOT,
    UPSTREAM_KEY,
    UPSTREAM_KEY_ENV,
    VENV_BIN,
    Target,
    chat_body,
    http_request,
    wait_until,
)
from devkit.harness import HOST, Processes, free_port, tail

WARMUP = 100
COUNTED = 300


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], capture_output=True, check=True, timeout=60)  # noqa: S603, S607


def _total(out: Path) -> int:
    """The instructions of every part callgrind wrote (a dump, then the rest at exit): each part's
    `totals:` line (its `summary:` line may be written before the count, as 0)."""
    total = 0
    for part in out.parent.glob(out.name + "*"):
        counts = [
            line for line in part.read_text(errors="replace").splitlines() if line.startswith("totals:")
        ]
        if counts:
            total += int(counts[-1].split()[1])
    return total


def count(procs: Processes, target: Target, tree: Path, cpus: str | None) -> dict[str, Any]:
    """Instructions per request of a gateway of `tree` on `target`'s PostgreSQL database (a second node
    beside the target's server, which stays idle meanwhile)."""
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        return {"skipped": "valgrind is not installed (Debian's package valgrind)"}
    if target.unavailable or not target.database_url:
        return {"skipped": target.unavailable or "no PostgreSQL database"}
    out = OUT / f"callgrind-{target.name}.out"
    for old in OUT.glob(out.name + "*"):
        old.unlink()
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_DEBUG": "false",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        UPSTREAM_KEY_ENV: UPSTREAM_KEY,
        "DATABASE_URL": target.database_url,
        "PGAPPNAME": f"{target.application or target.name}-callgrind",
    }
    for name in ("GATEWAY_CONFIG", "PROMETHEUS_MULTIPROC_DIR", "WEB_CONCURRENCY"):
        env.pop(name, None)
    cmd = [
        *(("env", "-C", str(tree)) if tree != ROOT else ()),
        *("valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"),
        str(VENV_BIN / "python"),
        *("-m", "gatewaysite.server", "--host", HOST, "--port", str(port), "--loop", "uvloop"),
    ]
    name = f"{target.name}-callgrind"
    proc = procs.start(name, cmd, env, cpus)  # taskset and env exec: its pid is valgrind's
    try:
        why = wait_until(
            lambda: "" if http_request(f"http://{HOST}:{port}/healthz").status == 200 else "no /healthz yet",
            180,
            proc,
        )
        if why:
            last = tail(LOGS / f"{name}.log")
            return {"skipped": f"the gateway under valgrind did not come up: {why}; {last}"}
        body = json.dumps(chat_body("gpt-5", stream=False)).encode()
        headers = {"content-type": "application/json", "authorization": f"Bearer {target.key}"}
        conn = http.client.HTTPConnection(HOST, port, timeout=120)

        def post() -> None:
            conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}")

        try:
            for _ in range(WARMUP):
                post()
            _control("--instr=on", str(proc.pid))
            started = time.monotonic()
            for _ in range(COUNTED):
                post()
            elapsed = time.monotonic() - started
            _control("--instr=off", str(proc.pid))
            _control("--dump", str(proc.pid))
        except (OSError, http.client.HTTPException, RuntimeError, subprocess.SubprocessError) as exc:
            return {"skipped": f"{type(exc).__name__}: {exc}"}
        finally:
            conn.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
    total = _total(out)
    if not total:
        return {"skipped": "callgrind wrote no count"}
    return {"per_request": total / COUNTED, "requests": COUNTED, "ms_per_request": elapsed * 1000 / COUNTED}
