"""A newcomer's first hour, line by line from the README (issue 20): `make run`'s script in a fresh copy
of the tree, the README's demo requests, and the README's commands from a second terminal that has
none of the first one's environment. A second `make run` on another port starts beside the first."""

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from devkit.harness import free_port

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
VENV = Path(sys.prefix)  # the venv running the tests: `make test`'s .venv


def _readme_blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", README, re.S)


def _curl_commands(port: int) -> list[list[str]]:
    """Every `curl` of the README's demo, as the argument list a shell would give it."""
    commands = []
    for block in _readme_blocks():
        for command in block.replace("\\\n", " ").splitlines():
            if command.strip().startswith("curl") and "127.0.0.1:8000" in command:
                commands.append(shlex.split(command.replace("127.0.0.1:8000", f"127.0.0.1:{port}")))
    return commands


@pytest.fixture
def tree(tmp_path):
    """The committed tree's files as a newcomer's clone has them, with this run's venv as its .venv."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(
        b"\0"
    )
    for name in filter(None, files):
        source = REPO / name.decode()
        if source.is_file():
            target = tmp_path / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
            target.chmod(source.stat().st_mode)
    (tmp_path / ".venv").symlink_to(VENV, target_is_directory=True)
    return tmp_path


def _second_terminal() -> dict[str, str]:
    # Nothing of the first terminal, nor of the test run: just a shell's PATH and HOME.
    return {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}


def _make_run(tree: Path, port: int) -> subprocess.Popen:
    env = {**_second_terminal(), "PORT": str(port), "VENV": ".venv"}
    return subprocess.Popen(
        ["bash", "scripts/run.sh"],
        cwd=tree,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_healthy(port: int, proc: subprocess.Popen) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            pytest.fail(f"make run exited: {proc.stdout.read()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    pytest.fail("make run did not answer /healthz")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def test_the_readme_works_as_written_from_a_second_terminal(tree):
    port = free_port()
    first = _make_run(tree, port)
    second = None
    try:
        _wait_healthy(port, first)

        curls = _curl_commands(port)
        assert len(curls) >= 2, "the README's demo requests were not found"
        for curl in curls:
            out = subprocess.run(curl, capture_output=True, text=True, timeout=30, env=_second_terminal())
            assert out.returncode == 0, out.stderr
            assert out.stdout.startswith("HTTP/1.1 200"), out.stdout[:500]
            assert "hello from demo-b" in out.stdout
            assert re.search(r"^x-gateway-attempts: [12]\r?$", out.stdout, re.M | re.I), out.stdout[:800]

        # The README's second-terminal commands, as written (createsuperuser needs a terminal; its
        # non-interactive form shows the same settings are read).
        explain = next(
            line for block in _readme_blocks() for line in block.splitlines() if "routing_explain" in line
        )
        done = subprocess.run(
            shlex.split(explain), cwd=tree, env=_second_terminal(), capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert "demo-a" in done.stdout and "demo-b" in done.stdout
        assert done.stdout.index("demo-b") < done.stdout.index("demo-a"), done.stdout  # demoted goes last
        superuser = subprocess.run(
            [
                ".venv/bin/python",
                "manage.py",
                "createsuperuser",
                "--noinput",
                "--username",
                "newcomer",
                "--email",
                "newcomer@example.com",
            ],
            cwd=tree,
            env=_second_terminal(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert superuser.returncode == 0, superuser.stderr

        # A second `make run` on another port comes up beside the first (no fixed demo ports).
        other = free_port()
        second = _make_run(tree, other)
        _wait_healthy(other, second)
        assert first.poll() is None
    finally:
        _stop(first)
        if second is not None:
            _stop(second)


def _processes_in(tree: Path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if Path(os.readlink(proc / "cwd")).is_relative_to(tree):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


@pytest.mark.parametrize("after_s", [0.5, 3.0])
def test_stopping_make_run_while_it_starts_leaves_nothing_running(tree, after_s):
    # Ctrl-C (or a test's SIGTERM) during migrate or while the demo upstreams start.
    proc = _make_run(tree, free_port())
    time.sleep(after_s)
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(30)
    deadline = time.monotonic() + 10
    while _processes_in(tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_in(tree) == []
