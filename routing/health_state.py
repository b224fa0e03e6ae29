"""The health of a set of pools as routing reads it (SPEC §5.4, §7.1): circuits of a route class, active
demotions, and each route's latency, headroom and load (kept by the ledger writer), in ONE statement
(`health_sql`), shared by every node. The request path reads it inside its own statement
(`routing.request_state`); `manage.py routing_explain` and the console alone (`health_load`).
"""

from dataclasses import dataclass, field
from datetime import datetime
from enum import IntEnum

from pools.models import Assignment
from routing.models import Circuit, Demotion, Latency
from routing.policy.breaker import CircuitSnapshot
from routing.policy.types import ASSIGNMENT_WIDE, CircuitReason, CircuitState, RouteClass
from runtime import rawsql


class RowKind(IntEnum):
    """The first column of a row of the health statement (`health_sql`: circuits, demotions, latency)
    and of the request's statement built around it (`routing.request_state`: the key's rows and its
    affinities'), in the order the request's statement sorts them."""

    CIRCUIT = 0
    DEMOTION = 1
    KEY = 2
    AFFINITY = 3
    LATENCY = 4


HEALTH_COLUMNS = 10  # what `health_sql` selects: the row's kind, then (assignment, model) and its state


def health_sql(pools: str, models: int = 0, figures: bool = True) -> str:
    """Circuits of a route class, active demotions and latency averages in the pools `pools` (an SQL
    set: a list of placeholders or a subquery); params: the route class, ASSIGNMENT_WIDE, now.

    A latency row carries its average in whole milliseconds in the cooldown column (an integer column
    for both backends' UNION; a millisecond is finer than any order it decides), and the latest headroom
    its answers reported in thousandths in the failures column, with its limit's reset in the open_until
    column (null: none reported), and its recent load in thousandths in the probes column, as written at
    the lease column's time (it is decayed to the request's time here, so the rows stay the same between
    two ledger batches). Every latency row of
    the pools is read, unless `models` > 0: then the statement around it defines a relation `n` that has
    a row when the request's models are known (`Narrowing`), and with it only the latency rows of the
    `models` models in the placeholders after now are read (a pool of 200 accounts serving 20 models has
    4,000 such rows, and a request plans over one or two of its models); and with `figures` False, none
    of them (the reader has them from a read of less than `FIGURES_MAX_AGE_S` ago: `routing.request_state`),
    and no placeholder for the models: every latency row of the pools only when `n` has no row."""
    circuit, demotion, assignment, latency = Circuit._meta, Demotion._meta, Assignment._meta, Latency._meta
    latencies = (
        f"SELECT {int(RowKind.LATENCY)}, l.assignment_id, l.model, '', '', "  # noqa: S608
        "CAST(ROUND(l.headroom_left * 1000) AS INTEGER), CAST(ROUND(l.ewma_ms) AS INTEGER), "
        "l.headroom_until, CAST(ROUND(l.load * 1000) AS INTEGER), l.updated_at "
        f"FROM {latency.db_table} l JOIN {assignment.db_table} la ON la.id = l.assignment_id "
        f"WHERE la.pool_id IN {pools}"
    )
    return (
        f"SELECT {int(RowKind.CIRCUIT)}, assignment_id, model, state, reason, consecutive_failures, "  # noqa: S608
        "cooldown_seconds, open_until, probes_in_flight, probe_lease_expires_at "
        f"FROM {circuit.db_table} "
        f"WHERE route_class IN (%s, %s) AND pool_id IN {pools} "
        "UNION ALL "
        f"SELECT {int(RowKind.DEMOTION)}, d.assignment_id, d.model, '', d.reason, 0, 0, d.until, 0, NULL "
        f"FROM {demotion.db_table} d JOIN {assignment.db_table} a ON a.id = d.assignment_id "
        f"WHERE d.until > %s AND a.pool_id IN {pools} "
        "UNION ALL " + _latency_rows(latencies, models, figures)
    )


