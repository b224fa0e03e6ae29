"""The multi-node soak (`make soak SOAK_ARGS="--nodes 3 --database postgres"`): several gateway nodes on
one PostgreSQL while nodes and the database fail, then the invariants an on-call engineer wants proven
before putting the nodes in front of paying traffic.

What runs (loopback only; everything started here is stopped here):
- a PostgreSQL server of the run's own (devkit/databases.py `PostgresCluster`: initdb into a temporary
  directory, a free port, trust on loopback, fsync off) and a fresh database on it;
- `--nodes` gateway nodes, each `python -m gatewaysite.server --workers 2` (uvicorn's supervisor and
  two workers, as `make run` serves), all on that database;
- the four chaotic upstreams of the single-node soak, which also log every request they receive by
  the client's id (`sid=` in the prompt), with its behaviour, arrival and end;
- the load: the single-node soak's mix (HTTP, SSE, websocket; a few bad requests), spread round-robin
  over the nodes that are in rotation, as a load balancer would; a share of it (`--budget-share`)
  sent with a second key whose budget runs out during the run;
- the faults, one after another as the load progresses: node 1 killed with SIGKILL (supervisor and
  workers) and started again; PostgreSQL restarted (`pg_ctl restart -m fast`); PostgreSQL stalled
  (SIGSTOP of the postmaster and its backends for `--db-stall-s`, then SIGCONT); node 2 drained (taken
  out of rotation, SIGTERM, waited for, started again). A node is taken out of rotation before its
  fault, so only requests already in flight on it meet the fault.

Afterwards: the upstreams stop (a request to any of them is refused from then on), one node is asked
until every circuit is open, and every node is asked once more; the nodes get SIGTERM; the ledger
is read. Every check prints its figure (see soak/README.md for the list).

Half-open probes across nodes (`half_open_probes`), from the upstreams' own log:
The harness polls the circuit rows every 100 ms (its own connection). Each open period it sees
gives its `open_until`: from that instant the circuit is half-open and admits at most
`half_open_probes` requests of that (assignment, route class) at once, on all nodes together. The
window ends when a poll sees the circuit closed or opened again (with a later `open_until`), or, if
sooner, when the first answer in the window that the gateway took as a success ends (its attempt
`succeeded` in the ledger; without a plan, what the upstream served): any success closes the
circuit a moment later, a last resort's too, and cutting the window there keeps the polling lag
from counting ordinary traffic after the close as probes. A success that ended before the window
but after the last poll before it was sent (a poll's snapshot lies between sending its query and
its stamp, which the harness's load can hold far apart) closes the circuit inside the window too
(no poll could show it): the window ends with it. Within each window, the upstream's
arrivals of that route class are taken in order of arrival; an arrival while `half_open_probes`
earlier window arrivals are still in flight at the upstream (arrived, not yet answered or
disconnected) is a violation: while a probe is in flight no verdict on it exists, so its slot
cannot legitimately have been freed. A probe that ends neutrally
(the client's deadline) is seen by the upstream as the gateway closing the connection, which ends it
in the log too. An arrival that is a last resort (SPEC §5.4: an open or half-open assignment stays
at the end of a plan, reached without the lease once everything before it was tried) holds no probe
slot and is not counted. Whether it was one is judged from the request's plan in the ledger
(`read_plans`, by the client's id): the gateway orders its candidates by the health it read at the
request's start and passes some over without an upstream arrival (budget, deadline, capability, a
circuit read again), so the arrival is a last resort iff every assignment whose circuit was closed
at the last poll read before the request's `started_at`, and still at the first poll sent after it
(the request reads its view after starting), is among its attempts before this one (dispatched or
passed over). Closed at both polls is not closed throughout: an assignment that failed after the
first was sent (the failure that may have opened its circuit) and then served a success the gateway
took before the second was read (which closed it again) may have been read open, unseen by either.
A request the ledger lacks (its node was killed; websocket frames, whose ids the client does not
see) is judged from the polls alone: every assignment closed at the last poll before the arrival
was reached earlier by the same request. The plans read are written to
`ledger_plans.jsonl` beside `circuit_polls.jsonl` and the upstreams' log, to judge a run again.
The figure: windows examined, arrivals in them and how each was judged, the largest concurrency seen.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from devkit.databases import Database, PostgresCluster
from devkit.gateway import GatewayNode
from devkit.harness import PYTHON, spawn, stop
from devkit.procfs import tree_inventory
from soak.checks import Check, client_checks, ledger_checks
from soak.circuits import (
    GONE_MODEL,
    CircuitPoller,
    budget_checks,
    circuits_agree,
    half_open_check,
    probes_check,
    read_arrivals,
    read_plans,
    records_checks,
    replay_check,
    split_deadline,
)
from soak.faults import (
    MULTINODE_CHECK_IDS,
    PRICE,
    Cluster,
    ClusterLoad,
    FaultInjector,
    classify_db_faults,
    classify_killed,
    drain_check,
    exit_of,
    faults_check,
    killed_check,
)
from soak.load import ROOT, UPSTREAM_KEY_ENV, UPSTREAM_NAMES, Outcome, log
from soak.nodes import bench_section, log_check, monitor, node_checks, summary, write_bench_section
from soak.report import (
    BENCH_SOAK_MD,
    FULL_RUN_REQUESTS,
    latency_table,
    read_json,
)
from soak.run import chaos_config, websocket_mode

# --- the run -------------------------------------------------------------------------------------


def main(args: argparse.Namespace) -> int:
    started = time.monotonic()
    workdir = args.workdir or ROOT / "soak" / "out" / time.strftime("multinode-%Y%m%d-%H%M%S")
    workdir.mkdir(parents=True, exist_ok=True)
    keys = {"main": f"sk-gw-soak-{secrets.token_hex(16)}", "budget": f"sk-gw-soak-b-{secrets.token_hex(16)}"}
    pg = PostgresCluster(workdir / "postgres.log")
    upstreams: subprocess.Popen | None = None
    cluster: Cluster | None = None
    poller: CircuitPoller | None = None
    database: Database | None = None
    try:
        pg.start()
        database = Database.create(workdir, server_url=pg.url)
        log(f"workdir {workdir}; PostgreSQL of its own on port {pg.port}, database {database.name}")
        upstreams, ports = start_upstreams(workdir, args)
        env = {UPSTREAM_KEY_ENV: f"sk-soak-upstream-{secrets.token_hex(8)}"}
        nodes = [
            GatewayNode(database, workdir, env_extra=dict(env), index=i, workers=args.workers)
            for i in range(args.nodes)
        ]
        budget_micros = max(300, int(args.requests * args.budget_share * 6))
        nodes[0].prepare(cluster_config(ports, keys, budget_micros))
        for node in nodes:
            node.start()
        cluster = Cluster(nodes)
        log("nodes " + ", ".join(f"{n.index}: pid {n.pid} {n.url}" for n in nodes) + f"; upstreams {ports}")
        websocket, ws_note = websocket_mode(args, nodes[0].url, keys["main"])
        log(ws_note)
        poller = CircuitPoller(database)
        poller.start()
        baselines = {n.index: (n.incarnation, tree_inventory(n.pid)) for n in nodes}

        samples: list[dict] = []
        load = None
        injector: FaultInjector | None = None

        async def drive() -> list[Outcome]:
            nonlocal load, injector
            for n in nodes:
                cluster.bring_up(n.index, args.concurrency)
            load = ClusterLoad(args, cluster, keys, websocket)
            injector = FaultInjector(args, cluster, pg, load, baselines)
            stop_event = asyncio.Event()
            watcher = asyncio.create_task(monitor(cluster, load, samples, stop_event))
            injecting = asyncio.create_task(injector.run())
            try:
                outcomes = await load.run()
            finally:
                stop_event.set()
                await watcher
                await injecting  # skips what the load did not reach; waits for nodes starting again
                await cluster.close()
            return outcomes

        log(f"load: {args.requests} requests at concurrency {args.concurrency} over {args.nodes} nodes ...")
        outcomes = asyncio.run(drive())
        assert load is not None and injector is not None
        faults = injector.faults
        load_seconds = time.monotonic() - load.started
        log(f"load done in {load_seconds:.1f} s; faults: {', '.join(f.name for f in faults)}")
        poller.stop()

        agreement = asyncio.run(circuits_agree(nodes, keys["main"], args))
        time.sleep(1.0)
        stop(upstreams)  # the upstreams write their arrival log
        upstreams = None
        time.sleep(1.0)
        after = {n.index: tree_inventory(n.pid) for n in nodes}

        exits = []
        for n in nodes:
            code, seconds = n.terminate(args.exit_timeout)
            exits.append((f"node {n.index} at the end", code, seconds))
        exits += [(f"node {f.node} drained", *exit_of(f)) for f in faults if f.name == "drain"]

        classify_killed(outcomes, faults)
        classify_db_faults(outcomes, faults)
        with open(workdir / "outcomes.jsonl", "w") as out:
            for o in outcomes:
                out.write(json.dumps(asdict(o)) + "\n")
        arrivals = read_arrivals(workdir / "upstream_arrivals.jsonl")
        checks = [faults_check(faults, args)]
        checks += split_deadline(client_checks(outcomes, len(load.plan)), outcomes)
        checks.append(killed_check(outcomes, faults))
        checks.append(drain_check(outcomes, faults))
        checks.append(
            Check(
                "exit",
                "every node given SIGTERM exits on its own within the grace period",
                all(code in (0, -signal.SIGTERM) for _, code, _ in exits),
                "; ".join(f"{what}: exit {code} in {seconds:.1f} s" for what, code, seconds in exits),
            )
        )
        l_checks, l_summary = ledger_checks(database, outcomes)
        checks += [c for c in l_checks if c.id not in ("records", "probes")]
        checks += [*records_checks(outcomes, faults, database), probes_check(database)]
        checks.append(replay_check(arrivals))
        with open(workdir / "circuit_polls.jsonl", "w") as out:
            for (t, rows), sent in zip(poller.observations, poller.sent, strict=True):
                out.write(json.dumps([t, rows, sent], default=str) + "\n")
        plans = read_plans(database, outcomes)
        with open(workdir / "ledger_plans.jsonl", "w") as out:
            for sid, plan in plans.items():
                out.write(json.dumps([sid, plan.started, plan.attempts]) + "\n")
        checks.append(half_open_check(arrivals, poller, database, plans))
        checks += budget_checks(database, load.max_reservation, outcomes, faults)
        checks.append(agreement)
        checks += node_checks(nodes, baselines, after, samples, args, database.port)
        checks.append(log_check(nodes))
        order = {cid: i for i, cid in enumerate(MULTINODE_CHECK_IDS)}
        checks.sort(key=lambda c: order.get(c.id, len(order)))

        report = {
            "run": {
                "mode": "multi-node",
                "nodes": args.nodes,
                "workers_per_node": args.workers,
                "requests_planned": len(load.plan),
                "requests_done": len(outcomes),
                "by_transport": dict(Counter(o.transport for o in outcomes)),
                "by_node": dict(Counter(str(o.node) for o in outcomes)),
                "concurrency": args.concurrency,
                "load_seconds": load_seconds,
                "database": "postgresql (its own server, restarted and stalled during the run)",
                "websocket": ws_note,
                "deadline_ms": args.deadline_ms,
                "seed": args.seed,
                "workdir": str(workdir),
            },
            "faults": [asdict(f) for f in faults],
            "outcomes": dict(
                Counter(
                    f"{o.status or '-'} {o.code or '?'} ({o.transport}){' [killed node]' if o.killed else ''}"
                    for o in outcomes
                ).most_common()
            ),
            "latency_ms": latency_table(outcomes),
            "ledger": l_summary,
            "upstreams": read_json(workdir / "upstream_stats.json"),
            "checks": [asdict(c) for c in checks],
        }
        report["run"]["total_seconds"] = time.monotonic() - started
    finally:
        if poller is not None:
            poller.stop()
        if cluster is not None:
            for n in cluster.nodes:
                n.kill()
        if upstreams is not None:
            stop(upstreams)
        if database is not None:
            with contextlib.suppress(Exception):
                database.drop()
        pg.stop()
    text = summary(report)
    print(text, flush=True)
    (workdir / "summary.txt").write_text(text + "\n")
    if args.requests >= FULL_RUN_REQUESTS and not args.no_bench_record:
        write_bench_section(bench_section(report))
        log(f"figures for bench/results.md: {BENCH_SOAK_MD}")
    report_path = args.json or workdir / "report.json"
    report_path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    log(f"report: {report_path}; total {time.monotonic() - started:.0f} s")
    return 0 if all(c["ok"] for c in report["checks"]) else 1


def cluster_config(ports: dict[str, int], keys: dict[str, str], budget_micros: int) -> dict:
    config = chaos_config(ports, keys["main"])
    for assignment in config["pools"][0]["assignments"]:
        assignment["models"].append({"id": GONE_MODEL})
        for model in assignment["models"]:
            model["price"] = dict(PRICE)
    config["keys"].append(
        {
            "name": "soak-budget",
            "key": keys["budget"],
            "pools": ["soak"],
            "allowed_models": ["*"],
            "budget_micros": budget_micros,
        }
    )
    return config


def start_upstreams(workdir: Path, args: argparse.Namespace) -> tuple[subprocess.Popen, dict[str, int]]:
    ready = workdir / "upstreams.json"
    ready.unlink(missing_ok=True)
    cmd = [
        PYTHON,
        "-m",
        "devkit.chaos_upstream",
        "--names",
        ",".join(UPSTREAM_NAMES),
        "--seed",
        str(args.seed),
        "--hang-s",
        str(args.hang_s),
        "--ready-file",
        str(ready),
        "--stats-file",
        str(workdir / "upstream_stats.json"),
        "--arrivals-file",
        str(workdir / "upstream_arrivals.jsonl"),
    ]
    log_path = workdir / "upstreams.log"
    proc = spawn(cmd, dict(os.environ), log_path)
    deadline = time.monotonic() + 30
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(f"chaos upstreams did not start: {log_path.read_text()[-800:]}")
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())["ports"]
