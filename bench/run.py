"""`make bench`: the gateway against direct upstream calls and the LiteLLM proxy, on loopback.

What runs (everything on 127.0.0.1, everything stopped at exit):
- two fast fake upstreams (devkit/fast_upstream.py): `fast-a` rejects gpt-x with 404 model_not_found,
  `fast-b` serves it;
- the LiteLLM proxy from its own venv (bench/.venv-litellm), started offline as
  /work/shared/peers/README.md describes, configured by bench/litellm_config.yaml;
- the gateway, as production runs it, twice side by side: daphne and uvicorn (uvloop + httptools),
  DJANGO_DEBUG=false, a generated secret, a throwaway SQLite database under bench/out/, migrated and
  loaded with bench/gateway_config.yaml. Or, with --gateway-url/--gateway-key, a gateway someone
  else started (configured with bench/gateway_config.yaml against the upstream ports above).

Load: wrk (installed with apt-get when missing) with bench/wrk_post.lua for non-streaming requests
(latency percentiles from wrk's histogram, throughput, failover); a small asyncio/aiohttp client for
the SSE time to first content event, where wrk cannot see inside a response.

Websockets (bench/ws.py, first, on freshly started servers): memory per idle client websocket with
its live upstream websocket (gateway RSS growth over 500 idle connections, per kind of client), and
the relay latency added per event (upstream send stamp to client read, gateway minus direct).

Each scenario warms every target up, then runs `--reps` repetitions, the targets interleaved inside
each repetition so drift on this shared machine hits them alike; the report gives medians.
The system under test (gateway or LiteLLM, one process each) is pinned to one CPU, the upstreams and
the load generators to the others, when the machine has at least two.

Writes bench/results.md (and bench/out/results.json); logs in bench/out/logs/.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import datetime as dt
import hashlib
import http.client
import json
import math
import os
import platform
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import ws  # noqa: E402

from devkit.harness import HOST, Processes, free_port, port_is_free, run_logged, tail  # noqa: E402
from devkit.procfs import cpu_seconds  # noqa: E402

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
        before = cpu_seconds(pid)
        time.sleep(0.25)
        after = cpu_seconds(pid)
        if before is None or after is None or (after - before) / 0.25 < 0.05:
            return


def run_wrk(
    target: Target, body_file: Path, concurrency: int, duration: float, count_header: str | None = None
) -> dict[str, Any]:
    env = {**os.environ, "BENCH_BODY_FILE": str(body_file), "BENCH_KEY": target.key}
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
    keys = [k for k, v in reps[0].items() if isinstance(v, int | float) and not isinstance(v, bool)]
    med: dict[str, Any] = {k: statistics.median(r[k] for r in reps) for k in keys}
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
            for t in active:
                cpu_before = cpu_seconds(t.pid) if t.pid else None
                up_before = upstream_stats(upstream_ports)
                r = measure(t, sc, body_file, args.duration, use_wrk)
                cpu_after = cpu_seconds(t.pid) if t.pid else None
                up_after = upstream_stats(upstream_ports)
                if up_before and up_after and r.get("ok"):
                    # new upstream connections per 100 answered requests: ~0 when the target keeps a pool
                    r["upstream_conns_per_100"] = (up_after[0] - up_before[0]) * 100 / r["ok"]
                if cpu_before is not None and cpu_after is not None and r.get("ok"):
                    # the server's own CPU time per answered request: comparable between servers even when
                    # other processes on a shared machine take CPU away from them
                    r["cpu_ms_per_req"] = (cpu_after - cpu_before) * 1000 / r["ok"]
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
    """Memory per idle websocket and relay latency per event (bench/ws.py) for every gateway."""
    gws = [t for t in targets if t.kind == "gateway" and not t.unavailable]
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


# --- report ------------------------------------------------------------------------------------


def fmt(v: float | None, digits: int = 2, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.{digits}f}{unit}"


def fmt_ratio(r: float | None) -> str:
    if r is None or math.isnan(r):
        return "n/a"
    return f"{r:.2f}x" if r >= 0.1 else f"{r:.2g}x"  # keep small ratios readable (0.0026x, not 0.00x)


def med(sc: Scenario, target: str) -> dict[str, Any] | None:
    return sc.results.get(target, {}).get("median")


def why_missing(sc: Scenario, target: str) -> str:
    res = sc.results.get(target)
    if res is None:
        return "not part of this scenario"
    return res.get("skipped", "no result")


def cell(sc: Scenario, target: str, key: str, digits: int = 2) -> str:
    m = med(sc, target)
    if m is None:
        return "n/a"
    text = fmt(m.get(key), digits)
    if m.get("errors_total"):
        text += f" ({m['errors_total']} err)"
    return text


def verdict(value: float | None, limit: float, kind: str, unit: str, note: str = "") -> str:
    """kind 'max': value <= limit; 'min': value >= limit."""
    if value is None or math.isnan(value):
        return "not measured" + (f": {note}" if note else "")
    if kind == "max":
        ok = value <= limit
        margin = limit - value
    else:
        ok = value >= limit
        margin = value - limit
    word = "**met**" if ok else "**MISSED**"
    how = f"{abs(margin):.2f}{unit} {'headroom' if ok else 'short'}"
    return f"{word}: {value:.2f}{unit} ({how})" + (f"; {note}" if note else "")


def ws_memory_figure(websocket: dict[str, Any], name: str) -> tuple[float | None, str]:
    """Memory per idle websocket for one gateway: the larger of the client kinds' figures, and a note
    that names both, or None and why there is no figure."""
    if "skipped" in websocket:
        return None, websocket["skipped"]
    mem = websocket.get("memory", {}).get(name)
    if mem is None:
        return None, "not part of the websocket phase"
    if "error" in mem:
        return None, mem["error"]
    parts, problems = [], []
    for k in mem["kinds"]:
        if k["open"] < k["asked"]:
            first = k["first_errors"][0] if k["first_errors"] else "no error recorded"
            problems.append(f"only {k['open']} of {k['asked']} opened ({first})")
        if k["upstream_ws_open_added"] != k["open"]:
            problems.append(f"{k['upstream_ws_open_added']} upstream websockets held for {k['open']} clients")
        parts.append(f"{fmt(k['per_connection_kib'], 1)} KiB when the client {k['client']}")
    if problems:
        return None, "; ".join(problems)
    values = [k["per_connection_kib"] for k in mem["kinds"] if k["per_connection_kib"] is not None]
    return (max(values) if values else None), "; ".join(parts)


def ws_added(websocket: dict[str, Any], mode: str, name: str, key: str = "p50_us") -> float | None:
    """Relay latency a gateway adds to an event (gateway minus direct), in microseconds."""
    by = websocket.get("latency", {}).get(mode, {})
    g, d = by.get(name, {}), by.get("direct", {})
    if "events" not in g or "events" not in d:
        return None
    return g["events"][key] - d["events"][key]


def ws_latency_note(websocket: dict[str, Any], name: str) -> str:
    if "skipped" in websocket:
        return websocket["skipped"]
    by = websocket.get("latency", {}).get("paced", {})
    for who in (name, "direct"):
        if "error" in by.get(who, {"error": "not measured"}):
            return f"{who}: {by.get(who, {}).get('error', 'not measured')}"
    return ""


def ws_report(websocket: dict[str, Any], gws: list[Target]) -> list[str]:
    """The report's websocket section (bench/ws.py measures it)."""
    L = ["## Websocket relay (`/v1/responses`, SPEC §6.3)", ""]
    if "skipped" in websocket:
        return [*L, f"Not measured: {websocket['skipped']}.", ""]
    n = websocket["idle_connections"]
    quick = (
        f" (**--quick**: {n} instead of the {websocket['target_idle_connections']} the target is stated for)"
        if websocket.get("quick")
        else ""
    )
    L.append(
        f"Idle websockets: {n} per kind of client{quick}, each after one whole response, so that each "
        "holds its live upstream websocket; the second kind is opened while the first kind's connections "
        "are still open. Per connection = growth of the gateway process's VmRSS / connections open. "
        f"Open-file limit of this run: {websocket['fd_limit'][0]} (raised to the hard limit; the servers "
        "inherit it)."
    )
    L.append("")
    L.append(
        "| server | client | idle websockets | upstream websockets held | gateway fds added "
        "| extension negotiated | RSS before (MiB) | RSS idle (MiB) | per connection (KiB) |"
    )
    L.append("|---|---|---|---|---|---|---|---|---|")
    closing: list[str] = []
    for g in gws:
        mem = websocket["memory"].get(g.name, {"error": "not measured"})
        if "error" in mem:
            L.append(f"| {g.label} | n/a: {mem['error']} | | | | | | | |")
            continue
        for k in mem["kinds"]:
            negotiated = ", ".join(f"{ext} x{c}" for ext, c in sorted(k["negotiated"].items())) or "n/a"
            errors = f" ({k['errors']} failed)" if k["errors"] else ""
            rss_before, rss_idle = k["before"]["rss_kib"], k["idle"]["rss_kib"]
            L.append(
                f"| {g.label} | {k['client']} | {k['open']} of {k['asked']}{errors} "
                f"| +{k['upstream_ws_open_added']} | +{k['fds_added']} | {negotiated} "
                f"| {fmt(rss_before / 1024 if rss_before else None, 1)} "
                f"| {fmt(rss_idle / 1024 if rss_idle else None, 1)} | {fmt(k['per_connection_kib'], 1)} |"
            )
        start, after = mem["start"], mem["after_close"]
        back = (
            "back to where they were" if mem["upstream_ws_open_back"] else "**not** back to where they were"
        )
        closing.append(
            f"- {g.label}: after closing all {mem['closed_all']}, the upstreams' open websockets are {back} "
            f"({start['upstream_ws_open']} -> {after['upstream_ws_open']}), the gateway's descriptors "
            f"{after['fds']} against {start['fds']} at the start, RSS "
            f"{fmt((after['rss_kib'] or 0) / 1024, 1)} MiB (freed memory stays with the Python process)."
        )
    L.append("")
    L.extend(closing)
    L.append("")
    L.append(
        "uvicorn negotiates permessage-deflate with every client that offers it (`--ws-per-message-deflate` "
        "defaults to true). This run starts uvicorn as the README recommends, "
        "`uvicorn gatewaysite.asgi:application --loop uvloop --http httptools`, with no websocket option: "
        'the "offers permessage-deflate" rows show what compression costs an idle connection there, and '
        'the "offers no compression" rows what every connection costs when uvicorn is started with '
        "`--ws-per-message-deflate false` (a server that negotiates nothing holds no compression state). "
        'The "extension negotiated" column shows what each server agreed to. The target row takes the '
        "larger of the two figures."
    )
    L.append("")
    lat = websocket.get("latency", {})
    labels = {"direct": "direct (fast upstream)", **{g.name: g.label for g in gws}}
    for mode, title in (
        (
            "paced",
            f"upstream waits {websocket['pace_ms']:g} ms before each delta, as a model streams tokens",
        ),
        ("burst", "upstream writes every event back to back (later events queue behind earlier ones)"),
    ):
        by = lat.get(mode, {})
        L.append(f"### Relay latency per event, {mode}: {title}")
        L.append("")
        L.append(
            f"{websocket['deltas']} deltas per response, {websocket['responses_per_rep']} responses x "
            f"{websocket['reps']} repetitions per target on one kept-open connection (after "
            f"{ws.WARMUP_RESPONSES} warm-up responses); a delta's latency is the time from the upstream's "
            "write to the client's read; added = target minus direct."
        )
        L.append("")
        L.append(
            "| target | deltas | p50 (us) | p90 (us) | p99 (us) | added p50 (us) | added p99 (us) "
            "| p50 per repetition (us) | response.completed p50 (us) | create -> completed p50 (ms) "
            "| server CPU ms / response | extension |"
        )
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for name, label in labels.items():
            r = by.get(name)
            if r is None or "error" in r:
                L.append(f"| {label} | n/a: {(r or {}).get('error', 'not measured')} | | | | | | | | | | |")
                continue
            ev = r["events"]
            added = "" if name == "direct" else fmt(ws_added(websocket, mode, name), 1)
            added99 = "" if name == "direct" else fmt(ws_added(websocket, mode, name, "p99_us"), 1)
            errors = f" ({r['errors']} err: {r['first_error']})" if r["errors"] else ""
            reps = ", ".join(fmt(v, 0) for v in r["rep_p50_us"])
            L.append(
                f"| {label} | {ev['count']}{errors} | {fmt(ev['p50_us'], 1)} | {fmt(ev['p90_us'], 1)} "
                f"| {fmt(ev['p99_us'], 1)} | {added} | {added99} | {reps} "
                f"| {fmt(r['terminal']['p50_us'], 1)} "
                f"| {fmt(r['round_trip']['p50_us'] / 1000, 2)} | {fmt(r['cpu_ms_per_response'], 2)} "
                f"| {r['negotiated']} |"
            )
        L.append("")
    L.append(
        "The gateway settles a response before it relays the terminal event (proxy/relay.py `_relay_rest`: "
        "the response-id affinity is written and the ledger row handed over first, so that a continuation "
        "sent at once finds them), so `response.completed` takes longer than a delta; create -> completed "
        "also holds the routing of the frame. Neither is part of the per-event target."
    )
    L.append("")
    return L


