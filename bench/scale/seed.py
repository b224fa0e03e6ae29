"""Bulk data for `make bench-scale`, written into the database `DATABASE_URL` names (a gateway's, already
migrated and loaded with its YAML): run as `python -m bench.scale.seed WHAT ...` beside the gateway, with
the gateway's environment.

- `keys N --pool P`: N gateway keys of pool P, named `scale-key-000000`..., whose secrets are
  `key_secret(i)`; written by bulk_create (the secrets hashed as `pools.models.hash_key` does), so 100,000
  take seconds rather than the minutes `create_key` would.
- `latency --pool P`: a latency row for every (assignment, model) route of pool P, as a pool whose every
  route has served holds (`routing.models.Latency`): the request path reads them all (SPEC §5.4).
- `ledger N --days D`: N request records spread evenly over the last D days up to now, over the keys and
  the catalog's routes that exist, one attempt each and a handed-off second one for every twentieth
  (INSERT ... SELECT generate_series in chunks: PostgreSQL writes them at its own speed, no Python per
  row); then the spend page's daily totals (proxy.ledger.models.DailySpend) built from them by their
  migration's backfill (proxy migrated back before it and forward again),
  as the ledger writer would have kept them;
  then VACUUM ANALYZE, as a database that has lived through them would have its statistics.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import django

CHUNK = 1_000_000  # ledger rows per INSERT statement


def key_secret(index: int) -> str:
    """The secret of bulk key `index` (what a client of the bench sends)."""
    return f"sk-gw-scale-{index:012d}-0000"


def key_name(index: int) -> str:
    return f"scale-key-{index:06d}"


def seed_keys(count: int, pool_name: str, start: int = 0) -> None:
    from django.db import transaction

    from pools.models import GatewayKey, Pool, hash_key

    pool = Pool.objects.get(name=pool_name)
    through = GatewayKey.pools.through
    batch = 5000
    with transaction.atomic():
        for first in range(start, start + count, batch):
            indexes = range(first, min(first + batch, start + count))
            keys = [
                GatewayKey(
                    name=key_name(i),
                    key_hash=hash_key(key_secret(i)),
                    prefix=key_secret(i)[:10],
                    allowed_models=["*"],
                )
                for i in indexes
            ]
            created = GatewayKey.objects.bulk_create(keys)
            through.objects.bulk_create([through(gatewaykey_id=k.pk, pool_id=pool.pk) for k in created])


def seed_latency(pool_name: str) -> int:
    """A latency row for every route of the pool; how many."""
    from django.db import connection

    from catalog.models import CatalogEntry
    from pools.models import Assignment, Pool
    from routing.models import Latency

    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {Latency._meta.db_table} "  # noqa: S608 - table names from the models
            "(assignment_id, model, ewma_ms, samples, updated_at, load) "
            "SELECT c.assignment_id, c.model, 40 + (c.id %% 50), 100, now(), 0 "
            f"FROM {CatalogEntry._meta.db_table} c "
            f"JOIN {Assignment._meta.db_table} a ON a.id = c.assignment_id "
            f"WHERE a.pool_id = %s ON CONFLICT DO NOTHING",
            [Pool.objects.get(name=pool_name).pk],
        )
        return cursor.rowcount


# Request records spread over the window, newest at now; outcomes, transports and a second attempt in
# fixed proportions (one in fifty failed, one in ten streamed, one in twenty handed off).
RECORDS_SQL = """
INSERT INTO {records} (request_id, key_id, route, transport, requested_model, served_model, operation_id,
                       outcome, status_code, retry_count, started_at, finished_at)
SELECT 'scale_' || lpad(to_hex(g), 12, '0'),
       (%(keys)s::bigint[])[1 + g %% cardinality(%(keys)s::bigint[])],
       '/v1/chat/completions',
       CASE WHEN g %% 10 = 0 THEN 'sse' ELSE 'http' END,
       (%(models)s::text[])[1 + g %% cardinality(%(models)s::text[])],
       (%(models)s::text[])[1 + g %% cardinality(%(models)s::text[])],
       'scale_' || lpad(to_hex(g), 12, '0'),
       CASE WHEN g %% 50 = 0 THEN 'upstream_timeout' ELSE 'ok' END,
       CASE WHEN g %% 50 = 0 THEN 504 ELSE 200 END,
       CASE WHEN g %% 20 = 0 THEN 1 ELSE 0 END,
       %(start)s::timestamptz + (g - 1) * %(step)s::interval,
       %(start)s::timestamptz + (g - 1) * %(step)s::interval + (200 + g %% 900) * interval '1 millisecond'
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
"""

# One attempt per record (the second candidate's, when the record was handed off, ordinal 2 after the
# first's retryable failure); its assignment one of those serving its model.
ATTEMPTS_SQL = """
INSERT INTO {attempts} (request_id, ordinal, assignment_id, model, route_class, status, failure_class,
                        ineligible_reason, dispatch_state, upstream_status, error_code, elapsed_ms,
                        input_tokens, output_tokens, cached_read_tokens, cached_write_tokens, cost_micros,
                        config_version)
