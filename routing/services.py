"""Writes to the shared routing state (SPEC §7.1, §7.2).

Every transition is decided by the pure `routing.policy.breaker` and applied with a compare-and-swap
UPDATE guarded by the exact fields that were read, so two nodes can never both make the same
transition (for example, both take the only half-open probe slot). A loser re-reads and decides
again, a bounded number of times. Nothing here keeps state in the process.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from pools.models import Assignment, ConfigVersion, GatewaySettings
from routing.models import Affinity, AffinityKind, Circuit, Demotion, Latency
from routing.policy import breaker
from routing.policy.breaker import BreakerSettings, CircuitSnapshot
from routing.policy.latency import ALPHA, LOAD_HALF_LIFE_S, Fold
from routing.policy.types import ASSIGNMENT_WIDE, CircuitReason, CircuitState
from runtime import rawsql

CAS_TRIES = 5


@dataclass(frozen=True, slots=True)
class CircuitKey:
    pool_id: int
    assignment_id: int
    model: str
    route_class: str

    @classmethod
    def wide(cls, pool_id: int, assignment_id: int) -> "CircuitKey":
        """The assignment-wide circuit (credential_rejected): every model and route class."""
        return cls(pool_id, assignment_id, ASSIGNMENT_WIDE, ASSIGNMENT_WIDE)

    @property
    def is_wide(self) -> bool:
        return self.route_class == ASSIGNMENT_WIDE

    def filter(self) -> dict:
        return {
            "pool_id": self.pool_id,
            "assignment_id": self.assignment_id,
            "model": self.model,
            "route_class": self.route_class,
        }


def breaker_settings(settings: GatewaySettings) -> BreakerSettings:
    return BreakerSettings(
        failure_threshold=settings.failure_threshold,
        cooldown_seconds=settings.cooldown_seconds,
        max_cooldown_seconds=settings.max_cooldown_seconds,
        half_open_probes=settings.half_open_probes,
        probe_lease_seconds=settings.probe_lease_seconds,
    )


def circuit_snapshot(row: Circuit) -> CircuitSnapshot:
    return CircuitSnapshot(
        state=CircuitState(row.state),
        reason=CircuitReason(row.reason) if row.reason else None,
        consecutive_failures=row.consecutive_failures,
        cooldown_seconds=row.cooldown_seconds,
        open_until=row.open_until,
        probes_in_flight=row.probes_in_flight,
        probe_lease_expires_at=row.probe_lease_expires_at,
    )


def _columns(snapshot: CircuitSnapshot) -> dict:
    return {
        "state": str(snapshot.state),
        "reason": str(snapshot.reason) if snapshot.reason else "",
        "consecutive_failures": snapshot.consecutive_failures,
        "cooldown_seconds": snapshot.cooldown_seconds,
        "open_until": snapshot.open_until,
        "probes_in_flight": snapshot.probes_in_flight,
        "probe_lease_expires_at": snapshot.probe_lease_expires_at,
    }


@dataclass(frozen=True, slots=True)
class Seen:
    """A circuit as the caller already read it (`snapshot` None: no row). The plan selector loads
    every circuit of the plan, so the hot path can skip the read."""

    snapshot: CircuitSnapshot | None


def _read(key: CircuitKey) -> CircuitSnapshot | None:
    row = Circuit.objects.filter(**key.filter()).first()
    return circuit_snapshot(row) if row else None


def circuit_governing(*, key: CircuitKey) -> CircuitSnapshot | None:
    """The circuit that decides `key`'s candidate now (`breaker.governing`: its assignment-wide
    circuit when that is not closed, else its own), read again in one query."""
    wide = CircuitKey.wide(key.pool_id, key.assignment_id)
    rows = {
        (row.model, row.route_class): circuit_snapshot(row)
        for row in Circuit.objects.filter(pool_id=key.pool_id, assignment_id=key.assignment_id).filter(
            model__in=(key.model, wide.model), route_class__in=(key.route_class, wide.route_class)
        )
    }
    governing, _ = breaker.governing(
        rows.get((key.model, key.route_class)), rows.get((wide.model, wide.route_class))
    )
    return governing


def _circuit_apply(
    key: CircuitKey,
    transition: Callable[[CircuitSnapshot | None], CircuitSnapshot | None],
    seen: Seen | None = None,
) -> tuple[bool, CircuitSnapshot | None]:
    """Apply `transition` to the circuit as stored. Returns (written, resulting snapshot).

    When `seen` is stale the guarded UPDATE misses and we re-read."""
    for _ in range(CAS_TRIES):
        current = seen.snapshot if seen is not None else _read(key)
        seen = None
        new = transition(current)
        if new is None:
            return False, current
        if current is None:
            try:
                with transaction.atomic():
                    Circuit.objects.create(**key.filter(), **_columns(new))
            except IntegrityError:
                continue  # another node created it first: decide again on its row
            return True, new
        if _guarded_update(key, current, new):
            return True, new
    return False, None


def _sql_value(value: object) -> object:
    return rawsql.as_param(value) if isinstance(value, datetime) else value


def _guarded_update_sql(key: CircuitKey, current: CircuitSnapshot, new: CircuitSnapshot) -> tuple[str, list]:
    """The UPDATE of the circuit to `new` only if it still holds exactly `current` (the compare-and-swap).

    Hand-written (see runtime.rawsql): every failover writes it, and the ORM's query building
    was most of that write's cost. NULL columns are matched with IS NULL, as the ORM does."""
    q = connection.ops.quote_name
    old, values = _columns(current), _columns(new)
    assignments = ", ".join(f"{q(column)} = %s" for column in values)
    params: list[object] = [*(_sql_value(v) for v in values.values()), rawsql.as_param(timezone.now())]
    where = [f"{q(column)} = %s" for column in key.filter()]
    params += key.filter().values()
    for column, value in old.items():
        if value is None:
            where.append(f"{q(column)} IS NULL")
        else:
            where.append(f"{q(column)} = %s")
            params.append(_sql_value(value))
    sql = (
        f"UPDATE {q(Circuit._meta.db_table)} SET {assignments}, {q('updated_at')} = %s "  # noqa: S608 (names only)
        f"WHERE {' AND '.join(where)}"
    )
    return sql, params