def build_report(
    ctx: dict[str, Any], targets: list[Target], scenarios: list[Scenario], websocket: dict[str, Any]
) -> str:
    by = {s.name: s for s in scenarios}
    names = {t.name: t for t in targets}
    gws = [t for t in targets if t.kind == "gateway"]
    c1, c16, c64, sse, fo, slow = (
        by[n] for n in ("chat_c1", "chat_c16", "chat_c64", "sse_c1", "failover_c1", "slow_c50")
    )

    def diff(sc: Scenario, a: str, b: str, key: str) -> float | None:
        ma, mb = med(sc, a), med(sc, b)
        if ma is None or mb is None:
            return None
        return ma[key] - mb[key]

    def ratio(sc: Scenario, a: str, b: str) -> float | None:
        ma, mb = med(sc, a), med(sc, b)
        if ma is None or mb is None or not mb["rps"]:
            return None
        return ma["rps"] / mb["rps"]

    notes: dict[str, int] = {}  # why a number is missing -> footnote number (each reason printed once)

    def ref(text: str) -> str:
        return f"[{notes.setdefault(text, len(notes) + 1)}]"

    def na(sc: Scenario, t: str) -> str:
        label = names[t].label if t in names else t
        return f"n/a {ref(f'{label}: {why_missing(sc, t)}')}"

    def reason(sc: Scenario, t: str, others: tuple[str, ...] = ("direct",)) -> str:
        for name in (t, *others):
            if med(sc, name) is None:
                return "see " + na(sc, name).removeprefix("n/a ")
        return ""

    L: list[str] = []
    L.append("# Benchmark results")
    L.append("")
    L.append(
        "Generated by `make bench` (bench/run.py); every run overwrites this file. Raw numbers: "
        "`bench/out/results.json`, server logs: `bench/out/logs/`."
    )
    L.append("")
    L.append(f"- Date: {ctx['date']} (took {ctx['elapsed_s']:.0f} s)")
    L.append(f"- Commit: {ctx['commit']}")
    L.append(
        f"- Machine: {ctx['nproc']} CPUs ({ctx['cpu_model']}), Linux {ctx['kernel']}, "
        f"load average {ctx['load_start']} at start, {ctx['load_end']} at end"
    )
    L.append(
        f"- Python {ctx['python']}; daphne {ctx['versions'].get('daphne')}, uvicorn "
        f"{ctx['versions'].get('uvicorn')}, Django {ctx['versions'].get('django')}; "
        f"LiteLLM {ctx['versions'].get('litellm', 'n/a')}; load generator: {ctx['loadgen']}"
    )
    L.append(f"- CPU placement: {ctx['pinning']}")
    L.append(
        f"- Runs: {ctx['reps']} repetitions x {ctx['duration']:g} s per target and scenario after a "
        f"{ctx['warmup']:g} s warm-up; the tables show the median of the repetitions."
    )
    L.append("")
    L.append("Targets:")
    L.append("")
    for t in targets:
        status = f"unavailable: {t.unavailable}" if t.unavailable else t.base_url
        L.append(f"- **{t.label}**: {status}")
    L.append("")

    # --- targets table
    if ctx["busy"]:
        L.append(f"> **Shared machine**: {ctx['busy']}")
        L.append("")
    notes_at = len(L)
    L.append("## Targets")
    L.append("")
    header = "| target | limit | " + " | ".join(g.label for g in gws) + " |"
    L.append(header)
    L.append("|" + "---|" * (2 + len(gws)))
    rows: list[tuple[str, str, list[str]]] = []
    cells = []
    for g in gws:
        cells.append(verdict(diff(c1, g.name, "direct", "p50_ms"), 1.5, "max", " ms", reason(c1, g.name)))
    rows.append(("Added latency p50, c=1, non-streaming", "<= 1.5 ms", cells))
    cells = [verdict(diff(c1, g.name, "direct", "p99_ms"), 5, "max", " ms", reason(c1, g.name)) for g in gws]
    rows.append(("Added latency p99, c=1, non-streaming", "<= 5 ms", cells))
    for sc in (c16, c64):
        cells = [
            verdict(ratio(sc, g.name, "litellm"), 2, "min", "x", reason(sc, g.name, ("litellm",)))
            for g in gws
        ]
        rows.append((f"Throughput c={sc.concurrency} vs LiteLLM", ">= 2x", cells))
    cells = [
        verdict(diff(sse, g.name, "direct", "ttfb_p50_ms"), 2, "max", " ms", reason(sse, g.name)) for g in gws
    ]
    rows.append(("SSE time-to-first-content added, p50", "<= 2 ms", cells))
    cells = []
    for g in gws:
        value = None
        note = reason(fo, g.name, ()) or reason(c1, "direct", ())
        mf, md = med(fo, g.name), med(c1, "direct")
        if mf is not None and md is not None:
            value = mf["p50_ms"] - md["p50_ms"]
            share = failover_share(mf)
            if share is None:
                note = "x-gateway-attempts header absent: cannot confirm the runs failed over"
            elif share < 0.99:
                note = f"only {share:.0%} of requests made 2 attempts: not a failover measurement"
                value = math.nan
        cells.append(verdict(value, 3, "max", " ms", note))
    rows.append(
        ("Failover (gpt-x: fast-a rejects, fast-b serves) minus direct single call, p50", "<= 3 ms", cells)
    )
    cells = []
    for g in gws:
        r = ratio(slow, g.name, "direct")
        cells.append(verdict(None if r is None else r * 100, 85, "min", " %", reason(slow, g.name)))
    rows.append((f"Throughput c=50, upstream +{SLOW_DELAY_MS} ms, % of direct", ">= 85 %", cells))
    cells = []
    for g in gws:
        value, note = ws_memory_figure(websocket, g.name)
        cells.append(verdict(value, 100, "max", " KiB", note))
    idle = websocket.get("idle_connections", ws.IDLE_CONNECTIONS)
    quick = " (**--quick**: the target is for 500)" if websocket.get("quick") else ""
    rows.append(
        (f"Memory per idle websocket with its upstream connection, {idle} idle{quick}", "<= 100 KiB", cells)
    )
    cells = []
    for g in gws:
        added = ws_added(websocket, "paced", g.name)
        added99 = ws_added(websocket, "paced", g.name, "p99_us")
        note = (
            ws_latency_note(websocket, g.name)
            or f"p99 added {fmt(None if added99 is None else added99 / 1000, 3)} ms"
        )
        cells.append(verdict(None if added is None else added / 1000, 1, "max", " ms", note))
    rows.append(("Websocket relay latency added per event, p50", "<= 1 ms", cells))
    rows.append(
        (
            "DB queries per successful request",
            "(issue)",
            [
                "2 reads before dispatch, 0 writes on a healthy Chat Completions request (asserted by "
                "tests); a Responses answer also writes its response-id affinity (SPEC §7.2); a key "
                "with a budget adds its reservation's one conditional UPDATE (SPEC §7.4)"
            ]
            * len(gws),
        )
    )
    for name, limit, cs in rows:
        L.append(f"| {name} | {limit} | " + " | ".join(cs) + " |")
    L.append("")
    L.append('Margins: "headroom" is how far inside the limit, "short" how far outside.')
    L.append("")
    if PROFILE_MD.exists():
        # What the profiles show for the targets still missed: kept by hand next to this report.
        L.append(PROFILE_MD.read_text().strip())
        L.append("")
    if SOAK_MD.exists():
        L.append(SOAK_MD.read_text().strip())
        L.append("")

    # --- latency
    L.append("## Added latency, c=1, non-streaming (ms)")
    L.append("")
    L.append("| target | p50 | p90 | p99 | added p50 | added p99 | req/s |")
    L.append("|---|---|---|---|---|---|---|")
    for t in targets:
        m = med(c1, t.name)
        if m is None:
            L.append(f"| {t.label} | {na(c1, t.name)} | | | | | |")
            continue
        added = "" if t.name == "direct" else fmt(diff(c1, t.name, "direct", "p50_ms"), 3)
        added99 = "" if t.name == "direct" else fmt(diff(c1, t.name, "direct", "p99_ms"), 3)
        L.append(
            f"| {t.label} | {cell(c1, t.name, 'p50_ms', 3)} | {fmt(m['p90_ms'], 3)} | {fmt(m['p99_ms'], 3)} "
            f"| {added} | {added99} | {fmt(m['rps'], 0)} |"
        )
    L.append("")

    # --- throughput
    L.append("## Throughput (successful requests/s), non-streaming")
    L.append("")
    L.append("| target | c=1 | c=16 | c=64 |")
    L.append("|---|---|---|---|")
    for t in targets:
        cs = []
        for sc in (c1, c16, c64):
            cs.append(cell(sc, t.name, "rps", 0) if med(sc, t.name) else f"{na(sc, t.name)}")
        L.append(f"| {t.label} | " + " | ".join(cs) + " |")
    for g in gws:
        for other, olabel in (("direct", "direct"), ("litellm", "LiteLLM")):
            rs = [ratio(sc, g.name, other) for sc in (c1, c16, c64)]
            L.append(f"| ratio {g.label} / {olabel} | " + " | ".join(fmt_ratio(r) for r in rs) + " |")
    L.append("")
    L.append("| server CPU ms per request | c=1 | c=16 | c=64 |")
    L.append("|---|---|---|---|")
    for t in targets:
        if t.pid is None:
            continue
        cs = [fmt((med(sc, t.name) or {}).get("cpu_ms_per_req"), 3) for sc in (c1, c16, c64)]
        L.append(f"| {t.label} | " + " | ".join(cs) + " |")
    L.append("")
    L.append("| new upstream connections per 100 requests | c=1 | c=16 | c=64 |")
    L.append("|---|---|---|---|")
    for t in targets:
        if t.kind == "direct":
            continue
        cs = [fmt((med(sc, t.name) or {}).get("upstream_conns_per_100"), 2) for sc in (c1, c16, c64)]
        L.append(f"| {t.label} | " + " | ".join(cs) + " |")
    L.append("")
    L.append("| latency p50 / p99 (ms) | c=16 | c=64 |")
    L.append("|---|---|---|")
    for t in targets:
        cs = []
        for sc in (c16, c64):
            m = med(sc, t.name)
            cs.append(f"{fmt(m['p50_ms'], 2)} / {fmt(m['p99_ms'], 2)}" if m else "n/a")
        L.append(f"| {t.label} | " + " | ".join(cs) + " |")
    L.append("")

    # --- SSE
    L.append("## SSE time to first content event, c=1 (ms)")
    L.append("")
    L.append("| target | TTFB p50 | TTFB p99 | added TTFB p50 | whole stream p50 |")
    L.append("|---|---|---|---|---|")
    for t in targets:
        m = med(sse, t.name)
        if m is None:
            L.append(f"| {t.label} | {na(sse, t.name)} | | | |")
            continue
        added = "" if t.name == "direct" else fmt(diff(sse, t.name, "direct", "ttfb_p50_ms"), 3)
        L.append(
            f"| {t.label} | {cell(sse, t.name, 'ttfb_p50_ms', 3)} | {fmt(m['ttfb_p99_ms'], 3)} | {added} "
            f"| {fmt(m['p50_ms'], 3)} |"
        )
    L.append("")

    # --- failover
    L.append("## Failover cost, c=1 (ms)")
    L.append("")
    L.append(
        "gpt-x through the gateway: fast-a answers 404 `model_not_found`, fast-b serves. Compared with one "
        "direct gpt-5 call (direct row of the c=1 table)."
    )
    L.append("")
    L.append("| target | p50 | p99 | minus direct single call p50 | responses by status:x-gateway-attempts |")
    L.append("|---|---|---|---|---|")
    md = med(c1, "direct")
    for g in gws:
        m = med(fo, g.name)
        if m is None:
            L.append(f"| {g.label} | {na(fo, g.name)} | | | |")
            continue
        minus = fmt(m["p50_ms"] - md["p50_ms"], 3) if md else "n/a (no direct baseline)"
        tallies = ", ".join(f"`{k}` x{v}" for k, v in sorted(m["tallies"].items())) or "none"
        L.append(
            f"| {g.label} | {cell(fo, g.name, 'p50_ms', 3)} | {fmt(m['p99_ms'], 3)} | {minus} | {tallies} |"
        )
    L.append("")

    # --- slow upstream
    L.append(f"## Upstream with {SLOW_DELAY_MS} ms delay, c=50, non-streaming")
    L.append("")
    L.append("| target | req/s | % of direct | p50 ms | p99 ms |")
    L.append("|---|---|---|---|---|")
    for t in targets:
        m = med(slow, t.name)
        if m is None:
            L.append(f"| {t.label} | {na(slow, t.name)} | | | |")
            continue
        r = ratio(slow, t.name, "direct")
        L.append(
            f"| {t.label} | {cell(slow, t.name, 'rps', 0)} | {fmt(None if r is None else r * 100, 1, ' %')} "
            f"| {fmt(m['p50_ms'], 2)} | {fmt(m['p99_ms'], 2)} |"
        )
    L.append("")

    L.extend(ws_report(websocket, gws))

    # --- side by side
    L.append("## Gateway servers side by side (daphne vs uvicorn)")
    L.append("")
    L.append("| metric | " + " | ".join(g.label for g in gws) + " |")
    L.append("|---|" + "---|" * len(gws))
    side = [
        ("added p50 c=1 (ms)", lambda g: fmt(diff(c1, g, "direct", "p50_ms"), 3)),
        ("added p99 c=1 (ms)", lambda g: fmt(diff(c1, g, "direct", "p99_ms"), 3)),
        ("req/s c=1", lambda g: cell(c1, g, "rps", 0)),
        ("req/s c=16", lambda g: cell(c16, g, "rps", 0)),
        ("req/s c=64", lambda g: cell(c64, g, "rps", 0)),
        ("added SSE TTFB p50 (ms)", lambda g: fmt(diff(sse, g, "direct", "ttfb_p50_ms"), 3)),
        ("failover p50 (ms)", lambda g: cell(fo, g, "p50_ms", 3)),
        (f"req/s c=50, +{SLOW_DELAY_MS} ms upstream", lambda g: cell(slow, g, "rps", 0)),
        (
            "memory per idle websocket (KiB, larger client kind)",
            lambda g: fmt(ws_memory_figure(websocket, g)[0], 1),
        ),
        (
            "websocket added per event p50 / p99 (us)",
            lambda g: " / ".join(fmt(ws_added(websocket, "paced", g, k), 1) for k in ("p50_us", "p99_us")),
        ),
    ]
    for label, fn in side:
        L.append(f"| {label} | " + " | ".join(fn(g.name) for g in gws) + " |")
    L.append("")

    # --- method
    L.append("## Method")
    L.append("")
    method = METHOD.format(
        delay=SLOW_DELAY_MS,
        key=GATEWAY_KEY,
        loadgen=ctx["loadgen"],
        idle=websocket.get("idle_connections", ws.IDLE_CONNECTIONS),
        deltas=websocket.get("deltas", ws.DELTAS),
    )
    L.extend(method.strip().splitlines())
    L.append("")

    # --- raw
    L.append("## Every repetition")
    L.append("")
    L.append("| scenario | target | req/s | p50 ms | p99 ms | TTFB p50 ms | errors |")
    L.append("|---|---|---|---|---|---|---|")
    for sc in scenarios:
        for t in targets:
            res = sc.results.get(t.name)
            if not res:
                continue
            for r in res.get("reps", []):
                L.append(
                    f"| {sc.title} | {t.label} | {fmt(r['rps'], 0)} | {fmt(r['p50_ms'], 3)} "
                    f"| {fmt(r['p99_ms'], 3)} | {fmt(r.get('ttfb_p50_ms'), 3)} | {r['errors']} |"
                )
    L.append("")
    if notes:
        block = ["Why some numbers are missing:", ""]
        block += [f"{n}. {text}" for text, n in notes.items()]
        L[notes_at:notes_at] = [*block, ""]
    return "\n".join(L)


