"""The load of `make bench`: wrk and the Python SSE client against each target, the scenarios, their
repetitions interleaved across targets, and the websocket phase (bench/ws.py) wired to the run's
upstreams.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from bench import ws
from bench.accounting import backend_cpu, backend_cpu_spent, tree_cpu_seconds
from bench.figures import fmt
from bench.targets import (
    BENCH,
    CONTENT_RE,
    OUT,
    SLOW_DELAY_MS,
    Scenario,
    Target,
    chat_body,
    http_request,
    log,
)
from devkit.harness import HOST
from devkit.procfs import cpu_seconds

# --- measurements ------------------------------------------------------------------------------


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def throughput(concurrency: int, ok: int, requests: int, mean_s: float, seconds: float) -> float:
    """Successful requests per second.

    At c=1: completed / duration. At c>1: Little's law for a closed loop with no think time,
    c / mean latency, times the share of 2xx answers. Counting completions in a fixed window loses the
    c requests still in flight at its end and the ramp at its start, which undercounts a slow target
    (LiteLLM at c=64 has about a second of latency: a 5 s window would lose ~10 %); Little's law
    does not. Both numbers are kept in results.json (`rps`, `rps_count`).
    """
    if concurrency <= 1 or not requests or mean_s <= 0:
        return ok / seconds if seconds else 0.0
    return concurrency / mean_s * ok / requests


def quiesce(target: Target, timeout: float = 20) -> None:
    """Wait until the target's server is idle: a server may keep working on requests whose client
    went away at the end of a run, and that work would land on the next target's measurement."""
    if target.pid is not None:
        quiesce_pid(target.pid, timeout)


