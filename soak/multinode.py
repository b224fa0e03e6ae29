"""The multi-node soak (`make soak SOAK_ARGS="--nodes 3 --database postgres"`): several gateway nodes on
one PostgreSQL while nodes and the database fail, then the invariants an on-call engineer wants proven
before putting the nodes in front of paying traffic.

What runs (loopback only; everything started here is stopped here):
- a PostgreSQL server of the run's own (devkit/gateway.py `PostgresCluster`: initdb into a temporary
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
sooner, when the first probe that the upstream served ends (its success closes the circuit a moment
later; cutting the window there keeps the polling lag from counting ordinary traffic after the close
as probes). Within each window, the upstream's arrivals of that route class are taken in order of
arrival; an arrival while `half_open_probes` earlier window arrivals are still in flight at the
upstream (arrived, not yet answered or disconnected) is a violation: while a probe is in flight no
verdict on it exists, so its slot cannot legitimately have been freed. A probe that ends neutrally
(the client's deadline) is seen by the upstream as the gateway closing the connection, which ends it
in the log too. The figure: windows examined, arrivals in them, the largest concurrency seen.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import math
import os
import random
import re
import secrets
import signal
import subprocess
import threading
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from devkit.databases import Database, PostgresCluster, libpq_url
from devkit.gateway import GatewayNode
from devkit.harness import PYTHON, spawn, stop
from devkit.procfs import Inventory, tree_inventory
from soak.run import (
    BENCH_SOAK_MD,
    FULL_RUN_REQUESTS,
    MULTINODE_SECTION,
    ROOT,
    UPSTREAM_KEY_ENV,
    UPSTREAM_NAMES,
    Check,
    Load,
    Outcome,
    _examples,
    _read_json,
    chaos_config,
    client_checks,
    latency_table,
    ledger_checks,
    log,
    websocket_mode,
)

# Prices so that every attempt has a cost (micros per million tokens: 1 and 2 micros per token).
PRICE = {"input_per_mtok_micros": 1_000_000, "output_per_mtok_micros": 2_000_000}
MAX_TOKENS = 16  # every request asks for at most this many output tokens (part of its reservation)
# Problems a client may see on a request that was in flight when its node was killed: the
# connection closed under it. Anything else (a wrong status, a malformed error, a provider message,
# mixed upstream text) is a wrong answer, even there.
CLOSED_CONNECTION = (
    "transport error",
    "response body ended abnormally",
    "terminal events",
    "websocket dropped without a close frame",
    "websocket handshake failed",
)
# Behaviours after which the gateway knows the upstream rejected the request (an error status, or
# an error event before any output): only after these may another upstream receive it.
REJECTED = {"model_not_found", "rate_limited", "unavailable", "fail_before_visible", None}
SERVED = {"serve", "slow"}

MULTINODE_CHECK_IDS = (
    "faults",
    "all_ran",
    "deadline",
    "deadline_db",
    "no_500",
    "well_formed",
    "sanitized",
    "one_upstream",
    "killed_node",
    "drain_answers",
    "exit",
    "records",
    "records_sigkill",
    "ledger_matches_client",
    "attempts",
    "no_replay",
    "half_open_probes",
    "budget",
    "budget_reservations",
    "circuits",
    "probes",
    "circuits_agree",
    "memory",
    "descriptors",
    "log",
)


@dataclass
class Fault:
    name: str
    node: int | None
    at: float  # monotonic
    wall: float
    progress: float
    seconds: float = 0.0
    detail: str = ""
    incarnation: int = 0  # which start of the node the fault hit


class Cluster:
    """The nodes, which of them are in rotation, and one client session per node start."""

    def __init__(self, nodes: list[GatewayNode]) -> None:
        self.nodes = nodes
        self.up: list[int] = []
        self.sessions: dict[int, aiohttp.ClientSession] = {}
        self.old_sessions: list[aiohttp.ClientSession] = []
        self._next = 0

    def bring_up(self, i: int, concurrency: int) -> None:
        """In rotation, with a fresh client session (a load balancer does not reuse connections
        to a node that went away)."""
        if i in self.sessions:
            self.old_sessions.append(self.sessions[i])
        connector = aiohttp.TCPConnector(limit=concurrency)
        self.sessions[i] = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        if i not in self.up:
            self.up.append(i)
            self.up.sort()

    def take_out(self, i: int) -> None:
        if i in self.up:
            self.up.remove(i)

    def pick(self) -> int:
        self._next += 1
        return self.up[self._next % len(self.up)]

    async def close(self) -> None:
        for s in [*self.old_sessions, *self.sessions.values()]:
            await s.close()


class ClusterLoad(Load):
    def __init__(
        self, args: argparse.Namespace, cluster: Cluster, keys: dict[str, str], websocket: bool
    ) -> None:
        super().__init__(args, cluster.nodes[0].url, keys["main"], websocket)
        self.cluster = cluster
        self.key_headers = {
            name: {**self.headers, "authorization": f"Bearer {key}"} for name, key in keys.items()
        }
        rng = random.Random(args.seed + 7)  # noqa: S311 - a reproducible mix, not secrets
        self.key_plan = [
            "budget" if rng.random() < args.budget_share else "main" for _ in range(len(self.plan))
        ]
        self.max_reservation = 0  # the largest reservation any budget request can make (micros)

    def pick(self, session: aiohttp.ClientSession) -> tuple[aiohttp.ClientSession, str, int, int]:
        i = self.cluster.pick()
        node = self.cluster.nodes[i]
        return self.cluster.sessions[i], node.url, i, node.incarnation

    def key_for(self, index: int) -> tuple[str, dict[str, str]]:
        name = self.key_plan[index] if index < len(self.key_plan) else "main"
        return name, self.key_headers[name]

    def body(self, kind: str, stream: bool, sid: str = "") -> dict:  # type: ignore[override]
        body = Load.body(kind, stream, sid)
        if "messages" in body:
            body["max_tokens"] = MAX_TOKENS
        else:
            body["max_output_tokens"] = MAX_TOKENS
        # SPEC §7.4: estimated prompt tokens (a quarter of the body's bytes) + max output tokens.
        size = len(json.dumps({"type": "response.create", **body}).encode())
        self.max_reservation = max(self.max_reservation, size // 4 * 1 + MAX_TOKENS * 2)
        return body

    def progress(self) -> float:
        return len(self.outcomes) / max(len(self.plan), 1)


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
        exits += [(f"node {f.node} drained", *_exit_of(f)) for f in faults if f.name == "drain"]

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
        checks.append(half_open_check(arrivals, poller, database))
        with open(workdir / "circuit_polls.jsonl", "w") as out:
            for t, rows in poller.observations:
                out.write(json.dumps([t, rows], default=str) + "\n")
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
            "upstreams": _read_json(workdir / "upstream_stats.json"),
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


# --- the faults ----------------------------------------------------------------------------------


class FaultInjector:
    """The faults, one after another, each once the load has reached its share of the requests
    (`PLAN`); a node taken down is started again in the background while the next faults go on."""

    PLAN = (("sigkill", 0.2), ("db_restart", 0.35), ("db_stall", 0.5), ("drain", 0.65))

    def __init__(
        self,
        args: argparse.Namespace,
        cluster: Cluster,
        pg: PostgresCluster,
        load: ClusterLoad,
        baselines: dict[int, tuple[int, Inventory]],
    ) -> None:
        self.args, self.cluster, self.pg, self.load, self.baselines = args, cluster, pg, load, baselines
        self.faults: list[Fault] = []
        self.kill_node, self.drain_node = 1 % len(cluster.nodes), 2 % len(cluster.nodes)
        self._restarts: list[asyncio.Task] = []

    async def run(self) -> None:
        try:
            for name, progress in self.PLAN:
                if not await self._at(progress):
                    return  # the load ended first: the fault is skipped (the `faults` check says so)
                await getattr(self, name)()
        finally:
            for task in self._restarts:  # a node starting again is waited for, even after the load
                await task

    async def _at(self, progress: float) -> bool:
        while self.load.progress() < progress:
            if self.load.next >= len(self.load.plan) and self.load.progress() >= 1:
                return False
            await asyncio.sleep(0.05)
        return True

    def _note(self, name: str, node: int | None, **fields: Any) -> Fault:
        fault = Fault(name, node, time.monotonic(), time.time(), self.load.progress(), **fields)
        self.faults.append(fault)
        log(f"fault: {name}{'' if node is None else f' node {node}'} at {fault.progress:.0%} {fault.detail}")
        return fault

    async def _restart(self, i: int) -> None:
        """Started again (launched from the event loop's thread, which outlives the node: a child's
        parent-death signal follows the thread that started it) and back in rotation once ready."""
        node = self.cluster.nodes[i]
        t0 = time.monotonic()
        node.launch()
        await asyncio.to_thread(node.wait_ready)
        self.baselines[i] = (node.incarnation, await asyncio.to_thread(tree_inventory, node.pid))
        self.cluster.bring_up(i, self.args.concurrency)
        self._note("restarted", i, seconds=time.monotonic() - t0, detail=f"pid {node.pid}")

    async def sigkill(self) -> None:
        node = self.cluster.nodes[self.kill_node]
        self.cluster.take_out(node.index)
        fault = self._note("sigkill", node.index, incarnation=node.incarnation)
        await asyncio.to_thread(node.sigkill)
        fault.seconds = time.monotonic() - fault.at
        await asyncio.sleep(1.0)
        self._restarts.append(asyncio.create_task(self._restart(node.index)))

    async def db_restart(self) -> None:
        fault = self._note("db_restart", None, detail="pg_ctl restart -m fast")
        fault.seconds = await asyncio.to_thread(self.pg.restart)

    async def db_stall(self) -> None:
        fault = self._note("db_stall", None, detail=f"SIGSTOP for {self.args.db_stall_s:.0f} s")
        stopped = await asyncio.to_thread(self.pg.stall, self.args.db_stall_s)
        fault.seconds = time.monotonic() - fault.at
        fault.detail += f" ({len(stopped)} processes)"

    async def drain(self) -> None:
        node = self.cluster.nodes[self.drain_node]
        self.cluster.take_out(node.index)  # out of rotation first, as a load balancer would
        fault = self._note("drain", node.index, incarnation=node.incarnation)
        assert node.proc is not None
        node.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = await asyncio.to_thread(node.proc.wait, self.args.exit_timeout)
        except subprocess.TimeoutExpired:
            await asyncio.to_thread(node.kill)
            code = None
        fault.seconds = time.monotonic() - fault.at
        fault.detail = f"exit {code}"
        self._restarts.append(asyncio.create_task(self._restart(node.index)))


def _exit_of(fault: Fault) -> tuple[int | None, float]:
    match = re.search(r"exit (-?\d+|None)", fault.detail)
    code = None if match is None or match.group(1) == "None" else int(match.group(1))
    return code, fault.seconds


def faults_check(faults: list[Fault], args: argparse.Namespace) -> Check:
    names = Counter(f.name for f in faults)
    wanted = Counter(["sigkill", "restarted", "db_restart", "db_stall", "drain", "restarted"])
    return Check(
        "faults",
        "every fault was injected during the load",
        names == wanted and all(f.progress < 1 for f in faults if f.name != "restarted"),
        "; ".join(
            f"{f.name}{'' if f.node is None else f' node {f.node}'} at {f.progress:.0%} ({f.seconds:.1f} s)"
            for f in faults
        )
        or "none",
    )


def classify_killed(outcomes: list[Outcome], faults: list[Fault]) -> None:
    """A request in flight on a node when it was killed, whose client saw only its connection
    closing, is the one allowed exception: marked `killed`, its problems set aside."""
    for fault in faults:
        if fault.name != "sigkill":
            continue
        for o in outcomes:
            # The node left the rotation at `fault.at`: whatever ran on it was sent to it before (a
            # websocket frame's own start is later than its connection's).
            if o.node != fault.node or o.incarnation != fault.incarnation:
                continue
            if o.done_at < fault.at or not o.problems:
                continue
            if all(any(marker in p for marker in CLOSED_CONNECTION) for p in o.problems):
                o.killed = True
                o.problems = []


def during_db_fault(o: Outcome, faults: list[Fault]) -> Fault | None:
    """The database fault the request overlapped (restart or stall), if any."""
    for f in faults:
        if (
            f.name in ("db_restart", "db_stall")
            and o.started_at <= f.at + f.seconds + 1
            and o.done_at >= f.at
        ):
            return f
    return None


def classify_db_faults(outcomes: list[Outcome], faults: list[Fault]) -> None:
    """While the database is unreachable a request cannot be authenticated: a bad body or an
    unknown model then gets the typed 503 gateway_unavailable instead of its 400/404 (the key is
    checked first). That is the right answer there, not a malformed one."""
    for o in outcomes:
        if during_db_fault(o, faults) is None:
            continue
        o.problems = [
            p
            for p in o.problems
            if not (p.startswith(f"{o.kind}: expected") and "'gateway_unavailable')" in p)
        ]
        o.problems = [
            f"{p} (during the {fault.name})" if "within" in p and (fault := during_db_fault(o, faults)) else p
            for p in o.problems
        ]


def killed_check(outcomes: list[Outcome], faults: list[Fault]) -> Check:
    kills = [f for f in faults if f.name == "sigkill"]
    in_flight = [
        o
        for f in kills
        for o in outcomes
        if o.node == f.node and o.incarnation == f.incarnation and f.at <= o.done_at
    ]
    closed = sum(1 for o in in_flight if o.killed)
    wrong = [f"#{o.index} {o.kind} node {o.node}: {p}" for o in in_flight for p in o.problems]
    return Check(
        "killed_node",
        "requests in flight on the killed node see a closed connection or a right answer, never a wrong one",
        bool(kills) and not wrong,
        f"{len(in_flight)} in flight at the SIGKILL: {closed} saw the connection close, "
        f"{len(in_flight) - closed - len({w.split(':')[0] for w in wrong})} answered well-formed, "
        f"{len(wrong)} wrong answers",
        _examples(wrong),
    )


def drain_check(outcomes: list[Outcome], faults: list[Fault]) -> Check:
    drains = [f for f in faults if f.name == "drain"]
    in_flight = [
        o
        for f in drains
        for o in outcomes
        if o.node == f.node and o.incarnation == f.incarnation and o.started_at <= f.at <= o.done_at
    ]
    broken = [f"#{o.index} {o.kind} rid={o.request_id}: {p}" for o in in_flight for p in o.problems]
    return Check(
        "drain_answers",
        "requests in flight on the drained node finish with a well-formed answer",
        bool(drains) and not broken,
        f"{len(in_flight)} in flight at SIGTERM, {len(in_flight) - len(broken)} answered well-formed",
        _examples(broken),
    )


# --- the circuits, watched during the run --------------------------------------------------------


class CircuitPoller:
    """Reads the circuit rows every `interval` seconds on its own connection (reconnecting while the
    database restarts or stalls): each observation is (time.time(), rows)."""

    def __init__(self, database: Database, interval: float = 0.1) -> None:
        self.database = database
        self.interval = interval
        self.observations: list[tuple[float, list[tuple]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="circuit-poller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(15)

    def _run(self) -> None:
        import psycopg

        conn = None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = psycopg.connect(libpq_url(self.database.url), autocommit=True, connect_timeout=2)
                rows = conn.execute(
                    "SELECT assignment_id, route_class, state, open_until, probes_in_flight "
                    "FROM routing_circuit"
                ).fetchall()
                self.observations.append((time.time(), rows))
            except Exception:  # the database restarting or stalled: try again
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                conn = None
            self._stop.wait(self.interval)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def windows(self) -> list[tuple[int, str, float, float]]:
        """Half-open windows: (assignment id, route class, from open_until, to the first poll that
        saw the circuit closed or opened again; the last poll if never)."""
        found: dict[tuple[int, str, float], float] = {}
        current: dict[tuple[int, str], float] = {}
        last = self.observations[-1][0] if self.observations else 0.0
        for t, rows in self.observations:
            seen = set()
            for assignment, route_class, state, open_until, _ in rows:
                key = (assignment, route_class)
                seen.add(key)
                until = open_until.timestamp() if open_until is not None and state != "closed" else None
                previous = current.get(key)
                if previous is not None and until != previous:
                    # Closed or opened again; before its open_until (a last-resort success closes an
                    # open circuit) the window never opened: it ends before it starts.
                    found[(*key, previous)] = t
                if until is not None:
                    current[key] = until
                    found.setdefault((*key, until), math.inf)
                else:
                    current.pop(key, None)
            for key in [k for k in current if k not in seen]:
                found[(*key, current.pop(key))] = t
        return [
            (a, rc, start, min(end, last)) for (a, rc, start), end in found.items() if start < min(end, last)
        ]


def read_arrivals(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        return []


def replay_check(arrivals: list[dict]) -> Check:
    by_sid: dict[str, list[dict]] = defaultdict(list)
    for a in arrivals:
        if a.get("sid"):
            by_sid[a["sid"]].append(a)
    replays, unknown = [], 0
    for sid, seen in by_sid.items():
        seen.sort(key=lambda a: a["a"])
        for n, a in enumerate(seen):
            if a["k"] in REJECTED:
                continue
            unknown += a["k"] not in SERVED
            if n + 1 < len(seen):
                later = seen[n + 1]
                replays.append(
                    f"{sid}: {a['u']}/{a['t']} {a['k']}, then {later['u']}/{later['t']} {later['k']}"
                )
    handed = sum(1 for seen in by_sid.values() if len(seen) > 1)
    return Check(
        "no_replay",
        "no upstream received a request again after a dispatch that was not known to be rejected",
        bool(by_sid) and not replays,
        f"{len(arrivals)} upstream arrivals of {len(by_sid)} requests; {handed} requests reached more "
        f"than one upstream; {unknown} dispatches with an unknown outcome (hang, drop, cut, close); "
        f"{len(replays)} replays",
        _examples(replays),
    )


def half_open_check(arrivals: list[dict], poller: CircuitPoller, database: Database) -> Check:
    """See the module docstring. SPEC §5.4 keeps an open or half-open assignment at the end of a
    plan for availability: a request that does not hold the probe lease may still reach it, but
    only after every assignment whose circuit was closed. Such a last-resort arrival holds no probe
    slot; every other arrival in a half-open window is in a probe's position and counts."""
    names = {
        pk: name.removeprefix("acct-") for pk, name in database.query("SELECT id, name FROM pools_assignment")
    }
    rows = database.query("SELECT half_open_probes FROM pools_gatewaysettings WHERE id = 1")
    limit = rows[0][0] if rows else 1
    by_lane: dict[tuple[str, str], list[dict]] = defaultdict(list)
    by_sid: dict[str, list[dict]] = defaultdict(list)
    for a in arrivals:
        by_lane[(a["u"], a["t"])].append(a)
        if a.get("sid"):
            by_sid[a["sid"]].append(a)
    for lane in by_lane.values():
        lane.sort(key=lambda a: a["a"])
    times = [t for t, _ in poller.observations]

    def last_resort(a: dict) -> bool:
        """Every assignment whose circuit (this route class) was closed at the last poll before the
        arrival was tried earlier by the same request."""
        at = bisect.bisect_right(times, a["a"]) - 1
        if at < 0:
            return False
        not_closed = {
            names.get(assignment)
            for assignment, route_class, state, _, _ in poller.observations[at][1]
            if route_class == a["t"] and state != "closed"
        }
        tried = {b["u"] for b in by_sid.get(a.get("sid") or "", []) if b["a"] < a["a"]}
        return all(name in tried for name in set(names.values()) - not_closed - {a["u"]})

    windows = poller.windows()
    violations, examined, max_seen, resort = [], 0, 0, 0
    for assignment, route_class, start, end in windows:
        lane = by_lane.get((names.get(assignment, "?"), route_class), [])
        inside = [a for a in lane if start <= a["a"] < end]
        first_served = next((a for a in inside if a["k"] in SERVED), None)
        if first_served is not None:
            inside = [a for a in inside if a["a"] < first_served.get("e", math.inf)]
        probes = []
        for a in inside:
            if last_resort(a):
                resort += 1
                continue
            in_flight = sum(1 for b in probes if b.get("e", math.inf) > a["a"])
            probes.append(a)
            max_seen = max(max_seen, in_flight + 1)
            if in_flight >= limit:
                violations.append(
                    f"{names.get(assignment)}/{route_class} half-open from {start:.3f}: "
                    f"{a['sid']} arrived at "
                    f"{a['a']:.3f} ({a['k']}) with {in_flight} probe(s) in flight"
                )
        examined += 1 if probes else 0
    return Check(
        "half_open_probes",
        f"at most half_open_probes ({limit}) probes at once per half-open circuit across nodes",
        bool(poller.observations) and not violations,
        f"{len(windows)} half-open windows seen in {len(poller.observations)} circuit polls, "
        f"{examined} with probes; at most {max_seen} probe(s) at once; {resort} last-resort arrivals "
        f"(every closed assignment tried first); {len(violations)} violations",
        _examples(violations),
    )