def failover_share(m: dict[str, Any]) -> float | None:
    """Share of 200 responses that say they made 2 attempts; None when the header never appeared."""
    tallies = m.get("tallies", {})
    ok = {k: v for k, v in tallies.items() if k.startswith("200:")}
    if not ok or all(k == "200:absent" for k in ok):
        return None
    return ok.get("200:2", 0) / sum(ok.values())


METHOD = """
- **Upstreams**: `devkit/fast_upstream.py` (asyncio + httptools on uvloop), two processes: `fast-a` serves
  gpt-5 and rejects gpt-x with 404 `{{"error": {{"code": "model_not_found", "param": "model", ...}}}}`,
  `fast-b` serves both. Fixed ~0.3 KB chat completion; a stream is 7 events written one by one.
- **Direct**: the same requests sent straight to `fast-a`. Every "added" number is target minus direct,
  medians of the same repetitions.
- **Gateway**: `daphne gatewaysite.asgi:application` (as `make run` serves it) and
  `uvicorn gatewaysite.asgi:application --loop uvloop --http httptools`, both with `DJANGO_DEBUG=false`,
  a generated `DJANGO_SECRET_KEY`, a fresh SQLite `DATABASE_URL` in bench/out/, `manage.py migrate` and
  `manage.py load_gateway_config bench/gateway_config.yaml` (pool `bench`, assignments `fast-a` tier 0 and
  `fast-b` tier 1, key `{key}`). Default logging of each server (access log to bench/out/logs).
- **LiteLLM**: litellm 1.110.2 proxy from bench/requirements-litellm-proxy.txt in its own venv, started
  offline as the peers README says, with bench/litellm_config.yaml (the same two upstreams, simple-shuffle),
  one worker.
- **Non-streaming latency and throughput**: {loadgen}; closed loop, fixed concurrency 1, 16, 64 (and 50 for
  the slow-upstream case), fixed duration; latency percentiles from wrk's histogram (microsecond
  resolution); req/s counts only 2xx answers: at c=1 completed / duration, at c>1 c / mean latency x the
  2xx share (Little's law for a closed loop, so a slow target is not undercounted by the requests still
  in flight when the window closes). After every run the harness waits until the server's CPU use falls
  below 5 %, so abandoned requests do not spill into the next target's run. Every target and scenario
  is checked with one request first; a target that does not answer 200 is reported with the answer it
  gave instead of numbers.
- **SSE**: an asyncio/aiohttp client, c=1, sequential streams; time from sending the request to the
  first event that carries non-empty `content` (what the user sees first; the gateway may hold back a
  role-only chunk, so time-to-first-byte would not compare like with like). Exact percentiles over every
  request.
- **Failover**: wrk, c=1, model gpt-x through the gateway; every 2xx answer's `x-gateway-attempts` is
  tallied (the config sets `demotion_seconds: 0` and an unreachable circuit threshold so every request
  fails over). Cost = failover p50 minus the direct c=1 p50.
- **Server CPU per request**: user + system CPU time of the server process (/proc) during each measured
  run, divided by its 2xx answers. Contention from other processes barely moves it, so it is the
  steadiest number on a shared machine. (The peers README gives about 14 ms for LiteLLM.)
- **Upstream connections**: the fast upstreams count the connections they accept; the report shows new
  connections per 100 answered requests during each run (about 0 when a proxy keeps a connection pool;
  the one pre-flight request per target and scenario is outside the measured runs).
- **Slow upstream**: both upstreams switched at run time to a {delay} ms delay before answering; c=50;
  gateway req/s as a share of direct req/s.
- **Websocket** (bench/ws.py, run before the HTTP scenarios so that the idle connections cannot
  reuse memory HTTP load left free): `fast_upstream.py` also speaks the Responses websocket mode on
  `/v1/responses`, stamping every event with `time.monotonic_ns()` as it writes it. Memory: the gateway
  process's VmRSS (/proc) before and after opening {idle} client websockets per kind of client, each
  through one whole `response.create` and then idle; the upstreams count the websockets they hold (one
  per client connection) and /proc the gateway's descriptors (two per connection); all are closed at
  the end and both counts must come back. Latency: one kept-open client connection per target (the
  `websockets` client), {deltas} deltas per response, each delta's upstream-write-to-client-read time
  through the gateway minus the same directly against the upstream, targets interleaved in every
  repetition; p50 and p99 over every delta.
- **DB queries per successful request**: counted by the tests, not by this run.
"""


