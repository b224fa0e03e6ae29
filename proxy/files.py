"""The OpenAI Files API (SPEC §4, §5.2, §7.2): `POST /v1/files`, `GET /v1/files/{id}`,
`GET /v1/files/{id}/content`, `DELETE /v1/files/{id}`, for `openai` accounts.

- An upload is planned like any request without a model (`routing.policy.files.files_plan`) and runs through
  the one attempt loop (`proxy.relay.Relay`) with `FilesDispatch` as its transport, so it fails over
  before the client has seen anything, records circuits and its ledger row like every other route.
  Its answer's file id is remembered as the key's own file affinity (id -> assignment).
- The upload body is never held whole: `gatewaysite.asgi` hands `POST /v1/files` here before reading
  anything; the key and `content-length` are checked first (`proxy.edge.body_refusal`, limit
  GATEWAY_MAX_UPLOAD_BYTES), then the client's multipart body is streamed as it arrives
  (`proxy.edge.iter_body`: refused the moment it passes the limit) to the upstream, as sent. When the
  plan has another candidate, what was streamed is also spooled to a temporary file on disk, so a
  pre-visible failure (a 429, a refused connection) can be replayed to the next candidate.
- GET, content and DELETE go to the assignment that holds the file, never elsewhere. A file id the key
  does not own (unknown, expired, another key's) gets the same 404 from the same single lookup; a file
  whose assignment left the key's pools gets 409 `file_assignment_conflict`. A DELETE that succeeds
  ends the affinity.
- The file ids a Chat, Responses or Messages body references become hard pins in `proxy.ingress.prepare`
  (`routing.policy.files.file_ids_of`, `file_pins`).

The ledger row of a file operation has its route (`/v1/files`, `/v1/files/{id}`,
`/v1/files/{id}/content`, `DELETE /v1/files/{id}`), attempts and outcome: never a file id, file name
or content.
"""

import json
import logging
import random
import re
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from typing import IO

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.views.decorators.http import require_http_methods

from pools.selectors import Authenticated, key_authenticate
from proxy import edge, upstream
from proxy.dispatch import HttpDispatch, read_answer
from proxy.ingress import (
    READ_TIMEOUT_S,
    RequestFailed,
    admit_limits,
    bearer,
    headers_requirements,
    request_id_headers,
    take_lease,
    typed_response,
)
from proxy.ledger.exchange import Exchange, Failure, Final, Memory, Stream
from proxy.ledger.recorder import record
from proxy.limits import Finishing, guarded
from proxy.relay import Relay
from proxy.transport import Answer, TransportFailure
from proxy.wire.providers.base import FILES, UpstreamCall
from proxy.wire.providers.registry import carriers
from routing.affinities import affinity_get
from routing.models import Affinity, AffinityKind
from routing.policy.eligibility import tighten
from routing.policy.errors import ErrorCode
from routing.policy.failures import DispatchState, FailureClass, Observation
from routing.policy.files import files_plan
from routing.policy.plan import HardPin, PinKind, PlanError
from routing.policy.route import RoutingView
from routing.policy.types import Candidate, RouteClass
from routing.policy.vocabulary import ClientRoute, Outcome
from routing.selectors import RouteSettings, routing_view_load
from runtime import db

logger = logging.getLogger("gateway")

UPLOAD_ROUTE = edge.UPLOAD_PATH
FILE_ROUTE = ClientRoute.FILE
CONTENT_ROUTE = ClientRoute.FILE_CONTENT
DELETE_ROUTE = ClientRoute.FILE_DELETE
# The ids the gateway routes by: what OpenAI issues (`file-...`), never a path step such as `..`.
FILE_ID = re.compile(r"[A-Za-z0-9_-]{1,300}")
NEVER_AN_ID = "."  # what FILE_ID never matches, so never recorded
SPOOL_CHUNK = 1 << 16
# An upload may take longer than a JSON body: at least this rate is expected of the client.
UPLOAD_MIN_BYTES_PER_S = 64 * 1024


# -- the upload body ---------------------------------------------------------------------------------


