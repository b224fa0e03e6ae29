"""Writes to keys and their budgets, and the stored credentials' rotation. The YAML configuration's
writes are `gatewayconfig.services`."""

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction

from pools import credentials
from pools.models import (
    Assignment,
    BudgetHold,
    GatewayKey,
    Pool,
    new_key_secret,
)
from routing.policy.budget import period_start
from runtime import rawsql


class KeyRefused(ValueError):
    """A key operation refused, with the operator-facing reason (nothing was written)."""


def parse_overlap(text: str) -> timedelta:
    """`0`, or a whole number with a unit: `90s`, `30m`, `24h`, `7d`."""
    match = re.fullmatch(r"(\d{1,6})([smhd]?)", text.strip())
    if match is None or (match[2] == "" and match[1] != "0"):
        raise KeyRefused(f"overlap {text!r}: expected 0 or a number with s, m, h or d (e.g. 24h)")
    return timedelta(seconds=int(match[1]) * {"": 0, "s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]])


@dataclass(frozen=True, slots=True)
class KeyTerms:
    """A key's budget and limits as the CLI gives them (None: none)."""

    budget_micros: int | None = None
    budget_period: str = ""  # day | week | month; empty: a lifetime budget
    rpm: int | None = None
    tpm: int | None = None
    concurrent: int | None = None


@transaction.atomic
def gateway_key_create(
    *,
    name: str,
    pool_names: list[str],
    allowed_models: list[str],
    expires_at: datetime | None,
    terms: KeyTerms = KeyTerms(),
) -> tuple[GatewayKey, str]:
    """A new key with a generated secret; the secret is returned once and only its hash is stored.
    Without `allowed_models` it may use every model of its pools (`*`, as in the YAML and admin)."""
    if not name or len(name) > GatewayKey._meta.get_field("name").max_length:
        raise KeyRefused("a key name is 1 to 100 characters")
    if GatewayKey.objects.filter(name=name).exists():
        raise KeyRefused(f"a key named {name!r} exists (rotate_key replaces its secret)")
    pools = {p.name: p for p in Pool.objects.filter(name__in=pool_names)}
    missing = [p for p in pool_names if p not in pools]
    if missing or not pool_names:
        raise KeyRefused(f"unknown pool(s): {', '.join(missing)}" if missing else "name at least one pool")
    secret = new_key_secret()
    key = GatewayKey(
        name=name,
        allowed_models=allowed_models or ["*"],
        expires_at=expires_at,
        budget_micros=terms.budget_micros,
        budget_period=terms.budget_period,
        limit_rpm=terms.rpm,
        limit_tpm=terms.tpm,
        limit_concurrent=terms.concurrent,
    )
    key.set_key(secret)
    key.save()
    key.pools.set(pools.values())
    return key, secret


@transaction.atomic
def gateway_key_rotate(*, name: str, overlap: timedelta, now: datetime) -> tuple[GatewayKey, str]:
    """A new generated secret for the key; the replaced one stays valid for `overlap` (0: not at all)."""
    key = GatewayKey.objects.select_for_update().filter(name=name).first()
    if key is None:
        raise KeyRefused(f"no key named {name!r}")
    secret = new_key_secret()
    key.rotate(secret, valid_until=now + overlap if overlap else None)
    key.save(
        update_fields=["key_hash", "prefix", "previous_key_hash", "previous_prefix", "previous_valid_until"]
    )
    return key, secret


# -- budgets (SPEC §7.4): hand-written conditional UPDATEs, one statement each ---------------------


def _period_sql(start: datetime | None) -> tuple[str, str, list[object]]:
    """(this period's spend, the period start to store, their params) as SQL over the key's row."""
    if start is None:
        return "spent_micros", "period_start", []
    at = rawsql.as_param(start)
    current = "(CASE WHEN period_start IS NOT NULL AND period_start >= %s THEN spent_micros ELSE 0 END)"
    stored = "(CASE WHEN period_start IS NOT NULL AND period_start >= %s THEN period_start ELSE %s END)"
    return current, stored, [at]


def _budget_reserve_parts(
    key_id: int, request_id: str, amount: int, period: str, now: datetime
) -> tuple[str, list[object], str, list[object]]:
    """The reservation's conditional UPDATE and the hold's upsert clause, with their parameters."""
    table = GatewayKey._meta.db_table
    current, stored, at = _period_sql(period_start(period, now))
    reserve = (
        f"UPDATE {table} SET spent_micros = {current}, period_start = {stored}, "  # noqa: S608
        "reserved_micros = reserved_micros + %s "
        f"WHERE id = %s AND budget_micros IS NOT NULL AND {current} + reserved_micros + %s <= budget_micros"
    )
    params = [*at, *(at * 2), amount, key_id, *at, amount]
    holds = BudgetHold._meta.db_table
    upsert = f"ON CONFLICT (request_id) DO UPDATE SET micros = {holds}.micros + excluded.micros"
    return reserve, params, upsert, [request_id, amount, rawsql.as_param(now)]


def key_budget_reserve_statement(
    *, key_id: int, request_id: str, amount: int, period: str, now: datetime
) -> tuple[str, list[object]]:
    """`key_budget_reserve` on PostgreSQL as one statement (a data-modifying WITH) and its parameters:
    it changes one row (the hold's) when the reservation is granted, none when it is not. Run as it
    is by the request path on the event loop (runtime.loopdb)."""
    reserve, params, upsert, hold = _budget_reserve_parts(key_id, request_id, amount, period, now)
    sql = (
        f"WITH reserved AS ({reserve} RETURNING id) "  # noqa: S608
        f"INSERT INTO {BudgetHold._meta.db_table} (request_id, key_id, micros, created_at) "
        f"SELECT %s, id, %s, %s FROM reserved {upsert}"
    )
    return sql, [*params, *hold]


def key_budget_reserve(*, key_id: int, request_id: str, amount: int, period: str, now: datetime) -> bool:
    """Hold `amount` micros of the key's budget for the request `request_id` in flight, if this
    period's spend plus what is held plus `amount` stays within the budget: one conditional UPDATE, so
    requests on any number of nodes can together pass the budget by at most one reservation's
    estimate error. The request's `BudgetHold` grows by `amount` with it, atomically: in the same
    statement on PostgreSQL (a data-modifying WITH, `key_budget_reserve_statement`), in the same
    transaction on SQLite (which has none). False: the budget cannot cover it (nothing changed)."""
    request = {"key_id": key_id, "request_id": request_id, "amount": amount, "period": period, "now": now}
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(*key_budget_reserve_statement(**request))
            return cursor.rowcount == 1
        reserve, params, upsert, hold = _budget_reserve_parts(key_id, request_id, amount, period, now)
        holds = BudgetHold._meta.db_table
        with transaction.atomic():
            cursor.execute(reserve, params)
            if cursor.rowcount != 1:
                return False
            columns = "(request_id, key_id, micros, created_at)"
            cursor.execute(
                f"INSERT INTO {holds} {columns} VALUES (%s, %s, %s, %s) {upsert}",  # noqa: S608
                [request_id, key_id, *hold[1:]],
            )
            return True


_SETTLE_CHUNK = 1000  # keys a statement settles (3 parameters each: well within SQLite's 32,766)


def keys_budget_settle(*, settled: Mapping[tuple[int, str], Sequence[int]], now: datetime) -> None:
    """Release what requests held and add what they cost: `settled` maps (key id, budget period) to
    (released, charged), added in each key's current period. One UPDATE per period present, whatever the
    number of keys (a statement a key made a ledger batch over many keys as many round trips as
    records). On PostgreSQL the keys' rows are first locked in id order, so two nodes' batches over the
    same keys take their locks in the same order and cannot deadlock."""
    if not settled:
        return
    table = GatewayKey._meta.db_table
    by_period: dict[str, list[int]] = {}
    for (key_id, period), (released, charged) in sorted(settled.items()):
        by_period.setdefault(period, []).extend((key_id, released, charged))
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql" and len(settled) > 1:
            ids = sorted({key_id for key_id, _ in settled})
            lock = f"SELECT id FROM {table} WHERE id = ANY(%s::bigint[]) ORDER BY id FOR UPDATE"  # noqa: S608
            cursor.execute(lock, [ids])
        for period, values in by_period.items():
            current, stored, at = _period_sql(period_start(period, now))
            for start in range(0, len(values), 3 * _SETTLE_CHUNK):
                chunk = values[start : start + 3 * _SETTLE_CHUNK]
                rows = ", ".join(["(%s, %s, %s)"] * (len(chunk) // 3))
                sql = (
                    f"WITH settled (id, released, charged) AS (VALUES {rows}) "  # noqa: S608
                    f"UPDATE {table} SET reserved_micros = CASE WHEN reserved_micros > settled.released "
                    "THEN reserved_micros - settled.released ELSE 0 END, "
                    f"spent_micros = {current} + settled.charged, period_start = {stored} "
                    f"FROM settled WHERE {table}.id = settled.id"
                )
                cursor.execute(sql, [*chunk, *at, *(at * 2)])


def budget_holds_take(*, request_ids: list[str]) -> dict[str, int]:
    """Delete the requests' holds; what each held (a request without one held nothing). The caller
    releases it from the keys (`proxy.ledger.services.exchanges_settle`), in the same transaction."""
    if not request_ids:
        return {}
    holds = BudgetHold._meta.db_table
    among = rawsql.placeholders(len(request_ids))
    sql = f"DELETE FROM {holds} WHERE request_id IN ({among}) RETURNING request_id, micros"  # noqa: S608
    return dict(rawsql.fetch(sql, request_ids))


def key_budget_release_statement(*, key_id: int, request_id: str, amount: int) -> tuple[str, list[object]]:
    """Release `amount` of what the request holds (the part of its reservation its answer did not
    cost), from its hold and its key together, as one statement (a data-modifying WITH on PostgreSQL,
    run on the event loop by runtime.loopdb; `key_budget_release` elsewhere). Only what its hold still
    has: a hold its ledger record settled meanwhile is not released twice."""
    holds, keys = BudgetHold._meta.db_table, GatewayKey._meta.db_table
    sql = (
        f"WITH released AS (UPDATE {holds} SET micros = micros - %s "  # noqa: S608
        "WHERE request_id = %s AND key_id = %s AND micros >= %s RETURNING key_id) "
        f"UPDATE {keys} SET reserved_micros = CASE WHEN reserved_micros > %s THEN reserved_micros - %s "
        "ELSE 0 END WHERE id IN (SELECT key_id FROM released)"
    )
    return sql, [amount, request_id, key_id, amount, amount, amount]


@transaction.atomic
def key_budget_release(*, key_id: int, request_id: str, amount: int) -> None:
    """`key_budget_release_statement` without a WITH that writes (SQLite): two statements, one transaction."""
    holds, keys = BudgetHold._meta.db_table, GatewayKey._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {holds} SET micros = micros - %s "  # noqa: S608
            "WHERE request_id = %s AND key_id = %s AND micros >= %s",
            [amount, request_id, key_id, amount],
        )
        if cursor.rowcount == 1:
            cursor.execute(
                f"UPDATE {keys} SET reserved_micros = CASE WHEN reserved_micros > %s "  # noqa: S608
                "THEN reserved_micros - %s ELSE 0 END WHERE id = %s",
                [amount, amount, key_id],
            )


@transaction.atomic
def key_budget_give_back(*, key_id: int, request_id: str, amount: int, period: str, now: datetime) -> None:
    """Give back a reservation of `amount` the request stopped waiting for (`runtime.db.write_within`'s
    undo: it was granted after the request's deadline, or after its client left): only what its
    hold still has of it, so a hold its ledger record settled meanwhile is not released twice."""
    holds = BudgetHold._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {holds} SET micros = micros - %s WHERE request_id = %s AND micros >= %s",  # noqa: S608
            [amount, request_id, amount],
        )
        if cursor.rowcount != 1:
            return
        cursor.execute(f"DELETE FROM {holds} WHERE request_id = %s AND micros = 0", [request_id])  # noqa: S608
    keys_budget_settle(settled={(key_id, period): (amount, 0)}, now=now)


@dataclass(frozen=True, slots=True)
class CredentialRotation:
    rotated: int = 0
    unreadable: tuple[str, ...] = ()  # assignment names
    key_missing: bool = False


def credentials_rotate() -> CredentialRotation:
    """Every stored credential re-encrypted under the first key. Each row is a compare-and-swap on the
    token read, so a credential set in admin meanwhile is never overwritten with the old one."""
    if not credentials.can_encrypt():
        return CredentialRotation(key_missing=True)
    rotated, unreadable = 0, []
    for pk, name, token in Assignment.objects.exclude(credential="").values_list("pk", "name", "credential"):
        try:
            fresh = credentials.credential_rotate(token)
        except credentials.CredentialUnreadable:
            unreadable.append(name)
            continue
        rotated += Assignment.objects.filter(pk=pk, credential=token).update(credential=fresh)
    return CredentialRotation(rotated=rotated, unreadable=tuple(unreadable))
