"""The request path every ingress shares (SPEC §4, §5): the HTTP views (`proxy.views`), the Responses
websocket consumer (`proxy.consumers`), the Files API (`proxy.files`) and the ASGI edge
(`gatewaysite.asgi`). `prepare` authenticates and reads the routing state in one database hop (one
selector: `routing.request_state.READER.read`), decides (`route_request`; on PostgreSQL drafted while
that read is on the wire, and kept only if the read finds what the draft assumed), and builds the Relay;
the typed error responses, body decoding and header parsing live beside it. An ingress only parses its
own framing and delivers the result, and imports this module, never another ingress.
"""

import contextlib
import json
import math
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpResponse

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
from routing.affinities import Affinities, AffinityIds
from routing.policy.auto import AutoError
from routing.policy.conversation import conversation_key
from routing.policy.eligibility import tighten
from routing.policy.errors import ErrorCode
from routing.policy.files import TooManyFiles, file_ids_of
from routing.policy.plan import HardPin, Plan, PlanError
from routing.policy.resolution import Resolution, ResolutionError
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
from routing.request_state import MIN_READ_S, READER, Loaded, Wanted
from routing.selectors import RouteSettings, RoutingInputs
from routing.services import Seen
from runtime import db
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


def unheld(body: dict, path: str, affinities: Affinities, file_ids: tuple[str, ...]) -> RequestFailed | None:
    """The gateway forwards only the `previous_response_id` and `file_id`s it saw this key create
    (SPEC §7.2): any other (never seen, expired, created on the upstream directly, or another key's:
    one answer from the same lookup) is refused as OpenAI refuses an unknown one, nothing sent."""
    if previous_response_id(body, path) is not None and affinities.response is None:
        return RequestFailed(ErrorCode.PREVIOUS_RESPONSE_NOT_FOUND, "previous_response_id")
    if any(file_id not in affinities.files for file_id in file_ids):
        return RequestFailed(ErrorCode.FILE_NOT_FOUND, "file_id")
    return None


def previous_response_id(body: dict, path: str) -> str | None:
    previous = body.get("previous_response_id")
    return previous if path in RESPONSES_ROUTES and isinstance(previous, str) else None


@dataclass(frozen=True, slots=True)
class Routed:
    """What a request is decided from its read and itself alone (`route_request`): no I/O, so it can be
    drafted while the read is on its way (`routing.request_state.Reader.read`)."""

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


READ_TIMEOUT_S = edge.READ_TIMEOUT_S  # the ingresses' reads outside a request (a handshake, a file)


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
    try:
        file_ids = file_ids_of(body, raw) if body is not None else ()
    except TooManyFiles:
        file_ids, body_error = (), body_error or RequestFailed(ErrorCode.INVALID_REQUEST, "file_id")
    session_key = conversation_key(headers, body, derived=settings.GATEWAY_POOL_FEATURES)
    routable = body if body_error is None else None  # a request refused once its key is known: no routing
    loaded, routed = await _read(
        headers,
        path,
        routable,
        route_class,
        started,
        AffinityIds(None, session_key, file_ids),
        body_size,
        pins,
    )
    exchange.keyed(loaded.authenticated)
    if routable is None:
        raise body_error or RequestFailed(ErrorCode.INVALID_REQUEST)
    exchange.requested_model = routable["model"]
    exchange.transport = str(route_class)
    if (refusal := unheld(routable, path, loaded.affinities, file_ids)) is not None:
        raise refusal
    routed = routed or route_request(
        loaded, headers=headers, path=path, body=routable, body_size=body_size, pins=pins
    )
    deadline = started + routed.deadline_ms / 1000
    inputs = routed.inputs
    plan, resolution, leased = await _with_lease(routed, route_class, deadline)
    ticket = await admit_limits(loaded.authenticated, leased, deadline)  # the last check before dispatch
    exchange.served_model = resolution.served
    if resolution.is_fallback:
        exchange.fallback_reason = str(resolution.fallback)
    relay = Relay(
        exchange=exchange,
        view=inputs.view,
        plan=plan,
        breaker_settings=inputs.settings.breaker,
        demotion_seconds=inputs.settings.demotion_seconds,
        backoff_base_ms=inputs.settings.backoff_base_ms,
        requirements=routed.requirements,
        deadline=deadline,
        client_deadline=routed.client_deadline,
        path=ClientRoute(path).tail,
        body=routable,
        route_class=route_class,
        dialect=dialect,
        on_finish=record if ticket is None else Finishing(record, ticket),
        single_attempt=path == COMPACT,
        memory=Memory(
            response_ids=path in RESPONSES_ROUTES,
            session=session_key,
            session_seen=(inputs.session.assignment_id, inputs.session.model) if inputs.session else None,
        ),
        dispatch=dispatch or HttpDispatch(api=api_for(path)),
        client_headers=forwarded(headers, path),
        lease=leased,
        first_call=routed.first_call,
    )
    return guarded(relay, ticket)


