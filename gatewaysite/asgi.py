"""ASGI entry point.

- `/v1/...`: the client API. Its proxied routes (proxy.views.PROXIED) are answered straight on ASGI
  (runtime.reply), without Django's request and response objects; the others (models, files) by a
  Django handler with NO middleware (runtime.handler). Django's stock middleware is sync code that an
  async request must hop to a thread for (and WhiteNoise is sync-only, which forces the whole chain
  into a thread); the API authenticates with gateway keys, needs no session, CSRF or static files,
  and sets its own headers, so it skips all of it.
- everything else over HTTP (admin, health, metrics, unknown paths): the full Django stack, behind
  `guarded`: its body is read first under the API's limits and timeouts (`GATEWAY_MAX_BODY_BYTES`,
  `GATEWAY_CLIENT_TIMEOUT_S`, `GATEWAY_BODY_TIMEOUT_S`; an over-limit `content-length` refused before
  any of it), so Django never spools an unauthenticated body to a temporary file nor waits on a
  client that drips one (issue 45).
- websockets: the proxy's consumers.
"""

import asyncio
import gc
import os
from functools import partial

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gatewaysite.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.http import HttpResponse  # noqa: E402

from proxy import edge, files, shutdown, upstream, views  # noqa: E402
from proxy.ingress import bearer, typed_response  # noqa: E402
from proxy.ledger import recorder as ledger  # noqa: E402
from proxy.ws_urls import websocket_urlpatterns  # noqa: E402
from routing.policy.errors import ErrorCode  # noqa: E402
from routing.request_state import READER  # noqa: E402
from runtime import loopdb  # noqa: E402
from runtime.handler import BareHandler  # noqa: E402
from runtime.reply import Reply, respond  # noqa: E402


class ApiHandler(BareHandler):
    """The `/v1/` API on runtime.handler's bare Django handler (no middleware, no request signals).

    The body is read here, not by Django (which spools all of it to a temporary file first): only
    once the headers showed a known key and an acceptable `content-length`, as a stream refused the
    moment it passes the limit, within the client timeouts (`proxy.edge`). A request whose body
    was left unread reaches its view with the refusal (`request.gateway_refusal` for a Django view)
    and an empty body."""

    async def handle(self, scope, receive, send) -> None:
        path = scope["path"]
        if path == edge.UPLOAD_PATH and scope["method"] == "POST":
            # A file upload streams its body to the upstream itself (proxy.files), never read here.
            response = await files.upload(scope, receive)
            api_headers(response, body_unread=False)
            await self.send_response(response, send)
            return
        headers = edge.headers_of(scope)
        refusal = await edge.body_refusal(path, headers, bearer(headers))
        body = b""
        if refusal is None:
            try:
                body = await edge.read_body(
                    receive,
                    limit=edge.body_limit(path),
                    idle_timeout_s=settings.GATEWAY_CLIENT_TIMEOUT_S,
                    total_timeout_s=settings.GATEWAY_BODY_TIMEOUT_S,
                )
            except edge.ClientGone:
                return
            except edge.BodyTooLarge:
                refusal = ErrorCode.REQUEST_TOO_LARGE
            except edge.BodyTimeout:
                response = typed_response(path, ErrorCode.REQUEST_TIMEOUT)
                api_headers(response, body_unread=True)
                await self.send_response(response, send)
                return

        if path in views.PROXIED:
            with READER.answering():
                await respond(
                    receive,
                    send,
                    partial(self.proxied, path, scope["method"], headers, body, refusal),
                    watch_disconnect=refusal is None,
                )
            return

        def setup(request) -> None:
            request.gateway_refusal = refusal

        # With its body unread, the next message would be body, not a disconnect; such an answer
        # needs nothing slow (no upstream), so there is nothing to watch.
        await self.serve(scope, receive, send, body, setup=setup, watch_disconnect=refusal is None)

    @staticmethod
    async def proxied(
        path: str, method: str, headers: dict[str, str], body: bytes, refusal: str | None
    ) -> Reply:
        """A proxied route's answer (proxy.views), with the headers every `/v1/` answer gets."""
        reply = await views.proxied(path, method, headers, body, refusal)
        api_headers(reply, body_unread=refusal is not None)
        return reply

    def around(self, get_response):
        return api_responses(get_response)


