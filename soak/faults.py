"""The multi-node soak's cluster and its faults: the nodes and the load spread over those in
rotation (`Cluster`, `ClusterLoad`), the faults injected one after another as the load progresses
(`FaultInjector`: a node killed, PostgreSQL restarted and stalled, a node drained), and what the
clients saw during each (`classify_killed`, `classify_db_faults` and their checks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aiohttp

from devkit.databases import PostgresCluster
from devkit.gateway import GatewayNode
from devkit.procfs import Inventory, tree_inventory
from soak.checks import Check, examples
from soak.load import Load, Outcome, log

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


def exit_of(fault: Fault) -> tuple[int | None, float]:
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
        examples(wrong),
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
        examples(broken),
    )