def _guarded_update(key: CircuitKey, current: CircuitSnapshot, new: CircuitSnapshot) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(*_guarded_update_sql(key, current, new))
        return cursor.rowcount == 1


def circuit_record_failure(
    *,
    key: CircuitKey,
    reason: CircuitReason,
    settings: BreakerSettings,
    now: datetime,
    seen: Seen | None = None,
) -> CircuitSnapshot | None:
    _, result = _circuit_apply(key, lambda s: breaker.on_failure(s, reason, settings, now), seen)
    return result


def circuit_record_success(*, key: CircuitKey, seen: Seen | None = None) -> CircuitSnapshot | None:
    """Closes the circuit. On a clean circuit (no row, or closed with no failures) it writes nothing,
    and with `seen` it does not even read."""
    _, result = _circuit_apply(key, breaker.on_success, seen)
    return result


def circuit_take_probe(
    *,
    key: CircuitKey,
    settings: BreakerSettings,
    now: datetime,
    seen: Seen | None = None,
) -> bool:
    """Take one half-open probe slot. Across all nodes at most `half_open_probes` callers win
    while the lease runs: each win is one guarded UPDATE that the others' UPDATEs then miss."""
    written, _ = _circuit_apply(key, lambda s: breaker.acquire_probe(s, settings, now), seen)
    return written


def circuit_release_probe(*, key: CircuitKey, seen: Seen | None = None) -> None:
    """A probe that ended neutrally (never started, client gone, stream closed without a verdict)."""
    _circuit_apply(key, breaker.on_neutral, seen)


@dataclass(frozen=True, slots=True)
class Demote:
    """A demotion to record: (assignment, model) moves to the end of later plans until `until`."""

    assignment_id: int
    model: str
    reason: CircuitReason
    until: datetime


def _demotion_sql(demote: Demote) -> tuple[str, list]:
    # One INSERT .. ON CONFLICT UPDATE: concurrent demotions of one pair cannot race into the
    # unique constraint, as a read-then-write would. Hand-written like the circuit's CAS: every
    # failover writes it (runtime.rawsql).
    q = connection.ops.quote_name
    sql = (
        f"INSERT INTO {q(Demotion._meta.db_table)} "  # noqa: S608 (names only; values are parameters)
        f"({q('assignment_id')}, {q('model')}, {q('reason')}, {q('until')}, {q('created_at')}) "
        f"VALUES (%s, %s, %s, %s, %s) ON CONFLICT ({q('assignment_id')}, {q('model')}) "
        f"DO UPDATE SET {q('reason')} = excluded.{q('reason')}, {q('until')} = excluded.{q('until')}"
    )
    params = [
        demote.assignment_id,
        demote.model,
        str(demote.reason),
        rawsql.as_param(demote.until),
        rawsql.as_param(timezone.now()),
    ]
    return sql, params


def demotion_record(demote: Demote) -> None:
    with connection.cursor() as cursor:
        cursor.execute(*_demotion_sql(demote))


