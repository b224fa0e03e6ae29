"""Which CPython `make bench` measures on: `python bench/interpreter.py [--venv DIR]` prints its path.

Production runs an optimised interpreter (the official container images and the distributions build
CPython with profile-guided optimisation; bench/README.md), and the gateway's CPU per request follows
the build: pyenv's default build (a shared libpython, no profile-guided optimisation) runs pure Python
20-40 % slower than Debian's on this machine class, and the gateway 10-15 % (bench/profile.md). So the
bench looks at the CPythons installed here that the project supports (`python3` and `python3.N` on
PATH, in /usr/bin and /usr/local/bin; each able to make a venv, none a venv's own), times the same
pure-Python probe as the report's "Interpreter" line in each, and takes the fastest: `python3` (what
`make install` uses) unless another is at least `MARGIN` faster. `BENCH_PYTHON=/path/to/python make
bench` chooses one by hand.

With `--venv DIR`: a venv there made from another interpreter is removed, so that `make install`
makes it again from the one chosen.

Standard library only: it runs before any venv exists.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MINIMUM = (3, 11)  # pyproject.toml's requires-python
MARGIN = 0.05  # another interpreter replaces `python3` only when its probe is this much faster
NAMES = ["python3", *(f"python3.{minor}" for minor in range(MINIMUM[1], 15))]
PLACES = ["/usr/bin", "/usr/local/bin"]

# Run by each candidate: what it is, whether it can make a venv with pip, and the report's probe
# (best of 7 after a warm-up).
_PROBE = """
import json, os, sys, time
try:
    import ensurepip, venv
    can_venv = True
except ImportError:
    can_venv = False
best = float("inf")
for _ in range(8):
    t = time.perf_counter()
    sum(i * i for i in range(100_000))
    best = min(best, time.perf_counter() - t)
print(json.dumps({
    "executable": os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable),
    "version": list(sys.version_info[:2]),
    "in_venv": sys.prefix != sys.base_prefix,
    "can_venv": can_venv,
    "probe_ms": round(best * 1000, 3),
}))
"""


@dataclass(frozen=True)
class Interpreter:
    command: str  # how it was found (a pyenv shim resolves to its version only when run)
    executable: str
    version: tuple[int, int]
    probe_ms: float


def found() -> list[str]:
    """Candidate commands: each name on PATH, then in the usual system places."""
    commands: list[str] = []
    for name in NAMES:
        for path in [os.environ.get("PATH", ""), *PLACES]:
            command = shutil.which(name, path=path)
            if command and command not in commands:
                commands.append(command)
    return commands


def probe(command: str) -> Interpreter | None:
    """The interpreter behind `command`, or None when it is not one the bench can use."""
    try:
        done = subprocess.run(  # noqa: S603
            [command, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False
        )
        facts = json.loads(done.stdout)
        version = (int(facts["version"][0]), int(facts["version"][1]))
        usable = done.returncode == 0 and not facts["in_venv"] and facts["can_venv"] and version >= MINIMUM
        found = Interpreter(command, str(facts["executable"]), version, float(facts["probe_ms"]))
    except (OSError, subprocess.TimeoutExpired, ValueError, LookupError, TypeError):
        return None  # not a CPython that runs the probe
    return found if usable else None


def choose(default: Interpreter | None, others: list[Interpreter]) -> Interpreter | None:
    """The default unless another is at least MARGIN faster; then the fastest."""
    fastest = min(others, key=lambda i: i.probe_ms, default=None)
    if default is None:
        return fastest
    if fastest is not None and fastest.probe_ms < default.probe_ms * (1 - MARGIN):
        return fastest
    return default


def venv_base(venv: Path) -> str | None:
    """The interpreter a venv was made from (its pyvenv.cfg), None when there is no venv."""
    try:
        lines = (venv / "pyvenv.cfg").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "executable":
            return os.path.realpath(value.strip())
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, help="remove this venv if another interpreter made it")
    parser.add_argument("--use", metavar="PYTHON", help="this interpreter, not the fastest found")
    args = parser.parse_args(argv)

    by_executable: dict[str, Interpreter] = {}
    default = None
    for command in [args.use] if args.use else found():
        interpreter = probe(command)
        if interpreter is None:
            continue
        if (args.use or Path(command).name == "python3") and default is None:
            default = interpreter
        by_executable.setdefault(interpreter.executable, interpreter)
    others = [i for i in by_executable.values() if default is None or i.executable != default.executable]
    chosen = choose(default, others)
    if chosen is None:
        wanted = args.use or "none found"
        print(f"bench/interpreter.py: no CPython >= 3.11 that can make a venv ({wanted})", file=sys.stderr)
        return 1
    for i in sorted(by_executable.values(), key=lambda i: i.probe_ms):
        mark = "*" if i.executable == chosen.executable else " "
        version = ".".join(map(str, i.version))
        print(f"{mark} {i.executable} ({version}): probe {i.probe_ms:.2f} ms", file=sys.stderr)
    if args.venv is not None:
        base = venv_base(args.venv)
        if base is not None and base != chosen.executable:
            made_from = base or "another interpreter"
            print(f"bench/interpreter.py: {args.venv} was made from {made_from}: made again", file=sys.stderr)
            shutil.rmtree(args.venv)
    print(chosen.executable)
    return 0


if __name__ == "__main__":
    sys.exit(main())
