"""The request's one read before dispatch (SPEC §5, §7.1, §7.2, §11): `READER.read` is the one selector the
request path calls. It sends one statement (`request_state_query`): the key (`pools.selectors.key_sql`),
its pools' health (`routing.health_state.health_sql`) and the key's live affinities for the ids the request
names (`routing.affinities`), side by side in one UNION ALL, each kind of row padded with NULLs where the
others have their columns (`RowKind` says which is which), decoded by `request_state_from_rows`. With
the configuration cached (`routing.selectors.config_cached`), the routing inputs are built from those
rows on the event loop; else they are loaded on runtime.db's threads.

Two things it remembers of a key's last read, each checked against the database's answer, never trusted
on its own (`Reader`): the models its request plans over, so that only their latency rows are read
(`Narrowing`), and the state its rows said, so that while the statement is on the wire the loop can
decide the request from it (a draft), kept only when the read returns those very rows. One thing it
trusts for a while: the latency, headroom and load rows of a narrowing's models (`Figures`), which the
ledger writers change once a batch: read by one request, routed on by the next ones of the same
narrowing for up to FIGURES_MAX_AGE_S, whose statements leave them out.
"""

import contextlib
import functools
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial
from typing import TypeVar

from pools.models import ConfigVersion, hash_key
from pools.selectors import KEY_COLUMNS, Authenticated, authenticated_from_rows, key_params, key_sql
from routing.affinities import (
    Affinities,
    AffinityIds,
    affinities_from_rows,
    affinity_params,
    affinity_where,
)
from routing.health_state import HEALTH_COLUMNS, HealthState, RowKind, health_from_rows, health_sql
from routing.models import Affinity
from routing.policy.route import models_decided
from routing.policy.types import ASSIGNMENT_WIDE, RouteClass
from routing.selectors import ConfigSnapshot, RoutingInputs, config_cached, routing_inputs_load
from runtime import db, loopdb, rawsql


@dataclass(frozen=True, slots=True)
class Narrowing:
    """What the request's read assumes to take only its models' latency rows: the key's pools and the
    config version as its last read found them, and `models`, every model a request of its model plans
    over in that configuration (`routing.policy.route.models_decided`). The statement checks the assumption
    against what it reads (the key's pools, the version): when either moved, it reads every latency
    row of the pools, as without a narrowing, so a stale assumption costs rows, never a decision."""

    pool_ids: tuple[int, ...]
    config_version: int
    models: tuple[str, ...]


def narrowing(pool_ids: tuple[int, ...], version: int, model: object, now: datetime) -> Narrowing | None:
    """The narrowing for a request of `model` by a key last read with these pools at this version, when
    their configuration is cached (no query); else None."""
    config = config_cached(pool_ids, version, now) if pool_ids and isinstance(model, str) else None
    if config is None:
        return None
    models = models_decided(
        model, policy=config.policy, routable=config.routes.keys(), auto_models=config.auto_models
    )
    return Narrowing(pool_ids, version, models) if models else None