def failure_record(
    *,
    key: CircuitKey,
    reason: CircuitReason | None,
    settings: BreakerSettings,
    now: datetime,
    seen: Seen | None,
    demote: Demote | None,
) -> None:
    """What one failed attempt writes (SPEC §7.1): its circuit's failure (when `reason` counts one) and
    its demotion, committed together.

    On PostgreSQL, when the circuit is known as read (`seen` with its row, the usual case: the request's
    read loaded it), both are one statement, the circuit's guarded UPDATE and the demotion's upsert as
    data-modifying CTEs: one round trip where a transaction takes four (BEGIN, two statements, COMMIT).
    Its commit does not wait for the WAL to reach the disk (`synchronous_commit` off for this transaction
    alone): it is seen by every node at once all the same, and what a crash of the database server could
    lose is the last fraction of a second of failure counts and demotions, which the next failures
    write again. The request's answer waits for this write, so a failover no longer waits for a disk
    flush. A compare-and-swap that missed (another request wrote the circuit since it was read) is
    decided again on the row as stored, as `circuit_record_failure` does; the demotion is written by then.
    """
    current = seen.snapshot if seen is not None else None
    if connection.vendor != "postgresql" or (reason is not None and current is None):
        with transaction.atomic():  # SQLite, or a circuit to create or to read first
            if reason is not None:
                circuit_record_failure(key=key, reason=reason, settings=settings, now=now, seen=seen)
            if demote is not None:
                demotion_record(demote)
        return
    parts: list[str] = []
    params: list[object] = []
    if reason is not None:
        assert current is not None
        sql, values = _guarded_update_sql(key, current, breaker.on_failure(current, reason, settings, now))
        parts.append(f"circuit AS ({sql} RETURNING 1)")
        params += values
    if demote is not None:
        sql, values = _demotion_sql(demote)
        parts.append(f"demotion AS ({sql})")
        params += values
    if not parts:
        return
    swapped = "(SELECT count(*) FROM circuit)" if reason is not None else "1"
    statement = f"WITH {', '.join(parts)} SELECT {swapped}, set_config('synchronous_commit', 'off', true)"
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        (written, _) = cursor.fetchone()
    if reason is not None and written != 1:
        circuit_record_failure(key=key, reason=reason, settings=settings, now=now)


def latencies_record(*, folds: list[Fold], now: datetime) -> None:
    """Fold a ledger batch's time-to-first-byte samples into each pair's moving average
    (`routing.policy.latency`),
    in ONE statement whatever the number of pairs: an upsert whose update computes `Fold.applied` on the
    stored average, so two nodes' writers folding the same pair at once each add their samples (the row
    lock orders them) and no read-then-write can lose one. Pairs are written in key order, so two such
    statements lock their rows in the same order and cannot deadlock. A sample of an assignment deleted
    meanwhile is dropped by the statement itself rather than failing the others. No fold: no statement."""
    if not folds:
        return
    q = connection.ops.quote_name
    table, assignments = q(Latency._meta.db_table), q(Assignment._meta.db_table)
    rows = sorted(folds, key=lambda f: (f.assignment_id, f.model))
    values = ", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(rows))
    stamp = rawsql.as_param(now)
    # Seconds since the row was last written (never below 0: two nodes' clocks), for the load's halving
    # (routing.policy.latency.LOAD_HALF_LIFE_S). Each backend spells a timestamp difference its own way.
    was, at = f"{table}.{q('updated_at')}", f"excluded.{q('updated_at')}"
    if connection.vendor == "postgresql":
        seconds = f"EXTRACT(EPOCH FROM ({at} - {was}))"
    else:
        seconds = f"((julianday({at}) - julianday({was})) * 86400.0)"
    age = f"(CASE WHEN {seconds} > 0 THEN {seconds} ELSE 0 END)"
    # VALUES columns are column1..column6 on both backends; `WHERE` lets SQLite parse the upsert of a SELECT.
    sql = (
        f"INSERT INTO {table} ({q('assignment_id')}, {q('model')}, {q('ewma_ms')}, {q('samples')}, "  # noqa: S608
        f"{q('updated_at')}, {q('load')}) SELECT v.column1, v.column2, v.column3, v.column4, v.column5, "
        "v.column6 "
        f"FROM (VALUES {values}) v WHERE v.column1 IN (SELECT {q('id')} FROM {assignments}) "
        f"ON CONFLICT ({q('assignment_id')}, {q('model')}) DO UPDATE SET "
        f"{q('ewma_ms')} = {table}.{q('ewma_ms')} * POWER(%s, excluded.{q('samples')}) "
        f"+ excluded.{q('ewma_ms')} * (1 - POWER(%s, excluded.{q('samples')})), "
        f"{q('samples')} = {table}.{q('samples')} + excluded.{q('samples')}, "
        f"{q('load')} = {table}.{q('load')} * POWER(0.5, {age} / %s) + excluded.{q('load')}, "
        f"{q('updated_at')} = excluded.{q('updated_at')}"
    )
    params: list[object] = [
        v for f in rows for v in (f.assignment_id, f.model, f.mean, f.count, stamp, f.load)
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, 1 - ALPHA, 1 - ALPHA, LOAD_HALF_LIFE_S])


