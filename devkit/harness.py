"""The one process harness of the soak, the bench and the tests that start real processes: free
ports on loopback, children in their own session that die with the harness, a graceful stop that ends
in SIGKILL of the group, one-shot commands with their output in a log.

- `spawn(cmd, env, log_path)`: a child in its own session with its output appended to `log_path`; it
  gets SIGTERM when the harness dies, even by SIGKILL (Linux prctl).
- `stop(proc)`: SIGTERM, a bounded wait, then SIGKILL of its process group.
- `Processes(log_dir)`: a group of named children (logs in `log_dir/NAME.log`), all stopped by `stop_all`.
- `run_logged(cmd, env, log_path, timeout)`: a command to completion; its exit code and last lines.

The gateway itself as production runs it is `devkit.gateway`; its databases `devkit.databases`; what
/proc shows of a process `devkit.procfs`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

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


def tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])[-800:]


def port_is_free(port: int) -> bool:
    """Whether `port` can be listened on (TIME_WAIT leftovers do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
            s.listen()
        except OSError:
            return False
    return True


def run_logged(cmd: list[str], env: dict[str, str] | None, log_path: Path, timeout: float) -> tuple[int, str]:
    """Run to completion (in its own session) with its output in `log_path`: (exit code, last
    lines); -1 when it timed out."""
    with open(log_path, "wb") as log:
        try:
            rc = subprocess.run(  # noqa: S603 - argv built by the harness
                cmd,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
                check=False,
                start_new_session=True,
            ).returncode
        except subprocess.TimeoutExpired:
            return -1, f"timed out after {timeout:.0f} s"
    return rc, tail(log_path)


class Processes:
    """Named children of one run, each in its own session with its log in `log_dir/NAME.log`; all
    stopped by `stop_all` (SIGTERM to each group, a shared wait, then SIGKILL of every group)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[tuple[str, subprocess.Popen]] = []

    def start(
        self, name: str, cmd: list[str], env: dict[str, str] | None = None, cpus: str | None = None
    ) -> subprocess.Popen:
        """Start `cmd` (pinned to `cpus` with taskset when given)."""
        if cpus is not None:
            cmd = ["taskset", "-c", cpus, *cmd]
        proc = spawn(cmd, env if env is not None else dict(os.environ), self.log_dir / f"{name}.log")
        self.children.append((name, proc))
        return proc

    def stop_all(self) -> None:
        for _, proc in self.children:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 8
        for _, proc in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for _, proc in self.children:
            # the group too: a server may have left workers behind even if its leader exited
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
        self.children.clear()
