"""Loads everything a routing decision needs and hands the pure core plain values (SPEC §5, §7).

Two kinds of input, read differently:
- configuration (settings, aliases, fallbacks, the pools' assignments and catalog) changes rarely:
  it is cached per process and per set of pools, and reloaded when the config version that the key
  lookup read alongside the key has moved (`pools.models.ConfigVersion`);
- health (circuits of the request's route class, active demotions) and each route's latency average
  (`routing.policy.latency`, kept by the ledger writer) are shared, durable state that must be seen at once by
  every node: they are read on every request, in ONE query.
So a successful request costs one read before dispatch: the key (with its pools and the config
version), the health and the key's affinities for the ids the request names (SPEC §7.2), in one
statement (`routing.request_state`). No per-candidate query anywhere.
"""

from collections.abc import Callable, Iterator, KeysView, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import IntEnum
from typing import Any

from catalog.models import CatalogEntry
from catalog.prices import route_price
from catalog.selectors import evidence_load, route_capabilities
from pools.models import (
    Assignment,
    GatewaySettings,
    ModelAlias,
    ModelFallback,
    Pool,
)
from routing.affinities import Affinities, FoundAffinity
from routing.models import Circuit, Demotion, Latency
from routing.policy import breaker
from routing.policy.breaker import BreakerSettings, CircuitSnapshot
from routing.policy.capabilities import Capability, Effective, valid_until
from routing.policy.files import file_pins
from routing.policy.latency import load_now
from routing.policy.plan import HardPin, PinKind
from routing.policy.resolution import ModelPolicy
from routing.policy.route import RoutingView, Target
from routing.policy.types import (
    ASSIGNMENT_WIDE,
    Candidate,
    CircuitReason,
    CircuitState,
    DataCollection,
    Price,
    RouteClass,
    Router,
    ToolRepresentation,
    TriState,
)
from routing.services import breaker_settings
from runtime import rawsql

CACHE_LIMIT = 512
# The model of an account-wide candidate (a route with no model, the Files API): its circuits are
# (assignment, "") per route class, apart from every model's.
ACCOUNT_MODEL = ""


@dataclass(frozen=True, slots=True)
class RouteSettings:
    max_attempts: int
    demotion_seconds: int
    backoff_base_ms: int
    default_deadline_ms: int
    breaker: BreakerSettings
    min_attempt_ms: int = 100


@dataclass(frozen=True, slots=True)
class ConfigSnapshot:
    settings: RouteSettings
    policy: ModelPolicy
    routes: dict[str, tuple[Candidate, ...]]  # healthy, undemoted: health is applied per request
    auto_models: tuple[str, ...]
    targets: dict[int, Target]
    accounts: tuple[Candidate, ...] = ()  # one per assignment, model "" (`RoutingView.accounts`)
    # The first expiry of a qualified capability it applied: from then on it is stale whatever the
    # config version says (an expiry moves no trigger).
    valid_until: datetime | None = None

    @property
    def assignment_ids(self) -> set[int]:
        return set(self.targets)


def _candidate(entry: CatalogEntry, capabilities: dict[Capability, Effective]) -> Candidate:
    a = entry.assignment
    tools = capabilities[Capability.TOOLS].value
    vision = capabilities[Capability.VISION].value
    return Candidate(
        assignment_id=a.pk,
        model=entry.model,
        assignment=a.name,
        pool=a.pool.name,
        adapter=a.adapter,
        tier=a.tier,
        weight=a.weight,
        region=a.region,
        router=Router(a.router),
        zero_retention=TriState(a.zero_retention),
        data_collection=DataCollection(a.data_collection),
        # The route's effective capabilities (evidence, else declared): the per-model values carry
        # them too, since the gate lets a known per-model value override the assignment's.
        tools=TriState(tools),
        write_tools=TriState(capabilities[Capability.WRITE_TOOLS].value),
        vision=TriState(vision),
        role_separation=TriState(capabilities[Capability.ROLE_SEPARATION].value),
        tool_representation=ToolRepresentation(capabilities[Capability.TOOL_REPRESENTATION].value),
        model_tools=TriState(tools),
        model_vision=TriState(vision),
        quality=a.quality,
        min_deadline_ms=a.min_deadline_ms,
        context_window=entry.context_window,
        max_output_tokens=entry.max_output_tokens,
        price=route_price(
            entry.model,
            entry.input_per_mtok_micros,
            entry.output_per_mtok_micros,
            cached_input=entry.cached_input_per_mtok_micros,
            cache_write=entry.cache_write_per_mtok_micros,
        ),
        provenance=entry.provenance or None,
    )


