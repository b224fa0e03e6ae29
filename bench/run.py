"""`make bench`: the gateway against direct upstream calls and the LiteLLM proxy, on loopback.

What runs (everything on 127.0.0.1, everything stopped at exit):
- two fast fake upstreams (devkit/fast_upstream.py): `fast-a` rejects gpt-x with 404 model_not_found,
  `fast-b` serves it;
- the LiteLLM proxy from its own venv (bench/.venv-litellm), started offline as
  /work/shared/peers/README.md describes, configured by bench/litellm_config.yaml;
- the gateway, as production runs it (`python -m gatewaysite.server`: uvicorn, uvloop, httptools),
  DJANGO_DEBUG=false, a generated secret, three times side by side: on a PostgreSQL database the run
  creates afresh (the primary row), on a throwaway SQLite database under bench/out/, and on the same
  PostgreSQL with two workers; each database migrated and loaded with bench/gateway_config.yaml.
  With --baseline DIR, another checkout's gateway beside them (A/B in one run). Or, with
  --gateway-url/--gateway-key, a gateway someone else started (configured with
  bench/gateway_config.yaml against the upstream ports above).

Load: wrk (installed with apt-get when missing) with bench/wrk_post.lua for non-streaming requests
(latency percentiles from wrk's histogram, throughput, failover); a small asyncio/aiohttp client for
the SSE time to first content event, where wrk cannot see inside a response.

Websockets (bench/ws.py, first, on freshly started servers): memory per idle client websocket with
its live upstream websocket (gateway RSS growth over 500 idle connections, per kind of client), and
the relay latency added per event (upstream send stamp to client read, gateway minus direct).

Last, the PostgreSQL gateway (and the --baseline's) runs once more under callgrind for its user-space
instructions per request (bench/instructions.py): a figure that does not move with the machine.

Each scenario warms every target up, then runs `--reps` repetitions, the targets interleaved inside
each repetition so drift on this shared machine hits them alike; the report gives medians.
The system under test (gateway or LiteLLM) is pinned to one CPU, the upstreams, the load
generators and a PostgreSQL server on this machine (its affinity restored at exit) to the others,
when the machine has at least two.

Writes bench/results.md (and bench/out/results.json); logs in bench/out/logs/.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime as dt
import json
import math
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import accounting, instructions, ws  # noqa: E402
from bench import interpreter as interpreters  # noqa: E402
from bench.load import build_scenarios, run_scenarios, run_websocket_phase  # noqa: E402
from bench.report import build_report  # noqa: E402
from bench.targets import (  # noqa: E402
    DEFAULT_UPSTREAM_PORTS,
    GATEWAY_KEY,
    LITELLM_VENV,
    LOGS,
    OUT,
    RESULTS_MD,
    Target,
    ensure_wrk,
    git_commit,
    log,
    start_gateways,
    start_litellm,
    start_upstreams,
)
from devkit.harness import HOST, Processes, free_port, port_is_free  # noqa: E402


def machine_busy_share(seconds: float = 1.0) -> float | None:
    """Share of all CPUs busy over `seconds` (from /proc/stat), sampled before this run starts anything."""

    def sample() -> tuple[int, int] | None:
        try:
            values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        except (OSError, ValueError, IndexError):
            return None
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        return idle, sum(values)

    first = sample()
    time.sleep(seconds)
    second = sample()
    if first is None or second is None or second[1] == first[1]:
        return None
    return 1 - (second[0] - first[0]) / (second[1] - first[1])


def interpreter() -> dict[str, Any]:
    """The interpreter every Python process of the run uses (the gateways, the upstreams and LiteLLM's
    venv are made from it): its executable, whether its core is a shared libpython (a build with
    `--enable-shared`, and no profile-guided optimisation unless asked, as pyenv's default: slower
    than a distribution's or the official images' build), and a pure-Python speed probe (best of 5)."""
    executable = getattr(sys, "_base_executable", None) or sys.executable
    maps = ""
    with contextlib.suppress(OSError):
        maps = Path("/proc/self/maps").read_text()
    best = math.inf
    for _ in range(5):
        started = time.perf_counter()
        sum(i * i for i in range(100_000))
        best = min(best, time.perf_counter() - started)
    return {
        "executable": os.path.realpath(executable),
        "shared_libpython": "libpython" in maps,
        "probe_ms": round(best * 1000, 2),
    }


def other_interpreters() -> list[dict[str, Any]]:
    """The other CPythons bench/interpreter.py found here, with their probes: the report shows what
    this run's interpreter was chosen over."""
    mine = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    seen: dict[str, dict[str, Any]] = {}
    for command in interpreters.found():
        found = interpreters.probe(command)
        if found is not None and found.executable != mine:
            seen.setdefault(found.executable, {"executable": found.executable, "probe_ms": found.probe_ms})
    return list(seen.values())


