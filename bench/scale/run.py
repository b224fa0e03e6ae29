"""`make bench-scale`: does the gateway's cost stay flat as keys, accounts, ledger history and open streams
grow (issue 49)? Each curve is measured in one run, its sizes side by side, and written as a table and a
plot into its section of bench/results.md (bench/scale/report.py).

What runs (everything on 127.0.0.1, everything stopped at exit; databases created on the PostgreSQL
server of `--database-url` and dropped at exit):
- one upstream, `bench/scale/stream_upstream.py` (devkit/fast_upstream.py with long paced streams),
  serving the twenty models of every configuration here;
- the gateway as production serves it (`python -m gatewaysite.server`, devkit/gateway.py), one per size
  of a curve, each on a database of its own, migrated, configured and filled in bulk
  (bench/scale/seed.py) before it starts;
- the load: wrk (bench/load.py's scenarios: c=1 for the added latency, c=16 for the CPU per request,
  the sizes' repetitions interleaved, CPU from /proc: the gateway's processes and its PostgreSQL
  backends), the stream client (bench/scale/streams.py), the idle websockets (bench/ws.py), and Django
  itself for the admin pages, `routing_explain` and `prune_ledger` (bench/scale/probe.py).

On a machine of two CPUs or more the gateways run on CPU 0 and this driver, wrk and the upstream on CPU 1
(the workers curve gives the gateway both); the shared PostgreSQL server is not moved.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import load, ws  # noqa: E402
from bench.accounting import tree_cpu_seconds  # noqa: E402
from bench.scale import report, seed, streams  # noqa: E402
from bench.targets import LOGS, Scenario, Target, ensure_wrk, http_request, wait_until  # noqa: E402
from devkit.databases import Database  # noqa: E402
from devkit.gateway import GatewayProcess  # noqa: E402
from devkit.harness import HOST, PYTHON, Processes, free_port, run_logged  # noqa: E402
from devkit.procfs import cpu_seconds, rss_kb  # noqa: E402

OUT = ROOT / "bench" / "out" / "scale"
MODELS = ("gpt-5", *(f"model-{i:02d}" for i in range(1, 20)))  # gpt-5: what bench/ws.py asks for
KEY = "sk-gw-scale-bench-00000000000"
UPSTREAM_KEY_ENV, UPSTREAM_KEY = "GATEWAY_UPSTREAM_SCALE_KEY", "sk-scale-upstream-0000000000"
EVENTS_PER_S = 50
IDLE_S = 3.0  # the gateway's idle CPU is read over this long before each level
STALL_S = 1.0  # a stream whose client waited longer than this between two events stalled (50 intervals)
LEDGER_DAYS = 30  # GATEWAY_LEDGER_RETENTION_DAYS' default: a ledger pruned daily holds this many days


@dataclass(frozen=True)
class Sizes:
    keys: tuple[int, ...]
    accounts: tuple[int, ...]
    rows: tuple[int, ...]
    streams: tuple[int, ...]
    idle_websockets: int
    stream_s: float
    direct_stream_s: float
    reps: int
    duration: float
    warmup: float


FULL = Sizes(
    (10, 10_000, 100_000), (2, 20, 200), (0, 1_000_000, 10_000_000), (1, 100, 1000), 5000, 60, 15, 3, 5, 1
)
QUICK = Sizes((10, 1000), (2, 20), (0, 20_000), (1, 20), 100, 6, 4, 1, 2, 0.5)
PHASES = ("keys", "accounts", "history", "streams", "workers")


def log(message: str) -> None:
    print(message, flush=True)


def pool_config(assignments: int, upstream: str, keys: list[dict] | None = None) -> dict[str, Any]:
    """One pool `scale` of `assignments` accounts on the upstream, each serving MODELS, and the bench
    key (or `keys`)."""
    return {
        "model_fallback_family": False,
        "pools": [
            {
                "name": "scale",
                "assignments": [
                    {
                        "name": f"acct-{i:03d}",
                        "adapter": "openai",
                        "base_url": f"{upstream}/v1",
                        "api_key_env": UPSTREAM_KEY_ENV,
                        "tier": 0,
                        "weight": 1,
                        "discovery": False,
                        "models": [{"id": m} for m in MODELS],
                    }
                    for i in range(assignments)
                ],
            }
        ],
        "keys": keys or [{"name": "bench", "key": KEY, "pools": ["scale"], "allowed_models": ["*"]}],
    }


class Run:
    """The run's upstream, gateways and databases, and the CPUs they are placed on."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.sizes = QUICK if args.quick else FULL
        self.procs = Processes(OUT)
        self.gateways: list[GatewayProcess] = []
        self.pinned = len(os.sched_getaffinity(0)) >= 2 and not args.no_pin
        self.port = free_port()
        self.upstream = f"http://{HOST}:{self.port}"

    def start_upstream(self) -> None:
        cmd = [
            PYTHON,
            "-m",
            "bench.scale.stream_upstream",
            "--port",
            str(self.port),
            "--models",
            ",".join(MODELS),
        ]
        self.procs.start("upstream", [*cmd, "--interval-ms", str(1000 / EVENTS_PER_S)])
        why = wait_until(
            lambda: "" if http_request(f"{self.upstream}/v1/models", key="x").status == 200 else "no answer",
            20,
        )
        if why:
            raise RuntimeError(f"the upstream did not start: {why}")

    def direct(self) -> Target:
        return Target("direct", "direct (the upstream)", "direct", base_url=f"{self.upstream}/v1", key=KEY)

    def gateway(
        self, name: str, label: str, config: dict, seeds: list[list[str]], workers: int = 1, pin: bool = True
    ) -> tuple[GatewayProcess, Target]:
        """A gateway on a fresh database with `config` loaded and `seeds` (bench/scale/seed.py arguments)
        applied, started and ready."""
        workdir = OUT / name
        workdir.mkdir(parents=True, exist_ok=True)
        database = Database.create(workdir, server_url=self.args.database_url)
        application = f"scale-{name}"
        env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, "PGAPPNAME": application}
        args = ["--workers", str(workers)] if workers > 1 else []
        gw = GatewayProcess(database, workdir, env_extra=env, uvicorn_args=args)
        self.gateways.append(gw)
        gw.prepare(config)
        for what in seeds:
            started = time.monotonic()
            rc, last = run_logged(
                [PYTHON, "-m", "bench.scale.seed", *what], gw.env(), workdir / "seed.log", 3600
            )
            if rc != 0:
                raise RuntimeError(f"seed {' '.join(what)} failed ({rc}): {last}")
            log(f"  {name}: seed {' '.join(what)} in {time.monotonic() - started:.0f} s")
        gw.launch()
        os.sched_setaffinity(gw.pid, {0} if self.pinned and pin else os.sched_getaffinity(0) | {0, 1})
        gw.wait_ready()
        target = Target(
            name,
            label,
            "gateway",
            base_url=f"{gw.url}/v1",
            key=KEY,
            pid=gw.pid,
            database="postgres",
            workers=workers,
            database_url=database.url,
            application=application,
        )
        return gw, target

    def probe(self, gw: GatewayProcess, *what: str) -> dict[str, Any]:
        """bench/scale/probe.py on the gateway's database: its JSON."""
        proc = subprocess.run(  # noqa: S603 - argv built here
            [PYTHON, "-m", "bench.scale.probe", *what],
            env=gw.env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        if proc.returncode != 0:
            return {"error": (proc.stderr or proc.stdout).strip()[-400:]}
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def stop(self, gws: list[GatewayProcess]) -> None:
        for gw in gws:
            gw.kill()
            gw.database.drop()
            self.gateways.remove(gw)

    def stop_all(self) -> None:
        self.stop(list(self.gateways))
        self.procs.stop_all()

    def measure(self, targets: list[Target], concurrencies: tuple[int, ...]) -> dict[str, dict[str, Any]]:
        """bench/load.py's wrk scenarios, the targets interleaved: per concurrency, target -> median."""
        s = self.sizes
        scenarios = [
            Scenario(f"c{c}", f"non-streaming, c={c}", "gpt-5", False, c, ("direct", "gateway"), "wrk")
            for c in concurrencies
        ]
        args = SimpleNamespace(warmup=s.warmup, reps=s.reps, duration=s.duration)
        load.run_scenarios(targets, scenarios, args, [self.port], use_wrk=True)
        return {sc.name: {t: r.get("median", r) for t, r in sc.results.items()} for sc in scenarios}


# --- the curves ----------------------------------------------------------------------------------------


def keys_file(count: int) -> Path:
    path = OUT / f"keys-{count}.txt"
    path.write_text("".join(seed.key_secret(i) + "\n" for i in range(count)))
    return path


def curve_keys(run: Run) -> dict[str, Any]:
    config = pool_config(2, run.upstream)
    started, targets = [], [run.direct()]
    for n in run.sizes.keys:
        gw, t = run.gateway(f"keys-{n}", f"{n:,} keys", config, [["keys", str(n), "--pool", "scale"]])
        t.key, t.keys_file = seed.key_secret(0), str(keys_file(n))
        started.append(gw)
        targets.append(t)
    try:
        return {"sizes": list(run.sizes.keys), "load": run.measure(targets, (1, 16))}
    finally:
        run.stop(started)


def curve_accounts(run: Run) -> dict[str, Any]:
    started, targets, probes = [], [run.direct()], {}
    for n in run.sizes.accounts:
        config = pool_config(n, run.upstream)
        gw, t = run.gateway(f"accounts-{n}", f"{n} accounts", config, [["latency", "--pool", "scale"]])
        started.append(gw)
        targets.append(t)
    try:
        measured = run.measure(targets, (1, 16))
        for gw, n in zip(started, run.sizes.accounts, strict=True):
            probes[n] = run.probe(gw, "routing", "--key", "bench", "--secret", KEY, "--model", "gpt-5")
            log(f"  accounts {n}: {json.dumps(probes[n])[:300]}")
        return {"sizes": list(run.sizes.accounts), "load": measured, "probes": probes}
    finally:
        run.stop(started)


def curve_history(run: Run) -> dict[str, Any]:
    config = pool_config(4, run.upstream)
    started, targets, probes = [], [run.direct()], {}
    for n in run.sizes.rows:
        seeds = [["keys", "100", "--pool", "scale"]]
        if n:
            seeds.append(["ledger", str(n), "--days", str(LEDGER_DAYS)])
        gw, t = run.gateway(f"history-{n}", f"{n:,} records", config, seeds)
        started.append(gw)
        targets.append(t)
    try:
        measured = run.measure(targets, (1, 16))
        for gw, n in zip(started, run.sizes.rows, strict=True):
            probes[n] = run.probe(gw, "admin", "--prune-days", str(LEDGER_DAYS - 1))
            log(f"  history {n}: {json.dumps(probes[n])[:300]}")
        return {"sizes": list(run.sizes.rows), "days": LEDGER_DAYS, "load": measured, "probes": probes}
    finally:
        run.stop(started)


async def one_level(run: Run, target: Target, count: int, seconds: float) -> dict[str, Any]:
    """`count` streams of `seconds` through `target`; for a gateway, its CPU and memory in the window
    (from 40 % of the run to 90 %: every stream open and flowing)."""
    events = int(seconds * EVENTS_PER_S)
    window = (seconds * 0.4, seconds * 0.9)
    readings: dict[str, Any] = {}

    async def watch() -> None:
        if target.pid is None:
            return
        await asyncio.sleep(window[0])
        readings["cpu0"], readings["rss_mid_kib"] = tree_cpu_seconds(target.pid), rss_kb(target.pid)
        await asyncio.sleep(window[1] - window[0])
        readings["cpu1"] = tree_cpu_seconds(target.pid)

    if target.pid is not None:
        # What the gateway spends with nothing open (its timers, the ledger writer's ticks), subtracted
        # from the window's CPU: otherwise one stream's 50 events a second carry the idle process.
        idle0 = tree_cpu_seconds(target.pid)
        await asyncio.sleep(IDLE_S)
        readings["idle_cpu_per_s"] = (tree_cpu_seconds(target.pid) - idle0) / IDLE_S
        readings["rss_before_kib"] = rss_kb(target.pid)
    found, _ = await asyncio.gather(
        streams.run_streams(target.base_url, target.key, "gpt-5", count, events, window, 2 * seconds + 30),
        watch(),
    )
    result = streams.summary(*found, events, STALL_S)
    if target.pid is not None:
        spent = readings["cpu1"] - readings["cpu0"]
        net = spent - readings["idle_cpu_per_s"] * (window[1] - window[0])
        seen = result["events_in_window"]
        result["cpu_busy"] = spent / (window[1] - window[0])  # of one core: 1.0 is a saturated worker
        result["cpu_us_per_event_raw"] = spent * 1e6 / seen if seen else None
        result["cpu_us_per_event"] = net * 1e6 / seen if seen else None
        result["rss_per_stream_kib"] = (readings["rss_mid_kib"] - readings["rss_before_kib"]) / count
        result |= {k: v for k, v in readings.items() if k.startswith("rss")}
    return result


def curve_streams(run: Run) -> dict[str, Any]:
    gw, target = run.gateway("streams", "gateway", pool_config(1, run.upstream), [])
    levels: dict[int, Any] = {}
    try:
        for count in run.sizes.streams:
            direct = asyncio.run(one_level(run, run.direct(), count, run.sizes.direct_stream_s))
            load.quiesce(target)
            through = asyncio.run(one_level(run, target, count, run.sizes.stream_s))
            levels[count] = {"direct": direct, "gateway": through}
            log(f"  streams {count}: gateway {json.dumps(through)[:300]}")
            log(f"  streams {count}: direct {json.dumps(direct)[:200]}")
        hooks = ws.Hooks(
            upstream_stats=lambda: load.upstream_counters([run.port]),
            configure_upstreams=lambda settings: load.configure_upstreams([run.port], settings),
            quiesce=load.quiesce_pid,
            cpu_seconds=cpu_seconds,
        )
        server = ws.Server(target.name, target.label, ws.ws_url(target.base_url), KEY, target.pid)
        count = run.sizes.idle_websockets
        idle = asyncio.run(ws.measure_memory(server, count, hooks, clients=ws.CLIENT_KINDS[:1]))
        log(f"  idle websockets {count}: {json.dumps(idle.get('kinds', idle))[:300]}")
        return {
            "sizes": list(run.sizes.streams),
            "seconds": run.sizes.stream_s,
            "levels": levels,
            "idle": idle,
        }
    finally:
        run.stop([gw])


def curve_workers(run: Run) -> dict[str, Any]:
    config = pool_config(2, run.upstream)
    limited = [
        {
            "name": "bench",
            "key": KEY,
            "pools": ["scale"],
            "allowed_models": ["*"],
            "limits": {"rpm": 1_000_000_000, "tpm": 2_000_000_000, "concurrent": 100},
        }
    ]
    started, targets = [], [run.direct()]
    for name, label, workers, cfg in (
        ("workers-1", "1 worker", 1, config),
        ("workers-2", "2 workers", 2, config),
        (
            "workers-1-limits",
            "1 worker, key with limits (database)",
            1,
            pool_config(2, run.upstream, limited),
        ),
    ):
        gw, t = run.gateway(name, label, cfg, [], workers=workers, pin=False)
        started.append(gw)
        targets.append(t)
    try:
        return {"load": run.measure(targets, (16, 64))}
    finally:
        run.stop(started)


CURVES = {
    "keys": curve_keys,
    "accounts": curve_accounts,
    "history": curve_history,
    "streams": curve_streams,
    "workers": curve_workers,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="make bench-scale: the gateway's cost as what it holds grows")
    p.add_argument("--quick", action="store_true", help="a smoke run: the smallest sizes, short runs")
    p.add_argument("--only", action="append", choices=PHASES, help="measure this curve only (repeatable)")
    p.add_argument("--no-pin", action="store_true", help="don't pin the gateways and the load to CPUs")
    p.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_SCALE_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
        help="a PostgreSQL server: each gateway runs on a database created there and dropped at exit "
        "(env BENCH_SCALE_DATABASE_URL)",
    )
    p.add_argument("--report-only", action="store_true", help="rewrite the section from the last results")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    raw = OUT / "results.json"
    if args.report_only:
        results = json.loads(raw.read_text())
        log(f"wrote {report.write(results, results['context']['quick'], OUT)}")
        return 0
    started = time.monotonic()
    LOGS.mkdir(parents=True, exist_ok=True)
    why = ensure_wrk()
    if why:
        log(f"make bench-scale needs wrk: {why}")
        return 1
    ws.raise_fd_limit()
    run = Run(args)
    atexit.register(run.stop_all)
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    if run.pinned:
        os.sched_setaffinity(0, {1})  # the driver, wrk and the upstream; the gateways go to CPU 0
    context = report.context(ROOT, args.quick, asdict(run.sizes), run.pinned)
    run.start_upstream()
    results: dict[str, Any] = {"context": context, "curves": {}}
    if args.only and raw.exists():  # the other curves' last figures stay
        results["curves"] = json.loads(raw.read_text()).get("curves", {})
    for name in args.only or PHASES:
        log(f"{name} ...")
        begun = time.monotonic()
        results["curves"][name] = CURVES[name](run)
        results["curves"][name]["elapsed_s"] = round(time.monotonic() - begun)
        results["curves"][name]["load_average"] = os.getloadavg()
        raw.write_text(json.dumps(results, indent=1) + "\n")
    run.stop_all()
    context["elapsed_s"] = round(time.monotonic() - started)
    context["load_end"] = os.getloadavg()
    raw.write_text(json.dumps(results, indent=1) + "\n")
    log(f"wrote {report.write(results, args.quick, OUT)} in {context['elapsed_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