def quiesce_pid(pid: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = tree_cpu_seconds(pid)
        time.sleep(0.25)
        after = tree_cpu_seconds(pid)
        if before is None or after is None or (after - before) / 0.25 < 0.05:
            return


def run_wrk(
    target: Target, body_file: Path, concurrency: int, duration: float, count_header: str | None = None
) -> dict[str, Any]:
    env = {**os.environ, "BENCH_BODY_FILE": str(body_file), "BENCH_KEY": target.key}
    if target.keys_file:
        env["BENCH_KEYS_FILE"] = target.keys_file
    if count_header:
        env["BENCH_COUNT_HEADER"] = count_header
    cmd = [
        "wrk",
        "-t1",
        f"-c{concurrency}",
        f"-d{duration:g}s",
        "--timeout",
        "10s",
        "--latency",
        "-s",
        str(BENCH / "wrk_post.lua"),
        target.chat_url,
    ]
    try:
        proc = subprocess.run(  # noqa: S603
            cmd, env=env, capture_output=True, timeout=duration + 30, check=False, text=True
        )
    except subprocess.TimeoutExpired:
        return {"error": f"wrk did not finish within {duration + 30:.0f} s"}
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH_JSON ")), None)
    if proc.returncode != 0 or line is None:
        return {"error": f"wrk exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-300:]}"}
    raw = json.loads(line.removeprefix("BENCH_JSON "))
    seconds = raw["duration_us"] / 1e6
    errs = raw["errors"]
    socket_errors = errs["connect"] + errs["read"] + errs["write"] + errs["timeout"]
    ok = raw["requests"] - errs["status"]
    return {
        "tool": "wrk",
        "requests": raw["requests"],
        "ok": ok,
        "errors": errs["status"] + socket_errors,
        "rps": throughput(concurrency, ok, raw["requests"], raw["mean_us"] / 1e6, seconds),
        "rps_count": ok / seconds if seconds else 0.0,
        "p50_ms": raw["p50_us"] / 1000,
        "p90_ms": raw["p90_us"] / 1000,
        "p99_ms": raw["p99_us"] / 1000,
        "mean_ms": raw["mean_us"] / 1000,
        "tallies": raw["tallies"],
    }


async def _py_load(
    url: str, key: str, body: bytes, concurrency: int, duration: float, stream: bool, count_header: str | None
) -> dict[str, Any]:
    import aiohttp

    latencies: list[float] = []
    ttfb: list[float] = []
    tallies: dict[str, int] = {}
    errors = 0
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as session:
        deadline = time.perf_counter() + duration

        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                first = None
                try:
                    async with session.post(url, data=body, headers=headers) as resp:
                        if count_header:
                            tag = f"{resp.status}:{resp.headers.get(count_header, 'absent')}"
                            tallies[tag] = tallies.get(tag, 0) + 1
                        if resp.status != 200:
                            errors += 1
                            await resp.read()
                            continue
                        if stream:
                            async for line in resp.content:
                                if first is None and CONTENT_RE.search(line):
                                    first = time.perf_counter()
                        else:
                            await resp.read()
                except (aiohttp.ClientError, TimeoutError):
                    errors += 1
                    continue
                t1 = time.perf_counter()
                if stream and first is None:
                    errors += 1  # a 200 stream that never showed content
                    continue
                latencies.append(t1 - t0)
                if first is not None:
                    ttfb.append(first - t0)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    ttfb.sort()
    result: dict[str, Any] = {
        "tool": "python-aiohttp",
        "requests": len(latencies) + errors,
        "ok": len(latencies),
        "errors": errors,
        "rps": throughput(
            concurrency,
            len(latencies),
            len(latencies) + errors,
            statistics.fmean(latencies) if latencies else 0,
            elapsed,
        ),
        "rps_count": len(latencies) / elapsed if elapsed else 0.0,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p90_ms": percentile(latencies, 90) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "mean_ms": (statistics.fmean(latencies) * 1000) if latencies else math.nan,
        "tallies": tallies,
    }
    if stream:
        result["ttfb_p50_ms"] = percentile(ttfb, 50) * 1000
        result["ttfb_p99_ms"] = percentile(ttfb, 99) * 1000
    return result


def run_py(
    target: Target,
    body: bytes,
    concurrency: int,
    duration: float,
    stream: bool,
    count_header: str | None = None,
) -> dict[str, Any]:
    coro = _py_load(target.chat_url, target.key, body, concurrency, duration, stream, count_header)
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def build_scenarios() -> list[Scenario]:
    all_kinds = ("direct", "litellm", "gateway")
    return [
        Scenario("chat_c1", "non-streaming, c=1", "gpt-5", False, 1, all_kinds, "wrk"),
        Scenario("chat_c16", "non-streaming, c=16", "gpt-5", False, 16, all_kinds, "wrk"),
        Scenario("chat_c64", "non-streaming, c=64", "gpt-5", False, 64, all_kinds, "wrk"),
        Scenario("sse_c1", "SSE, c=1", "gpt-5", True, 1, all_kinds, "py"),
        Scenario(
            "failover_c1",
            "failover gpt-x, c=1",
            "gpt-x",
            False,
            1,
            ("gateway",),
            "wrk",
            count_header="x-gateway-attempts",
        ),
        Scenario(
            "slow_c50",
            f"non-streaming, c=50, upstream +{SLOW_DELAY_MS} ms",
            "gpt-5",
            False,
            50,
            all_kinds,
            "wrk",
            upstream_delay_ms=SLOW_DELAY_MS,
        ),
    ]


def preflight(target: Target, scenario: Scenario, body: bytes) -> str:
    """One request of the scenario's shape; "" when it is answered as the scenario needs."""
    probe = http_request(target.chat_url, "POST", body, target.key, timeout=15)
    if probe.status != 200:
        path = "/" + target.chat_url.split("://", 1)[1].split("/", 1)[1]
        shape = f"{scenario.model}, stream" if scenario.stream else scenario.model
        return f"POST {path} ({shape}) -> {probe.summary()}"
    if scenario.stream:
        ctype = probe.headers.get("content-type", "")
        if "text/event-stream" not in ctype:
            return f"stream answered with content-type {ctype!r}, not text/event-stream"
        if not CONTENT_RE.search(probe.body):
            return "stream answered 200 but carried no content event"
    return ""


def measure(target: Target, scenario: Scenario, body_file: Path, duration: float, use_wrk: bool) -> dict:
    if scenario.tool == "wrk" and use_wrk:
        return run_wrk(target, body_file, scenario.concurrency, duration, scenario.count_header)
    return run_py(
        target, body_file.read_bytes(), scenario.concurrency, duration, scenario.stream, scenario.count_header
    )


def median_of(reps: list[dict[str, Any]]) -> dict[str, Any]:
    # A figure counted per answered request is missing from a repetition that answered none (a
    # starved target): the median is of the repetitions that have it.
    keys = {k for r in reps for k, v in r.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    med: dict[str, Any] = {k: statistics.median(r[k] for r in reps if k in r) for k in sorted(keys)}
    tallies: dict[str, int] = {}
    for r in reps:
        for k, v in r.get("tallies", {}).items():
            tallies[k] = tallies.get(k, 0) + v
    med["tallies"] = tallies
    med["requests_total"] = sum(r["requests"] for r in reps)
    med["errors_total"] = sum(r["errors"] for r in reps)
    med["tool"] = reps[0].get("tool")
    return med


def upstream_counters(ports: list[int]) -> dict[str, int] | None:
    """The upstreams' `/_bench/stats` counters, summed over the upstreams."""
    total: dict[str, int] = {}
    for port in ports:
        probe = http_request(f"http://{HOST}:{port}/_bench/stats")
        if probe.status != 200:
            return None
        for key, value in json.loads(probe.body).items():
            total[key] = total.get(key, 0) + value
    return total


def upstream_stats(ports: list[int]) -> tuple[int, int] | None:
    """(connections accepted, requests served), summed over the upstreams."""
    counters = upstream_counters(ports)
    return None if counters is None else (counters["connections"], counters["requests"])


def configure_upstreams(ports: list[int], settings: dict[str, float]) -> None:
    for port in ports:
        probe = http_request(f"http://{HOST}:{port}/_bench/config", "POST", json.dumps(settings).encode())
        if probe.status != 200:
            raise RuntimeError(f"could not set {settings} on the upstream on port {port}: {probe.summary()}")


def set_upstream_delay(ports: list[int], delay_ms: float) -> None:
    configure_upstreams(ports, {"delay_ms": delay_ms})


def run_scenarios(
    targets: list[Target],
    scenarios: list[Scenario],
    args: argparse.Namespace,
    upstream_ports: list[int],
    use_wrk: bool,
) -> None:
    bodies = OUT / "bodies"
    bodies.mkdir(exist_ok=True)
    for sc in scenarios:
        body_file = bodies / f"{sc.model}-{'stream' if sc.stream else 'json'}.json"
        body_file.write_text(json.dumps(chat_body(sc.model, sc.stream)))
        body = body_file.read_bytes()
        set_upstream_delay(upstream_ports, sc.upstream_delay_ms)
        active: list[Target] = []
        for t in targets:
            if t.kind not in sc.kinds:
                continue
            if t.unavailable:
                sc.results[t.name] = {"skipped": t.unavailable}
                continue
            why = preflight(t, sc, body)
            if why:
                sc.results[t.name] = {"skipped": why}
                log(f"  {sc.name} {t.name}: skipped: {why}")
                continue
            measure(t, sc, body_file, args.warmup, use_wrk)  # warm-up, discarded
            quiesce(t)
            active.append(t)
            sc.results[t.name] = {"reps": []}
        for rep in range(args.reps):
            # Each repetition starts one target later: a target measured right after another pays for
            # what that one left running in the shared database (its ledger's last batches, autovacuum);
            # in a fixed order the last target (the --baseline) always paid it.
            shift = rep % len(active) if active else 0
            for t in active[shift:] + active[:shift]:
                cpu_before = tree_cpu_seconds(t.pid) if t.pid else None
                db_before = backend_cpu(t.database_url, t.application) if t.application else None
                up_before = upstream_stats(upstream_ports)
                r = measure(t, sc, body_file, args.duration, use_wrk)
                cpu_after = tree_cpu_seconds(t.pid) if t.pid else None
                db_after = backend_cpu(t.database_url, t.application) if t.application else None
                up_after = upstream_stats(upstream_ports)
                if up_before and up_after and r.get("ok"):
                    # new upstream connections per 100 answered requests: ~0 when the target keeps a pool;
                    # the second reading's own connection to each upstream is not the target's
                    opened = up_after[0] - up_before[0] - len(upstream_ports)
                    r["upstream_conns_per_100"] = opened * 100 / r["ok"]
                if cpu_before is not None and cpu_after is not None and r.get("ok"):
                    # the server's own CPU time per answered request (every worker): comparable between
                    # servers even when other processes on a shared machine take CPU away from them
                    r["cpu_ms_per_req"] = (cpu_after - cpu_before) * 1000 / r["ok"]
                db_spent = backend_cpu_spent(db_before, db_after)
                if db_spent is not None and r.get("ok"):
                    r["db_cpu_ms_per_req"] = db_spent * 1000 / r["ok"]
                quiesce(t)
                if "error" in r:
                    log(f"  {sc.name} {t.name} rep {rep + 1}: {r['error']}")
                    sc.results[t.name].setdefault("run_errors", []).append(r["error"])
                    continue
                sc.results[t.name]["reps"].append(r)
                extra = f" ttfb p50 {r['ttfb_p50_ms']:.3f} ms" if "ttfb_p50_ms" in r else ""
                log(
                    f"  {sc.name:12} {t.name:12} rep {rep + 1}: {r['rps']:9.1f} req/s"
                    f"  p50 {r['p50_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms{extra}  errors {r['errors']}"
                )
        for t in active:
            res = sc.results[t.name]
            if res["reps"]:
                res["median"] = median_of(res["reps"])
            else:
                res["skipped"] = "every run failed: " + "; ".join(res.get("run_errors", []))[:300]
    set_upstream_delay(upstream_ports, 0)


def run_websocket_phase(targets: list[Target], args: argparse.Namespace, ports: list[int]) -> dict[str, Any]:
    """Memory per idle websocket and relay latency per event (bench/ws.py) for every one-worker gateway
    (the memory per connection is read from that one process's RSS)."""
    gws = [t for t in targets if t.kind == "gateway" and not t.unavailable and t.workers == 1]
    if not gws:
        return {"skipped": "no gateway to measure"}
    direct = next(t for t in targets if t.kind == "direct")
    hooks = ws.Hooks(
        upstream_stats=lambda: upstream_counters(ports),
        configure_upstreams=lambda settings: configure_upstreams(ports, settings),
        quiesce=quiesce_pid,
        cpu_seconds=cpu_seconds,
    )
    servers = [ws.Server(t.name, t.label, ws.ws_url(t.base_url), t.key, t.pid) for t in gws]
    idle = ws.QUICK_IDLE_CONNECTIONS if args.quick else ws.IDLE_CONNECTIONS
    log(f"websocket phase: {idle} idle connections per client kind, then relay latency per event ...")
    result = ws.run_phase(
        ws.Server(direct.name, direct.label, ws.ws_url(direct.base_url), direct.key, None),
        servers,
        hooks,
        quick=args.quick,
        reps=args.reps,
    )
    for t in gws:
        mem = result["memory"].get(t.name, {})
        for kind in mem.get("kinds", []):
            log(
                f"  ws memory  {t.name:12} client {kind['client']:27} {kind['open']} open: "
                f"{fmt(kind['per_connection_kib'], 1)} KiB each, upstream websockets +"
                f"{kind['upstream_ws_open_added']}, fds +{kind['fds_added']}, errors {kind['errors']}"
            )
        if "error" in mem:
            log(f"  ws memory  {t.name:12} {mem['error']}")
    for mode, by in result["latency"].items():
        for name, lat in by.items():
            if "error" in lat:
                log(f"  ws {mode:6} {name:12} {lat['error']}")
                continue
            ev = lat["events"]
            log(
                f"  ws {mode:6} {name:12} per-event p50 {ev['p50_us']:8.1f} us  p99 {ev['p99_us']:8.1f} us "
                f" ({ev['count']} events, errors {lat['errors']})"
            )
    return result
