"""The request path's routing cost at 2 and 200 accounts x 20 models, in process (bench/scale/profile.md).

Not collected by the suite (no `test_` prefix): run it by name,
`python -m pytest tests/routing/scale_measure.py -n 0 -s`. Each size is a pool of N accounts (tier 0,
weight 1, as `make bench-scale` configures them) serving 20 models, with a latency row and a recent load for
every route (as the ledger writer keeps them); the loop is what `proxy.ingress` does per request once the
key's read is back: `routing_inputs_load` on the read's health and the cached configuration, then
`decide` with a fresh draw, each with its own `now`. Timed with
`time.thread_time` (this thread's CPU, not the wall: the machine's other load does not count), best of
REPEATS runs of LOOPS requests.
"""

import random
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from catalog.models import CatalogEntry
from pools.models import Assignment
from routing.models import Latency
from routing.policy.route import decide
from routing.policy.types import Requirements, RouteClass
from routing.request_state import request_state_load
from routing.selectors import config_snapshot, routing_inputs_load
from tests.factories import GatewayKeyFactory, PoolFactory

pytestmark = pytest.mark.django_db

MODELS = ("gpt-5", *(f"model-{i:02d}" for i in range(1, 20)))
LOOPS = 2000
REPEATS = 5
RAW = "sk-gw-scale-measure-0123456789abcdef"


def _pool(accounts: int):
    pool = PoolFactory(name=f"scale-{accounts}")
    assignments = Assignment.objects.bulk_create(
        Assignment(
            pool=pool,
            name=f"s{accounts}-a{i:03d}",
            adapter="openai",
            base_url=f"http://127.0.0.1:{19000 + i}/v1",
        )
        for i in range(accounts)
    )
    entries = CatalogEntry.objects.bulk_create(
        CatalogEntry(assignment=a, model=m, provenance="configured") for a in assignments for m in MODELS
    )
    now = timezone.now()
    Latency.objects.bulk_create(
        Latency(
            assignment=e.assignment,
            model=e.model,
            ewma_ms=40 + e.pk % 50,
            samples=100,
            updated_at=now - timedelta(seconds=e.pk % 7),
            load=1.0 + e.pk % 13,
        )
        for e in entries
    )
    key = GatewayKeyFactory(raw_key=f"{RAW}-{accounts}", pools=[pool])
    return pool, key


def _measure(accounts: int) -> dict[str, float]:
    _pool(accounts)
    raw = f"{RAW}-{accounts}"
    now = timezone.now()
    state = request_state_load(raw, route_class=RouteClass.HTTP, now=now)
    assert state is not None
    key = state.authenticated.key
    pool_ids, version = key.pool_ids, state.authenticated.config_version
    config = config_snapshot(pool_ids, version, now)
    rng = random.Random(7)
    best = {"inputs": float("inf"), "decide": float("inf")}
    for _ in range(REPEATS):
        spent = {"inputs": 0.0, "decide": 0.0}
        for i in range(LOOPS):
            at = now + timedelta(milliseconds=i)
            t0 = time.thread_time()
            inputs = routing_inputs_load(
                pool_ids=pool_ids,
                route_class=RouteClass.HTTP,
                now=at,
                affinities=state.affinities,
                config_version=version,
                health=state.health,
                config=config,
            )
            t1 = time.thread_time()
            decision = decide(inputs.view, key, "gpt-5", Requirements(), draw=rng.random())
            t2 = time.thread_time()
            spent["inputs"] += t1 - t0
            spent["decide"] += t2 - t1
            assert decision.plan is not None and decision.plan.order
        for part, total in spent.items():
            best[part] = min(best[part], total / LOOPS * 1e6)
    return best


def test_measure_2_and_200_accounts():
    found = {n: _measure(n) for n in (2, 200)}
    for n, parts in found.items():
        total = parts["inputs"] + parts["decide"]
        print(
            f"\n{n:>3} accounts x 20 models: routing_inputs_load {parts['inputs']:.1f} us, "
            f"decide {parts['decide']:.1f} us, total {total:.1f} us per request"
        )


def test_profile_200_accounts():
    import cProfile
    import pstats

    global LOOPS, REPEATS
    LOOPS, REPEATS = 300, 1
    profile = cProfile.Profile()
    profile.enable()
    _measure(int(__import__("os").environ.get("ACCOUNTS", "200")))
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(25)


def test_parts_200_accounts():
    from routing import selectors
    from routing.policy import eligibility, plan, preference

    _pool(200)
    now = timezone.now()
    state = request_state_load(f"{RAW}-200", route_class=RouteClass.HTTP, now=now)
    key = state.authenticated.key
    config = config_snapshot(key.pool_ids, state.authenticated.config_version, now)
    base = config.routes["gpt-5"]
    h = state.health
    rng = random.Random(1)

    def t(name, fn, loops=500):
        best = float("inf")
        for _ in range(3):
            t0 = time.thread_time()
            for i in range(loops):
                fn(i)
            best = min(best, (time.thread_time() - t0) / loops * 1e6)
        print(f"\n{name}: {best:.1f} us")

    t(
        "with_latency",
        lambda i: selectors.with_latency(
            base, h.latency, h.headroom, now + timedelta(milliseconds=i), h.load
        ),
    )
    measured = selectors.with_latency(base, h.latency, h.headroom, now, h.load)
    t("gate", lambda i: eligibility.gate(measured, Requirements()))
    t("order draw", lambda i: preference.order(measured, rng.random()))
    t("order", lambda i: preference.order(measured))
    t(
        "build_plan",
        lambda i: plan.build_plan(
            primary=measured,
            requirements=Requirements(),
            allowed_models=["*"],
            max_attempts=3,
            draw=rng.random(),
        ),
    )