def cpu_idle() -> dict[str, str] | None:
    """How an idle CPU waits (Linux's cpuidle driver and, for the `haltpoll` driver of a virtual machine's
    guest, how long it polls before it halts): with no polling, every hand-over to an idle CPU waits for
    the host to run it again, a cost each of c=1's cross-CPU hops pays (bench/profile.md)."""
    base = Path("/sys/devices/system/cpu/cpuidle")
    try:
        driver = (base / "current_driver").read_text().strip()
    except OSError:
        return None
    info = {"driver": driver}
    with contextlib.suppress(OSError):
        info["halt_poll_ns"] = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns").read_text().strip()
    return info


# The echo end of `round_trip_us`: a process of its own, on the CPU its third argument names.
_ECHO = (
    "import os, socket, sys\n"
    "os.sched_setaffinity(0, {int(sys.argv[3])})\n"
    "peer = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n"
    "peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n"
    "while data := peer.recv(64):\n"
    "    peer.sendall(data)\n"
)


def round_trip_us(here: int, there: int, rounds: int = 2000) -> float | None:
    """Median microseconds of a one-byte request and its echo over loopback TCP, from this process on CPU
    `here` to another process on CPU `there`. Two processes on different CPUs pay for waking each other
    (on a virtual machine whose idle CPUs halt, the host's), two on one CPU only for a switch: at c=1 the
    gateway's request crosses between the run's CPUs three times (client, PostgreSQL, upstream) where
    the direct call stays on one (bench/profile.md)."""
    affinity = os.sched_getaffinity(0)
    listener = socket.create_server((HOST, 0))
    echo = None
    try:
        port = listener.getsockname()[1]
        echo = subprocess.Popen([sys.executable, "-c", _ECHO, HOST, str(port), str(there)])  # noqa: S603
        listener.settimeout(10)
        conn, _ = listener.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            os.sched_setaffinity(0, {here})
            times = []
            for _ in range(rounds):
                started = time.perf_counter()
                conn.sendall(b"x")
                conn.recv(64)
                times.append(time.perf_counter() - started)
        return round(statistics.median(times) * 1e6, 1)
    except OSError:
        return None
    finally:
        os.sched_setaffinity(0, affinity)
        listener.close()
        if echo is not None:
            echo.kill()  # gone already when the measurement ended: its connection closed
            echo.wait()