@functools.cache  # table and column names only: the same text for the life of the process, per shape
def _request_state_sql(
    response: bool = False,
    session: bool = False,
    files: int = 0,
    pools: int = 0,
    models: int = 0,
    figures: bool = True,
) -> str:
    # One statement, so one round trip: the key's rows (RowKind.KEY, as `key_sql`, matched once) and the
    # health rows of its pools (as `health_sql`) side by side. With ids named (the shape of
    # `AffinityIds`), the key's live affinities for them too (RowKind.AFFINITY, in the health columns:
    # `_affinity_from_row`), owned by the key matched. The server's cost is mostly fixed per relation the
    # statement names: matching the key once (not for its pools, its row and its affinities each) took
    # 4-8 % of the server's CPU off the statement run alone, too little to show under load
    # (bench/profile.md).
    # With a narrowing of `pools` pools and `models` models (`Narrowing`), `n` has its row when the key
    # read has exactly those pools at that version (params after the key's: the version, the pool ids).
    # Without `figures`, the narrowed models' latency rows are not read at all (`Reader.read`).
    narrowed = (
        f", n AS (SELECT 1 AS narrowed WHERE (SELECT COUNT(*) FROM r) = {pools} "  # noqa: S608
        f"AND (SELECT COUNT(*) FROM r WHERE r.pool_id IN ({rawsql.placeholders(pools)})) = {pools} "
        f"AND COALESCE((SELECT v.value FROM {ConfigVersion._meta.db_table} v WHERE v.id = 1), 0) = %s)"
        if models
        else ""
    )
    sql = (
        f"WITH r AS ({key_sql()}){narrowed} "  # noqa: S608
        f"SELECT {int(RowKind.KEY)}, {rawsql.nulls(HEALTH_COLUMNS - 1)}, r.* FROM r "
        f"UNION ALL SELECT h.*, {rawsql.nulls(KEY_COLUMNS)} "
        f"FROM ({health_sql('(SELECT pool_id FROM r)', models, figures)}) h "
    )
    if response or session or files:
        sql += (
            f"UNION ALL SELECT {int(RowKind.AFFINITY)}, a.assignment_id, a.model, a.kind, a.key, 0, 0, "  # noqa: S608
            f"a.expires_at, 0, NULL, {rawsql.nulls(KEY_COLUMNS)} "
            f"FROM {Affinity._meta.db_table} a "
            f"WHERE {affinity_where('IN (SELECT id FROM r)', response, session, files)} "
        )
    return sql + f"ORDER BY 1, {HEALTH_COLUMNS + KEY_COLUMNS}"  # the key's rows by their pool's name


@dataclass(frozen=True, slots=True)
class RequestStateQuery:
    """The request's statement, to run on whichever connection the caller has (the request path's:
    runtime.loopdb.rows_within)."""

    sql: str
    params: list[object]
    digest: str  # of the key's secret: the rows are the key's only if it matches (`request_state_from_rows`)


def request_state_query(
    raw_key: str,
    *,
    route_class: RouteClass,
    now: datetime,
    affinity: AffinityIds | None = None,
    narrow: Narrowing | None = None,
    figures: bool = True,
) -> RequestStateQuery | None:
    """None for an empty secret: no key can match it, no statement is needed. `narrow`: the latency
    rows to read when the key still has those pools at that version (`Narrowing`); with `figures`
    False, none of them then (the caller has them: `Reader.read`)."""
    if not raw_key:
        return None
    digest = hash_key(raw_key)
    params = key_params(digest)
    pools = models = 0
    if narrow is not None:
        pools, models = len(narrow.pool_ids), len(narrow.models)
        params += [*narrow.pool_ids, narrow.config_version]
    params += [str(route_class), ASSIGNMENT_WIDE, rawsql.as_param(now)]
    figures = figures or narrow is None  # without a narrowing, the rows are all read
    if narrow is not None and figures:
        params += narrow.models
    ids = affinity or AffinityIds()
    shape = (bool(ids.response_id), bool(ids.session), len(ids.file_ids), pools, models, figures)
    sql = _request_state_sql(*shape)
    return RequestStateQuery(sql, [*params, *affinity_params(ids, now)] if ids else params, digest)


@dataclass(frozen=True, slots=True)
class RequestState:
    """What the request's statement found: the key, its pools' health, and its live affinities for the
    ids the request named (none named: none)."""

    authenticated: Authenticated
    health: HealthState
    affinities: Affinities


def request_state_load(
    raw_key: str, *, route_class: RouteClass, now: datetime, affinity: AffinityIds | None = None
) -> RequestState | None:
    """The request's statement run on this thread's connection (a tool's or a test's read; the request
    path's is `READER.read`). None for a missing, wrong or disabled key."""
    query = request_state_query(raw_key, route_class=route_class, now=now, affinity=affinity)
    if query is None:
        return None
    return request_state_from_rows(rawsql.fetch(query.sql, query.params), query.digest)


