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

import heapq
import math
from collections.abc import Callable, Iterator, KeysView, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from types import MappingProxyType
from typing import Any

from catalog.models import CatalogEntry
from catalog.prices import route_price
from catalog.selectors import evidence_load, route_capabilities
from pools.models import (
    GatewaySettings,
    ModelAlias,
    ModelFallback,
    Pool,
)
from routing.affinities import Affinities, FoundAffinity
from routing.health_state import HealthState, health_load
from routing.policy import breaker
from routing.policy.breaker import BreakerSettings
from routing.policy.capabilities import Capability, Effective, valid_until
from routing.policy.files import file_pins
from routing.policy.latency import load_now
from routing.policy.plan import HardPin, PinKind
from routing.policy.resolution import ModelPolicy
from routing.policy.route import RoutingView, Target
from routing.policy.types import (
    Candidate,
    DataCollection,
    Price,
    RouteClass,
    Router,
    ToolRepresentation,
    TriState,
)
from routing.services import breaker_settings

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


Measured = tuple[float | None, float | None, float | None]
_MEASURED_FIELDS = ("latency_ms", "headroom_left", "load")
_UNMEASURED = tuple(name for name in Candidate.__slots__ if name not in _MEASURED_FIELDS)
_set = object.__setattr__
# How early a candidate's figures are looked at again before they can change (`_due`): far above the error
# of a float timestamp (under a microsecond) and of the logarithm, so a change is never missed.
_EARLY_S = 1e-3
_NEVER = float("inf")
_NO_LOAD: Mapping[tuple[int, str], tuple[float, datetime]] = MappingProxyType({})


def _measured(c: Candidate, value: Measured) -> Candidate:
    """`c` with `value` as its (latency_ms, headroom_left, load): `dataclasses.replace` without its
    per-field checks and keyword `__init__` (a third of its cost; `c` was built and checked already)."""
    copy = object.__new__(Candidate)
    for name in _UNMEASURED:
        _set(copy, name, getattr(c, name))
    _set(copy, "latency_ms", value[0])
    _set(copy, "headroom_left", value[1])
    _set(copy, "load", value[2])
    return copy


def _figures(
    key: tuple[int, str],
    latency: Mapping[tuple[int, str], float],
    headroom: Mapping[tuple[int, str], tuple[float, datetime]],
    loads: Mapping[tuple[int, str], tuple[float, datetime]],
    now: datetime,
    built: datetime,
) -> tuple[Measured, float, float]:
    """A candidate's (latency, headroom, load) at `now` (`with_latency`'s rules), its load decayed to
    `built`; the timestamp from which they may differ (a headroom until its limit resets, else never,
    until the rows change); and the timestamp of the reset that left its headroom out, if one did
    (before it, they were different)."""
    left = headroom.get(key)
    due, settled = _NEVER, -_NEVER
    room = None
    if left is not None:
        if now < left[1]:
            room = left[0]
            due = left[1].timestamp() - _EARLY_S
        else:
            settled = left[1].timestamp()
    served = loads.get(key)
    load = None if served is None else round(load_now(served[0], served[1], built), 1)
    return (latency.get(key), room, load), due, settled


@dataclass(frozen=True, slots=True)
class _Built:
    """A model's candidates as `with_latency` last built them: from `candidates` and the three mappings
    (by identity: a request state read again with the same rows keeps them, `routing.request_state`),
    their loads decayed to `built` (the first request's time), at `stamp` (now's timestamp); `due` a heap
    of (timestamp from which candidate i may change, i); `settled` the latest reset they reflect (a
    request earlier than it builds them again; one between it and `stamp` is answered with them)."""

    candidates: tuple[Candidate, ...]
    sources: tuple[object, object, object]
    built: datetime
    stamp: float
    settled: float
    values: list[Measured]
    result: tuple[Candidate, ...]
    due: list[tuple[float, int]]


# By id of the configuration tuple they were built from (each entry holds that tuple: its id stays its own).
_latency_built: dict[int, _Built] = {}


def with_latency(
    candidates: tuple[Candidate, ...],
    latency: Mapping[tuple[int, str], float],
    headroom: Mapping[tuple[int, str], tuple[float, datetime]],
    now: datetime,
    load: Mapping[tuple[int, str], tuple[float, datetime]] | None = None,
) -> tuple[Candidate, ...]:
    """`candidates` with `latency_ms` filled from `latency` (None where a pair has no average yet),
    `headroom_left` from `headroom` while its limit has not reset by `now`, and `load` from `load`
    decayed to when these rows were first built on (rounded to a tenth).

    Built once per set of rows (issue 49), then the same tuple for every request on them, so what is
    worked out of a routes tuple is worked out once (`routing.policy.plan`): a request looks again only
    at the candidates whose headroom's limit has reset since, by a heap of when each does, and copies
    only those. The loads are not decayed again per request: a decay halves every load of the rows
    alike, so which of two is the busier, all the draw asks of them (`routing.policy.preference`), is
    the same at any later time (to their rounding); the rows themselves are read again at least every
    `routing.request_state.FIGURES_MAX_AGE_S` under traffic. A request decided out of order (concurrent
    requests are) gets the same tuple unless a reset it must not see was applied, then it and new rows
    build it all again."""
    loads = _NO_LOAD if load is None else load  # one empty mapping: the same source every time
    stamp = now.timestamp()
    sources = (latency, headroom, loads)
    built = _latency_built.get(id(candidates))
    if (
        built is not None
        and built.candidates is candidates
        and all(a is b for a, b in zip(built.sources, sources, strict=True))
        and stamp >= built.settled
    ):
        if not built.due or built.due[0][0] > stamp:  # nothing due: the same, earlier than `stamp` too
            return built.result
        # Copies, not changes in place: another thread may be reading this entry.
        due, values, result = list(built.due), list(built.values), list(built.result)
        changed, settled = False, built.settled
        while due and due[0][0] <= stamp:
            _, i = heapq.heappop(due)
            c = candidates[i]
            value, when, reset = _figures(c.key, latency, headroom, loads, now, built.built)
            settled = max(settled, reset)
            if value != values[i]:
                values[i], changed = value, True
                result[i] = c if (c.latency_ms, c.headroom_left, c.load) == value else _measured(c, value)
            if when != _NEVER:
                heapq.heappush(due, (max(when, math.nextafter(stamp, _NEVER)), i))
        out = tuple(result) if changed else built.result
        entry = _Built(candidates, sources, built.built, stamp, settled, values, out, due)
        _latency_built[id(candidates)] = entry
        return out
    values = []
    due = []
    rebuilt = []
    settled = -_NEVER
    for i, c in enumerate(candidates):
        value, when, reset = _figures(c.key, latency, headroom, loads, now, now)
        settled = max(settled, reset)
        values.append(value)
        rebuilt.append(c if (c.latency_ms, c.headroom_left, c.load) == value else _measured(c, value))
        if when != _NEVER:
            due.append((max(when, math.nextafter(stamp, _NEVER)), i))
    heapq.heapify(due)
    out = tuple(rebuilt)
    if built is not None and built.candidates is candidates and built.result == out:
        out = built.result  # the same candidates as before: the same tuple, for what is cached by it
    if len(_latency_built) >= CACHE_LIMIT:
        _latency_built.clear()
    _latency_built[id(candidates)] = _Built(candidates, sources, now, stamp, settled, values, out, due)
    return out


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