# Django's own answers on the API (its HTML pages for an unknown path, a wrong method, an exception that
# escaped a view) become the API's typed errors; Django still logs the exception.
DJANGO_ANSWERS = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED, 500: ErrorCode.INTERNAL_ERROR}


def api_responses(get_response):
    """What every `/v1/` response of a Django view gets, with no middleware to give it: a typed JSON body
    whatever went wrong, and `api_headers`."""

    async def respond(request):
        response = await get_response(request)
        code = DJANGO_ANSWERS.get(response.status_code)
        if code is not None and not response.get("content-type", "").startswith("application/json"):
            allow = response.get("allow")
            response = typed_response(request.path, code)
            if allow:
                response["allow"] = allow
        api_headers(response, body_unread=getattr(request, "gateway_refusal", None) is not None)
        return response

    return respond


def api_headers(response: HttpResponse | Reply, *, body_unread: bool) -> None:
    """The headers every `/v1/` answer gets, whichever handler sent it: `nosniff` (SecurityMiddleware's
    header), and `connection: close` when the body was left unread (the rest of it may still be on its
    way: closing is cheaper than reading it to reuse the connection)."""
    if body_unread:
        response["connection"] = "close"
    response["x-content-type-options"] = "nosniff"


def freeze_startup_heap() -> None:
    """Take what the process holds before its first request (Django, the app's modules, about 140,000
    objects the collector tracks) out of the cyclic garbage collector's full collections.

    Measured on the bench's PostgreSQL gateway at c=16: each full collection walked all of them, about
    140 ms of CPU with every request waiting, once every few seconds; after the freeze, about 20 ms.
    What startup left as garbage is collected first, since frozen objects are never collected."""
    gc.collect()
    gc.freeze()


async def close_clients() -> None:
    """Close what the running loop holds open: its upstream client, its database connections."""
    await upstream.close_client()
    await loopdb.close()


async def lifespan(scope, receive, send) -> None:
    """Servers that speak ASGI lifespan (uvicorn) tell us when they stop: drain the ledger then.
    uvicorn ends its process by re-raising SIGTERM, so an atexit hook would never run there
    (daphne sends no lifespan events; the ledger's atexit hook covers it)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            shutdown.install()
            freeze_startup_heap()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await asyncio.to_thread(ledger.writer.flush)
            await close_clients()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def refuse(send, status: int, reason: str) -> None:
    """A plain answer that closes the connection (the rest of the body may still be on its way)."""
    body = reason.encode()
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        (b"x-content-type-options", b"nosniff"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def guarded(scope, receive, send) -> None:
    """The Django stack with the request body already read under the API's limits and timeouts, and
    handed to it whole (so it never waits on the client, nor spools more than the limit)."""
    limit = settings.GATEWAY_MAX_BODY_BYTES
    length = edge.declared_length(edge.headers_of(scope))
    if length is not None and length > limit:
        await refuse(send, 413, "request body too large")
        return
    try:
        body = await edge.read_body(
            receive,
            limit=limit,
            idle_timeout_s=settings.GATEWAY_CLIENT_TIMEOUT_S,
            total_timeout_s=settings.GATEWAY_BODY_TIMEOUT_S,
        )
    except edge.ClientGone:
        return
    except edge.BodyTooLarge:
        await refuse(send, 413, "request body too large")
        return
    except edge.BodyTimeout:
        await refuse(send, 408, "request body too slow")
        return
    read = False

    async def replay() -> dict:
        nonlocal read
        if not read:
            read = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: the disconnect, when it comes

    await django_asgi_app(scope, replay, send)


api = ApiHandler()


async def http(scope, receive, send) -> None:
    await (api if scope["path"].startswith("/v1/") else guarded)(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": http,
        "websocket": URLRouter(websocket_urlpatterns),
        "lifespan": lifespan,
    }
)
