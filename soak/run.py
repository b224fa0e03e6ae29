"""`make soak`: a bounded, self-stopping soak of the gateway on loopback, then the invariants.

What runs (everything on 127.0.0.1, everything stopped at the end):
- four chaotic upstreams in one process (devkit/chaos_upstream.py): each request is served, rejected
  with model_not_found, rate limited (429), failed with 503, hung past the client's deadline, dropped,
  or (on streams) cut or failed before or after visible output, or (websockets) closed;
- the gateway as production runs it (devkit/gateway.py): `python -m gatewaysite.server`,
  DJANGO_DEBUG=false, a generated secret, a fresh SQLite file (or a fresh PostgreSQL database on the
  server of DATABASE_URL when it is PostgreSQL), `manage.py migrate` and `load_gateway_config` of a
  generated YAML: one pool with the four assignments, one key;
- the load: `--requests` client requests at `--concurrency`, mixed over plain HTTP and SSE (Chat
  Completions and Responses) and, when the gateway has a websocket route at /v1/responses, Responses
  websocket mode; plus a few malformed requests and unknown models. Every request carries
  `x-gateway-deadline-ms`, so hung upstreams end at the deadline.

Then the gateway gets SIGTERM and must exit on its own (its ledger writer flushes at exit), and the
harness reads the ledger from the database. It asserts:
- every request got exactly one well-formed answer or typed error within deadline + margin; no 500;
  error bodies in the SPEC §4 shape; no provider message relayed; a stream's visible text comes from
  one upstream only (no handoff after visible output) and ends with exactly one terminal event;
- every request has exactly one RequestRecord (matched by `x-gateway-request-id`; websocket frames
  by count), with the status the client saw; its attempts are consistent: ordinals 1..n, at most one
  `succeeded`, handoffs only from attempts whose dispatch was rejected or never sent, and
  `retry_count` == number of `retryable_failed` attempts;
- circuit rows obey the state machine: state closed/open/half_open, open rows have open_until,
  probes_in_flight <= half_open_probes unless the lease expired, and no probe slot held at exit;
- no socket, descriptor or thread leak: the gateway's sockets back to baseline once the clients and
  the upstreams are gone; RSS flat after warm-up (growth below `--max-rss-growth`);
- SIGTERM drains the ledger: the process exits 0 within the grace period and no record is missing.

Prints a summary table; `--json PATH` writes the full report; a run of 20,000+ requests writes its
figures to bench/soak.md (included in bench/results.md). Exit status 0 only if every check holds.

Usage: python soak/main.py [--requests 20000] [--concurrency 64] [--seed 1] [--json report.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import aiohttp

from devkit.databases import Database, LedgerStall
from devkit.gateway import GatewayProcess
from devkit.harness import PYTHON, spawn, stop
from devkit.procfs import inventory
from soak.checks import Check, client_checks, drain_checks, examples, ledger_checks, process_checks
from soak.load import (
    CIRCUIT,
    RETRY,
    ROOT,
    UPSTREAM_KEY_ENV,
    UPSTREAM_NAMES,
    Load,
    Outcome,
    Sample,
    log,
    monitor,
)
from soak.report import (
    BENCH_SOAK_MD,
    FULL_RUN_REQUESTS,
    MULTINODE_SECTION,
    bench_section,
    latency_table,
    read_json,
    summary_table,
)

# --- the run -----------------------------------------------------------------------------------


def websocket_route_present() -> bool:
    consumers, routes = ROOT / "proxy" / "consumers.py", ROOT / "proxy" / "ws_urls.py"
    return consumers.exists() and "v1/responses" in routes.read_text()


async def websocket_handshake_ok(url: str, key: str) -> bool:
    try:
        async with aiohttp.ClientSession() as session:
            auth = {"authorization": f"Bearer {key}"}
            ws = await asyncio.wait_for(session.ws_connect(url, headers=auth), 5)
            await ws.close()
            return True
    except (aiohttp.ClientError, TimeoutError):
        return False


def start_upstreams(
    workdir: Path, args: argparse.Namespace, phase: str, ports: dict[str, int] | None = None
) -> tuple[subprocess.Popen, dict[str, int]]:
    ready = workdir / f"upstreams-{phase}.json"
    ready.unlink(missing_ok=True)
    cmd = [
        PYTHON,
        "-m",
        "devkit.chaos_upstream",
        "--names",
        ",".join(UPSTREAM_NAMES),
        "--seed",
        str(args.seed if phase == "load" else args.seed + 1),
        "--hang-s",
        str(args.hang_s),
        "--ready-file",
        str(ready),
        "--stats-file",
        str(workdir / f"upstream_stats-{phase}.json"),
    ]
    if ports:
        cmd += ["--ports", ",".join(str(ports[n]) for n in UPSTREAM_NAMES)]
    log_path = workdir / f"upstreams-{phase}.log"
    proc = spawn(cmd, dict(os.environ), log_path)
    deadline = time.monotonic() + 30
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(f"chaos upstreams did not start: {log_path.read_text()[-800:]}")
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())["ports"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--deadline-ms", type=int, default=3000, help="x-gateway-deadline-ms on every request")
    p.add_argument("--margin-s", type=float, default=2.5, help="allowed past the deadline")
    p.add_argument("--hang-s", type=float, default=8.0, help="how long a hanging upstream hangs")
    p.add_argument("--warmup", type=float, default=0.2, help="share of requests before memory is baselined")
    p.add_argument("--max-rss-growth", type=float, default=0.2)
    p.add_argument("--time-limit", type=float, help="seconds of load at most (480; with --nodes > 1: 1200)")
    p.add_argument("--exit-timeout", type=float, default=60, help="seconds the gateway gets to exit")
    p.add_argument("--drain-after", type=float, default=1.0, help="seconds into the drain burst for SIGTERM")
    p.add_argument(
        "--drain-db-stall",
        type=float,
        default=8.0,
        help="PostgreSQL: at most this many seconds the ledger table stays locked from SIGTERM to the exit",
    )
    p.add_argument("--no-websocket", action="store_true", help="HTTP and SSE only")
    p.add_argument(
        "--no-bench-record",
        action="store_true",
        help=f"do not write {BENCH_SOAK_MD.name} (a run of {FULL_RUN_REQUESTS}+ requests writes it)",
    )
    p.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="gateway nodes (more than one: the multi-node soak with node and database faults)",
    )
    p.add_argument(
        "--database",
        choices=("default", "postgres"),
        default="default",
        help="postgres: a PostgreSQL server of the soak's own (multi-node mode); default: SQLite, or "
        "a fresh database on the server of DATABASE_URL",
    )
    p.add_argument("--workers", type=int, default=2, help="multi-node: uvicorn workers per node")
    p.add_argument("--db-stall-s", type=float, default=5.0, help="multi-node: how long PostgreSQL is stopped")
    p.add_argument(
        "--budget-share",
        type=float,
        default=0.1,
        help="multi-node: share of requests sent with a budgeted key",
    )
    p.add_argument("--workdir", type=Path, help="default: soak/out/<timestamp>")
    p.add_argument("--json", type=Path, help="write the full report here")
    return p.parse_args(argv)


def main(args: argparse.Namespace) -> int:
    """The single-node run; soak/main.py chooses between it and soak/multinode.py."""
    started = time.monotonic()
    workdir = args.workdir or ROOT / "soak" / "out" / time.strftime("%Y%m%d-%H%M%S")
    workdir.mkdir(parents=True, exist_ok=True)
    key = f"sk-gw-soak-{secrets.token_hex(16)}"
    database = Database.create(workdir)
    log(f"workdir {workdir}; database {database.vendor} {database.name}")
    upstreams, ports = start_upstreams(workdir, args, "load")
    gateway = GatewayProcess(
        database, workdir, env_extra={UPSTREAM_KEY_ENV: f"sk-soak-upstream-{secrets.token_hex(8)}"}
    )
    try:
        gateway.prepare(chaos_config(ports, key))
        gateway.start()
        args.gateway_port = gateway.port
        log(f"gateway pid {gateway.pid} on {gateway.url}; upstreams {ports}")
        websocket, ws_note = websocket_mode(args, gateway.url, key)
        log(ws_note)
        baseline = inventory(gateway.pid)

        # 1. The load, with the gateway process watched.
        load = Load(args, gateway.url, key, websocket)
        samples: list[Sample] = []

        async def drive() -> list[Outcome]:
            stop_event = asyncio.Event()
            watcher = asyncio.create_task(monitor(gateway.pid, load, samples, stop_event))
            try:
                return await load.run()
            finally:
                stop_event.set()
                await watcher

        log(f"load: {args.requests} requests at concurrency {args.concurrency} ...")
        outcomes = asyncio.run(drive())
        load_seconds = time.monotonic() - load.started
        log(f"load done in {load_seconds:.1f} s")

        # 2. Leaks: the clients are gone (their session closed); then the upstreams too.
        time.sleep(1.0)
        drained = inventory(gateway.pid)
        stop(upstreams)
        time.sleep(1.5)
        after = inventory(gateway.pid)

        # 3. SIGTERM in the middle of a burst: in-flight requests finish, the process exits on its
        #    own, and its last ledger records (submitted during the graceful shutdown) are saved.
        upstreams, _ = start_upstreams(workdir, args, "drain", ports)
        log("drain: a burst of requests, SIGTERM to the gateway 1 s into it ...")
        drain_outcomes, exit_code, exit_seconds = asyncio.run(drain(args, gateway, database, key))
        log(f"gateway exited with {exit_code} {exit_seconds:.1f} s after SIGTERM")
        stop(upstreams)

        everything = outcomes + drain_outcomes
        checks = client_checks(outcomes, len(load.plan))
        checks += drain_checks(drain_outcomes, exit_code, exit_seconds, args)
        p_checks, p_summary = process_checks(baseline, drained, after, samples, args, database.port)
        checks += p_checks
        l_checks, l_summary = ledger_checks(database, everything)
        checks += l_checks
        log_text = gateway.log_path.read_text(errors="replace")
        tracebacks = len(re.findall(r"^Traceback|Exception in ASGI application", log_text, re.M))
        checks.append(
            Check(
                "log",
                "no unhandled exception in the gateway log",
                not tracebacks,
                f"{tracebacks} tracebacks in {gateway.log_path}",
                examples(sorted(set(re.findall(r"^\w*(?:Error|Exception)\b.*$", log_text, re.M)))),
            )
        )
        report = {
            "run": {
                "requests_planned": len(load.plan),
                "requests_done": len(outcomes),
                "drain_requests": len(drain_outcomes),
                "by_transport": dict(Counter(o.transport for o in outcomes)),
                "concurrency": args.concurrency,
                "load_seconds": load_seconds,
                "database": database.vendor,
                "websocket": ws_note,
                "deadline_ms": args.deadline_ms,
                "seed": args.seed,
                "exit_code": exit_code,
                "exit_seconds": exit_seconds,
                "workdir": str(workdir),
            },
            "outcomes": dict(
                Counter(f"{o.status or '-'} {o.code} ({o.transport})" for o in outcomes).most_common()
            ),
            "latency_ms": latency_table(outcomes),
            "ledger": l_summary,
            "process": p_summary,
            "upstreams": {
                phase: read_json(workdir / f"upstream_stats-{phase}.json") for phase in ("load", "drain")
            },
            "checks": [asdict(c) for c in checks],
        }
        report["run"]["total_seconds"] = time.monotonic() - started
    except BaseException:
        gateway.kill()
        stop(upstreams)
        raise
    finally:
        with contextlib.suppress(Exception):
            database.drop()
    text = summary_table(report)
    print(text, flush=True)
    (workdir / "summary.txt").write_text(text + "\n")
    if args.requests >= FULL_RUN_REQUESTS and not args.no_bench_record:
        # The multi-node section (soak/multinode.py) stays as its last run wrote it.
        current = BENCH_SOAK_MD.read_text() if BENCH_SOAK_MD.exists() else ""
        rest = current[current.find(MULTINODE_SECTION) :] if MULTINODE_SECTION in current else ""
        BENCH_SOAK_MD.write_text(bench_section(report) + ("\n" + rest if rest else ""))
        log(f"figures for bench/results.md: {BENCH_SOAK_MD}")
    report_path = args.json or workdir / "report.json"
    report_path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    log(f"report: {report_path}; total {time.monotonic() - started:.0f} s")
    return 0 if all(c["ok"] for c in report["checks"]) else 1


def websocket_mode(args: argparse.Namespace, url: str, key: str) -> tuple[bool, str]:
    if args.no_websocket:
        return False, "websocket: off (--no-websocket)"
    if not websocket_route_present():
        return False, "websocket: not exercised (no proxy/consumers.py with a /v1/responses route)"
    if not asyncio.run(websocket_handshake_ok(url.replace("http://", "ws://") + "/v1/responses", key)):
        return False, "websocket: not exercised (the /v1/responses websocket handshake was refused)"
    return True, "websocket: exercised"


async def drain(
    args: argparse.Namespace, gateway: GatewayProcess, database: Database, key: str
) -> tuple[list[Outcome], int | None, float]:
    """Requests at full concurrency; SIGTERM `--drain-after` seconds in; no new request after it.

    On PostgreSQL, from just before the SIGTERM until the process exits (at most `--drain-db-stall`
    seconds), another connection locks the ledger table against INSERTs: the records of the requests
    that finish during the graceful shutdown are then still queued in the writer when the server
    stops, and only a flush at exit saves them. (On SQLite a lock would stall the request path's own
    writes too, so there the drain relies on timing alone.)"""
    burst = argparse.Namespace(**{**vars(args), "requests": args.concurrency * 50, "seed": args.seed + 1})
    load = Load(burst, gateway.url, key, websocket=False, phase="drain")
    sigterm_at = 0.0

    async def trigger() -> None:
        nonlocal sigterm_at
        await asyncio.sleep(args.drain_after)
        stall = LedgerStall(database)
        if args.drain_db_stall > 0 and database.vendor == "postgresql":
            await asyncio.to_thread(stall.acquire)
        load.closed = True
        sigterm_at = time.monotonic()
        assert gateway.proc is not None
        gateway.proc.send_signal(signal.SIGTERM)
        while gateway.proc.poll() is None and time.monotonic() < sigterm_at + args.drain_db_stall:
            await asyncio.sleep(0.05)
        await asyncio.to_thread(stall.release)

    task = asyncio.create_task(trigger())
    outcomes = await load.run()
    await task
    code = await asyncio.to_thread(gateway.wait, args.exit_timeout - (time.monotonic() - sigterm_at))
    return outcomes, code, time.monotonic() - sigterm_at


def chaos_config(ports: dict[str, int], key: str) -> dict:
    from devkit.gateway import gateway_config

    urls = {name: f"http://127.0.0.1:{port}/v1" for name, port in ports.items()}
    return gateway_config(urls, key=key, key_env=UPSTREAM_KEY_ENV, circuit=CIRCUIT, retry=RETRY)


if __name__ == "__main__":
    sys.exit("soak: the entry point is soak/main.py (make soak)")
