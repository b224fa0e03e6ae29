"""The multi-node soak's process checks and report: the nodes watched from /proc during the run, their
leaks and logs (tracebacks other than the ones logged on purpose), the summary and its section of
bench/results.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import re
import time

from devkit.gateway import GatewayNode
from devkit.procfs import Inventory, tree_inventory
from soak.checks import Check, examples
from soak.faults import Cluster, ClusterLoad
from soak.load import ROOT, log
from soak.report import (
    BENCH_SOAK_MD,
    MULTINODE_SECTION,
    summary_table,
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
            examples(memory_bad),
        ),
        Check(
            "descriptors",
            "descriptors back to the node's start once clients and upstreams are gone",
            not fds_bad,
            "; ".join(fds),
            examples(fds_bad),
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
    "runtime.db.DatabaseTimeout",
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
        examples(sorted(set(unhandled))),
    )


# --- the report ----------------------------------------------------------------------------------


def summary(report: dict) -> str:

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