class UploadBody:
    """The client's upload as one attempt after another reads it: a replay of what earlier attempts
    took (from the spool on disk), then the rest as it arrives. `refused` is the typed code of a body
    that broke the rules midway (too large, too slow, or the client left)."""

    def __init__(self, receive: edge.Receive, *, limit: int, replayable: bool, declared: int | None) -> None:
        expected = declared if declared is not None else limit
        self._client = edge.iter_body(
            receive,
            limit=limit,
            idle_timeout_s=settings.GATEWAY_CLIENT_TIMEOUT_S,
            total_timeout_s=settings.GATEWAY_BODY_TIMEOUT_S + expected / UPLOAD_MIN_BYTES_PER_S,
        )
        self._spool: IO[bytes] | None = tempfile.TemporaryFile() if replayable else None  # noqa: SIM115
        self._spooled = 0
        self._attempts = 0
        self.done = False
        self.refused: str | None = None

    async def stream(self) -> AsyncIterator[bytes]:
        self._attempts += 1
        if self._attempts > 1 and self._spool is None:
            raise RuntimeError("an upload without a spool was dispatched twice")
        offset = 0
        while self._spool is not None and offset < self._spooled:
            self._spool.seek(offset)
            chunk = self._spool.read(min(SPOOL_CHUNK, self._spooled - offset))
            offset += len(chunk)
            yield chunk
        if self.done or self.refused is not None:
            if self.refused is not None:
                raise UploadRefused(self.refused)
            return
        try:
            async for chunk in self._client:
                if self._spool is not None:
                    # Spooled before it is handed on: an attempt abandoned right after taking it
                    # still leaves it for the next one.
                    self._spool.seek(0, 2)
                    self._spool.write(chunk)
                    self._spooled += len(chunk)
                yield chunk
        except edge.BodyTooLarge:
            self.refused = ErrorCode.REQUEST_TOO_LARGE
        except edge.BodyTimeout:
            self.refused = ErrorCode.REQUEST_TIMEOUT
        except edge.ClientGone:
            self.refused = Outcome.CANCELLED
        if self.refused is not None:
            raise UploadRefused(self.refused)
        self.done = True

    def close(self) -> None:
        if self._spool is not None:
            self._spool.close()


