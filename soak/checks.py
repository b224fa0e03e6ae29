"""The soak's invariants over what the clients saw, what the ledger holds and what /proc shows of
the gateway (`Check` per invariant, `CHECK_IDS` their order), and the drain's.
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import signal
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

from devkit.databases import Database
from devkit.procfs import Inventory
from soak.load import Outcome, Sample

# --- checks ------------------------------------------------------------------------------------


@dataclass
class Check:
    id: str  # stable: tests/reliability/test_soak_short.py names its cases by these
    name: str
    ok: bool
    detail: str
    examples: list[str] = field(default_factory=list)


CHECK_IDS = (
    "all_ran",
    "deadline",
    "no_500",
    "well_formed",
    "sanitized",
    "one_upstream",
    "drain_answers",
    "exit",
    "client_sockets",
    "sockets",
    "threads",
    "memory",
    "records",
    "ledger_matches_client",
    "attempts",
    "circuits",
    "probes",
    "log",
)


def examples(items: list[str], n: int = 5) -> list[str]:
    return items[:n]


def client_checks(outcomes: list[Outcome], planned: int) -> list[Check]:
    by_problem: dict[str, list[str]] = defaultdict(list)
    for o in outcomes:
        for p in o.problems:
            category = (
                "deadline"
                if "within" in p
                else "status"
                if p.startswith("status")
                else "leak"
                if "provider message" in p
                else "handoff"
                if "upstream" in p and "text" in p
                else "shape"
            )
            by_problem[category].append(f"#{o.index} {o.kind} rid={o.request_id}: {p}")
    five_hundreds = [o for o in outcomes if o.status and o.status >= 500 and o.status not in (502, 503, 504)]
    checks = [
        Check(
            "all_ran",
            "all planned requests ran",
            len(outcomes) == planned,
            f"{len(outcomes)} of {planned} (a shortfall means the time limit stopped the load)",
        ),
        Check(
            "deadline",
            "every request answered within deadline + margin",
            not by_problem["deadline"],
            f"{len(by_problem['deadline'])} late or unanswered",
            examples(by_problem["deadline"]),
        ),
        Check(
            "no_500",
            "no 500 (or other untyped 5xx) from the gateway",
            not five_hundreds and not by_problem["status"],
            f"{len(five_hundreds)} untyped 5xx, {len(by_problem['status'])} unexpected statuses",
            examples(by_problem["status"]),
        ),
        Check(
            "well_formed",
            "answers and errors well-formed (SPEC §4 shape, one terminal event per stream)",
            not by_problem["shape"],
            f"{len(by_problem['shape'])} malformed",
            examples(by_problem["shape"]),
        ),
        Check(
            "sanitized",
            "no provider message relayed",
            not by_problem["leak"],
            f"{len(by_problem['leak'])} leaks",
            examples(by_problem["leak"]),
        ),
        Check(
            "one_upstream",
            "visible output from one upstream only (no handoff after visible output)",
            not by_problem["handoff"],
            f"{len(by_problem['handoff'])} mixed",
            examples(by_problem["handoff"]),
        ),
    ]
    return checks


def ledger_checks(database: Database, outcomes: list[Outcome]) -> tuple[list[Check], dict]:
    """Reads the ledger and the circuits straight from the database (the gateway has exited)."""
    os.environ["DATABASE_URL"] = database.url
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
    os.environ["DJANGO_DEBUG"] = "false"
    os.environ["DATABASE_CONN_MAX_AGE"] = "0"
    os.environ["DJANGO_SETTINGS_MODULE"] = "gatewaysite.settings"
    import django

    django.setup()
    from django.db import connections

    from pools.models import GatewaySettings
    from proxy.ledger.models import Attempt, RequestRecord
    from routing.models import Circuit

    try:
        records = list(
            RequestRecord.objects.values(
                "id", "request_id", "transport", "status_code", "outcome", "retry_count", "finished_at"
            )
        )
        attempts: dict[int, list[dict]] = defaultdict(list)
        for a in Attempt.objects.order_by("request_id", "ordinal").values(
            "request_id", "ordinal", "status", "dispatch_state", "failure_class"
        ):
            attempts[a["request_id"]].append(a)
        circuits = list(Circuit.objects.values())
        settings = GatewaySettings.objects.filter(pk=1).values().first() or {}
    finally:
        connections.close_all()
    now = datetime.now(UTC)

    by_rid = {r["request_id"]: r for r in records}
    missing, mismatched = [], []
    for o in outcomes:
        if o.transport == "websocket" or o.request_id is None or o.killed:
            continue
        record = by_rid.get(o.request_id)
        if record is None:
            missing.append(f"#{o.index} {o.kind} {o.status} rid={o.request_id}")
            continue
        dispatched = sum(1 for a in attempts[record["id"]] if a["status"] != "ineligible")
        if record["status_code"] != o.status:
            mismatched.append(f"rid={o.request_id}: client saw {o.status}, ledger {record['status_code']}")
        if o.attempts_header is not None and o.attempts_header != dispatched:
            mismatched.append(
                f"rid={o.request_id}: x-gateway-attempts {o.attempts_header}, ledger {dispatched} dispatched"
            )
    # Requests the gateway answered have a known id; one the client gave up on (or that was refused
    # around SIGTERM, or whose node was killed under it) may or may not have reached the ledger: the
    # record count must lie in between.
    answered = sum(1 for o in outcomes if o.transport != "websocket" and o.request_id and not o.killed)
    unknown = sum(1 for o in outcomes if o.transport != "websocket" and (not o.request_id or o.killed))
    stored_http = sum(1 for r in records if r["transport"] in ("http", "sse"))
    # Websocket frames likewise: one answered by an event surely reached the gateway; one that met
    # only a close (the gateway stopping under SIGTERM) may or may not have been delivered to it.
    sent = [
        o for o in outcomes if o.transport == "websocket" and o.code not in ("not_sent", "ws_connect_failed")
    ]
    frames = len(sent)
    closed_only = sum(1 for o in sent if o.code.startswith("closed_") or o.killed)
    stored_ws = sum(1 for r in records if r["transport"] == "websocket")
    count_ok = answered <= stored_http <= answered + unknown and frames - closed_only <= stored_ws <= frames
    inconsistent = []
    for r in records:
        rows = attempts.get(r["id"], [])
        why = _attempt_problems(r, rows)
        if why:
            trail = " ".join(f"{a['ordinal']}:{a['status']}/{a['dispatch_state']}" for a in rows)
            inconsistent.append(f"rid={r['request_id']} outcome={r['outcome']}: {why} [{trail}]")

    circuit_bad, probe_held = [], []
    limit = settings.get("half_open_probes", 1)
    for c in circuits:
        label = f"circuit a{c['assignment_id']}/{c['model']}/{c['route_class']} {c['state']}"
        if c["state"] not in ("closed", "open", "half_open"):
            circuit_bad.append(f"{label}: unknown state")
        if c["state"] == "open" and c["open_until"] is None:
            circuit_bad.append(f"{label}: open without open_until")
        lease_expired = c["probe_lease_expires_at"] is not None and c["probe_lease_expires_at"] <= now
        if c["probes_in_flight"] > limit and not lease_expired:
            circuit_bad.append(f"{label}: {c['probes_in_flight']} probes in flight > {limit}")
        if c["probes_in_flight"] > 0:
            probe_held.append(f"{label}: {c['probes_in_flight']} probe(s) still held at exit")

    checks = [
        Check(
            "records",
            "every request has exactly one RequestRecord (SIGTERM drained the ledger)",
            not missing and count_ok,
            f"{len(missing)} missing by request id; HTTP/SSE: {stored_http} records for {answered} answered "
            f"(+{unknown} unanswered) requests; websocket: {stored_ws} records for {frames} frames "
            f"({closed_only} answered only by a close)",
            examples(missing),
        ),
        Check(
            "ledger_matches_client",
            "ledger agrees with what the client saw (status, x-gateway-attempts)",
            not mismatched,
            f"{len(mismatched)} disagreements",
            examples(mismatched),
        ),
        Check(
            "attempts",
            "attempts consistent (ordinals, <= 1 succeeded, handoffs pre-visible, retry_count)",
            not inconsistent,
            f"{len(inconsistent)} inconsistent of {len(records)} records",
            examples(inconsistent),
        ),
        Check(
            "circuits",
            "circuit rows obey the state machine",
            not circuit_bad,
            f"{len(circuits)} circuit rows, states {dict(Counter(c['state'] for c in circuits))}",
            examples(circuit_bad),
        ),
        Check(
            "probes",
            "no probe slot held once no request is in flight",
            not probe_held,
            f"{len(probe_held)} circuits with a held probe",
            examples(probe_held),
        ),
    ]
    summary = {
        "records": len(records),
        "attempts": sum(len(v) for v in attempts.values()),
        "handoffs": sum(r["retry_count"] for r in records),
        "requests_with_handoff": sum(1 for r in records if r["retry_count"]),
        "ledger_outcomes": dict(Counter(f"{r['status_code']} {r['outcome']}" for r in records).most_common()),
        "attempt_statuses": dict(Counter(a["status"] for rows in attempts.values() for a in rows)),
        "circuits": dict(Counter(c["state"] for c in circuits)),
    }
    return checks, summary


def _attempt_problems(record: dict, rows: list[dict]) -> str:
    # A request its node died with, recorded from the node's journal: unfinished by nature, and its
    # attempts end where the node did (a handoff may have been under way).
    lost = record["outcome"] == "gateway_lost"
    if not lost and (record["finished_at"] is None or record["status_code"] is None or not record["outcome"]):
        return "record not finished (finished_at/status/outcome empty)"
    if [a["ordinal"] for a in rows] != list(range(1, len(rows) + 1)):
        return f"ordinals {[a['ordinal'] for a in rows]}"
    statuses = [a["status"] for a in rows]
    if statuses.count("succeeded") > 1:
        return f"{statuses.count('succeeded')} succeeded attempts"
    if record["retry_count"] != statuses.count("retryable_failed"):
        return f"retry_count {record['retry_count']} != {statuses.count('retryable_failed')} retryable_failed"
    dispatched = [a for a in rows if a["status"] != "ineligible"]
    for n, a in enumerate(dispatched):
        last = n == len(dispatched) - 1
        if not last and a["status"] != "retryable_failed":
            return f"attempt {a['ordinal']} {a['status']} is followed by another dispatch"
        if a["status"] == "retryable_failed":
            if last and not lost:
                return f"attempt {a['ordinal']} retryable_failed but no handoff followed"
            if a["dispatch_state"] not in ("not_sent", "rejected"):
                return f"handoff after attempt {a['ordinal']} whose dispatch was {a['dispatch_state']}"
        if a["status"] == "succeeded" and a["dispatch_state"] != "completed":
            return f"succeeded attempt {a['ordinal']} with dispatch {a['dispatch_state']}"
    if record["outcome"] == "ok" and statuses.count("succeeded") != 1:
        return "outcome ok without a succeeded attempt"
    return ""


def process_checks(
    baseline: Inventory,
    drained: Inventory,
    after: Inventory,
    samples: list[Sample],
    args: argparse.Namespace,
    db_port: int | None,
) -> tuple[list[Check], dict]:
    warm = [s for s in samples if s.progress >= args.warmup]
    tail = [s for s in samples if s.progress >= 0.9]
    rss_warm = warm[0].rss_kb if warm else 0
    rss_end = max((s.rss_kb for s in tail), default=0)
    growth = (rss_end / rss_warm - 1) if rss_warm else math.nan
    threads_warm = max((s.threads for s in samples if s.progress <= args.warmup + 0.05), default=0)
    leftover_tcp = after.tcp_excluding(db_port)
    downstream = [s for s in drained.tcp if s.local_port == args.gateway_port and s.state != "LISTEN"]
    checks = [
        Check(
            "client_sockets",
            "client connections closed on the gateway side",
            not downstream,
            f"{len(downstream)} sockets still open to clients 1 s after the clients closed",
            examples([f"{s}" for s in downstream]),
        ),
        Check(
            "sockets",
            "gateway sockets back to baseline once clients and upstreams are gone",
            after.non_db_sockets(db_port) <= baseline.non_db_sockets(db_port) and not leftover_tcp,
            f"non-database sockets: baseline {baseline.non_db_sockets(db_port)}, after "
            f"{after.non_db_sockets(db_port)} (TCP left: {len(leftover_tcp)}); fds {baseline.fds} -> "
            f"{after.fds}",
            examples([f"{s}" for s in leftover_tcp]),
        ),
        Check(
            "threads",
            "no thread leak",
            after.threads <= threads_warm + 4,
            f"threads: baseline {baseline.threads}, after warm-up {threads_warm}, end {after.threads}",
        ),
        Check(
            "memory",
            f"memory flat after warm-up (RSS growth < {args.max_rss_growth:.0%})",
            bool(rss_warm) and growth < args.max_rss_growth,
            f"RSS {baseline.rss_kb / 1024:.0f} MiB at start, {rss_warm / 1024:.0f} MiB after warm-up, "
            f"{rss_end / 1024:.0f} MiB at the end ({growth:+.1%})",
        ),
    ]
    return checks, {
        "rss_mib": {"start": baseline.rss_kb / 1024, "warm": rss_warm / 1024, "end": rss_end / 1024},
        "rss_growth": growth,
        "threads": {"start": baseline.threads, "warm": threads_warm, "end": after.threads},
        "sockets": {"start": baseline.sockets, "drained": drained.sockets, "end": after.sockets},
        "fds": {"start": baseline.fds, "end": after.fds},
    }


def drain_checks(
    outcomes: list[Outcome], exit_code: int | None, exit_seconds: float, args: argparse.Namespace
) -> list[Check]:
    answered = [o for o in outcomes if o.status is not None]
    broken = [f"#{o.index} {o.kind} rid={o.request_id}: {p}" for o in answered for p in o.problems]
    refused = sum(1 for o in outcomes if o.status is None)
    return [
        Check(
            "drain_answers",
            "requests in flight at SIGTERM finish with a well-formed answer",
            bool(answered) and not broken,
            f"{len(answered)} answered during the drain ({refused} refused after SIGTERM, as expected)",
            examples(broken),
        ),
        # uvicorn re-raises SIGTERM after its graceful shutdown, so "exited on its own" is -15 or 0.
        Check(
            "exit",
            "gateway exits on its own after SIGTERM within the grace period",
            exit_code in (0, -signal.SIGTERM),
            f"exit {exit_code} {exit_seconds:.1f} s after SIGTERM (limit {args.exit_timeout:.0f} s)",
        ),
    ]