KEY, AFFINITY = int(RowKind.KEY), int(RowKind.AFFINITY)


def _affinity_columns(row: tuple) -> tuple:
    """An affinity row's (kind, key, assignment, model, expiry), as `affinities_from_rows` takes them,
    from the health columns `_request_state_sql` puts them in."""
    _, assignment_id, model, kind, key, _, _, expires_at = row[:8]
    return kind, key, assignment_id, model, expires_at


def request_state_from_rows(rows: list[tuple], digest: str) -> RequestState | None:
    """The state the request's statement's rows say: None when they hold no key whose secret's digest
    is `digest`."""
    authenticated = authenticated_from_rows([row[HEALTH_COLUMNS:] for row in rows if row[0] == KEY], digest)
    if authenticated is None:
        return None
    health = health_from_rows([row[:HEALTH_COLUMNS] for row in rows if row[0] != KEY and row[0] != AFFINITY])
    found = [_affinity_columns(row) for row in rows if row[0] == AFFINITY]
    return RequestState(authenticated, health, affinities_from_rows(found))


NO_IDS = AffinityIds()


@dataclass(frozen=True, slots=True)
class Wanted:
    """What the request's read needs to know of the request."""

    raw_key: str
    route_class: RouteClass
    now: datetime
    ids: AffinityIds = NO_IDS  # the ids whose affinities are read with the key
    routing: bool = True  # its routing inputs too (False: a request refused once its key is known)
    model: object = None  # what its body names as the model: only its models' latency rows are read


@dataclass(frozen=True, slots=True)
class Loaded:
    """What the request's read found: its key, its affinities for the ids it named, and its routing
    inputs (None when `Wanted.routing` is False)."""

    authenticated: Authenticated
    affinities: Affinities
    inputs: RoutingInputs | None = None


def loaded(state: RequestState, wanted: Wanted, config: ConfigSnapshot | None = None) -> Loaded:
    """The read's result from its state: with `config` (cached), no query; else the configuration is
    loaded (on runtime.db's threads)."""
    if not wanted.routing:
        return Loaded(state.authenticated, state.affinities)
    authenticated = state.authenticated
    inputs = routing_inputs_load(
        pool_ids=authenticated.key.pool_ids,
        route_class=wanted.route_class,
        now=wanted.now,
        affinities=state.affinities,
        config_version=authenticated.config_version,
        health=state.health,
        config=config,
    )
    return Loaded(authenticated, state.affinities, inputs)


@dataclass(frozen=True, slots=True)
class Known:
    """A key's state as its last read found it: the statement's rows, what they say, and whether the
    read before found the same rows (a key whose rows change with every request, as a budget's
    reservations make them, is not worth a draft)."""

    rows: list[tuple]
    state: RequestState
    steady: bool


@dataclass(frozen=True, slots=True)
class Figures:
    """The latency, headroom and load rows of a narrowing's models as a read found them (the mappings
    of `HealthState`, kept as the same objects, so what is built from them is reused:
    `routing.selectors.with_latency`), and when (monotonic)."""

    latency: dict[tuple[int, str], float]
    headroom: dict[tuple[int, str], tuple[float, datetime]]
    load: dict[tuple[int, str], tuple[float, datetime]]
    read_at: float

    @classmethod
    def of(cls, health: HealthState, read_at: float) -> "Figures":
        return cls(health.latency, health.headroom, health.load, read_at)

    def held_by(self, health: HealthState) -> bool:
        held = health.latency is self.latency and health.headroom is self.headroom
        return held and health.load is self.load


T = TypeVar("T")
MIN_READ_S = 0.1  # the shortest a request's read before dispatch may wait
KNOWN_LIMIT = 1024
# How old the latency, headroom and load rows a request routes on may be (issue 49): the ledger writers
# change them once a batch, and a batch lingers up to proxy.ledger.recorder.LINGER_S (0.1 s; a test
# holds this no longer), so a copy this old is at most a batch behind, as the load is anyway. Circuits,
# demotions and the key are read by every request; these rows, a pool's size of them, ten times a second.
FIGURES_MAX_AGE_S = 0.1
FIGURES_LIMIT = 256