async def _read(
    headers: Mapping[str, str],
    path: str,
    routable: dict | None,
    route_class: RouteClass,
    started: float,
    ids: AffinityIds,
    body_size: int,
    pins: Sequence[HardPin],
) -> tuple[Loaded, Routed | None]:
    """The request's read before dispatch (`READER.read`: drafting its decision meanwhile), or its typed
    refusal: no key, or no database. `routable`: its body, None when it is refused once its key is
    known (then only the key is read); `ids`: its session and files (its previous response is found
    here)."""
    now = datetime.now(UTC)
    if routable is None:
        wanted, draft = Wanted(bearer(headers), route_class, now, routing=False), None
    else:
        response_id = previous_response_id(routable, path)
        if response_id != ids.response_id:
            ids = replace(ids, response_id=response_id)
        wanted = Wanted(bearer(headers), route_class, now, ids, model=routable.get("model"))
        draft = partial(_draft, headers=headers, path=path, body=routable, body_size=body_size, pins=pins)
    try:
        # The read's bound counts from the request's start (a websocket frame may have waited for its
        # key check).
        loaded, routed = await READER.read(wanted, started + edge.read_timeout_s(headers), draft)
    except DatabaseError:
        # Without the database nothing can be authorized or routed: fail fast, typed, and let the
        # pool's health-checked connections recover on their own once it is back.
        raise RequestFailed(ErrorCode.GATEWAY_UNAVAILABLE) from None
    if loaded is None:
        raise RequestFailed(ErrorCode.AUTHENTICATION_ERROR)
    return loaded, routed


async def _with_lease(
    routed: Routed, route_class: RouteClass, deadline: float
) -> tuple[Plan, Resolution, Lease | None]:
    """The request's plan, after it took the probe lease its decision offers, if it won it (decided
    again with that candidate first), or its typed refusal (RequestFailed)."""
    inputs = routed.inputs
    leased = await take_lease(
        inputs.view, route_class, inputs.settings, lease_candidate(routed.decision), deadline
    )
    decision = routed.decide(held={leased.candidate}) if leased is not None else routed.decision
    return (*planned(decision), leased)


def _draft(loaded: Loaded, **request: Any) -> Routed | None:
    """The request decided while its read is on its way (`route_request`); one its headers refuse is
    decided again from its own read, which refuses it in the order the path checks things (the key
    first)."""
    try:
        return route_request(loaded, **request)
    except RequestFailed:
        return None


def planned(decision: Decision) -> tuple[Plan, Resolution]:
    """The plan and resolution of a decision that has them, else its typed refusal (RequestFailed)."""
    error = decision.error
    if isinstance(error, ResolutionError):
        raise RequestFailed(str(error.code), model=error.model)
    if isinstance(error, AutoError):
        raise RequestFailed(str(error.code), str(error.reason) if error.reason else None, model="auto")
    if isinstance(error, PlanError):
        raise RequestFailed(str(error.code))
    assert decision.plan is not None and decision.resolution is not None
    return decision.plan, decision.resolution


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