def budget_checks(
    database: Database, max_reservation: int, outcomes: list[Outcome], faults: list[Fault]
) -> list[Check]:
    """SPEC §7.4: concurrent requests on any number of nodes never pass a budget by more than one
    request's reservation. Where the gateway reserves (a `reserved_micros` column), nothing should
    still be reserved once every node has stopped: a reservation no one settles shrinks the budget
    for good."""
    reserves = bool(
        database.query(
            "SELECT 1 FROM information_schema.columns "
            "WHERE table_name = 'pools_gatewaykey' AND column_name = 'reserved_micros'"
        )
    )
    reserved = "reserved_micros" if reserves else "0"
    rows = database.query(
        f"SELECT name, budget_micros, spent_micros, {reserved} FROM pools_gatewaykey "  # noqa: S608 - fixed text
        "WHERE budget_micros IS NOT NULL"
    )
    over = [
        f"{name}: spent {spent} of {budget} micros (+{spent - budget} > one reservation {max_reservation})"
        for name, budget, spent, _ in rows
        if spent > budget + max_reservation
    ]
    held = [f"{name}: {left} micros still reserved" for name, _, _, left in rows if left]
    killed = {(f.node, f.incarnation) for f in faults if f.name == "sigkill"}
    died = sum(1 for o in outcomes if o.key == "budget" and (o.node, o.incarnation) in killed)
    return [
        Check(
            "budget",
            "no budget overspent by more than one reservation",
            bool(rows) and not over,
            "; ".join(f"{name}: spent {spent} of {budget} micros" for name, budget, spent, _ in rows)
            + f"; one reservation is at most {max_reservation} micros"
            + ("" if reserves else "; the gateway keeps no reservations"),
            _examples(over),
        ),
        Check(
            "budget_reservations",
            "no budget reservation left once every node has stopped",
            reserves and not held,
            ("; ".join(held) or "nothing reserved")
            + f" ({died} requests with the budgeted key were served by the node that was killed)"
            if reserves
            else "the gateway keeps no reservations (no reserved_micros)",
            _examples(held),
        ),
    ]