class UploadRefused(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


REFUSED_STATUS = {ErrorCode.REQUEST_TOO_LARGE: 413, ErrorCode.REQUEST_TIMEOUT: 408, Outcome.CANCELLED: 499}


# -- the transport -------------------------------------------------------------------------------------


def _file_id(raw: bytes) -> str | None:
    """The id of the file object an upload answered."""
    try:
        parsed = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(parsed, dict) or parsed.get("object") != "file":
        return None
    value = parsed.get("id")
    return value if isinstance(value, str) and FILE_ID.fullmatch(value) else None


class ContentBody:
    """A file's bytes as they come (never held whole)."""

    status = 200

    def __init__(self, response: upstream.Response) -> None:
        self.response = response

    def chunks(self) -> AsyncIterator[bytes]:
        return self.response.chunks()

    async def aclose(self) -> None:
        await self.response.aclose()


class FilesDispatch(HttpDispatch):
    """One Files API attempt (a `proxy.transport.Dispatch`): the OpenAI error envelope of HttpDispatch, a
    streamed multipart body for an upload, a streamed answer for a file's content."""

    def __init__(
        self,
        method: str,
        *,
        upload: UploadBody | None = None,
        content_type: str = "",
        content_length: int | None = None,
        content: bool = False,
    ) -> None:
        super().__init__()
        self.method = method
        self.upload = upload
        self.content_type = content_type  # an upload's (with its boundary); a content answer's
        self.content_length = content_length
        self.content = content

    def _refused(self) -> Failure | None:
        if self.upload is None or self.upload.refused is None:
            return None
        code = self.upload.refused
        # The client's failure, not the upstream's: no circuit counts it, nothing is retried.
        if code == Outcome.CANCELLED:
            return Failure(FailureClass.CANCELLED, DispatchState.UNKNOWN, 499, None, code, None)
        # The upstream never received a whole body: it created nothing.
        return Failure(
            FailureClass.CLIENT_ERROR,
            DispatchState.REJECTED,
            REFUSED_STATUS[code],
            "invalid_request_error",
            code,
            None,
        )

    async def open(self, c: Candidate, call: UpstreamCall, *, stream: bool) -> Failure | Answer | ContentBody:
        headers = dict(call.headers)
        body = None
        if self.upload is not None:
            headers["content-type"] = self.content_type
            if self.content_length is not None:
                headers["content-length"] = str(self.content_length)
            body = self.upload.stream()
        try:
            response = await upstream.open_stream(
                self.method,
                call.url,
                headers=headers,
                json=None,
                content=body,
                read_timeout_s=settings.GATEWAY_UPSTREAM_READ_TIMEOUT_S,
            )
        except TransportFailure as failure:
            return self._refused() or Failure.observed(Observation(transport=failure.event))
        if self.content and response.status == 200:
            self.content_type = response.headers.get("content-type", "application/octet-stream")
            return ContentBody(response)
        answer = await read_answer(response)
        if isinstance(answer, Failure):
            return answer
        refused = self._refused()
        if refused is not None:
            return refused
        if self.upload is not None:
            return replace(answer, file_id=_file_id(answer.body))
        return answer


# -- the request path ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FilesLoaded:
    authenticated: Authenticated
    view: RoutingView
    settings: RouteSettings
    affinity: Affinity | None


def _load(raw_key: str, file_id: str | None, now: datetime) -> FilesLoaded | None:
    """The key, its routing view and (for an existing file) the key's own affinity of `file_id`: one
    thread hop; an id the key does not own costs the same query as one nobody owns."""
    authenticated = key_authenticate(raw_key)
    if authenticated is None:
        return None
    key = authenticated.key
    view, route_settings = routing_view_load(
        pool_ids=key.pool_ids,
        route_class=RouteClass.HTTP,
        now=now,
        config_version=authenticated.config_version,
    )
    affinity = (
        affinity_get(key_id=key.key_id, kind=AffinityKind.FILE, key=file_id, now=now) if file_id else None
    )
    return FilesLoaded(authenticated, view, route_settings, affinity)


def _exchange(route: str) -> Exchange:
    return Exchange(
        request_id=uuid.uuid4().hex,
        key_id=None,
        route=route,
        transport=str(RouteClass.HTTP),
        requested_model="",
        started_at=datetime.now(UTC),
    )


async def _relay(
    exchange: Exchange,
    headers: Mapping[str, str],
    *,
    file_id: str | None,
    started: float,
    path: str,
    dispatch: FilesDispatch,
    memory: Memory,
    replayable: list[bool] | None = None,
) -> Relay:
    """The Relay of one Files request, or RequestFailed with its typed code."""
    try:
        loaded = await db.run_within(READ_TIMEOUT_S, _load, bearer(headers), file_id, datetime.now(UTC))
    except DatabaseError:
        raise RequestFailed(ErrorCode.GATEWAY_UNAVAILABLE) from None
    if loaded is None:
        raise RequestFailed(ErrorCode.AUTHENTICATION_ERROR)
    key = loaded.authenticated.key
    exchange.key_id = key.key_id
    exchange.key_name = key.name
    if file_id is not None and loaded.affinity is None:
        raise RequestFailed(ErrorCode.FILE_NOT_FOUND, "id")
    extra, deadline_ms = headers_requirements(headers, loaded.settings.default_deadline_ms)
    pin = HardPin(PinKind.FILE, loaded.affinity.assignment_id) if loaded.affinity is not None else None
    deadline = started + deadline_ms / 1000
    requirements = tighten(key.requirements, extra)
    plan_now = partial(
        files_plan,
        loaded.view,
        replace(requirements, deadline_remaining_ms=deadline_ms),
        adapters=carriers(FILES) or frozenset(),
        pin=pin,
        draw=random.random() if settings.GATEWAY_POOL_FEATURES else None,  # noqa: S311
    )
    plan = plan_now()
    # A cooled account is probed first, by the one request that takes its lease (SPEC §5.4, §7.1), as
    # on every other route.
    leased = None
    if not isinstance(plan, PlanError):
        leased = await take_lease(loaded.view, RouteClass.HTTP, loaded.settings, plan.probe, deadline)
        if leased is not None:
            plan = plan_now(held={leased.candidate})
    if isinstance(plan, PlanError):
        raise RequestFailed(str(plan.code))
    if replayable is not None:
        replayable.append(len(plan.order) > 1)
    ticket = await admit_limits(loaded.authenticated, leased)  # the key's limits, before any upload
    relay = Relay(
        exchange=exchange,
        view=loaded.view,
        plan=plan,
        breaker_settings=loaded.settings.breaker,
        demotion_seconds=loaded.settings.demotion_seconds,
        backoff_base_ms=loaded.settings.backoff_base_ms,
        requirements=requirements,
        deadline=deadline,
        client_deadline=deadline_ms < loaded.settings.default_deadline_ms,
        path=path,
        body={},
        route_class=RouteClass.HTTP,
        dialect=None,
        on_finish=record if ticket is None else Finishing(record, ticket),
        memory=memory,
        dispatch=dispatch,
        lease=leased,
    )
    return guarded(relay, ticket)


def _answer(exchange: Exchange, result: Final | Stream, dispatch: FilesDispatch) -> HttpResponse:
    if isinstance(result, Stream):
        response: HttpResponse = StreamingHttpResponse(result.chunks, content_type=dispatch.content_type)
    else:
        response = HttpResponse(result.body, status=result.status, content_type=result.content_type)
        if result.should_retry is not None:
            response["x-should-retry"] = "true" if result.should_retry else "false"
        if result.retry_after is not None:
            response["retry-after"] = str(result.retry_after)
    response["x-gateway-attempts"] = str(exchange.attempts_made)
    return response


async def _typed(exchange: Exchange, failed: RequestFailed) -> HttpResponse:
    response = typed_response(UPLOAD_ROUTE, failed.code, failed.param)
    if failed.retry_after is not None:
        response["retry-after"] = str(failed.retry_after)
    exchange.refused(failed.code, failed.param, response.status_code)
    await record(exchange)
    return response


def _multipart(headers: Mapping[str, str]) -> bool:
    kind, _, params = headers.get("content-type", "").partition(";")
    return kind.strip().lower() == "multipart/form-data" and "boundary=" in params.lower()


async def upload(scope: Mapping, receive: edge.Receive) -> HttpResponse:
    """POST /v1/files, served from the ASGI scope before any of its body is read."""
    started = time.monotonic()
    exchange = _exchange(UPLOAD_ROUTE)
    headers = edge.headers_of(scope)
    body: UploadBody | None = None
    try:
        refusal = await edge.body_refusal(UPLOAD_ROUTE, headers, bearer(headers))
        if refusal is not None:
            raise RequestFailed(refusal)
        if not _multipart(headers):
            raise RequestFailed(ErrorCode.INVALID_REQUEST, "file")
        declared = edge.declared_length(headers)
        dispatch = FilesDispatch(
            "POST", content_type=headers["content-type"], content_length=declared if declared else None
        )
        replayable: list[bool] = []
        relay = await _relay(
            exchange,
            headers,
            file_id=None,
            started=started,
            path="/files",
            dispatch=dispatch,
            memory=Memory(file_upload=True),
            replayable=replayable,
        )
        body = dispatch.upload = UploadBody(
            receive, limit=edge.body_limit(UPLOAD_ROUTE), replayable=replayable[0], declared=declared
        )
        result = await relay.run()
        if body.refused is not None and body.refused != Outcome.CANCELLED:
            response = typed_response(UPLOAD_ROUTE, body.refused)
        else:
            response = _answer(exchange, result, dispatch)
    except RequestFailed as failed:
        response = await _typed(exchange, failed)
    except Exception:
        # Served outside Django's handler (no convert_exception_to_response): a bug still gets the
        # API's typed 500, and its traceback (never content) in the log.
        logger.exception("files: the upload failed")
        response = typed_response(UPLOAD_ROUTE, ErrorCode.INTERNAL_ERROR)
    finally:
        if body is not None:
            body.close()
    if body is None or not body.done:
        response["connection"] = "close"  # the rest of the body may still be on its way: never read
    request_id_headers(response, exchange.request_id)
    return response


async def _file_request(
    request: HttpRequest, file_id: str, *, route: str, content: bool = False
) -> HttpResponse:
    started = time.monotonic()
    exchange = _exchange(route)
    delete = request.method == "DELETE"
    dispatch = FilesDispatch(request.method or "GET", content=content)
    try:
        relay = await _relay(
            exchange,
            request.headers,
            # An id the gateway could never have recorded is looked up all the same (as a name nobody
            # owns), so its answer and its cost are an unknown id's.
            file_id=file_id if FILE_ID.fullmatch(file_id) else NEVER_AN_ID,
            started=started,
            path=f"/files/{file_id}/content" if content else f"/files/{file_id}",
            dispatch=dispatch,
            memory=Memory(file_deleted=file_id if delete else None),
        )
        response = _answer(exchange, await relay.run(), dispatch)
    except RequestFailed as failed:
        response = await _typed(exchange, failed)
    request_id_headers(response, exchange.request_id)
    return response


@require_http_methods(["GET", "DELETE"])
async def file_object(request: HttpRequest, file_id: str) -> HttpResponse:
    """GET /v1/files/{id} (the file object) and DELETE /v1/files/{id}."""
    route = DELETE_ROUTE if request.method == "DELETE" else FILE_ROUTE
    return await _file_request(request, file_id, route=route)


@require_http_methods(["GET"])
async def file_content(request: HttpRequest, file_id: str) -> HttpResponse:
    """GET /v1/files/{id}/content: the file's bytes, streamed."""
    return await _file_request(request, file_id, route=CONTENT_ROUTE, content=True)
