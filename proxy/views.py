"""OpenAI-compatible endpoints (SPEC §4): thin async views over the shared request path
(`proxy.ingress.prepare`) and the relay.
"""

import time
import uuid
from datetime import UTC, datetime

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from pools.selectors import key_authenticate
from proxy.apis.chat import error_body
from proxy.errors import TYPED_ERRORS
from proxy.exchange import Exchange, Final, Stream
from proxy.ingress import (
    COMPACT,
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
from proxy.ledger import record
from routing.resolution import is_allowed
from routing.types import RouteClass
from routing.vocabulary import ClientRoute
from runtime import db


async def _proxy(request: HttpRequest, path: str) -> HttpResponse:
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
        exchange.operation_id = operation_id(request.headers) or exchange.request_id
        response = await _handle(request, path, exchange, started_mono)
    except RequestFailed as failed:
        response = typed_failure(exchange, failed.code, failed.param)
        if failed.retry_after is not None:
            response["retry-after"] = str(failed.retry_after)
        await record(exchange)
    request_id_headers(response, exchange.request_id)
    response["x-gateway-operation-id"] = exchange.operation_id or exchange.request_id
    return response


async def _handle(request: HttpRequest, path: str, exchange: Exchange, started: float) -> HttpResponse:
    refusal = getattr(request, "gateway_refusal", None)
    if refusal in ("authentication_error", "gateway_unavailable"):
        raise RequestFailed(refusal)  # the edge found no such key, or no database: no second lookup
    try:
        body, body_error = parse_body(request), None
    except RequestFailed as failed:
        body, body_error = None, failed
    # Only the routes that stream (DIALECTS) do: an embeddings body's `stream` is the upstream's to judge.
    streaming = body is not None and body.get("stream") is True and path in DIALECTS
    relay = await prepare(
        exchange,
        headers=request.headers,
        path=path,
        body=body,
        body_error=body_error,
        body_size=len(request.body) if body is not None else 0,
        started=started,
        route_class=RouteClass.SSE if streaming else RouteClass.HTTP,
        dialect=DIALECTS.get(path) if streaming else None,
        raw=request.body if body is not None else None,
    )
    result = await relay.run()
    if isinstance(result, Stream):
        response: HttpResponse = StreamingHttpResponse(result.chunks, content_type="text/event-stream")
        response["cache-control"] = "no-cache"
    else:
        assert isinstance(result, Final)
        response = HttpResponse(result.body, status=result.status, content_type=result.content_type)
        if result.should_retry is not None:
            response["x-should-retry"] = "true" if result.should_retry else "false"
        if result.retry_after is not None:
            response["retry-after"] = str(result.retry_after)
        for name, value in result.headers:
            response[name] = value
    response["x-gateway-attempts"] = str(exchange.attempts_made)
    response["x-gateway-served-model"] = exchange.served_model
    if exchange.model_fallback or exchange.fallback_reason:
        response["x-gateway-model-fallback"] = exchange.served_model
    return response


def _proxied(path: str):
    """The view of one proxied POST route."""

    @csrf_exempt
    @require_POST
    async def view(request: HttpRequest) -> HttpResponse:
        return await _proxy(request, path)

    return view


chat_completions = _proxied(ClientRoute.CHAT_COMPLETIONS)
responses = _proxied(ClientRoute.RESPONSES)
responses_compact = _proxied(COMPACT)
messages = _proxied(ClientRoute.MESSAGES)
messages_count_tokens = _proxied(ClientRoute.COUNT_TOKENS)
embeddings = _proxied(ClientRoute.EMBEDDINGS)


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
            message=TYPED_ERRORS["gateway_unavailable"][1],
            type="gateway_unavailable",
            code="gateway_unavailable",
        )
        return HttpResponse(body, status=503, content_type="application/json")
    if authenticated is None:
        body = error_body(
            message=TYPED_ERRORS["authentication_error"][1],
            type="authentication_error",
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
        return typed_response(ClientRoute.MODEL, "model_not_found", "model")
    return JsonResponse(_model_object(model_id))