def records_checks(outcomes: list[Outcome], faults: list[Fault], db: Database) -> list[Check]:
    """Exactly one RequestRecord per answered request (by `x-gateway-request-id`; websocket frames by
    count), in two parts: `records` for every request, except those a killed node had answered
    just before its SIGKILL, which `records_sigkill` counts on its own: a node's ledger writer holds
    records in memory for a moment (it batches), and a SIGKILL takes them with it."""
    # The circuits_agree requests (for GONE_MODEL) come after the load and are not the client's.
    rows = db.query(
        "SELECT request_id, transport FROM proxy_requestrecord WHERE requested_model <> %s", (GONE_MODEL,)
    )
    stored = {rid for rid, _ in rows}
    killed = {(f.node, f.incarnation): f for f in faults if f.name == "sigkill"}

    def before_kill(o: Outcome) -> Fault | None:
        """The SIGKILL of the node start that answered the request: it answered before dying (the
        client may read the answer a moment after the kill, from its socket's buffer)."""
        return killed.get((o.node, o.incarnation))

    http = [o for o in outcomes if o.transport != "websocket"]
    answered = [o for o in http if o.request_id and not o.killed]
    unknown = sum(1 for o in http if not o.request_id or o.killed)
    lost_to_kill = [o for o in answered if o.request_id not in stored and before_kill(o)]
    missing = [o for o in answered if o.request_id not in stored and not before_kill(o)]
    stored_http = sum(1 for _, t in rows if t in ("http", "sse"))
    frames = [
        o for o in outcomes if o.transport == "websocket" and o.code not in ("not_sent", "ws_connect_failed")
    ]
    uncertain = [o for o in frames if o.code.startswith("closed_") or o.killed or before_kill(o)]
    stored_ws = sum(1 for _, t in rows if t == "websocket")
    count_ok = len(answered) - len(lost_to_kill) <= stored_http <= len(answered) + unknown
    ws_ok = len(frames) - len(uncertain) <= stored_ws <= len(frames)
    ages = [f"{max(f.at - o.done_at, 0) * 1000:.0f} ms" for o in lost_to_kill if (f := before_kill(o))]
    return [
        Check(
            "records",
            "every answered request has exactly one RequestRecord (through restarts, stalls and drains)",
            not missing and count_ok and ws_ok,
            f"{len(missing)} missing by request id; HTTP/SSE: {stored_http} records for {len(answered)} "
            f"answered requests (+{unknown} unanswered or cut by the SIGKILL, {len(lost_to_kill)} lost to "
            f"the SIGKILL); websocket: {stored_ws} records for {len(frames)} frames ({len(uncertain)} "
            "closed, or on the killed "
            "node: may or may not be recorded)",
            _examples([f"#{o.index} {o.kind} {o.status} node {o.node} rid={o.request_id}" for o in missing]),
        ),
        Check(
            "records_sigkill",
            "requests answered by a node just before its SIGKILL keep their RequestRecord",
            bool(killed) and not lost_to_kill,
            f"{len(lost_to_kill)} answered requests without a record, answered "
            f"{', '.join(ages[:8]) or '-'} before the SIGKILL",
            _examples(
                [f"#{o.index} {o.kind} {o.status} node {o.node} rid={o.request_id}" for o in lost_to_kill]
            ),
        ),
    ]