def headrooms_record(*, latest: Mapping[tuple[int, str], tuple[float, datetime]]) -> None:
    """The latest headroom each (assignment, model) of a ledger batch reported, on its latency row (written
    just before by `latencies_record` for the same succeeded attempts): one statement, executed for each
    pair (a pipeline on PostgreSQL). Nothing reported: no statement."""
    if not latest:
        return
    q = connection.ops.quote_name
    sql = (
        f"UPDATE {q(Latency._meta.db_table)} SET {q('headroom_left')} = %s, {q('headroom_until')} = %s "  # noqa: S608
        f"WHERE {q('assignment_id')} = %s AND {q('model')} = %s"
    )
    rows = sorted(latest.items())
    params = [(left, rawsql.as_param(until), aid, model) for (aid, model), (left, until) in rows]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)


def demotion_resolve(*, assignment_id: int, model: str) -> None:
    Demotion.objects.filter(assignment_id=assignment_id, model=model).delete()


def affinity_record(
    *,
    gateway_key_id: int,
    kind: AffinityKind,
    key: str,
    assignment_id: int | None,
    model: str = "",
    ttl: timedelta,
    now: datetime,
) -> None:
    """Remember (kind, key) -> assignment for the key that made the request (SPEC §7.2). The row is
    the key's own: the conflict target includes the owner, so no key can overwrite another's."""
    # One INSERT .. ON CONFLICT UPDATE: the upsert costs a single statement on the request path.
    Affinity.objects.bulk_create(
        [
            Affinity(
                gateway_key_id=gateway_key_id,
                kind=kind,
                key=key,
                assignment_id=assignment_id,
                model=model,
                expires_at=now + ttl,
            )
        ],
        update_conflicts=True,
        unique_fields=["gateway_key", "kind", "key"],
        update_fields=["assignment", "model", "expires_at"],
    )


def affinity_forget(*, gateway_key_id: int, kind: AffinityKind, key: str) -> None:
    """The key's affinity for (kind, key) is over (its file was deleted upstream)."""
    Affinity.objects.filter(gateway_key_id=gateway_key_id, kind=kind, key=key).delete()


PRUNE_BATCH = 1000


def affinity_prune(*, now: datetime, limit: int = PRUNE_BATCH) -> int:
    """Delete up to `limit` expired affinities (by the `expires_at` index); returns how many.

    Bounded so that a caller with other work (the ledger writer) never holds the table for long;
    `manage.py prune_affinities` calls it until nothing is left."""
    expired = Affinity.objects.filter(expires_at__lte=now).order_by("expires_at").values("pk")[:limit]
    # A subquery, not a list of ids: one statement (MySQL would refuse LIMIT here; we run on
    # PostgreSQL and SQLite, which accept it).
    deleted, _ = Affinity.objects.filter(pk__in=expired).delete()
    return deleted


@dataclass(frozen=True, slots=True)
class Reset:
    """What `circuit_reset` closed: the circuits and demotions as they stood, and the config version."""

    circuits: list[Circuit]
    demotions: list[Demotion]
    config_version: int


def circuit_reset(*, assignment_id: int, model: str | None = None) -> Reset:
    """For an operator who fixed an account: delete its circuits (every model and route class, or only
    `model`'s, and the assignment-wide one either way) and its demotions (every model's, or `model`'s),
    so its next request finds it healthy (a healthy pair has no row). One transaction, which also moves
    the config version as a change of configuration would: circuits are not configuration, so no
    trigger moves it (pools/0004); it is moved the way the triggers do, upserting the counter."""
    circuits = Circuit.objects.filter(assignment_id=assignment_id)
    demotions = Demotion.objects.filter(assignment_id=assignment_id)
    if model is not None:
        circuits = circuits.filter(model__in=(model, ASSIGNMENT_WIDE))
        demotions = demotions.filter(model=model)
    with transaction.atomic():
        closed = list(circuits.select_for_update().order_by("model", "route_class"))
        cleared = list(demotions.select_for_update().order_by("model"))
        Circuit.objects.filter(pk__in=[c.pk for c in closed]).delete()
        Demotion.objects.filter(pk__in=[d.pk for d in cleared]).delete()
        if not ConfigVersion.objects.filter(pk=1).update(value=F("value") + 1):
            ConfigVersion.objects.create(pk=1, value=1)
        version = ConfigVersion.objects.get(pk=1).value
    return Reset(closed, cleared, version)
