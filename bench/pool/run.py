"""`make bench-pool`: does a pool pool? The same agent-like load sent to the gateway twice in one run,
with the pool features on and with `GATEWAY_POOL_FEATURES=false` (SPEC §13, issue 43 point 8).

What runs (everything on 127.0.0.1, everything stopped at exit):
- `devkit/pool_upstream.py`: 23 fake accounts in one process, each with its own limits, prompt cache
  and outages (bench/pool/workload.py says which);
- the gateway as production serves it (`python -m gatewaysite.server --workers 2`: uvicorn, two
  processes sharing state through PostgreSQL), once per phase on a fresh database, with circuits short
  enough for a short run (`circuit.cooldown_seconds: 5`, `retry.default_deadline_ms: 4000`);
- the clients, in this process: open-loop conversations (bench/pool/workload.py) over aiohttp, and
  beside them a reader of the healing accounts' circuit rows in the gateway's database (every 0.5 s),
  for the cooldown in force when each healed.

Each phase resets the accounts (limits full, caches empty, outage schedules from now), runs the load
for the phase's duration, waits for the last answers, then reads the accounts' records and the CPU
the gateway's processes and their PostgreSQL backends spent (/proc, as `make bench` does).

Writes bench/pool.md and its summary in bench/results.md (bench/pool/report.py); logs and raw
figures in bench/out/pool/.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import psycopg  # noqa: E402

from bench import accounting  # noqa: E402
from bench.pool import figures, report, workload  # noqa: E402
from bench.pool.figures import CircuitSample, Turn  # noqa: E402
from devkit.databases import Database  # noqa: E402
from devkit.gateway import GatewayNode  # noqa: E402
from devkit.harness import HOST, PYTHON, Processes, free_port  # noqa: E402
from devkit.pool_upstream import AccountSpec  # noqa: E402

OUT = ROOT / "bench" / "out" / "pool"
KEY = "sk-gw-pool-bench-000000000000"
UPSTREAM_KEY_ENV, UPSTREAM_KEY = "GATEWAY_UPSTREAM_POOL_KEY", "sk-pool-upstream-0000000000"
MODEL = "pool-model"
CIRCUIT = {
    "failure_threshold": 2,
    "cooldown_seconds": 5,
    "max_cooldown_seconds": 20,
    "probe_lease_seconds": 10,
    "demotion_seconds": 5,
}
RETRY = {"max_attempts": 4, "backoff_base_ms": 20, "default_deadline_ms": 4000}
DRAIN_S = 10  # after the last turn is sent, how long its answers may take
WATCH_S = 0.5  # how often the circuit rows are read
CIRCUITS_SQL = (
    "SELECT a.name, c.model, c.route_class, c.state, c.cooldown_seconds, c.open_until "
    "FROM routing_circuit c JOIN pools_assignment a ON a.id = c.assignment_id WHERE a.name = ANY(%s)"
)


def log(message: str) -> None:
    print(message, flush=True)


def gateway_config(specs: list[AccountSpec], upstream: str) -> dict[str, Any]:
    assignments = [
        {
            "name": spec.name,
            "adapter": spec.shape,
            "base_url": f"{upstream}/{spec.name}/v1",
            "api_key_env": UPSTREAM_KEY_ENV,
            "tier": 0,
            "weight": 1,
            "discovery": False,
            "models": [{"id": MODEL}],
        }
        for spec in specs
    ]
    return {
        "circuit": CIRCUIT,
        "retry": RETRY,
        "model_fallback_family": False,
        "pools": [{"name": "pool", "assignments": assignments}],
        "keys": [{"name": "pool", "key": KEY, "pools": ["pool"], "allowed_models": ["*"]}],
    }


def request(kind: str, conversation: str, turn: int) -> tuple[str, dict[str, str], dict[str, Any]]:
    """(path, headers, body) of one turn for a client of `kind`."""
    system, messages = workload.system_prompt(conversation), workload.history(turn)
    bearer = {"authorization": f"Bearer {KEY}"}
    if kind == "pck":
        body = {
            "model": MODEL,
            "instructions": system,
            "input": messages,
            "max_output_tokens": workload.MAX_TOKENS,
        }
        return "/v1/responses", bearer, {**body, "prompt_cache_key": conversation}
    if kind == "cc":
        headers = {
            "x-api-key": KEY,
            "anthropic-version": "2023-06-01",
            "x-claude-code-session-id": conversation,
        }
        body = {"model": MODEL, "system": system, "messages": messages, "max_tokens": workload.MAX_TOKENS}
        return "/v1/messages", headers, body
    session = {"x-gateway-session": conversation} if kind == "gs" else {"session-id": conversation}
    body = {"model": MODEL, "messages": [{"role": "system", "content": system}, *messages]}
    return "/v1/chat/completions", {**bearer, **session}, {**body, "max_tokens": workload.MAX_TOKENS}


def error_code(payload: bytes) -> str:
    try:
        error = json.loads(payload).get("error") or {}
    except (ValueError, AttributeError):
        return "not json"
    return str(error.get("code") or error.get("type") or "") if isinstance(error, dict) else ""


async def send(
    session: aiohttp.ClientSession, url: str, kind: str, conversation: str, turn: int
) -> tuple[int, str]:
    path, headers, body = request(kind, conversation, turn)
    try:
        async with session.post(url + path, data=json.dumps(body), headers=headers) as answer:
            payload = await answer.read()
            return answer.status, "" if answer.status == 200 else error_code(payload)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return 0, type(exc).__name__


async def clients(url: str, s: workload.Settings, rate: float) -> list[Turn]:
    """Every slot's conversations, open loop: slot i sends at i/rate, then every slots/rate seconds (a
    turn whose previous answer is late goes as soon as it comes). Slot i's first conversation is joined
    at its turn `workload.first_turn(i)`, as if the run began in the middle of agents' work, so
    conversations end, and new ones begin, all along the run rather than all together."""
    period = s.slots / rate
    started = time.monotonic()
    turns: list[Turn] = []

    async def slot(index: int, session: aiohttp.ClientSession) -> None:
        kind, generation, turn, due = workload.kind_of(index), 0, workload.first_turn(index, s), index / rate
        while due < s.duration_s:
            await asyncio.sleep(max(started + due - time.monotonic(), 0))
            conversation = f"{kind}-{index:02d}-{generation:03d}"
            sent = time.monotonic() - started
            status, code = await send(session, url, kind, conversation, turn)
            turns.append(Turn(round(sent, 3), kind, conversation, turn, status, code))
            turn, due = turn + 1, due + period
            if turn > s.turns:
                generation, turn = generation + 1, 1

    timeout = aiohttp.ClientTimeout(total=RETRY["default_deadline_ms"] / 1000 + DRAIN_S)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        await asyncio.gather(*(slot(i, session) for i in range(s.slots)))
    return turns


async def watch_circuits(
    url: str, names: list[str], wall0: float, stop: asyncio.Event
) -> list[CircuitSample]:
    """The circuit rows of accounts `names`, read every WATCH_S until `stop`, each change once; instants
    on the phase clock (`wall0`: the Unix time of its start)."""
    found: list[CircuitSample] = []
    last: dict[tuple[str, str], tuple[str, int, float | None]] = {}
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, application_name="bench-pool-watch"
    ) as conn:
        while not stop.is_set():
            rows = await (await conn.execute(CIRCUITS_SQL, [names])).fetchall()
            t = round(time.time() - wall0, 3)
            for name, model, route_class, state, cooldown, until in rows:
                opened = None if until is None else round(until.timestamp() - cooldown - wall0, 3)
                key, seen = (name, f"{model}:{route_class}"), (state, cooldown, opened)
                if last.get(key) != seen:
                    last[key] = seen
                    found.append(CircuitSample(t, name, key[1], state, cooldown, opened))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), WATCH_S)
    return found


async def observed(
    url: str, s: workload.Settings, rate: float, database_url: str, names: list[str], wall0: float
) -> tuple[list[Turn], list[CircuitSample]]:
    """The clients' turns, and the circuits of accounts `names` while they ran."""
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch_circuits(database_url, names, wall0, stop))
    try:
        turns = await clients(url, s, rate)
    finally:
        stop.set()
    return turns, await watcher


