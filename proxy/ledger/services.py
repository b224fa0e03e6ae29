"""Ledger writes (SPEC §7.3)."""

from dataclasses import replace
from datetime import UTC, date, datetime

from django.db import connection, transaction
from django.db.models import Model

from pools.services import budget_holds_take, keys_budget_settle
from proxy.ledger.exchange import AttemptLog, Exchange
from proxy.ledger.models import MAX_TOTAL, Attempt, DailySpend, RequestRecord, cost_is_unknown
from routing.policy.vocabulary import AttemptStatus, Outcome
from runtime import rawsql


@transaction.atomic
def request_records_write(*, exchanges: list[Exchange], idempotent: bool = False) -> None:
    """One transaction for a batch: the records, all their attempts in one INSERT, their daily spend
    totals in one upsert (`_daily_spend_add`), and what each key spent (known costs only: an unknown
    price is never counted as zero, nor as anything).
    `idempotent` (a spool replay): records whose request id is already stored are skipped, with their
    attempts and their spend, so a record is never written or charged twice; a hold such a request
    still has (a reservation granted after its record was settled, whose give-back failed) is
    released."""
    recorded: list[Exchange] = []
    if idempotent:
        ids = [x.request_id for x in exchanges]
        stored = set(RequestRecord.objects.filter(request_id__in=ids).values_list("request_id", flat=True))
        recorded = [x for x in exchanges if x.request_id in stored]
        exchanges = [x for x in exchanges if x.request_id not in stored]
    rows = _insert(RequestRecord, _RECORD_COLUMNS, [_record(x) for x in exchanges], "request_id")
    ids = {request_id: pk for pk, request_id in rows}
    _insert(
        Attempt, _ATTEMPT_COLUMNS, [_attempt(ids[x.request_id], x, a) for x in exchanges for a in x.attempts]
    )
    _daily_spend_add(exchanges)
    exchanges_settle(exchanges=exchanges, recorded=recorded)


_CELL = ("day", "key_id", "assignment_id", "model")
_TOTALS = ("cost_micros", "attempts", "unpriced", "input_tokens", "cached_read_tokens")


def _daily_spend_add(exchanges: list[Exchange]) -> None:
    """Add the batch's dispatched attempts to their (UTC day of the request's start, key, assignment,
    model) totals (proxy.ledger.models.DailySpend): one statement, none for a batch without such an attempt.
    The cells go in their sort order, so two nodes' batches lock the rows they share in the same order
    and cannot deadlock (as `exchanges_settle` orders the keys). A total stays at MAX_TOTAL rather than
    pass it: an absurd figure costs that cell's sum, never the batch's records."""
    cells: dict[tuple[date, int, int, str], list[int]] = {}
    for x in exchanges:
        day = x.started_at.astimezone(UTC).date()
        for a in x.attempts:
            if a.status == AttemptStatus.INELIGIBLE:
                continue
            cell = cells.setdefault((day, x.key_id or 0, a.assignment_id or 0, a.model[:200]), [0] * 5)
            cell[0] += a.cost_micros or 0
            cell[1] += 1
            cell[2] += cost_is_unknown(a)
            cell[3] += a.input_tokens or 0
            cell[4] += a.cached_read_tokens or 0
    if not cells:
        return
    qn = connection.ops.quote_name
    table = qn(DailySpend._meta.db_table)
    if connection.vendor == "postgresql":
        added = "LEAST({t}.{c}::numeric + EXCLUDED.{c}, {most})::bigint"
    else:  # SQLite: an integer sum that overflows becomes a REAL, which MIN compares with the bound
        added = "MIN({t}.{c} + excluded.{c}, {most})"
    updates = ", ".join(f"{qn(c)} = " + added.format(t=table, c=qn(c), most=MAX_TOTAL) for c in _TOTALS)
    head = f"INSERT INTO {table} ({', '.join(map(qn, _CELL + _TOTALS))}) VALUES "  # noqa: S608 - the model's names
    tail = f" ON CONFLICT ({', '.join(map(qn, _CELL))}) DO UPDATE SET {updates}"
    row = f"({rawsql.placeholders(len(_CELL) + len(_TOTALS))})"
    adapt = connection.ops.adapt_datefield_value
    ordered = [
        ((adapt(day), *rest), [min(t, MAX_TOTAL) for t in totals])
        for (day, *rest), totals in sorted(cells.items())
    ]
    step = _PARAMS // (len(_CELL) + len(_TOTALS))
    with connection.cursor() as cursor:
        for start in range(0, len(ordered), step):
            chunk = ordered[start : start + step]
            params = [v for cell, totals in chunk for v in (*cell, *totals)]
            cursor.execute(head + ", ".join([row] * len(chunk)) + tail, params)


