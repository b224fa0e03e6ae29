"""The multi-node soak's checks of shared state: the circuits polled during the run and the half-open
probes across nodes from the upstreams' own log (soak/multinode.py's docstring says how), replays,
budgets, the ledger's records against the clients', probe slots, and whether the nodes' circuits
agree at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import math
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from devkit.databases import Database, libpq_url
from devkit.gateway import GatewayNode
from soak.checks import Check, examples
from soak.faults import REJECTED, SERVED, Fault
from soak.load import Outcome

# --- the circuits, watched during the run --------------------------------------------------------


class CircuitPoller:
    """Reads the circuit rows every `interval` seconds on its own connection (reconnecting while the
    database restarts or stalls): each observation is (time.time(), rows), stamped once the rows are
    read; `sent[i]` is when observation i's query was sent (its snapshot lies between the two, far
    apart at times: the harness's own load holds the thread back)."""

    def __init__(self, database: Database, interval: float = 0.1) -> None:
        self.database = database
        self.interval = interval
        self.observations: list[tuple[float, list[tuple]]] = []
        self.sent: list[float] = []
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
                sent = time.time()
                rows = conn.execute(
                    "SELECT assignment_id, route_class, state, open_until, probes_in_flight "
                    "FROM routing_circuit"
                ).fetchall()
                self.sent.append(sent)
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
        saw the circuit closed or opened again; the last poll if never). An open that became
        visible only after its open_until (a failure write that committed late, its cooldown
        counted from when it was computed) starts at the last poll that did not see it yet: before
        that, every request read the circuit as it was."""
        found: dict[tuple[int, str, float], float] = {}
        starts: dict[tuple[int, str, float], float] = {}
        current: dict[tuple[int, str], float] = {}
        last = self.observations[-1][0] if self.observations else 0.0
        before = -math.inf
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
                    if (*key, until) not in found:
                        found[(*key, until)] = math.inf
                        starts[(*key, until)] = max(until, before)
                else:
                    current.pop(key, None)
            for key in [k for k in current if k not in seen]:
                found[(*key, current.pop(key))] = t
            before = t
        windows = [(a, rc, starts[(a, rc, until)], min(end, last)) for (a, rc, until), end in found.items()]
        return [(a, rc, start, end) for a, rc, start, end in windows if start < end]


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
        examples(replays),
    )


@dataclass(frozen=True)
class Plan:
    """One request as its gateway recorded it (the ledger): when it started (epoch seconds) and its
    attempts in ordinal order, (assignment name, status), the pass-overs (`ineligible`) included."""

    started: float
    attempts: tuple[tuple[str, str], ...]


def read_plans(database: Database, outcomes: list[Outcome]) -> dict[str, Plan]:
    """The ledger's Plan of every request the client knows the id of, by the client's `sid` (the
    upstreams log requests by it). A request a killed node took with it has none."""
    sids = {o.request_id: o.sid for o in outcomes if o.request_id and o.sid}
    names = assignment_names(database)
    started: dict[str, float] = {}
    attempts: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for rid, at, assignment, status in database.query(
        "SELECT r.request_id, EXTRACT(EPOCH FROM r.started_at), a.assignment_id, a.status "
        "FROM proxy_requestrecord r LEFT JOIN proxy_attempt a ON a.request_id = r.id "
        "ORDER BY r.id, a.ordinal"
    ):
        if (sid := sids.get(rid)) is None:
            continue
        started[sid] = float(at)
        if status is not None:
            attempts[sid].append((names.get(assignment, "?"), status))
    return {sid: Plan(at, tuple(attempts[sid])) for sid, at in started.items()}


def assignment_names(database: Database) -> dict[int, str]:
    rows = database.query("SELECT id, name FROM pools_assignment")
    return {pk: name.removeprefix("acct-") for pk, name in rows}


def half_open_check(
    arrivals: list[dict], poller: CircuitPoller, database: Database, plans: dict[str, Plan]
) -> Check:
    """See the module docstring. SPEC §5.4 keeps an open or half-open assignment at the end of a
    plan for availability: a request that does not hold the probe lease may still reach it, but
    only after every assignment whose circuit was closed. Such a last-resort arrival holds no probe
    slot; every other arrival in a half-open window is in a probe's position and counts.

    What "closed" was for the request is judged from its plan in the ledger (`plans`): the gateway
    orders the candidates by the health it read at the request's start, and passes some over
    (budget, deadline, capability, a circuit read again) without an upstream arrival. So the
    arrival is a last resort iff every assignment whose circuit was closed around the request's
    `started_at` (`closed_around`) is among the request's attempts before the one this arrival is
    (dispatched or passed over). A request without a plan (a killed node's; websocket frames, whose
    ids the client does not see) is judged from the polls alone: every assignment closed at the
    last poll before the arrival was reached earlier by the same request."""
    names = assignment_names(database)
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

    def closed_in(at: int, route_class: str) -> set[str]:
        not_closed = {
            names.get(assignment)
            for assignment, rc, state, _, _ in poller.observations[at][1]
            if rc == route_class and state != "closed"
        }
        return set(names.values()) - not_closed

    def closed_at(t: float, route_class: str) -> set[str] | None:
        at = bisect.bisect_right(times, t) - 1
        return closed_in(at, route_class) if at >= 0 else None

    def closed_around(t: float, route_class: str) -> set[str] | None:
        """Closed at the last poll read before `t` and at the first sent after it: the request read
        its view after starting, so one that opened in between may have been read open. So may one
        that opened and closed again between the two polls, neither of which saw it open
        (`reopened_unseen`)."""
        at = bisect.bisect_right(times, t) - 1
        if at < 0:
            return None
        closed = closed_in(at, route_class)
        after = bisect.bisect_left(poller.sent, t)
        until = math.inf
        if after < len(times):
            closed &= closed_in(after, route_class)
            until = times[after]
        return {u for u in closed if not reopened_unseen(u, route_class, poller.sent[at], until)}

    def reopened_unseen(upstream: str, route_class: str, since: float, until: float) -> bool:
        """A failure that may count toward the circuit (a 429 only demotes, SPEC §5.6) answered after
        the poll at `since` was sent, then a success the gateway took, answered before the poll read
        at `until`: the failure's write may have opened the circuit (its threshold reached: the
        successes between failures write nothing when their request read it clean) and the
        success's closed it again (SPEC §7.1), both between the two polls."""
        lane = by_lane.get((upstream, route_class), [])
        failed = min(
            (
                b.get("e", math.inf)
                for b in lane
                if b.get("e", math.inf) >= since and b["k"] != "rate_limited" and not succeeded(b)
            ),
            default=math.inf,
        )
        return any(failed < b.get("e", math.inf) < until and succeeded(b) for b in lane)

    def attempt_of(a: dict) -> tuple[Plan, int] | None:
        """The request's plan and the index in it of the attempt this arrival is: the n-th arrival
        of the request at this upstream is its n-th dispatch there."""
        plan = plans.get(a.get("sid") or "")
        if plan is None:
            return None
        n = sum(1 for b in by_sid[a["sid"]] if b["u"] == a["u"] and b["a"] < a["a"])
        for i, (name, status) in enumerate(plan.attempts):
            if name == a["u"] and status != "ineligible":
                if n == 0:
                    return plan, i
                n -= 1
        return None

    def last_resort(a: dict) -> tuple[bool, bool]:
        """(a last resort?, judged from the ledger?)"""
        if (found := attempt_of(a)) is not None:
            plan, i = found
            closed = closed_around(plan.started, a["t"])
            tried = {name for name, _ in plan.attempts[:i]}
            return closed is not None and closed - {a["u"]} <= tried, True
        closed = closed_at(a["a"], a["t"])
        tried = {b["u"] for b in by_sid.get(a.get("sid") or "", []) if b["a"] < a["a"]}
        return closed is not None and closed - {a["u"]} <= tried, False

    def succeeded(a: dict) -> bool:
        """The gateway took the arrival's answer as a success, which closes the circuit whoever
        sent it (a last resort too): its attempt in the ledger, else what the upstream served."""
        if (found := attempt_of(a)) is not None:
            plan, i = found
            return plan.attempts[i][1] == "succeeded"
        return a["k"] in SERVED

    windows = poller.windows()
    violations, examined, max_seen, resort, from_ledger, judged = [], 0, 0, 0, 0, 0
    for assignment, route_class, start, end in windows:
        lane = by_lane.get((names.get(assignment, "?"), route_class), [])
        inside = [a for a in lane if start <= a["a"] < end]
        # The end of the first success that closes the circuit in the window: one answered in it, or
        # one answered before it whose close no poll before the window could show (its write lands
        # later, inside the window): after the last poll before the window was sent.
        last = bisect.bisect_left(times, start) - 1
        seen_at = poller.sent[last] if last >= 0 else -math.inf
        before = [a for a in lane if a["a"] < start and a.get("e", math.inf) >= seen_at]
        closed_by = min((a.get("e", math.inf) for a in before if succeeded(a)), default=math.inf)
        for n, a in enumerate(inside):
            if a["a"] >= closed_by:
                inside = inside[:n]
                break
            if succeeded(a):
                closed_by = min(closed_by, a.get("e", math.inf))
        probes = []
        for a in inside:
            judged += 1
            spared, by_ledger = last_resort(a)
            from_ledger += by_ledger
            if spared:
                resort += 1
                continue
            in_flight = sum(1 for b in probes if b.get("e", math.inf) > a["a"])
            probes.append(a)
            max_seen = max(max_seen, in_flight + 1)
            if in_flight >= limit:
                how = "its plan" if by_ledger else "the polls only"
                violations.append(
                    f"{names.get(assignment)}/{route_class} half-open from {start:.3f}: "
                    f"{a['sid']} arrived at "
                    f"{a['a']:.3f} ({a['k']}) with {in_flight} probe(s) in flight (judged from {how})"
                )
        examined += 1 if probes else 0
    return Check(
        "half_open_probes",
        f"at most half_open_probes ({limit}) probes at once per half-open circuit across nodes",
        bool(poller.observations) and not violations,
        f"{len(windows)} half-open windows seen in {len(poller.observations)} circuit polls, "
        f"{examined} with probes; at most {max_seen} probe(s) at once; {judged} arrivals in the windows, "
        f"{from_ledger} judged from the request's plan in the ledger, the rest from the polls; "
        f"{resort} last-resort arrivals (every assignment closed for the request tried first); "
        f"{len(violations)} violations",
        examples(violations),
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
    # Where the gateway keeps a hold per request (pools_budgethold), none may be left either.
    holds = (
        database.query("SELECT request_id, micros FROM pools_budgethold")
        if database.query("SELECT 1 FROM information_schema.tables WHERE table_name = 'pools_budgethold'")
        else []
    )
    held += [f"request {request_id}: a hold of {micros} micros left" for request_id, micros in holds]
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
            examples(over),
        ),
        Check(
            "budget_reservations",
            "no budget reservation left once every node has stopped",
            reserves and not held,
            ("; ".join(held) or "nothing reserved, no request's hold left")
            + f" ({died} requests with the budgeted key were served by the node that was killed)"
            if reserves
            else "the gateway keeps no reservations (no reserved_micros)",
            examples(held),
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
            examples([f"#{o.index} {o.kind} {o.status} node {o.node} rid={o.request_id}" for o in missing]),
        ),
        Check(
            "records_sigkill",
            "requests answered by a node just before its SIGKILL keep their RequestRecord",
            bool(killed) and not lost_to_kill,
            f"{len(lost_to_kill)} answered requests without a record, answered "
            f"{', '.join(ages[:8]) or '-'} before the SIGKILL",
            examples(
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
        examples(forever),
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
            examples(others),
        ),
        Check(
            "deadline_db",
            "requests that met a database restart or stall answered within deadline + margin",
            not during,
            f"{len(during)} late or unanswered while the database restarted or stalled",
            examples(during),
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