def probes_check(database: Database) -> Check:
    """Across nodes a probe slot can outlive its request: the node holding it was killed, or its
    release was a write lost while the database was unreachable. The lease (`probe_lease_seconds`)
    frees such a slot on its own; what must never be is a slot held with no lease, or a lease longer
    than the setting (held for good)."""
    rows = database.query("SELECT probe_lease_seconds FROM pools_gatewaysettings WHERE id = 1")
    lease_s = rows[0][0] if rows else 60
    held = database.query(
        "SELECT assignment_id, route_class, probes_in_flight, "
        "EXTRACT(EPOCH FROM probe_lease_expires_at - now()) FROM routing_circuit WHERE probes_in_flight > 0"
    )
    forever = [
        f"circuit a{a}/{rc}: {n} probe(s) held, lease {'none' if left is None else f'{float(left):.0f} s'}"
        for a, rc, n, left in held
        if left is None or float(left) > lease_s
    ]
    return Check(
        "probes",
        "no probe slot held for good once no request is in flight (a lease frees what a dead holder kept)",
        not forever,
        f"{len(held)} circuits with a probe slot still held at exit, each freed by its lease within "
        f"{lease_s} s (holders killed with a node, or releases lost to a database fault)"
        if held and not forever
        else f"{len(held)} circuits with a held probe, {len(forever)} without a lease that frees it",
        _examples(forever),
    )