# A batch's rows go in one hand-written statement per table (runtime.rawsql): bulk_create's compilation
# of the statement and of each value was about a third of the ledger writer's CPU, Python that holds
# the GIL while the requests run. On PostgreSQL a batch of more than _SMALL values goes by COPY, each
# row formatted in C by psycopg; the records' ids are taken from their sequence first, in one
# statement, since COPY returns nothing. Before, such a batch went as `INSERT ... SELECT * FROM
# unnest(...)` with one array per column, dumped in Python: about 25 us of the GIL a record, in one
# stretch, while the requests waited (c=1 p99 3.7 ms with it, 1.5 ms without the ledger). A smaller
# batch stays one VALUES list: its text is cached by psycopg and its scalars dump in C. SQLite keeps
# VALUES lists, at most _PARAMS values a statement (it allows 32,766).
_SMALL = 50
_PARAMS = 8000


def _insert(
    model: type[Model], columns: tuple[str, ...], rows: list[tuple], returning: str = ""
) -> list[tuple]:
    """Insert `rows` (values in `columns`' order) into the model's table; with `returning` (a column),
    the (id, that column) of each inserted row, in no particular order."""
    if not rows:
        return []
    if connection.vendor == "postgresql" and len(rows) * len(columns) > _SMALL:
        return _copy(model, columns, rows, returning)
    with connection.cursor() as cursor:
        head, tail = _insert_sql(model, columns, returning)
        head += "VALUES "
        row = f"({rawsql.placeholders(len(columns))})"
        step = max(1, _PARAMS // len(columns))
        inserted: list[tuple] = []
        for start in range(0, len(rows), step):
            chunk = rows[start : start + step]
            cursor.execute(head + ", ".join([row] * len(chunk)) + tail, [v for r in chunk for v in r])
            if returning:
                inserted += cursor.fetchall()
        return inserted


def _copy(model: type[Model], columns: tuple[str, ...], rows: list[tuple], returning: str) -> list[tuple]:
    """PostgreSQL: `_insert` by COPY, the ids first when `returning`."""
    qn = connection.ops.quote_name
    table = model._meta.db_table
    with connection.cursor() as cursor:
        if returning:
            cursor.execute(
                "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)",
                [qn(table), len(rows)],
            )
            rows = [(pk, *row) for (pk,), row in zip(cursor.fetchall(), rows, strict=True)]
            columns = ("id", *columns)
        # psycopg's own errors from COPY, as Django's (which `execute` raises): the writer tells a
        # refused row (DataError, IntegrityError) from a database that is away by them.
        with (
            connection.wrap_database_errors,
            cursor.copy(f"COPY {qn(table)} ({', '.join(map(qn, columns))}) FROM STDIN") as copy,
        ):
            for row in rows:
                copy.write_row(row)
    if not returning:
        return []
    index = columns.index(returning)
    return [(row[0], row[index]) for row in rows]


def _insert_sql(model: type[Model], columns: tuple[str, ...], returning: str) -> tuple[str, str]:
    """`INSERT INTO table (columns) ` and the RETURNING clause, for either form."""
    qn = connection.ops.quote_name
    names = ", ".join(map(qn, columns))
    tail = f" RETURNING {qn('id')}, {qn(returning)}" if returning else ""
    return f"INSERT INTO {qn(model._meta.db_table)} ({names}) ", tail


SANITIZED = "ledger_row_sanitized"


def sanitized(x: Exchange) -> Exchange:
    """How a record the database refused for its data is recorded instead (issue 45): its ids, route,
    models, outcome and times kept, every number in it nulled (the status, the retries, and each
    attempt's upstream status, time, token counts and cost, its ordinal renumbered), each attempt
    flagged with the error code `ledger_row_sanitized`. With no cost left, settling it charges what its
    request held (`charge_micros`), never a refund."""
    attempts = [
        replace(
            a,
            ordinal=ordinal,
            upstream_status=None,
            error_code=SANITIZED,
            elapsed_ms=0,
            input_tokens=None,
            output_tokens=None,
            cached_read_tokens=None,
            cached_write_tokens=None,
            cost_micros=None,
        )
        for ordinal, a in enumerate(x.attempts, start=1)
    ]
    return replace(x, status_code=None, retry_count=0, config_version=None, attempts=attempts)


def exchanges_settle(*, exchanges: list[Exchange], recorded: list[Exchange] | None = None) -> None:
    """Release what the requests' keys held, add what they cost (SPEC §7.4), all the batch's keys in
    one UPDATE per budget period (`pools.services.keys_budget_settle`). What a request held is its
    `BudgetHold`, deleted here (`budget_holds_take`), not what its process believed: a reservation
    whose answer never reached the request (its connection broke after the commit, its client left) is
    released too, and a hold is released once however often this runs for the request. Also run alone
    for a record the database refused, so a refused record never leaks its reservation. The keys' rows
    are locked in id order: two nodes' batches over the same keys then lock them in the same order and
    cannot deadlock (in batch order, one node held B and waited for A while the other held A and waited
    for B; PostgreSQL then aborted one, or a reservation queued behind them). `recorded`: requests whose
    records were settled before; only a hold they still have is released, nothing charged."""
    charged_before = {x.request_id for x in recorded or []}
    every = [*exchanges, *(recorded or [])]
    held = budget_holds_take(request_ids=[x.request_id for x in every if x.reserving])
    settle: dict[tuple[int, str], list[int]] = {}
    for x in every:
        reserved = held.get(x.request_id, 0)
        charged = 0 if x.request_id in charged_before else charge_micros(x, reserved)
        if x.key_id is not None and (charged or reserved):
            totals = settle.setdefault((x.key_id, x.budget_period), [0, 0])
            totals[0] += reserved
            totals[1] += charged
    keys_budget_settle(settled=settle, now=datetime.now(UTC))


def charge_micros(x: Exchange, reserved: int) -> int:
    """What a request costs its key: the known cost of every attempt (a failed one too, when its
    upstream reported usage); an attempt that may have run upstream without reporting usage costs
    what was reserved for it (`reserved`, its hold), never nothing; so does a request its node died
    with (`gateway_lost`). An unknown price is never counted as zero (no budget: nothing was reserved,
    and only known costs count)."""
    known = sum(a.cost_micros for a in x.attempts if a.cost_micros)
    unreported = x.outcome == Outcome.GATEWAY_LOST or any(
        a.cost_micros is None and a.dispatch_state in ("completed", "unknown") for a in x.attempts
    )
    return max(known, reserved) if unreported else known


_RECORD_COLUMNS = (
    "request_id",
    "operation_id",
    "key_id",
    "route",
    "transport",
    "requested_model",
    "served_model",
    "outcome",
    "status_code",
    "retry_count",
    "started_at",
    "finished_at",
)


def _record(x: Exchange) -> tuple:
    """A RequestRecord row, in _RECORD_COLUMNS' order."""
    return (
        x.request_id,
        (x.operation_id or x.request_id)[:64],
        x.key_id,
        x.route[:64],
        x.transport,
        x.requested_model[:200],
        x.served_model[:200],
        # Sanitized upstream, bounded again here: no field's value can cost a ledger row.
        x.outcome[:64],
        x.status_code,
        x.retry_count,
        rawsql.as_param(x.started_at),
        rawsql.as_param(x.finished_at) if x.finished_at is not None else None,
    )


_ATTEMPT_COLUMNS = (
    "request_id",
    "ordinal",
    "assignment_id",
    "model",
    "route_class",
    "status",
    "failure_class",
    "ineligible_reason",
    "dispatch_state",
    "upstream_status",
    "error_code",
    "config_version",
    "elapsed_ms",
    "input_tokens",
    "output_tokens",
    "cached_read_tokens",
    "cached_write_tokens",
    "cost_micros",
)


def _attempt(record_id: int, x: Exchange, a: AttemptLog) -> tuple:
    """An Attempt row of the record `record_id`, in _ATTEMPT_COLUMNS' order."""
    return (
        record_id,
        a.ordinal,
        a.assignment_id,
        a.model[:200],
        a.route_class,
        a.status,
        a.failure_class[:30],
        a.ineligible_reason[:30],
        a.dispatch_state,
        a.upstream_status,
        a.error_code[:64],
        x.config_version,
        a.elapsed_ms,
        a.input_tokens,
        a.output_tokens,
        a.cached_read_tokens,
        a.cached_write_tokens,
        a.cost_micros,
    )


PRUNE_BATCH = 1000


@transaction.atomic
def request_records_prune(*, before: datetime, limit: int = PRUNE_BATCH) -> int:
    """Delete up to `limit` request records started before `before`, with their attempts; returns how
    many records. Bounded so that no statement holds the ledger tables for long while the writer keeps
    inserting; `manage.py prune_ledger` calls it until nothing is left. Spend already counted on the
    keys is not touched: a budget does not grow back when its history is pruned. Nor are the daily
    spend totals (`DailySpend`): the spend page keeps showing what the deleted records cost, until
    `daily_spend_prune` drops their day."""
    due = RequestRecord.objects.filter(started_at__lt=before).order_by("started_at")
    old = list(due.values_list("pk", flat=True)[:limit])
    if not old:
        return 0
    Attempt.objects.filter(request_id__in=old).delete()
    deleted, _ = RequestRecord.objects.filter(pk__in=old).delete()
    return deleted


def daily_spend_prune(*, before: date) -> int:
    """Delete the daily spend totals of days before `before` (the spend page's first day: nothing reads
    them); how many. One statement: they are at most days x keys x routes rows."""
    deleted, _ = DailySpend.objects.filter(day__lt=before).delete()
    return deleted