def upstream_call(root: str, method: str, path: str) -> dict[str, Any]:
    async def call() -> dict[str, Any]:
        async with aiohttp.ClientSession() as session, session.request(method, root + path) as answer:
            answer.raise_for_status()
            return await answer.json()

    return asyncio.run(call())


def gateway_cpu(gateway: GatewayNode, application: str) -> tuple[float | None, dict[int, float] | None]:
    return accounting.tree_cpu_seconds(gateway.pid), accounting.backend_cpu(gateway.database.url, application)


def phase(
    name: str,
    features: bool,
    args: argparse.Namespace,
    upstream: str,
    s: workload.Settings,
    pace: workload.Pace,
) -> dict[str, Any]:
    specs = workload.accounts(s)
    workdir = OUT / name
    workdir.mkdir(parents=True, exist_ok=True)
    application = f"bench-pool-{name}"
    database = Database.create(workdir, server_url=args.database_url)
    env = {
        "GATEWAY_POOL_FEATURES": "true" if features else "false",
        UPSTREAM_KEY_ENV: UPSTREAM_KEY,
        "PGAPPNAME": application,
    }
    gateway = GatewayNode(database, workdir, env_extra=env, workers=2)
    try:
        gateway.prepare(gateway_config(specs, upstream))
        gateway.start()
        log(
            f"{name}: gateway up at {gateway.url} (GATEWAY_POOL_FEATURES={env['GATEWAY_POOL_FEATURES']}), "
            f"{pace.rate:.1f} turns/s for {s.duration_s:.0f} s ..."
        )
        wall0 = upstream_call(upstream, "POST", "/_pool/reset")["wall"]
        cpu_before, backends_before = gateway_cpu(gateway, application)
        heals = workload.heals(specs)
        turns, circuits = asyncio.run(observed(gateway.url, s, pace.rate, database.url, sorted(heals), wall0))
        cpu_after, backends_after = gateway_cpu(gateway, application)
        events = upstream_call(upstream, "GET", "/_pool/events")["events"]
    finally:
        gateway.kill()
        database.drop()
    found = figures.phase_figures([tuple(e) for e in events], turns, specs, heals, circuits)
    own = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    backends = accounting.backend_cpu_spent(backends_before, backends_after)
    found["circuits"] = [sample.__dict__ for sample in circuits]
    found["cpu_ms"] = {
        "gateway": None if own is None else own * 1000 / len(turns),
        "postgres": None if backends is None else backends * 1000 / len(turns),
    }
    (workdir / "figures.json").write_text(json.dumps(found, indent=2) + "\n")
    (workdir / "events.json").write_text(json.dumps(events) + "\n")
    log(f"{name}: {json.dumps(found['client'])}")
    return found


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="make bench-pool: pool efficiency, pool features on and off")
    p.add_argument(
        "--quick", action="store_true", help="a ~1 minute smoke run (shorter phases, fewer clients)"
    )
    p.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_POOL_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
        help="a PostgreSQL server: each phase's gateway runs on a fresh database created there and dropped "
        "after (env BENCH_POOL_DATABASE_URL)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    OUT.mkdir(parents=True, exist_ok=True)
    procs = Processes(OUT)
    atexit.register(procs.stop_all)
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    s = workload.settings(args.quick)
    specs = workload.accounts(s)
    pace = workload.pace(s, specs)
    accounts_file = OUT / "accounts.json"
    accounts_file.write_text(json.dumps([spec.to_json() for spec in specs], indent=1))
    port = free_port()
    procs.start(
        "pool-upstream",
        [PYTHON, "-m", "devkit.pool_upstream", "--port", str(port), "--accounts", str(accounts_file)],
    )
    upstream = f"http://{HOST}:{port}"
    for _ in range(100):
        try:
            upstream_call(upstream, "GET", "/_pool/events")
            break
        except (aiohttp.ClientError, OSError):
            time.sleep(0.1)
    context = report.context(ROOT, args.quick, s, pace, specs, CIRCUIT, RETRY)
    phases = {
        "on": phase("on", True, args, upstream, s, pace),
        "off": phase("off", False, args, upstream, s, pace),
    }
    procs.stop_all()
    context["elapsed_s"] = round(time.monotonic() - started)
    (OUT / "results.json").write_text(json.dumps({"context": context, "phases": phases}, indent=2) + "\n")
    report.write(report.render(context, phases), report.summary(context, phases))
    log(f"wrote bench/pool.md and its summary in bench/results.md in {context['elapsed_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