class Reader:
    """The request path's read before dispatch, one per process (`READER`). It remembers each key's last
    read (`known`, digest -> Known, the least recently read first; past `limit` keys the least recently
    read is forgotten, not all: a population of keys larger than the limit keeps its active ones) and
    counts the requests the process is answering (`answering`). It keeps, per narrowing, the latency,
    headroom and load rows its last read of them found (`figures`): a request whose narrowing's rows were
    read less than FIGURES_MAX_AGE_S ago routes on those and its statement does not read them again,
    so a pool's size costs its statement rows ten times a second, not once a request. A key it does not
    know (new, or forgotten past `limit`) is narrowed as if it had the pools and version of the last key
    whose rows were decoded (`last_pools`: most often the last key it did not know): keys share their
    pools far more often than not, and a wrong guess is checked by the statement as a stale narrowing
    is, costing rows, never a decision."""

    def __init__(self, limit: int = KNOWN_LIMIT) -> None:
        self.known: OrderedDict[str, Known] = OrderedDict()
        self.figures: dict[Narrowing, Figures] = {}
        self.limit = limit
        self.in_flight = 0
        self.last_pools: tuple[tuple[int, ...], int] | None = None  # the last decoded key's pools, version

    @contextlib.contextmanager
    def answering(self) -> Iterator[None]:
        """Counts a request while it is answered: an HTTP request at the edge (gatewaysite.asgi), a
        websocket turn from its frame to its last event (proxy.consumers). A request is drafted only when
        it is the one being answered: then the loop has nothing else to do while its read is out. With
        others in flight the loop has their work for that time, and a draft would only put this request's
        decision ahead of it (at c=50 against a 50 ms upstream, 3 % less throughput with every request
        drafted, bench/profile.md)."""
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    async def read(
        self, wanted: Wanted, deadline: float, draft: Callable[[Loaded], T | None] | None = None
    ) -> tuple[Loaded | None, T | None]:
        """The request's read by `deadline` (monotonic): None for a missing, wrong or disabled key; on
        DatabaseError or DatabaseTimeout the database could not answer. Its statement runs on the event
        loop (runtime.loopdb), and so does the building of the routing inputs when the configuration is
        cached; else that goes to runtime.db's threads, as the statement does when the loop has no
        connection to give.

        With `draft` (the request's decision from a Loaded, None when it cannot be decided), while the
        statement is on its way the loop decides the request from its key's last state; the draft comes
        back with the read only when the read found exactly the rows that state came from (the same
        rows: the same state, the same decision). At low load the decision then costs no wall time: the
        loop would otherwise wait for the rows."""

        def left() -> float:
            return max(deadline - time.monotonic(), MIN_READ_S)

        known = self.known.get(hash_key(wanted.raw_key)) if wanted.raw_key else None
        narrow = self._narrowing(known, wanted)
        cached = self._kept(narrow)
        query = request_state_query(
            wanted.raw_key,
            route_class=wanted.route_class,
            now=wanted.now,
            affinity=wanted.ids,
            narrow=narrow,
            figures=cached is None,
        )
        if query is None:
            return None, None
        drafted: list[tuple[Loaded, T]] = []
        meanwhile = None
        if draft is not None and known is not None and known.steady and self.in_flight <= 1:
            meanwhile = partial(_draft, draft, known.state, wanted, drafted)
        rows = await loopdb.rows_within(left(), query.sql, query.params, meanwhile)
        state = self._learn(query.digest, rows, known, narrow, cached)
        if state is None:
            return None, None
        if drafted and known is not None and state is known.state:
            return drafted[0]
        authenticated = state.authenticated
        config = config_cached(authenticated.key.pool_ids, authenticated.config_version, wanted.now)
        if config is not None or not wanted.routing:
            return loaded(state, wanted, config), None  # no query
        return await db.run_within(left(), loaded, state, wanted), None

    def _kept(self, narrow: Narrowing | None) -> Figures | None:
        """The figures kept for `narrow` that a request may route on instead of reading them: fresh ones;
        or, while another request is reading them again, the last ones. The first request to find them
        older than FIGURES_MAX_AGE_S reads them (None) and lets the others route on them for another max
        age meanwhile, so concurrent requests do not each read, decode and build a pool's rows."""
        kept = self.figures.get(narrow) if narrow is not None else None
        if kept is None or narrow is None:  # (narrow for the type checker: no narrowing, nothing kept)
            return None
        now = time.monotonic()
        if now - kept.read_at < FIGURES_MAX_AGE_S:
            return kept
        self.figures[narrow] = replace(kept, read_at=now)  # the same mappings: what is built on them stays
        return None

    def _narrowing(self, known: Known | None, wanted: Wanted) -> Narrowing | None:
        """The models this request plans over in the configuration its key's last read had (a key not
        known: the last decoded key's): only their latency rows are read (the statement reads them all if
        the key's pools or version are not those)."""
        if not wanted.routing:
            return None
        if known is not None:
            last = known.state.authenticated
            pools, version = last.key.pool_ids, last.config_version
        elif self.last_pools is not None:
            pools, version = self.last_pools
        else:
            return None
        return narrowing(pools, version, wanted.model, wanted.now)

    def _learn(
        self,
        digest: str,
        rows: list[tuple],
        known: Known | None,
        narrow: Narrowing | None = None,
        cached: Figures | None = None,
    ) -> RequestState | None:
        """The state `rows` say for the key `digest` (with `cached`'s figures when the statement left
        them out), remembered as its last read (or forgotten)."""
        if known is not None and rows == known.rows:
            state = self._figured(known.state, narrow, cached)
            if state is not known.state or not known.steady:
                self.known[digest] = Known(rows, state, steady=state is known.state)
            self.known.move_to_end(digest)
            return state
        decoded = request_state_from_rows(rows, digest)
        if decoded is None:
            self.known.pop(digest, None)
            return None
        self.last_pools = (decoded.authenticated.key.pool_ids, decoded.authenticated.config_version)
        state = self._figured(decoded, narrow, cached)
        self.known[digest] = Known(rows, state, steady=False)
        self.known.move_to_end(digest)
        if len(self.known) > self.limit:
            self.known.popitem(last=False)
        return state

    def _figured(self, state: RequestState, narrow: Narrowing | None, cached: Figures | None) -> RequestState:
        """`state` with the figures it routes on: `cached`'s when the statement left them out (and the
        narrowing held: else its rows are every latency row of the pools, as without one); its own,
        kept for the narrowing's next requests, when the statement read them."""
        authenticated = state.authenticated
        if (
            narrow is None
            or authenticated.key.pool_ids != narrow.pool_ids
            or authenticated.config_version != narrow.config_version
        ):
            return state
        health = state.health
        if cached is None:
            if len(self.figures) >= FIGURES_LIMIT and narrow not in self.figures:
                self.figures.clear()
            self.figures[narrow] = Figures.of(health, time.monotonic())
            return state
        if cached.held_by(health):
            return state
        figured = replace(health, latency=cached.latency, headroom=cached.headroom, load=cached.load)
        return replace(state, health=figured)


def _draft(
    draft: Callable[[Loaded], T | None], state: RequestState, wanted: Wanted, into: list[tuple[Loaded, T]]
) -> None:
    """The request decided from its key's last state, while its own read is on its way (a configuration
    not cached is left to the read: loading it is I/O)."""
    authenticated = state.authenticated
    config = config_cached(authenticated.key.pool_ids, authenticated.config_version, wanted.now)
    if config is None:
        return
    found = loaded(state, wanted, config)
    decided = draft(found)
    if decided is not None:
        into.append((found, decided))


READER = Reader()