def split_deadline(checks: list[Check], outcomes: list[Outcome]) -> list[Check]:
    """The deadline check in two: requests that met no database fault, and those that did."""
    late = [f"#{o.index} {o.kind}: {p}" for o in outcomes for p in o.problems if "within" in p]
    during = [x for x in late if "(during the db_" in x]
    others = [x for x in late if x not in during]
    checks = [c for c in checks if c.id != "deadline"]
    checks += [
        Check(
            "deadline",
            "every request that met no database fault answered within deadline + margin",
            not others,
            f"{len(others)} late or unanswered",
            _examples(others),
        ),
        Check(
            "deadline_db",
            "requests that met a database restart or stall answered within deadline + margin",
            not during,
            f"{len(during)} late or unanswered while the database restarted or stalled",
            _examples(during),
        ),
    ]
    return checks


GONE_MODEL = "gpt-5-gone"  # configured on every assignment; every upstream answers model_not_found


async def circuits_agree(nodes: list[GatewayNode], key: str, args: argparse.Namespace) -> Check:
    """A model every upstream has withdrawn (404 model_not_found): requests for it, sent round-robin
    over the nodes, open its circuits (reason upstream_model_unavailable, which makes the assignment
    ineligible until its probe) until one node dispatches nothing; then every node is asked at once
    and must answer the same, dispatching nothing: circuits opened through any node are open for all
    (no process-local health state)."""
    headers = {"authorization": f"Bearer {key}", "x-gateway-deadline-ms": str(args.deadline_ms)}
    body = {"model": GONE_MODEL, "messages": [{"role": "user", "content": "soak: circuits"}]}

    async def ask(session: aiohttp.ClientSession, node: GatewayNode) -> tuple[int, str, str]:
        async with session.post(f"{node.url}/v1/chat/completions", json=body, headers=headers) as resp:
            data = await resp.json(content_type=None)
            code = (data.get("error") or {}).get("code") if isinstance(data, dict) else None
            return resp.status, str(code), resp.headers.get("x-gateway-attempts", "?")

    answers: list[tuple[int, str, str]] = []
    asked: list[tuple[int, str, str]] = []
    async with aiohttp.ClientSession() as session:
        for n in range(12):
            asked.append(await ask(session, nodes[n % len(nodes)]))
            if asked[-1][2] == "0":
                answers = list(await asyncio.gather(*(ask(session, node) for node in nodes)))
                break
    ok = bool(answers) and len(set(answers)) == 1 and answers[0][2] == "0"
    return Check(
        "circuits_agree",
        "circuits opened through any node are open on every node at once",
        ok,
        (
            f"{len(asked)} requests for {GONE_MODEL} (round-robin) until one node dispatched nothing; then "
            + "; ".join(
                f"node {n.index}: {s} {c}, {a} attempts" for n, (s, c, a) in zip(nodes, answers, strict=True)
            )
        )
        if answers
        else f"no node stopped dispatching: {Counter(asked).most_common(4)}",
    )


