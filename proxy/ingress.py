"""The request path every ingress shares (SPEC §4, §5): the HTTP views (`proxy.views`), the Responses
websocket consumer (`proxy.consumers`), the Files API (`proxy.files`) and the ASGI edge
(`gatewaysite.asgi`). `prepare` authenticates, reads the routing state in one database hop, decides
(`route_request`; on PostgreSQL drafted while that read is on the wire, and kept only if the read finds
what the draft assumed: `_read`), and builds the Relay; the typed error responses, body decoding and
header parsing live beside it. An ingress only parses its own framing and delivers the result, and
imports this module, never another ingress.
"""

import contextlib
import json
import math
import random
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpResponse

from pools.models import hash_key
from pools.selectors import Authenticated
from proxy import edge, limits
from proxy.dispatch import HttpDispatch
from proxy.ledger.exchange import Exchange, Lease, Memory
from proxy.ledger.recorder import record
from proxy.limits import Finishing, Ticket, guarded
from proxy.outcomes import probe_circuit
from proxy.relay import Relay, call_for
from proxy.transport import Dispatch
from proxy.wire.apis.registry import STREAMING, api_for
from proxy.wire.providers.base import UpstreamCall
from proxy.wire.providers.registry import carriers
from proxy.wire.sse import Dialect
from proxy.wire.translations.translate import RequestTranslationError
from routing import services
from routing.policy.auto import AutoError
from routing.policy.conversation import conversation_key
from routing.policy.eligibility import tighten
from routing.policy.errors import ErrorCode
from routing.policy.files import TooManyFiles, file_ids_of
from routing.policy.plan import HardPin, PlanError
from routing.policy.resolution import ResolutionError
from routing.policy.route import (
    Decision,
    RequirementsHeaderError,
    RoutingView,
    decide,
    lease_candidate,
    parse_requirements_header,
)
from routing.policy.sanitize import valid as valid_field
from routing.policy.types import Candidate, Requirements, RouteClass
from routing.policy.vocabulary import ClientRoute
from routing.selectors import (
    Affinities,
    AffinityIds,
    ConfigSnapshot,
    RequestState,
    RouteSettings,
    RoutingInputs,
    config_cached,
    narrowing,
    request_state_from_rows,
    request_state_load,
    request_state_query,
    routing_inputs_load,
)
from routing.services import Seen
from runtime import db, loopdb
from runtime.reply import Reply

# The routes a request may stream from, and the dialect its stream is framed in.
DIALECTS = {route: api.dialect for route, api in STREAMING.items()}
RESPONSES_ROUTES = (ClientRoute.RESPONSES, ClientRoute.RESPONSES_COMPACT)
COMPACT = ClientRoute.RESPONSES_COMPACT


class RequestFailed(Exception):
    """A request the gateway answers with its own typed error `code` (a refusal of the routing rules,
    `routing.policy.errors.ErrorCode`, is one by value)."""

    def __init__(
        self, code: str, param: str | None = None, *, retry_after: int | None = None, model: str = ""
    ) -> None:
        super().__init__(code)
        self.code, self.param, self.retry_after = ErrorCode(code), param, retry_after
        self.message = self.code.about(model)  # a refusal about a model names it


def typed_response(
    route: str, code: ErrorCode, param: str | None = None, message: str | None = None
) -> HttpResponse:
    """The gateway's typed error `code` in the envelope of the API `route` belongs to (SPEC §4);
    `message`: its own words for this request (else the code's)."""
    status = code.status
    message = message or code.message
    if code == ErrorCode.NO_ELIGIBLE_BACKEND and param:
        message = f"no eligible backend: {param}"  # what excluded the last candidate, in words too
    if code == ErrorCode.RATE_LIMIT_EXCEEDED and param:
        message = f"This key's {param} limit is reached."
    api = api_for(route)
    kind = api.error_type(code, code=code, status=status, param=param)
    body = api.error_body(type=kind, code=code, param=param, message=message)
    response = HttpResponse(body, status=status, content_type="application/json")
    response["x-should-retry"] = "true" if code.should_retry(param) else "false"
    return response


def request_id_headers(response: HttpResponse | Reply, request_id: str) -> None:
    """The gateway's request id under the names the SDKs read into their exceptions (SPEC §4):
    `x-request-id` (openai) and `request-id` (anthropic)."""
    response["x-gateway-request-id"] = request_id
    response["x-request-id"] = request_id
    response["request-id"] = request_id


