"""The soak's report: the summary table it prints, the latency figures, and its section of
bench/results.md (bench/soak.md).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from soak.load import ROOT, Outcome

# --- report ------------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1]


def summary_table(report: dict) -> str:
    lines = []
    run = report["run"]
    lines.append(
        f"soak: {run['requests_done']} requests ({run['by_transport']}) at concurrency "
        f"{run['concurrency']} in {run['load_seconds']:.1f} s "
        f"({run['requests_done'] / max(run['load_seconds'], 1e-9):.0f} req/s); "
        f"database {run['database']}; {run['websocket']}"
    )
    lines.append("")
    lines.append(f"{'outcome (status, code, transport)':<58}{'count':>8}")
    for key, count in report["outcomes"].items():
        lines.append(f"{key:<58}{count:>8}")
    ledger = report.get("ledger", {})
    lines.append("")
    lines.append(
        f"handoffs: {ledger.get('handoffs', '?')} in {ledger.get('requests_with_handoff', '?')} requests; "
        f"attempts {ledger.get('attempt_statuses', {})}; circuits at exit {ledger.get('circuits', {})}"
    )
    lines.append("")
    lines.append(f"{'latency (ms)':<16}{'n':>8}{'p50':>10}{'p99':>10}{'max':>10}")
    for transport, row in report["latency_ms"].items():
        lines.append(f"{transport:<16}{row['n']:>8}{row['p50']:>10.1f}{row['p99']:>10.1f}{row['max']:>10.1f}")
    proc = report.get("process", {})
    if proc:
        lines.append("")
        rss = proc["rss_mib"]
        lines.append(
            f"gateway RSS {rss['start']:.0f} -> {rss['warm']:.0f} (warm) -> {rss['end']:.0f} MiB; "
            f"threads {proc['threads']}; sockets {proc['sockets']}; fds {proc['fds']}; "
            f"SIGTERM exit {report['run']['exit_code']} in {report['run']['exit_seconds']:.1f} s"
        )
    lines.append("")
    for c in report["checks"]:
        lines.append(f"[{'PASS' if c['ok'] else 'FAIL'}] {c['id']}: {c['name']}: {c['detail']}")
        for e in c["examples"]:
            lines.append(f"         e.g. {e}")
    failed = sum(1 for c in report["checks"] if not c["ok"])
    lines.append("")
    lines.append("soak: all checks passed" if not failed else f"soak: {failed} check(s) FAILED")
    return "\n".join(lines)


FULL_RUN_REQUESTS = 20000  # what the issue asks of `make soak`; shorter runs leave the figures alone
BENCH_SOAK_MD = ROOT / "bench" / "soak.md"  # included in bench/results.md by bench/run.py
MULTINODE_SECTION = "## Soak across nodes"  # the heading soak/multinode.py writes its section under


def bench_section(report: dict) -> str:
    """The soak's figures for bench/results.md: throughput and latency under the fault mix."""
    run, ledger = report["run"], report.get("ledger", {})
    checks = report["checks"]
    passed = sum(1 for c in checks if c["ok"])
    rate = run["requests_done"] / max(run["load_seconds"], 1e-9)
    lines = [
        "## Soak under faults (`make soak`)",
        "",
        f"Last full run: {time.strftime('%Y-%m-%d', time.gmtime())}, written by `soak/run.py` "
        "(soak/README.md says what runs and what is checked); `make bench` does not rerun it.",
        f"{run['requests_done']} requests ({run['by_transport']}) at concurrency {run['concurrency']} "
        "against four upstreams that reject, rate-limit, fail with 503, hang, cut streams before and "
        f"after output and close websockets; database {run['database']}; {run['websocket']}.",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| throughput under the fault mix | {rate:.0f} req/s ({run['load_seconds']:.1f} s of load) |",
        f"| handoffs | {ledger.get('handoffs', '?')} in {ledger.get('requests_with_handoff', '?')} "
        "requests |",
    ]
    for transport, row in report["latency_ms"].items():
        lines.append(
            f"| latency {transport} (n={row['n']}) | p50 {row['p50']:.1f} ms, p99 {row['p99']:.1f} ms, "
            f"max {row['max']:.1f} ms |"
        )
    lines.append(f"| invariant checks | {passed} of {len(checks)} passed |")
    lines += [
        "",
        f"Every request carries `x-gateway-deadline-ms: {run['deadline_ms']}` and some "
        "upstreams hang past it, so the p99 latencies are those requests' typed answers at the "
        "deadline, not slow successes.",
    ]
    lines += ["", "| outcome (status, code, transport) | count |", "| --- | --- |"]
    lines += [f"| {key} | {count} |" for key, count in report["outcomes"].items()]
    return "\n".join(lines) + "\n"


def latency_table(outcomes: list[Outcome]) -> dict[str, dict[str, float]]:
    latency: dict[str, dict[str, float]] = {}
    for transport in ("http", "sse", "websocket"):
        values = [o.latency_s * 1000 for o in outcomes if o.transport == transport and o.code != "not_sent"]
        if values:
            latency[transport] = {
                "n": len(values),
                "p50": percentile(values, 50),
                "p99": percentile(values, 99),
                "max": max(values),
            }
    return latency


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