def machine_context(args: argparse.Namespace) -> dict[str, Any]:
    cpu_model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    commit = git_commit(ROOT)
    versions: dict[str, str] = {}
    from importlib import metadata

    for pkg in ("django", "uvicorn"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[pkg] = metadata.version(pkg)
    busy = machine_busy_share()
    busy_note = ""
    if busy is not None and busy > 0.10:
        busy_note = (
            f"other processes kept {busy:.0%} of the CPUs busy just before this run started. Absolute "
            "numbers and tail latencies are noisier than on an idle machine; the ratios (targets interleaved "
            "in every repetition) and the server CPU time per request are the least affected."
        )
    return {
        "busy": busy_note,
        "busy_share": busy,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model,
        "kernel": platform.release(),
        "cpu_idle": cpu_idle(),
        "python": platform.python_version(),
        "interpreter": interpreter(),
        "other_interpreters": other_interpreters(),
        "versions": versions,
        "reps": args.reps,
        "duration": args.duration,
        "warmup": args.warmup,
        "load_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="make bench: gateway vs direct vs LiteLLM on loopback")
    p.add_argument("--duration", type=float, default=5, help="seconds per measured run (default 5)")
    p.add_argument("--reps", type=int, default=3, help="repetitions per target and scenario (default 3)")
    p.add_argument("--warmup", type=float, default=1, help="warm-up seconds per target and scenario")
    p.add_argument("--quick", action="store_true", help="1 repetition of 2 s: a smoke test of the harness")
    p.add_argument("--no-litellm", action="store_true", help="skip the LiteLLM peer")
    p.add_argument("--no-gateway", action="store_true", help="skip the gateway")
    p.add_argument(
        "--gateway-url",
        default=os.environ.get("BENCH_GATEWAY_URL", ""),
        help="measure a running gateway at this base URL (ending in /v1) instead of starting one; "
        "it must be loaded with bench/gateway_config.yaml (env BENCH_GATEWAY_URL)",
    )
    p.add_argument(
        "--gateway-key",
        default=os.environ.get("BENCH_GATEWAY_KEY", GATEWAY_KEY),
        help="key for --gateway-url (env BENCH_GATEWAY_KEY)",
    )
    p.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gateway_bench"),
        help="the PostgreSQL database the gateway runs on; dropped and created afresh by every run "
        "(env BENCH_DATABASE_URL)",
    )
    p.add_argument("--no-postgres", action="store_true", help="measure the gateway on SQLite only")
    p.add_argument(
        "--baseline",
        type=Path,
        help="another checkout of the project (e.g. `git worktree add --detach DIR main`): its gateway is "
        "measured on PostgreSQL too, in the same run, for an A/B comparison",
    )
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    p.add_argument(
        "--no-callgrind",
        action="store_true",
        help="skip counting the PostgreSQL gateway's instructions per request (bench/instructions.py)",
    )
    p.add_argument("--output", type=Path, default=RESULTS_MD)
    p.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite the report from bench/out/results.json, run nothing",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.reps, args.warmup = 2, 1, 0.5
    return args


def report_from_json(output: Path) -> int:
    raw = json.loads((OUT / "results.json").read_text())
    targets = [Target(**t) for t in raw["targets"]]
    scenarios = build_scenarios()
    for sc in scenarios:
        sc.results = raw["scenarios"].get(sc.name, {}).get("results", {})
    websocket = raw.get("websocket") or {"skipped": "results.json has no websocket phase"}
    output.write_text(build_report(raw["context"], targets, scenarios, websocket) + "\n")
    log(f"rewrote {output} from bench/out/results.json")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report_only:
        return report_from_json(args.output)
    started = time.monotonic()
    # Before any server starts, so that they inherit it: the websocket phase holds about 2000 sockets.
    fd_soft, fd_hard = ws.raise_fd_limit()
    shutil.rmtree(LOGS, ignore_errors=True)  # this run's logs only
    LOGS.mkdir(parents=True, exist_ok=True)
    procs = Processes(LOGS)
    atexit.register(procs.stop_all)

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    ctx = machine_context(args)
    ctx["fd_limit"] = [fd_soft, fd_hard]

    # CPU placement: the system under test on one CPU, everything else (this process, the upstreams,
    # the load generator, which inherit its affinity) on the rest.
    avail = sorted(os.sched_getaffinity(0))
    sut_cpus: str | None = None
    if not args.no_pin and len(avail) >= 2 and shutil.which("taskset"):
        sut_cpus = str(avail[0])
        ctx["round_trips"] = {
            "across": round_trip_us(avail[0], avail[1]),
            "within": round_trip_us(avail[1], avail[1]),
            "cpus": [avail[0], avail[1]],
        }
        os.sched_setaffinity(0, set(avail[1:]))
        ctx["pinning"] = (
            f"system under test (gateway / LiteLLM) on CPU {avail[0]}; upstreams, load generator "
            f"and this driver on CPU {','.join(map(str, avail[1:]))}"
        )
        # The database is a server the gateway talks to, as the upstreams are (in production, another
        # host): on their CPUs, not on the one the gateway is measured on. Its backends' CPU is still
        # counted in the CPU-per-request target.
        if not (args.no_postgres or args.no_gateway or args.gateway_url):
            moved = accounting.place_server(args.database_url, set(avail[1:]))
            atexit.register(accounting.restore_placement, moved)
            ctx["pinning"] += (
                f"; the PostgreSQL server on CPU {','.join(map(str, avail[1:]))}"
                if moved
                else "; the PostgreSQL server not moved (not on this machine, or not ours to move)"
            )
    else:
        ctx["pinning"] = "not pinned"

    wrk_problem = ensure_wrk()
    use_wrk = not wrk_problem
    if use_wrk:
        wrk = shutil.which("wrk") or "wrk"
        wrk_version = subprocess.run([wrk, "-v"], capture_output=True, text=True, check=False)  # noqa: S603
        ctx["loadgen"] = (
            (wrk_version.stdout or wrk_version.stderr).strip().splitlines()[0].split(" Copyright")[0]
        )
    else:
        ctx["loadgen"] = f"python aiohttp client for every scenario ({wrk_problem})"
        log(wrk_problem)

    try:
        ports = list(DEFAULT_UPSTREAM_PORTS)
        if args.gateway_url and not all(port_is_free(p) for p in ports):
            raise SystemExit(
                f"--gateway-url needs the upstream ports {ports} free (the gateway's config names them)"
            )
        if not all(port_is_free(p) for p in ports):
            ports = [free_port(), free_port()]
            while ports[0] == ports[1]:
                ports[1] = free_port()
        log(f"starting fast upstreams on {ports}")
        start_upstreams(procs, ports)
        targets = [
            Target("direct", "direct (fast upstream)", "direct", f"http://{HOST}:{ports[0]}/v1", "sk-direct")
        ]
        if args.no_litellm:
            targets.append(
                Target("litellm", "LiteLLM proxy", "litellm", unavailable="skipped (--no-litellm)")
            )
        else:
            targets.append(start_litellm(procs, ports, sut_cpus))
        if args.gateway_url:
            targets.append(
                Target("gw-external", "gateway", "gateway", args.gateway_url.rstrip("/"), args.gateway_key)
            )
        elif args.no_gateway:
            targets.append(
                Target("gw-pg", "gateway (PostgreSQL)", "gateway", unavailable="skipped (--no-gateway)")
            )
        else:
            log("preparing the gateways (PostgreSQL and SQLite: migrate, load_gateway_config) ...")
            database_url = "" if args.no_postgres else args.database_url
            targets.extend(start_gateways(procs, ports, sut_cpus, database_url, args.baseline))
        pg = next((t for t in targets if t.database_url), None)
        if pg is not None:
            ctx["versions"]["postgresql"] = accounting.server_version(pg.database_url)
        for t in targets:
            log(f"target {t.name}: {t.unavailable or t.base_url}")
        with contextlib.suppress(Exception):
            out = subprocess.run(  # noqa: S603
                [
                    str(LITELLM_VENV / "bin" / "python"),
                    "-c",
                    "import importlib.metadata as m; print(m.version('litellm'))",
                ],
                capture_output=True,
                text=True,
                check=False,
                timeout=30,
            )
            if out.returncode == 0:
                ctx["versions"]["litellm"] = out.stdout.strip()

        # The websocket phase first, on servers that have served nothing else yet: memory that HTTP load
        # left free in the heap would otherwise be reused by the idle websockets and hide their cost.
        websocket = run_websocket_phase(targets, args, ports)
        scenarios = build_scenarios()
        run_scenarios(targets, scenarios, args, ports, use_wrk)
        if not args.no_callgrind:
            trees = {"gw-pg": ROOT, "gw-pg-base": args.baseline}
            for t in targets:
                if t.name in trees and trees[t.name] is not None:
                    log(f"counting instructions per request of {t.label} under callgrind ...")
                    ctx.setdefault("instructions", {})[t.label] = instructions.count(
                        procs, t, trees[t.name], sut_cpus
                    )
    finally:
        procs.stop_all()

    ctx["elapsed_s"] = time.monotonic() - started
    ctx["load_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    ctx["probe_end_ms"] = interpreter()["probe_ms"]
    report = build_report(ctx, targets, scenarios, websocket)
    args.output.write_text(report + "\n")
    raw = {
        "context": ctx,
        "targets": [t.__dict__ for t in targets],
        "scenarios": {s.name: {"title": s.title, "results": s.results} for s in scenarios},
        "websocket": websocket,
    }
    (OUT / "results.json").write_text(json.dumps(raw, indent=2, default=str) + "\n")
    log(
        f"wrote {args.output.relative_to(ROOT) if args.output.is_relative_to(ROOT) else args.output} "
        f"in {ctx['elapsed_s']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