def typed_failure(
    exchange: Exchange, code: ErrorCode, param: str | None = None, message: str | None = None
) -> HttpResponse:
    """`typed_response` for `exchange`'s route, recorded as the exchange's outcome and status."""
    response = typed_response(exchange.route, code, param, message)
    exchange.refused(code, param, response.status_code)
    return response


def bearer(headers: Mapping[str, str]) -> str:
    """The gateway key of `Authorization: Bearer <key>` or `x-api-key: <key>` (lowercase names, or
    Django's case-insensitive `request.headers`)."""
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return headers.get("x-api-key", "").strip()


def parse_body(raw: bytes, refusal: str | None = None) -> dict:
    """The request's JSON body, checked (`validate_body`); RequestFailed with the typed code else.
    `refusal`: why the edge left the body unread (gatewaysite.asgi)."""
    if refusal is not None:
        raise RequestFailed(refusal)
    if len(raw) > settings.GATEWAY_MAX_BODY_BYTES:
        raise RequestFailed(ErrorCode.REQUEST_TOO_LARGE)
    try:
        return validate_body(decode_json(raw.decode("utf-8")))
    except UnicodeDecodeError:
        raise RequestFailed(ErrorCode.INVALID_REQUEST) from None


def _refuse_constant(constant: str) -> None:
    # NaN and Infinity are Python's extensions, not JSON: no upstream would accept them.
    raise ValueError(constant)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses to inf
        raise ValueError(text)
    return value


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def decode_json(text: str) -> object:
    """A client's JSON, or RequestFailed: no NaN/Infinity or overflowing numbers, no nesting deep
    enough to exhaust the parser, and no lone UTF-16 surrogate (valid JSON that no upstream can be
    sent, since it cannot be encoded as UTF-8)."""
    try:
        body = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite)
        if _SURROGATE_ESCAPE.search(text):
            json.dumps(body, ensure_ascii=False).encode("utf-8")
    except (ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
        raise RequestFailed(ErrorCode.INVALID_REQUEST) from None
    return body


def validate_body(body: object) -> dict:
    """The checks every OpenAI-shaped body gets before routing (the upstream judges the rest)."""
    if not isinstance(body, dict):
        raise RequestFailed(ErrorCode.INVALID_REQUEST)
    model = body.get("model")
    if not isinstance(model, str) or not model or len(model) > 200 or not model.isprintable():
        raise RequestFailed(ErrorCode.INVALID_REQUEST, "model")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise RequestFailed(ErrorCode.INVALID_REQUEST, "stream")
    if "messages" in body and not isinstance(body["messages"], list):
        raise RequestFailed(ErrorCode.INVALID_REQUEST, "messages")
    return body


def operation_id(headers: Mapping[str, str]) -> str | None:
    """The client's `x-gateway-operation-id` (the logical operation a retry or a fallback continues),
    held to the same alphabet as any id the ledger stores; anything else is a typed 400."""
    value = headers.get("x-gateway-operation-id")
    if value is None:
        return None
    if not valid_field(value):
        raise RequestFailed(ErrorCode.INVALID_REQUEST, "x-gateway-operation-id")
    return value


def headers_requirements(headers: Mapping[str, str], default_deadline_ms: int) -> tuple[Requirements, int]:
    try:
        extra = parse_requirements_header(headers.get("x-gateway-requirements", ""))
    except RequirementsHeaderError:
        raise RequestFailed(ErrorCode.INVALID_REQUEST, "x-gateway-requirements") from None
    deadline_ms = default_deadline_ms
    raw = headers.get("x-gateway-deadline-ms")
    if raw is not None:
        try:
            asked = int(raw)
        except ValueError:
            raise RequestFailed(ErrorCode.INVALID_REQUEST, "x-gateway-deadline-ms") from None
        if asked <= 0:
            raise RequestFailed(ErrorCode.INVALID_REQUEST, "x-gateway-deadline-ms")
        deadline_ms = min(asked, default_deadline_ms)
    return extra, deadline_ms


@dataclass(frozen=True, slots=True)
class Loaded:
    """Everything the request path reads from the database: for a request that finds its
    configuration cached, one statement (affinities included)."""

    authenticated: Authenticated
    inputs: RoutingInputs | None = None
    refusal: RequestFailed | None = None  # an id the request names that the key holds no affinity for


@dataclass(frozen=True, slots=True)
class ReadArgs:
    """What the request's read needs to know of the request."""

    raw_key: str
    body: dict | None
    path: str
    session_key: str | None
    now: datetime
    route_class: RouteClass
    file_ids: tuple[str, ...] = ()

    def affinity_ids(self) -> AffinityIds:
        """The ids whose affinities the read looks up with the key (none for a request without a
        body: it is refused once the key is known)."""
        if self.body is None:
            return AffinityIds()
        return AffinityIds(self.previous_response_id(), self.session_key, self.file_ids)

    def loaded(self, state: RequestState, config: ConfigSnapshot | None = None) -> Loaded:
        """The read of a request with a body: its routing inputs and whether it names an id it may not."""
        assert self.body is not None
        authenticated = state.authenticated
        inputs = routing_inputs_load(
            pool_ids=authenticated.key.pool_ids,
            route_class=self.route_class,
            now=self.now,
            affinities=state.affinities,
            config_version=authenticated.config_version,
            health=state.health,
            config=config,
        )
        return Loaded(authenticated, inputs, self.unheld(state.affinities))

    def unheld(self, affinities: Affinities) -> RequestFailed | None:
        """The gateway forwards only the `previous_response_id` and `file_id`s it saw this key create
        (SPEC §7.2): any other (never seen, expired, created on the upstream directly, or another key's:
        one answer from the same lookup) is refused as OpenAI refuses an unknown one, nothing sent."""
        if self.previous_response_id() is not None and affinities.response is None:
            return RequestFailed(ErrorCode.PREVIOUS_RESPONSE_NOT_FOUND, "previous_response_id")
        if any(file_id not in affinities.files for file_id in self.file_ids):
            return RequestFailed(ErrorCode.FILE_NOT_FOUND, "file_id")
        return None

    def previous_response_id(self) -> str | None:
        previous = self.body.get("previous_response_id") if self.body is not None else None
        return previous if self.path in RESPONSES_ROUTES and isinstance(previous, str) else None


def _load(args: ReadArgs) -> Loaded | None:
    """The read on runtime.db's threads, when the loop cannot make it (`_read`)."""
    state = request_state_load(
        args.raw_key, route_class=args.route_class, now=args.now, affinity=args.affinity_ids()
    )
    if state is None:
        return None
    if args.body is None:
        return Loaded(state.authenticated)
    return args.loaded(state)


@dataclass(frozen=True, slots=True)
class Routed:
    """What a request is decided from its read and itself alone (`route_request`): no I/O, so it can be
    drafted while the read is on its way (`_read`)."""

    loaded: Loaded
    inputs: RoutingInputs
    requirements: Requirements
    deadline_ms: int
    client_deadline: bool  # the client's x-gateway-deadline-ms set it (a cut is neutral), not the default
    decide: Callable[..., Decision]  # the decision again, for a request that took a probe lease
    decision: Decision
    # The request the plan's first candidate is sent (its key, its call): none when there is no plan,
    # or when the candidate's API cannot carry the request (the relay passes it over).
    first_call: tuple[tuple[int, str], UpstreamCall] | None


def forwarded(headers: Mapping[str, str], path: str) -> Mapping[str, str]:
    """The client's headers its route's API passes on to the provider (`ClientApi.forwarded_headers`)."""
    return {name: headers[name] for name in api_for(path).forwarded_headers if name in headers}


def route_request(
    loaded: Loaded,
    *,
    headers: Mapping[str, str],
    path: str,
    body: dict,
    body_size: int,
    pins: Sequence[HardPin],
) -> Routed:
    """The request's requirements (its key's, its headers', its turn's), its routing decision and the
    request its plan's first candidate is sent (`proxy.relay.call_for`: drafted with the decision, it
    is built while the read is on the wire); its headers' typed errors as RequestFailed."""
    inputs = loaded.inputs
    assert inputs is not None
    route_settings, session = inputs.settings, inputs.session
    extra, deadline_ms = headers_requirements(headers, route_settings.default_deadline_ms)
    turn = api_for(path).turn_requirements(body, body_size)
    requirements = tighten(
        tighten(loaded.authenticated.key.requirements, extra),
        replace(
            turn,
            adapters=carriers(ClientRoute(path).tail),
            min_attempt_ms=route_settings.min_attempt_ms,
            # Gated with the rest before the shortlist is cut (§5.3); each attempt is gated again for
            # what is left of it when its turn comes (proxy.relay).
            deadline_remaining_ms=deadline_ms,
        ),
    )
    decide_now = partial(
        decide,
        inputs.view,
        loaded.authenticated.key,
        body["model"],
        requirements,
        pins=[*pins, *inputs.pins],
        session_assignment_id=session.assignment_id if session else None,
        session_model=(session.model or None) if session else None,
        # Equal candidates share the load: each request draws its own first one (§5.4).
        draw=random.random() if settings.GATEWAY_POOL_FEATURES else None,  # noqa: S311
    )
    decision = decide_now()
    first_call = None
    if decision.plan is not None and decision.plan.order:
        first = decision.plan.order[0]
        with contextlib.suppress(RequestTranslationError):
            call = call_for(
                ClientRoute(path).tail,
                inputs.view,
                first,
                body,
                requirements,
                forwarded(headers, path),
            )
            first_call = (first.key, call)
    client_deadline = deadline_ms < route_settings.default_deadline_ms
    return Routed(
        loaded, inputs, requirements, deadline_ms, client_deadline, decide_now, decision, first_call
    )


@dataclass(frozen=True, slots=True)
class Known:
    """A key's state as its last read found it (`_read`): the statement's rows, what they say, and
    whether the read before found the same rows (a key whose rows change with every request, as a
    budget's reservations make them, is not worth a draft)."""

    rows: list[tuple]
    state: RequestState
    steady: bool


# Key digest -> its last read, the least recently read first. Used only against a request's own read: a
# draft is kept only when that read returns these very rows, and a narrowing (`Narrowing`) is checked by
# the statement itself, so nothing here is ever routed on without the database's word. Past KNOWN_LIMIT
# keys the least recently read is forgotten, not all of them: a population of keys larger than the
# limit keeps its active ones.
_known: OrderedDict[str, Known] = OrderedDict()
KNOWN_LIMIT = 1024

_answering = 0  # requests (HTTP, websocket turns) this process is answering (`answering`)


@contextlib.contextmanager
def answering() -> Iterator[None]:
    """Counts a request while it is answered: an HTTP request at the edge (gatewaysite.asgi), a websocket
    turn from its frame to its last event (proxy.consumers). A request is drafted only when it is the
    one being answered: then the loop has nothing else to do while its read is out. With others in
    flight the loop has their work for that time, and a draft would only put this request's decision
    ahead of it (at c=50 against a 50 ms upstream, 3 % less throughput with every request drafted,
    bench/profile.md)."""
    global _answering
    _answering += 1
    try:
        yield
    finally:
        _answering -= 1


def _learn(digest: str, rows: list[tuple], known: Known | None) -> RequestState | None:
    """The state `rows` say for the key `digest`, remembered as its last read (or forgotten)."""
    if known is not None and rows == known.rows:
        if not known.steady:
            _known[digest] = Known(rows, known.state, steady=True)
        _known.move_to_end(digest)
        return known.state
    state = request_state_from_rows(rows, digest)
    if state is None:
        _known.pop(digest, None)
        return None
    _known[digest] = Known(rows, state, steady=False)
    _known.move_to_end(digest)
    if len(_known) > KNOWN_LIMIT:
        _known.popitem(last=False)
    return state


def _draft(
    draft: Callable[[Loaded], Routed], state: RequestState, args: ReadArgs, into: list[Routed]
) -> None:
    """The request decided from its key's last state, while its own read is on its way (a configuration
    not cached is left to the read: loading it is I/O). A request the draft refuses (its headers) is
    decided again from its own read, which refuses it in the order the path checks things (the key
    first)."""
    authenticated = state.authenticated
    config = config_cached(authenticated.key.pool_ids, authenticated.config_version, args.now)
    if config is None:
        return
    with contextlib.suppress(RequestFailed):
        into.append(draft(args.loaded(state, config)))


async def _read(
    args: ReadArgs, deadline: float, draft: Callable[[Loaded], Routed] | None = None
) -> tuple[Loaded | None, Routed | None]:
    """The request's read by `deadline` (monotonic). Its statement runs on the event loop
    (runtime.loopdb), and so does the routing state built from it when the configuration is cached;
    else what is left goes to runtime.db's threads, and all of it when the loop has no connection to
    give (PostgreSQL) or its read would wait for a lock (SQLite).

    With `draft` (the request's decision from a Loaded, `route_request`), while the statement is on its
    way the loop decides the request from its key's last state; the draft comes back with the read only
    when the read found exactly the rows that state came from (the same rows: the same state, the same
    decision). At low load the decision then costs no time: the loop would otherwise wait for the rows."""

    def left() -> float:
        return max(deadline - time.monotonic(), MIN_READ_S)

    known = _known.get(hash_key(args.raw_key)) if args.raw_key else None
    narrow = None
    if known is not None and args.body is not None:
        # The models this request plans over, in the configuration its key's last read had: only their
        # latency rows are read (the statement reads them all if the key's pools or version moved).
        last = known.state.authenticated
        narrow = narrowing(last.key.pool_ids, last.config_version, args.body.get("model"), args.now)
    query = request_state_query(
        args.raw_key,
        route_class=args.route_class,
        now=args.now,
        affinity=args.affinity_ids(),
        narrow=narrow,
    )
    if query is None:
        return None, None
    drafted: list[Routed] = []
    meanwhile = None
    if draft is not None and known is not None and known.steady and _answering <= 1:
        meanwhile = partial(_draft, draft, known.state, args, drafted)
    try:
        rows = await loopdb.fetch_within(left(), query.sql, query.params, meanwhile)
    except loopdb.NoConnection:
        return await db.run_within(left(), _load, args), None
    state = _learn(query.digest, rows, known)
    if state is None:
        return None, None
    if args.body is None:
        return Loaded(state.authenticated), None
    if drafted and known is not None and state is known.state:
        return drafted[0].loaded, drafted[0]
    authenticated = state.authenticated
    config = config_cached(authenticated.key.pool_ids, authenticated.config_version, args.now)
    if config is not None:
        return args.loaded(state, config), None  # no query
    return await db.run_within(left(), args.loaded, state), None


READ_TIMEOUT_S = edge.READ_TIMEOUT_S  # the ingresses' reads outside a request (a handshake, a file)
MIN_READ_S = 0.1  # the shortest a request's read before dispatch may wait


async def prepare(
    exchange: Exchange,
    *,
    headers: Mapping[str, str],
    path: str,
    body: dict | None,
    body_error: RequestFailed | None,
    body_size: int,
    started: float,
    route_class: RouteClass,
    dialect: Dialect | None,
    dispatch: Dispatch | None = None,
    pins: Sequence[HardPin] = (),
    raw: bytes | str | None = None,
) -> Relay:
    """The Relay for one client request, or RequestFailed with its typed code (the exchange records
    what was learnt before: the key, the requested model). `headers` are the request's (an HTTP
    request's, or a websocket handshake's); `pins` are the ingress's own hard pins (a live websocket);
    `raw` is the body as sent, if the ingress has it (it spares most bodies the search for file ids)."""
    session_key = conversation_key(headers, body, derived=settings.GATEWAY_POOL_FEATURES)
    now = datetime.now(UTC)
    try:
        file_ids = file_ids_of(body, raw) if body is not None else ()
    except TooManyFiles:
        file_ids, body_error = (), body_error or RequestFailed(ErrorCode.INVALID_REQUEST, "file_id")
    draft = None
    if body is not None and body_error is None:
        draft = partial(route_request, headers=headers, path=path, body=body, body_size=body_size, pins=pins)
    try:
        loaded, drafted = await _read(
            ReadArgs(bearer(headers), body, path, session_key, now, route_class, file_ids),
            # The read's bound counts from the request's start (a websocket frame may have waited for
            # its key check).
            started + edge.read_timeout_s(headers),
            draft,
        )
    except DatabaseError:
        # Without the database nothing can be authorized or routed: fail fast, typed, and let the
        # pool's health-checked connections recover on their own once it is back.
        raise RequestFailed(ErrorCode.GATEWAY_UNAVAILABLE) from None
    if loaded is None:
        raise RequestFailed(ErrorCode.AUTHENTICATION_ERROR)
    exchange.key_id = loaded.authenticated.key.key_id
    exchange.key_name = loaded.authenticated.key.name
    exchange.config_version = loaded.authenticated.config_version
    exchange.budget_period = loaded.authenticated.budget_period
    if body_error is not None or body is None or draft is None:
        raise body_error or RequestFailed(ErrorCode.INVALID_REQUEST)
    exchange.requested_model = body["model"]
    exchange.transport = str(route_class)
    if loaded.refusal is not None:
        raise loaded.refusal
    routed = drafted or draft(loaded)
    view, route_settings, session = routed.inputs.view, routed.inputs.settings, routed.inputs.session
    decision = routed.decision
    deadline = started + routed.deadline_ms / 1000
    leased = await take_lease(view, route_class, route_settings, lease_candidate(decision), deadline)
    if leased is not None:
        decision = routed.decide(held={leased.candidate})
    if isinstance(decision.error, ResolutionError | AutoError):
        code = str(decision.error.code)
        param = (
            str(decision.error.reason)
            if isinstance(decision.error, AutoError) and decision.error.reason
            else None
        )
        model = decision.error.model if isinstance(decision.error, ResolutionError) else "auto"
        raise RequestFailed(code, param, model=model)
    if isinstance(decision.error, PlanError):
        raise RequestFailed(str(decision.error.code))
    assert decision.plan is not None and decision.resolution is not None
    ticket = await admit_limits(loaded.authenticated, leased, deadline)  # the last check before dispatch
    exchange.served_model = decision.resolution.served
    if decision.resolution.is_fallback:
        exchange.fallback_reason = str(decision.resolution.fallback)
    relay = Relay(
        exchange=exchange,
        view=view,
        plan=decision.plan,
        breaker_settings=route_settings.breaker,
        demotion_seconds=route_settings.demotion_seconds,
        backoff_base_ms=route_settings.backoff_base_ms,
        requirements=routed.requirements,
        deadline=deadline,
        client_deadline=routed.client_deadline,
        path=ClientRoute(path).tail,
        body=body,
        route_class=route_class,
        dialect=dialect,
        on_finish=record if ticket is None else Finishing(record, ticket),
        single_attempt=path == COMPACT,
        memory=Memory(
            response_ids=path in RESPONSES_ROUTES,
            session=session_key,
            session_seen=(session.assignment_id, session.model) if session else None,
        ),
        dispatch=dispatch or HttpDispatch(api=api_for(path)),
        client_headers=forwarded(headers, path),
        lease=leased,
        first_call=routed.first_call,
    )
    return guarded(relay, ticket)


async def admit_limits(
    authenticated: Authenticated, leased: Lease | None, deadline: float | None = None
) -> Ticket | None:
    """Admit the request under its key's `limits` (proxy.limits); a key without limits costs nothing
    here. Refused: 429 rate_limit_exceeded naming the limit, and the probe lease it took is freed."""
    if not authenticated.limits:
        return None
    wait_s = limits.DB_WAIT_S if deadline is None else min(deadline - time.monotonic(), limits.DB_WAIT_S)
    try:
        return await limits.admit(authenticated.key.key_id, authenticated.limits, max(wait_s, MIN_READ_S))
    except (limits.LimitExceeded, limits.LimitsUnavailable) as refusal:
        if leased is not None:  # its candidate will not be tried by this request
            with contextlib.suppress(DatabaseError):  # else the probe lease runs out on its own
                await db.write(services.circuit_release_probe, key=leased.circuit)
        if isinstance(refusal, limits.LimitExceeded):
            raise RequestFailed(
                ErrorCode.RATE_LIMIT_EXCEEDED, refusal.limit, retry_after=refusal.retry_after
            ) from None
        raise RequestFailed(ErrorCode.GATEWAY_UNAVAILABLE) from None


async def take_lease(
    view: RoutingView,
    route_class: RouteClass,
    route_settings: RouteSettings,
    c: Candidate | None,
    deadline: float,
) -> Lease | None:
    """Take the probe lease of `c` (a candidate whose circuit admits a probe) with one conditional
    UPDATE against the circuit as this request read it: across all nodes one request wins and tries
    it first (§5.4 group 1); the losers order it last. The request waits for it until its deadline
    at most; a lease the database grants after that is given back."""
    if c is None:
        return None
    key, snapshot = probe_circuit(view, route_class, c)
    take = partial(
        services.circuit_take_probe,
        key=key,
        settings=route_settings.breaker,
        now=datetime.now(UTC),
        seen=Seen(snapshot),
    )
    try:
        won = await db.write_within(
            max(deadline - time.monotonic(), 0.0),
            take,
            undo=lambda taken: taken and services.circuit_release_probe(key=key),
        )
    except DatabaseError:
        return None  # no lease: the candidate stays last, as for any other request
    return Lease(c.key, key) if won else None
