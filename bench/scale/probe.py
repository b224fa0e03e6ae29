"""Timings inside Django for `make bench-scale`, on the database `DATABASE_URL` names: run as
`python -m bench.scale.probe WHAT ...` beside the gateway, with its environment; prints one JSON object.

- `admin`: the operator pages a superuser opens (the request list, one request's page, the spend page,
  /admin/upstreams/ with its per-model leaderboard), each through Django's test client as the admin
  serves it: the median of `--repeat` renders after one discarded, its queries and its slowest query;
  then, with `--prune-days D`, `manage.py prune_ledger --days D` once.
- `routing --key NAME --model M --secret S`: the routing decision the request path makes (`decide` on
  the loaded inputs, in a loop), the request path's one statement (`request_state_query`, narrowed to
  the model as for a key read before, with and without the latency rows) under EXPLAIN ANALYZE, and
  `manage.py routing_explain` and /admin/upstreams/ with their query counts.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from typing import Any

import django

PROBE_USER = "scale-probe"


SLOW_MS = 2000  # a first call slower than this is the measurement: no repetition


def timed(call, repeat: int) -> dict[str, Any]:
    """`call()` once to warm, then `repeat` times: median and worst milliseconds, queries of the last. A
    first call over SLOW_MS is the one measurement (a page of a minute is not rendered five more times)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    times: list[float] = []
    for attempt in range(repeat + 1):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            call()
            took = (time.perf_counter() - started) * 1000
        if attempt:
            times.append(took)
        elif took > SLOW_MS:
            times.append(took)
            break
    slowest = max(queries.captured_queries, key=lambda q: float(q["time"]), default=None)
    return {
        "ms": statistics.median(times),
        "max_ms": max(times),
        "queries": len(queries.captured_queries),
        "slowest_query_ms": float(slowest["time"]) * 1000 if slowest else None,
        "slowest_query": slowest["sql"][:300] if slowest else None,
    }


def client():
    from django.contrib.auth import get_user_model
    from django.test import Client

    user, created = get_user_model().objects.get_or_create(
        username=PROBE_USER, defaults={"is_staff": True, "is_superuser": True}
    )
    if created:
        user.set_unusable_password()
        user.save()
    c = Client(SERVER_NAME="127.0.0.1")
    c.force_login(user)
    return c


def page(c, url: str):
    def get() -> None:
        answer = c.get(url)
        if answer.status_code != 200:
            raise RuntimeError(f"GET {url} answered {answer.status_code}")

    return get


def probe_admin(repeat: int, prune_days: int | None) -> dict[str, Any]:
    from django.core.management import call_command

    from proxy.ledger.models import RequestRecord

    c = client()
    found: dict[str, Any] = {"rows": RequestRecord.objects.count()}
    middle = RequestRecord.objects.order_by("pk").values_list("pk", flat=True)[
        found["rows"] // 2 : found["rows"] // 2 + 1
    ]
    pages = {
        "request_list": "/admin/proxy/requestrecord/",
        "spend": "/admin/spend/",
        "upstreams": "/admin/upstreams/",
    }
    if middle:
        pages["request_page"] = f"/admin/proxy/requestrecord/{middle[0]}/change/"
    for name, url in pages.items():
        found[name] = timed(page(c, url), repeat)
    if prune_days is not None:
        out = io.StringIO()
        started = time.perf_counter()
        call_command("prune_ledger", days=prune_days, stdout=out)
        found["prune"] = {"ms": (time.perf_counter() - started) * 1000, "said": out.getvalue().strip()}
    return found


def probe_routing(key_name: str, secret: str, model: str, repeat: int, loops: int) -> dict[str, Any]:
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from pools.selectors import key_by_name
    from routing.affinities import Affinities
    from routing.policy.route import decide
    from routing.policy.types import Requirements, RouteClass
    from routing.request_state import narrowing, request_state_load, request_state_query
    from routing.selectors import config_snapshot, routing_inputs_load

    found: dict[str, Any] = {}
    now = timezone.now()
    key = key_by_name(key_name)
    assert key is not None, key_name
    inputs = routing_inputs_load(
        pool_ids=key.pool_ids, route_class=RouteClass.HTTP, now=now, affinities=Affinities()
    )
    requirements = Requirements()
    times = []
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(loops):
            decision = decide(inputs.view, key, model, requirements)
        times.append((time.perf_counter() - started) * 1e6 / loops)
    assert decision.plan is not None and decision.plan.order, decision.error
    found["decision_us"] = min(times)
    found["candidates"] = len(decision.plan.order) + len(decision.plan.beyond_shortlist)
    # As the request path sends it for a key read before (routing.request_state.Reader.read): narrowed
    # to the models the request plans over, and without their latency rows (kept from a read of less
    # than FIGURES_MAX_AGE_S ago: most requests under load); `figures_` the one that reads them.
    state = request_state_load(secret, route_class=RouteClass.HTTP, now=now)
    assert state is not None
    pool_ids, version = state.authenticated.key.pool_ids, state.authenticated.config_version
    config_snapshot(pool_ids, version, now)
    narrow = narrowing(pool_ids, version, model, now)
    for prefix, figures in (("", False), ("figures_", True)):
        query = request_state_query(
            secret, route_class=RouteClass.HTTP, now=now, narrow=narrow, figures=figures
        )
        assert query is not None
        explain = []
        with connection.cursor() as cursor:
            for _ in range(repeat + 1):
                cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query.sql, query.params)
                explain.append(cursor.fetchone()[0][0])
            cursor.execute(query.sql, query.params)
            found[f"{prefix}statement_rows"] = len(cursor.fetchall())
        found[f"{prefix}statement_ms"] = statistics.median(e["Execution Time"] for e in explain[1:])
        found[f"{prefix}statement_planning_ms"] = statistics.median(e["Planning Time"] for e in explain[1:])

    def explain_command() -> None:
        call_command("routing_explain", key=key_name, model=model, stdout=io.StringIO())

    found["routing_explain"] = timed(explain_command, repeat)
    found["panel"] = timed(page(client(), "/admin/upstreams/"), repeat)
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="timings inside Django for make bench-scale")
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("admin")
    a.add_argument("--repeat", type=int, default=5)
    a.add_argument("--prune-days", type=int)
    r = sub.add_parser("routing")
    r.add_argument("--key", required=True)
    r.add_argument("--secret", required=True)
    r.add_argument("--model", required=True)
    r.add_argument("--repeat", type=int, default=5)
    r.add_argument("--loops", type=int, default=200)
    args = p.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gatewaysite.settings")
    django.setup()
    if args.what == "admin":
        found = probe_admin(args.repeat, args.prune_days)
    else:
        found = probe_routing(args.key, args.secret, args.model, args.repeat, args.loops)
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
