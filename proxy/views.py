"""OpenAI-compatible endpoints (SPEC §4): thin async views over the shared request path
(`proxy.ingress.prepare`) and the relay; and `/metrics` (SPEC §10).
"""

import logging
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pools.selectors import key_authenticate
from proxy.ingress import (
    DIALECTS,
    READ_TIMEOUT_S,
    RequestFailed,
    bearer,
    operation_id,
    parse_body,
    prepare,
    request_id_headers,
    typed_failure,
    typed_response,
)
from proxy.ledger.exchange import Exchange, Final, Stream
from proxy.ledger.metrics import scrape_registry
from proxy.ledger.recorder import observations, record
from proxy.wire.apis.chat import error_body
from proxy.wire.apis.registry import RELAYED
from routing.policy.errors import ErrorCode
from routing.policy.resolution import is_allowed
from routing.policy.types import RouteClass
from routing.policy.vocabulary import ClientRoute
from runtime import db
from runtime.reply import Reply

# The proxied routes, served straight on ASGI (gatewaysite.asgi), without Django's request and response.
PROXIED = frozenset(RELAYED)
logger = logging.getLogger("django.request")  # where Django logs what escapes a view


async def proxied(
    path: str, method: str, headers: Mapping[str, str], raw: bytes, refusal: str | None
) -> Reply:
    """The answer to a request on one of the PROXIED routes: its body `raw` (empty when the edge left it
    unread, `refusal` saying why), `headers` with lowercase names."""
    if method != "POST":
        reply = _reply_of(typed_response(path, ErrorCode.METHOD_NOT_ALLOWED))
        reply["allow"] = "POST"
        return reply
    try:
        return await _proxy(path, headers, raw, refusal)
    except Exception as exc:
        logger.error("Internal Server Error: %s", path, exc_info=exc)
        return _reply_of(typed_response(path, ErrorCode.INTERNAL_ERROR))


async def _proxy(path: str, headers: Mapping[str, str], raw: bytes, refusal: str | None) -> Reply:
    started_mono = time.monotonic()
    exchange = Exchange(
        request_id=uuid.uuid4().hex,
        key_id=None,
        route=path,
        transport="http",
        requested_model="",
        started_at=datetime.now(UTC),
    )
    try:
        exchange.operation_id = operation_id(headers) or exchange.request_id
        reply = await _handle(path, headers, raw, refusal, exchange, started_mono)
    except RequestFailed as failed:
        reply = _reply_of(typed_failure(exchange, failed.code, failed.param, failed.message))
        if failed.retry_after is not None:
            reply["retry-after"] = str(failed.retry_after)
        await record(exchange)
    request_id_headers(reply, exchange.request_id)
    reply["x-gateway-operation-id"] = exchange.operation_id or exchange.request_id
    return reply


def _reply_of(response: HttpResponse) -> Reply:
    """A typed error response (proxy.ingress, shared with the other ingresses) as a Reply."""
    return Reply(
        response.status_code, response.content, headers=[(n.lower(), v) for n, v in response.items()]
    )


async def _handle(
    path: str,
    headers: Mapping[str, str],
    raw: bytes,
    refusal: str | None,
    exchange: Exchange,
    started: float,
) -> Reply:
    if refusal in (ErrorCode.AUTHENTICATION_ERROR, ErrorCode.GATEWAY_UNAVAILABLE):
        raise RequestFailed(refusal)  # the edge found no such key, or no database: no second lookup
    try:
        body, body_error = parse_body(raw, refusal), None
    except RequestFailed as failed:
        body, body_error = None, failed
    # Only the routes that stream (DIALECTS) do: an embeddings body's `stream` is the upstream's to judge.
    streaming = body is not None and body.get("stream") is True and path in DIALECTS
    relay = await prepare(
        exchange,
        headers=headers,
        path=path,
        body=body,
        body_error=body_error,
        body_size=len(raw) if body is not None else 0,
        started=started,
        route_class=RouteClass.SSE if streaming else RouteClass.HTTP,
        dialect=DIALECTS.get(path) if streaming else None,
        raw=raw if body is not None else None,
    )
    result = await relay.run()
    if isinstance(result, Stream):
        reply = Reply(
            200,
            chunks=result.chunks,
            headers=[("content-type", "text/event-stream"), ("cache-control", "no-cache")],
        )
    else:
        assert isinstance(result, Final)
        reply = Reply(result.status, result.body, headers=[("content-type", result.content_type)])
        if result.should_retry is not None:
            reply["x-should-retry"] = "true" if result.should_retry else "false"
        if result.retry_after is not None:
            reply["retry-after"] = str(result.retry_after)
        for name, value in result.headers:
            reply[name] = value
    reply["x-gateway-attempts"] = str(exchange.attempts_made)
    reply["x-gateway-served-model"] = exchange.served_model
    if exchange.model_fallback or exchange.fallback_reason:
        reply["x-gateway-model-fallback"] = exchange.served_model
    return reply


def _models_for(key) -> list[str]:
    from catalog.models import CatalogEntry

    models = CatalogEntry.objects.filter(assignment__pool_id__in=key.pool_ids, assignment__enabled=True)
    return sorted({m for m in models.values_list("model", flat=True) if is_allowed(m, key.allowed_models)})


def _model_object(model: str) -> dict:
    return {"id": model, "object": "model", "created": 0, "owned_by": "gateway"}


async def _listed_models(request: HttpRequest) -> list[str] | HttpResponse:
    """The models the key may see (SPEC §4), or the typed error that stops the listing."""
    try:
        authenticated = await db.run_within(READ_TIMEOUT_S, key_authenticate, bearer(request.headers))
    except DatabaseError:
        body = error_body(
            message=ErrorCode.GATEWAY_UNAVAILABLE.message,
            type=ErrorCode.GATEWAY_UNAVAILABLE,
            code=ErrorCode.GATEWAY_UNAVAILABLE,
        )
        return HttpResponse(body, status=503, content_type="application/json")
    if authenticated is None:
        body = error_body(
            message=ErrorCode.AUTHENTICATION_ERROR.message,
            type=ErrorCode.AUTHENTICATION_ERROR,
            code="invalid_api_key",
        )
        return HttpResponse(body, status=401, content_type="application/json")
    return await db.run(_models_for, authenticated.key)


@require_GET
async def models(request: HttpRequest) -> HttpResponse:
    listed = await _listed_models(request)
    if isinstance(listed, HttpResponse):
        return listed
    return JsonResponse({"object": "list", "data": [_model_object(m) for m in listed]})


@require_GET
async def model(request: HttpRequest, model_id: str) -> HttpResponse:
    """One model of the listing; a model the key does not see is OpenAI's 404 `model_not_found`, the
    same whether no pool has it or the key may not use it (the listing is the key's whole world)."""
    listed = await _listed_models(request)
    if isinstance(listed, HttpResponse):
        return listed
    if model_id not in listed:
        return typed_response(
            ClientRoute.MODEL,
            ErrorCode.MODEL_NOT_FOUND,
            "model",
            ErrorCode.MODEL_NOT_FOUND.about(model_id),
        )
    return JsonResponse(_model_object(model_id))


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """The Prometheus scrape, with every request this process has finished counted (the ledger observes
    them in batches: `proxy.ledger.recorder.observations`). Sync on purpose: the open-circuits gauge queries
    the
    database, and Django runs a sync view in a thread under ASGI, so the event loop never blocks on it."""
    observations.drain()
    return HttpResponse(generate_latest(scrape_registry()), content_type=CONTENT_TYPE_LATEST)