SELECT r.id, o.ordinal,
       (%(assignments)s::bigint[])[1 + (r.id + o.ordinal) %% cardinality(%(assignments)s::bigint[])],
       r.served_model, r.transport,
       CASE WHEN o.ordinal = 1 AND r.retry_count = 1 THEN 'retryable_failed'
            WHEN r.outcome = 'ok' THEN 'succeeded' ELSE 'failed' END,
       CASE WHEN o.ordinal = 1 AND r.retry_count = 1 THEN 'upstream_rate_limited'
            WHEN r.outcome = 'ok' THEN '' ELSE 'timeout' END,
       '',
       CASE WHEN o.ordinal = 1 AND r.retry_count = 1 THEN 'rejected' ELSE 'completed' END,
       CASE WHEN o.ordinal = 1 AND r.retry_count = 1 THEN 429 WHEN r.outcome = 'ok' THEN 200 ELSE NULL END,
       CASE WHEN o.ordinal = 1 AND r.retry_count = 1 THEN 'rate_limit_exceeded' ELSE '' END,
       150 + r.id %% 700,
       1000 + r.id %% 3000, 100 + r.id %% 400, (r.id %% 3) * 500, NULL,
       CASE WHEN r.id %% 25 = 0 THEN NULL ELSE 1500 + r.id %% 6000 END,
       1
FROM {records} r
CROSS JOIN LATERAL (SELECT 1 AS ordinal UNION ALL SELECT 2 WHERE r.retry_count = 1) o
WHERE r.id BETWEEN %(lo)s AND %(hi)s
"""


def seed_ledger(rows: int, days: float, log=print, vacuum: bool = True) -> dict[str, float]:
    """`rows` request records (and their attempts) over the last `days` days; seconds each step took.
    `vacuum`: then VACUUM ANALYZE both tables (outside any transaction)."""
    from datetime import timedelta

    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from catalog.models import CatalogEntry
    from pools.models import GatewayKey
    from proxy.ledger.models import Attempt, DailySpend, RequestRecord

    keys = list(GatewayKey.objects.order_by("pk").values_list("pk", flat=True)[:1000])
    routes = list(
        CatalogEntry.objects.order_by("model", "assignment_id").values_list("model", "assignment_id")
    )
    models = sorted({m for m, _ in routes})
    assignments = sorted({a for _, a in routes})
    now = timezone.now()
    step = timedelta(days=days) / max(rows, 1)
    tables = {"records": RequestRecord._meta.db_table, "attempts": Attempt._meta.db_table}
    took: dict[str, float] = {}
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT coalesce(max(id), 0) FROM {tables['records']}")  # noqa: S608
        base = cursor.fetchone()[0]
        started = time.monotonic()
        for first in range(1, rows + 1, CHUNK):
            last = min(first + CHUNK - 1, rows)
            params = {
                "keys": keys,
                "models": models,
                "start": now - timedelta(days=days),
                "step": step,
                "first": first,
                "last": last,
            }
            cursor.execute(RECORDS_SQL.format(**tables), params)
            log(f"  ledger: {last:,} of {rows:,} request records")
        took["records_s"] = time.monotonic() - started
        started = time.monotonic()
        for lo in range(base + 1, base + rows + 1, CHUNK):
            params = {"assignments": assignments, "lo": lo, "hi": lo + CHUNK - 1}
            cursor.execute(ATTEMPTS_SQL.format(**tables), params)
        took["attempts_s"] = time.monotonic() - started
    started = time.monotonic()
    call_command("migrate", "proxy", "0005", verbosity=0)
    call_command("migrate", "proxy", verbosity=0)
    took["daily_spend_backfill_s"] = time.monotonic() - started
    if not vacuum:
        return took
    started = time.monotonic()
    with connection.cursor() as cursor:  # outside a transaction: VACUUM refuses to run in one
        cursor.execute(f"VACUUM ANALYZE {tables['records']}")
        cursor.execute(f"VACUUM ANALYZE {tables['attempts']}")
        cursor.execute(f"VACUUM ANALYZE {DailySpend._meta.db_table}")
    took["vacuum_s"] = time.monotonic() - started
    return took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="bulk data for make bench-scale")
    sub = p.add_subparsers(dest="what", required=True)
    k = sub.add_parser("keys")
    k.add_argument("count", type=int)
    k.add_argument("--pool", required=True)
    k.add_argument("--start", type=int, default=0)
    lat = sub.add_parser("latency")
    lat.add_argument("--pool", required=True)
    led = sub.add_parser("ledger")
    led.add_argument("rows", type=int)
    led.add_argument("--days", type=float, default=30)
    args = p.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gatewaysite.settings")
    django.setup()
    started = time.monotonic()
    if args.what == "keys":
        seed_keys(args.count, args.pool, args.start)
        print(f"created {args.count} keys in {time.monotonic() - started:.1f} s")
    elif args.what == "latency":
        print(f"created {seed_latency(args.pool)} latency rows")
    else:
        print(f"ledger: {seed_ledger(args.rows, args.days)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