# --- the processes -------------------------------------------------------------------------------


async def monitor(
    cluster: Cluster, load: ClusterLoad, samples: list[dict], stop_event: asyncio.Event
) -> None:
    last_log = time.monotonic()
    while not stop_event.is_set():
        for node in cluster.nodes:
            if node.index not in cluster.up or node.proc is None or node.proc.poll() is not None:
                continue  # only nodes serving (a node starting up is not yet warm)
            try:
                inv = await asyncio.to_thread(tree_inventory, node.pid)
            except OSError:
                continue
            samples.append(
                {
                    "node": node.index,
                    "incarnation": node.incarnation,
                    "progress": load.progress(),
                    "rss_kb": inv.rss_kb,
                    "fds": inv.fds,
                    "threads": inv.threads,
                }
            )
        if time.monotonic() - last_log >= 10:
            last_log = time.monotonic()
            log(f"{len(load.outcomes)}/{len(load.plan)} done; nodes in rotation {cluster.up}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop_event.wait(), 0.5)


def node_checks(
    nodes: list[GatewayNode],
    baselines: dict[int, tuple[int, Inventory]],
    after: dict[int, Inventory],
    samples: list[dict],
    args: argparse.Namespace,
    db_port: int | None,
) -> list[Check]:
    memory, memory_bad, fds, fds_bad = [], [], [], []
    for node in nodes:
        mine = [s for s in samples if s["node"] == node.index and s["incarnation"] == node.incarnation]
        if not mine:
            continue
        first = mine[0]["progress"]
        span = 1 - first
        end_rss = max((s["rss_kb"] for s in mine if s["progress"] >= 0.9), default=0)
        if span < 0.5:
            memory.append(f"node {node.index}: started at {first:.0%} of the load, too late to judge")
        else:
            warm_at = first + args.warmup * span
            warm = next((s for s in mine if s["progress"] >= warm_at), mine[0])
            growth = end_rss / warm["rss_kb"] - 1 if warm["rss_kb"] else math.nan
            line = (
                f"node {node.index} (start #{node.incarnation}): "
                f"{warm['rss_kb'] / 1024:.0f} MiB after warm-up, "
                f"{end_rss / 1024:.0f} MiB at the end ({growth:+.1%})"
            )
            memory.append(line)
            if not growth < args.max_rss_growth:
                memory_bad.append(line)
        incarnation, base = baselines[node.index]
        end = after[node.index]
        leftover = end.tcp_excluding(db_port)
        line = (
            f"node {node.index}: non-database sockets {base.non_db_sockets(db_port)} at start, "
            f"{end.non_db_sockets(db_port)} idle at the end (TCP left {len(leftover)}); "
            f"fds {base.fds} -> {end.fds}"
        )
        fds.append(line)
        if (
            incarnation != node.incarnation
            or leftover
            or end.non_db_sockets(db_port) > base.non_db_sockets(db_port)
        ):
            fds_bad.append(line + "".join(f" {s}" for s in leftover[:3]))
    return [
        Check(
            "memory",
            f"memory flat after warm-up on the surviving nodes (RSS growth < {args.max_rss_growth:.0%})",
            bool(memory) and not memory_bad,
            "; ".join(memory),
            _examples(memory_bad),
        ),
        Check(
            "descriptors",
            "descriptors back to the node's start once clients and upstreams are gone",
            not fds_bad,
            "; ".join(fds),
            _examples(fds_bad),
        ),
    ]


# A traceback the gateway logged on purpose: one of its own messages for a write it gave up on,
# caused by the database being unreachable (restarting or stalled). Everything else is unhandled.
LOGGED_ON_PURPOSE = re.compile(r"could not be (saved|pruned)|refused by the database")
DATABASE_GONE = (
    "django.db.utils.OperationalError",
    "django.db.utils.InterfaceError",
    "psycopg.OperationalError",
    "psycopg.errors.",
    "proxy.db.DatabaseTimeout",
)


def tracebacks(text: str) -> list[tuple[str, str]]:
    """(the log line before it, its last exception line) for each logged traceback, chained
    exceptions ("The above exception was the direct cause...") counted with the one they caused.
    An exception line is the first unindented line after a traceback's frames (what follows it may
    be more of its message, e.g. PostgreSQL's CONTEXT line)."""
    lines = text.splitlines()
    found: list[tuple[str, str]] = []
    for i, line in enumerate(lines):
        if not line.startswith("Traceback (most recent call last)"):
            continue
        last = next((x for x in lines[i + 1 :] if x.strip() and not x[:1].isspace()), "")
        before = [x for x in lines[max(i - 3, 0) : i] if x.strip()]
        chained = bool(before) and before[-1].startswith(("The above exception", "During handling"))
        if chained and found:
            found[-1] = (found[-1][0], last)
        else:
            found.append((lines[i - 1] if i else "", last))
    return found


def log_check(nodes: list[GatewayNode]) -> Check:
    unhandled, on_purpose = [], 0
    for node in nodes:
        for message, last in tracebacks(node.log_path.read_text(errors="replace")):
            if LOGGED_ON_PURPOSE.search(message) and last.startswith(DATABASE_GONE):
                on_purpose += 1
            else:
                unhandled.append(f"node {node.index}: {message[:80]} -> {last[:120]}")
    return Check(
        "log",
        "no traceback in any node's log but those of writes given up while the database was unreachable",
        not unhandled,
        f"{len(unhandled)} other tracebacks; {on_purpose} logged by the gateway for a write it gave up "
        "on while the database was unreachable",
        _examples(sorted(set(unhandled))),
    )


# --- the report ----------------------------------------------------------------------------------


def summary(report: dict) -> str:
    from soak.run import summary_table

    run = report["run"]
    lines = [
        f"multi-node soak: {run['nodes']} nodes x {run['workers_per_node']} workers on one PostgreSQL; "
        f"requests by node {run['by_node']}"
    ]
    lines += [
        f"  fault {f['name']}{'' if f['node'] is None else ' node ' + str(f['node'])} at {f['progress']:.0%} "
        f"of the load, {f['seconds']:.1f} s {f['detail']}"
        for f in report["faults"]
    ]
    return "\n".join(lines) + "\n\n" + summary_table({**report, "process": {}})


SECTION = f'{MULTINODE_SECTION} (`make soak SOAK_ARGS="--nodes 3 --database postgres"`)'


def bench_section(report: dict) -> str:
    run, ledger = report["run"], report.get("ledger", {})
    checks = report["checks"]
    passed = sum(1 for c in checks if c["ok"])
    rate = run["requests_done"] / max(run["load_seconds"], 1e-9)
    lines = [
        SECTION,
        "",
        f"Last full run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        "written by `soak/multinode.py` "
        "(soak/README.md says what runs and what is checked); `make bench` does not rerun it.",
        f"{run['requests_done']} requests ({run['by_transport']}) at concurrency {run['concurrency']} "
        "spread over "
        f"{run['nodes']} nodes (uvicorn, {run['workers_per_node']} workers each; requests by node "
        f"{run['by_node']}) on one PostgreSQL, against the same four chaotic upstreams; {run['websocket']}.",
        "Faults during the load: "
        + "; ".join(
            f"{f['name']}{'' if f['node'] is None else ' node ' + str(f['node'])} at {f['progress']:.0%} "
            f"({f['seconds']:.1f} s)"
            for f in report["faults"]
        )
        + ".",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| throughput under faults | {rate:.0f} req/s ({run['load_seconds']:.1f} s of load) |",
        f"| handoffs | {ledger.get('handoffs', '?')} in "
        f"{ledger.get('requests_with_handoff', '?')} requests |",
    ]
    for transport, row in report["latency_ms"].items():
        lines.append(
            f"| latency {transport} (n={row['n']}) | p50 {row['p50']:.1f} ms, p99 {row['p99']:.1f} ms, "
            f"max {row['max']:.1f} ms |"
        )
    lines.append(f"| invariant checks | {passed} of {len(checks)} passed |")
    lines += ["", "| invariant | result | figure |", "| --- | --- | --- |"]
    lines += [
        f"| `{c['id']}` {c['name']} | {'PASS' if c['ok'] else 'FAIL'} | {c['detail'].replace('|', '/')} |"
        for c in checks
    ]
    lines += ["", "| outcome (status, code, transport) | count |", "| --- | --- |"]
    lines += [f"| {key} | {count} |" for key, count in report["outcomes"].items()]
    return "\n".join(lines) + "\n"


BENCH_RESULTS_MD = ROOT / "bench" / "results.md"


def write_bench_section(text: str) -> None:
    """bench/soak.md keeps the single-node section and this one; each run replaces its own. The
    soak part of bench/results.md (what `make bench` copied from soak.md) is replaced as well, so
    the report shows the figures without a rerun of the benchmark."""
    current = BENCH_SOAK_MD.read_text() if BENCH_SOAK_MD.exists() else ""
    head, _, _ = current.partition(SECTION)
    soak_md = head.rstrip() + "\n\n" + text if head.strip() else text
    BENCH_SOAK_MD.write_text(soak_md)
    if not BENCH_RESULTS_MD.exists():
        return
    results = BENCH_RESULTS_MD.read_text()
    start = results.find("\n## Soak ")
    if start < 0:
        return
    end = start + 1
    while (end := results.find("\n## ", end + 1)) >= 0 and results.startswith("\n## Soak ", end):
        pass
    tail = results[end:] if end >= 0 else "\n"
    BENCH_RESULTS_MD.write_text(results[: start + 1] + soak_md.strip() + "\n" + tail)