def config_load(pool_ids: tuple[int, ...], now: datetime) -> ConfigSnapshot:
    """Five queries whatever the number of pools, assignments and models."""
    # Read, never create: creating the singleton here would itself move the config version.
    settings = GatewaySettings.objects.filter(pk=1).first() or GatewaySettings()
    policy = ModelPolicy(
        aliases=dict(ModelAlias.objects.values_list("alias", "canonical")),
        fallbacks=dict(ModelFallback.objects.values_list("requested", "served")),
        family=settings.model_fallback_family,
    )
    entries = (
        CatalogEntry.objects.filter(assignment__pool_id__in=pool_ids, assignment__enabled=True)
        .select_related("assignment", "assignment__pool")
        .order_by("assignment__pool__name", "assignment__tier", "assignment__name", "model")
    )
    routes: dict[str, list[Candidate]] = {}
    auto_models: list[str] = []
    targets: dict[int, Target] = {}
    accounts: list[Candidate] = []
    pools_seen: set[int] = set()
    evidence = evidence_load(pool_ids=pool_ids, now=now)
    expiries: list[datetime] = []
    for entry in entries:
        a = entry.assignment
        capabilities = route_capabilities(
            a,
            model=entry.model,
            model_tools=entry.tools,
            model_vision=entry.vision,
            evidence=evidence.get((a.pk, entry.model), {}),
            now=now,
        )
        if (expiry := valid_until(capabilities)) is not None:
            expiries.append(expiry)
        candidate = _candidate(entry, {e.capability: e for e in capabilities})
        routes.setdefault(entry.model, []).append(candidate)
        if a.pk not in targets:
            accounts.append(
                replace(
                    candidate, model=ACCOUNT_MODEL, context_window=None, max_output_tokens=None, price=Price()
                )
            )
        targets[a.pk] = Target(
            a.pk,
            a.name,
            a.pool_id,
            a.adapter,
            a.base_url,
            a.api_key_env,
            a.credential,
            a.region,
            TriState(a.stream_options),
            settings.headroom_floor if a.headroom_floor is None else a.headroom_floor,
        )
        if a.pool_id not in pools_seen:
            pools_seen.add(a.pool_id)
            auto_models.extend(m for m in a.pool.auto_models if m not in auto_models)
    return ConfigSnapshot(
        settings=RouteSettings(
            max_attempts=settings.max_attempts,
            demotion_seconds=settings.demotion_seconds,
            backoff_base_ms=settings.backoff_base_ms,
            default_deadline_ms=settings.default_deadline_ms,
            breaker=breaker_settings(settings),
            min_attempt_ms=settings.min_attempt_ms,
        ),
        policy=policy,
        routes={model: tuple(candidates) for model, candidates in routes.items()},
        auto_models=tuple(auto_models),
        targets=targets,
        valid_until=min(expiries, default=None),
        accounts=tuple(accounts),
    )


_cache: dict[tuple[int, ...], tuple[int, ConfigSnapshot]] = {}


def config_cache_clear() -> None:
    _cache.clear()


def config_cached(pool_ids: tuple[int, ...], version: int | None, now: datetime) -> ConfigSnapshot | None:
    """What `config_snapshot` would return without a query, or None when it would load."""
    hit = _cache.get(pool_ids) if version is not None else None
    if hit is not None and hit[0] == version and (hit[1].valid_until is None or now < hit[1].valid_until):
        return hit[1]
    return None


def config_snapshot(pool_ids: tuple[int, ...], version: int | None, now: datetime) -> ConfigSnapshot:
    """The cached configuration of these pools at `version` (None: always load, never cache), as long
    as no qualified capability in it has expired by `now`."""
    hit = config_cached(pool_ids, version, now)
    if hit is not None:
        return hit
    snapshot = config_load(pool_ids, now)
    if version is not None:
        if len(_cache) >= CACHE_LIMIT:
            _cache.clear()
        _cache[pool_ids] = (version, snapshot)
    return snapshot


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