# --- main --------------------------------------------------------------------------------------


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


GIT_RUN: dict[str, Any] = {"cwd": ROOT, "capture_output": True, "text": True, "check": True}


def machine_context(args: argparse.Namespace) -> dict[str, Any]:
    cpu_model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    commit = "unknown"
    git = shutil.which("git")
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        if git:
            head = subprocess.run([git, "rev-parse", "--short", "HEAD"], **GIT_RUN).stdout.strip()  # noqa: S603
            dirty = subprocess.run([git, "status", "--porcelain"], **GIT_RUN).stdout.strip()  # noqa: S603
            commit = head + (" with uncommitted changes" if dirty else "")
    versions: dict[str, str] = {}
    from importlib import metadata

    for pkg in ("django", "daphne", "uvicorn"):
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
        "python": platform.python_version(),
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
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
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
        os.sched_setaffinity(0, set(avail[1:]))
        ctx["pinning"] = (
            f"system under test (gateway / LiteLLM) on CPU {avail[0]}; upstreams, load generator "
            f"and this driver on CPU {','.join(map(str, avail[1:]))}"
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
                Target("gw-daphne", "gateway (daphne)", "gateway", unavailable="skipped (--no-gateway)")
            )
        else:
            log("preparing the gateway (migrate, load_gateway_config, daphne + uvicorn) ...")
            targets.extend(start_gateways(procs, ports, sut_cpus))
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
    finally:
        procs.stop_all()

    ctx["elapsed_s"] = time.monotonic() - started
    ctx["load_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
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