def _latency_rows(latencies: str, models: int, figures: bool) -> str:
    """`health_sql`'s latency rows: all, or under a narrowing (`n`) its models' (none without `figures`),
    and all when `n` has no row."""
    if not models:
        return latencies
    every = f"{latencies} AND NOT EXISTS (SELECT 1 FROM n)"  # noqa: S608
    if not figures:
        return every
    narrowed = f"l.model IN ({rawsql.placeholders(models)}) AND EXISTS (SELECT 1 FROM n)"  # noqa: S608
    return f"{latencies} AND {narrowed} UNION ALL {every}"


@dataclass(frozen=True, slots=True)
class HealthState:
    circuits: dict[tuple[int, str], CircuitSnapshot]  # (assignment, model) of the route class
    wide: dict[int, CircuitSnapshot]  # assignment -> its assignment-wide circuit (credential_rejected)
    demoted: set[tuple[int, str]]
    latency: dict[tuple[int, str], float] = field(default_factory=dict)  # (assignment, model) -> average ms
    # (assignment, model) -> (the share of its tightest rate limit left, when that limit resets)
    headroom: dict[tuple[int, str], tuple[float, datetime]] = field(default_factory=dict)
    # (assignment, model) -> (its recent load, when that was written: `routing.policy.latency.load_now`)
    load: dict[tuple[int, str], tuple[float, datetime]] = field(default_factory=dict)


def health_load(*, pool_ids: tuple[int, ...], route_class: RouteClass, now: datetime) -> HealthState:
    """Circuits of the route class, assignment-wide circuits and active demotions, in ONE query
    (hand-written SQL, see runtime.rawsql)."""
    if not pool_ids:
        return health_from_rows([])
    pools = f"({rawsql.placeholders(len(pool_ids))})"
    params = [str(route_class), ASSIGNMENT_WIDE, *pool_ids, rawsql.as_param(now), *pool_ids, *pool_ids]
    return health_from_rows(rawsql.fetch(health_sql(pools), params))


# A stored value's member by a dict lookup: an enum's call is a pure-Python function in 3.11, twice a row.
DEMOTION, LATENCY = int(RowKind.DEMOTION), int(RowKind.LATENCY)  # plain ints: compared once a row
_STATES = {state.value: state for state in CircuitState}
_REASONS = {reason.value: reason for reason in CircuitReason}


def health_from_rows(rows: list[tuple]) -> HealthState:
    found: dict[tuple[int, str], CircuitSnapshot] = {}
    wide: dict[int, CircuitSnapshot] = {}
    demoted: set[tuple[int, str]] = set()
    latency: dict[tuple[int, str], float] = {}
    headroom: dict[tuple[int, str], tuple[float, datetime]] = {}
    load: dict[tuple[int, str], tuple[float, datetime]] = {}
    for kind, assignment_id, model, state, reason, failures, cooldown, until, probes, lease in rows:
        if kind == DEMOTION:
            demoted.add((assignment_id, model))
            continue
        if kind == LATENCY:
            latency[(assignment_id, model)] = float(cooldown)
            if failures is not None and until is not None:
                headroom[(assignment_id, model)] = (failures / 1000, rawsql.as_datetime(until))
            if probes and lease is not None:
                load[(assignment_id, model)] = (probes / 1000, rawsql.as_datetime(lease))
            continue
        snapshot = CircuitSnapshot(
            state=_STATES[state],
            reason=_REASONS[reason] if reason else None,
            consecutive_failures=failures,
            cooldown_seconds=cooldown,
            open_until=rawsql.as_datetime(until),
            probes_in_flight=probes,
            probe_lease_expires_at=rawsql.as_datetime(lease),
        )
        if model == ASSIGNMENT_WIDE:
            wide[assignment_id] = snapshot
        else:
            found[(assignment_id, model)] = snapshot
    return HealthState(found, wide, demoted, latency, headroom, load)