def health_sql(pools: str, models: int = 0) -> str:
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
    4,000 such rows, and a request plans over one or two of its models)."""
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
        "UNION ALL "
        + (
            f"{latencies} AND l.model IN ({rawsql.placeholders(models)}) AND EXISTS (SELECT 1 FROM n) "  # noqa: S608
            f"UNION ALL {latencies} AND NOT EXISTS (SELECT 1 FROM n)"
            if models
            else latencies
        )
    )


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


class GovernedRoutes(Mapping[str, tuple[Candidate, ...]]):
    """The configuration's routes with the request's health applied, one model at a time as it is looked
    up: a request reads the routes of one or two models, where its pools may serve hundreds, and a
    circuit or a demotion of any of them made every one of them be rebuilt."""

    __slots__ = ("_done", "_govern", "_routes")

    def __init__(
        self,
        routes: Mapping[str, tuple[Candidate, ...]],
        govern: Callable[[tuple[Candidate, ...]], tuple[Candidate, ...]],
    ) -> None:
        self._routes, self._govern = routes, govern
        self._done: dict[str, tuple[Candidate, ...]] = {}

    def __getitem__(self, model: str) -> tuple[Candidate, ...]:
        done = self._done.get(model)
        if done is None:
            done = self._done[model] = self._govern(self._routes[model])
        return done

    def get(self, model: str, default: Any = None) -> Any:
        # Mapping's own `get` looks up through `__getitem__` and catches its KeyError: an exception and
        # its traceback for each model the routes do not hold (a fallback, an alias's miss).
        return self[model] if model in self._routes else default

    def keys(self) -> KeysView[str]:
        # The configuration's own view: the membership tests of resolution, in C.
        return self._routes.keys()

    def __contains__(self, model: object) -> bool:
        return model in self._routes

    def __iter__(self) -> Iterator[str]:
        return iter(self._routes)

    def __len__(self) -> int:
        return len(self._routes)


# A model's candidates with their latency averages, headroom and load, as last built, by the configuration
# tuple they were built from: (that tuple, the (average, headroom, load) triples, the candidates built).
Measured = tuple[float | None, float | None, float | None]
_latency_built: dict[int, tuple[tuple[Candidate, ...], tuple[Measured, ...], tuple[Candidate, ...]]] = {}
_MEASURED_FIELDS = ("latency_ms", "headroom_left", "load")
_UNMEASURED = tuple(name for name in Candidate.__slots__ if name not in _MEASURED_FIELDS)
_set = object.__setattr__


def _measured(c: Candidate, value: Measured) -> Candidate:
    """`c` with `value` as its (latency_ms, headroom_left, load): `dataclasses.replace` without its
    per-field checks and keyword `__init__` (a third of its cost; `c` was built and checked already).
    A request rebuilds a candidate whenever its decayed load moves by a tenth, most requests at load."""
    copy = object.__new__(Candidate)
    for name in _UNMEASURED:
        _set(copy, name, getattr(c, name))
    _set(copy, "latency_ms", value[0])
    _set(copy, "headroom_left", value[1])
    _set(copy, "load", value[2])
    return copy


def with_latency(
    candidates: tuple[Candidate, ...],
    latency: Mapping[tuple[int, str], float],
    headroom: Mapping[tuple[int, str], tuple[float, datetime]],
    now: datetime,
    load: Mapping[tuple[int, str], tuple[float, datetime]] | None = None,
) -> tuple[Candidate, ...]:
    """`candidates` with `latency_ms` filled from `latency` (None where a pair has no average yet),
    `headroom_left` from `headroom` while its limit has not reset by `now`, and `load` from `load`
    decayed to `now` (rounded to a tenth, so it changes the candidates no more often than it matters).
    Built once per change of these, not per request: a candidate's copy costs a few microseconds, a
    pool of twenty accounts a tenth of a millisecond a request (routing.policy.latency)."""
    loads = load or {}
    values = []
    for c in candidates:
        key = c.key
        left = headroom.get(key)
        served = loads.get(key)
        values.append(
            (
                latency.get(key),
                left[0] if left is not None and now < left[1] else None,
                round(load_now(served[0], served[1], now), 1) if served is not None else None,
            )
        )
    measured = tuple(values)
    built = _latency_built.get(id(candidates))
    if built is not None and built[0] is candidates and built[1] == measured:
        return built[2]
    result = tuple(
        c if (c.latency_ms, c.headroom_left, c.load) == v else _measured(c, v)
        for c, v in zip(candidates, measured, strict=True)
    )
    if len(_latency_built) >= CACHE_LIMIT:
        _latency_built.clear()
    # Holds `candidates`: its id stays its own.
    _latency_built[id(candidates)] = (candidates, measured, result)
    return result


def routing_view_load(
    *,
    pool_ids: tuple[int, ...],
    route_class: RouteClass,
    now: datetime,
    config_version: int | None = None,
    health: HealthState | None = None,
    config: ConfigSnapshot | None = None,
) -> tuple[RoutingView, RouteSettings]:
    """The routing view of these pools; `health`: their health as already read (`request_state_load`),
    else it is read here; `config`: their configuration as already found (`config_cached`), else it is
    taken from `config_snapshot`."""
    if config is None:
        config = config_snapshot(pool_ids, config_version, now)
    if health is None:
        health = health_load(pool_ids=pool_ids, route_class=route_class, now=now)
    circuits, wide, demoted, latency = health.circuits, health.wide, health.demoted, health.latency
    headroom = health.headroom
    bs = config.settings.breaker
    routes = config.routes

    def governed(c: Candidate) -> Candidate:
        snapshot, _ = breaker.governing(circuits.get(c.key), wide.get(c.assignment_id))
        return replace(c, health=breaker.health(snapshot, bs, now), demoted=c.key in demoted)

    def govern(candidates: tuple[Candidate, ...]) -> tuple[Candidate, ...]:
        if latency:
            candidates = with_latency(candidates, latency, headroom, now, health.load)
        if not (circuits or demoted or wide):
            return candidates
        return tuple(
            c
            if c.key not in circuits and c.key not in demoted and c.assignment_id not in wide
            else governed(c)
            for c in candidates
        )

    if circuits or demoted or wide or latency:
        routes = GovernedRoutes(routes, govern)
    accounts = config.accounts
    if circuits or wide:  # an account's own circuits, governed by its credential circuit (as every model's)
        accounts = tuple(
            c if c.key not in circuits and c.assignment_id not in wide else governed(c) for c in accounts
        )
    view = RoutingView(
        accounts=accounts,
        policy=config.policy,
        max_attempts=config.settings.max_attempts,
        routes=routes,
        auto_models=config.auto_models,
        circuits=circuits,
        wide=wide,
        targets=config.targets,
    )
    return view, config.settings


def pool_names(pool_ids: tuple[int, ...]) -> list[str]:
    return list(Pool.objects.filter(pk__in=pool_ids).order_by("name").values_list("name", flat=True))


@dataclass(frozen=True, slots=True)
class RoutingInputs:
    """Everything `routing.policy.route.decide` needs besides the key, the model and the requirements: the
    one gathering of inputs that the proxy, `manage.py routing_explain` and the panel's health
    signals share, so they cannot disagree (e.g. on an unknown `previous_response_id`)."""

    view: RoutingView
    settings: RouteSettings
    pins: tuple[HardPin, ...]
    session: FoundAffinity | None


def routing_inputs_load(
    *,
    pool_ids: tuple[int, ...],
    route_class: RouteClass,
    now: datetime,
    affinities: Affinities,
    config_version: int | None = None,
    health: HealthState | None = None,
    config: ConfigSnapshot | None = None,
) -> RoutingInputs:
    """A response this key had relayed pins the request to its assignment (§5.2, §7.2); one it never
    saw, another key's, or one whose affinity expired pins nothing, and the upstream answers for
    itself. `affinities`: the key's live ones for the request's ids (read with the key on the request
    path, `request_state_load`; by `affinities_load` elsewhere). `health` and `config` as for
    `routing_view_load`: with both, no query is made."""
    view, settings = routing_view_load(
        pool_ids=pool_ids,
        route_class=route_class,
        now=now,
        config_version=config_version,
        health=health,
        config=config,
    )
    pins: tuple[HardPin, ...] = ()
    if affinities.response is not None:
        pins = (HardPin(PinKind.RESPONSE, affinities.response.assignment_id),)
    # A file the key uploaded pins the request to the account that holds it (two such accounts, or
    # one that left the pools: 409); a file id it does not own pins nothing (SPEC §5.2, §7.2).
    pins += file_pins([affinity.assignment_id for affinity in affinities.files.values()])
    return RoutingInputs(view, settings, pins, affinities.session)
