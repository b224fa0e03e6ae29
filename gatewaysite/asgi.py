"""ASGI entry point.

- `/v1/...`: the client API, served by a Django handler with NO middleware. Django's stock
  middleware is sync code that an async request must hop to a thread for (and WhiteNoise is
  sync-only, which forces the whole chain into a thread); the API authenticates with gateway keys,
  needs no session, CSRF or static files, and sets its own headers, so it skips all of it.
- everything else over HTTP (admin, health, metrics): the full Django stack.
- websockets: the proxy's consumers.
"""

import asyncio
import contextlib
import io
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gatewaysite.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.exceptions import RequestAborted  # noqa: E402
from django.core.handlers.asgi import ASGIHandler, get_script_prefix  # noqa: E402
from django.core.handlers.exception import convert_exception_to_response  # noqa: E402
from django.http import HttpResponseBase  # noqa: E402
from django.urls import re_path, set_script_prefix  # noqa: E402

from proxy import edge, files, ledger, shutdown, upstream  # noqa: E402
from proxy.ingress import bearer, typed_response  # noqa: E402
from proxy.routing import websocket_urlpatterns  # noqa: E402


class ApiHandler(ASGIHandler):
    """Django's ASGI handler with an empty middleware chain (the `/v1/` API)."""

    async def __call__(self, scope, receive, send) -> None:
        # No per-request ThreadSensitiveContext: it starts (and joins) a new thread for every request
        # just to run Django's request signals, which this handler does not send (see `handle`).
        await self.handle(scope, receive, send)

    async def handle(self, scope, receive, send) -> None:
        """Django's `ASGIHandler.handle` without the request_started/request_finished signals.

        Their receivers (close_old_connections, reset_queries, close_caches, reset_urlconf) are sync
        and cost two hops to asgiref's one sync thread per request: about 0.9 ms of a c=1 request,
        since the next request's request_started queued behind the previous one's request_finished.
        They tend state this handler never uses: the API's database work runs on proxy.db's pool,
        whose threads age their own connections, and no middleware sets a urlconf. The client
        disconnect is still watched, and cancels the view, as Django does it.

        The body is read here, not by Django (which spools all of it to a temporary file first): only
        once the headers showed a known key and an acceptable `content-length`, as a stream refused the
        moment it passes the limit, within the client timeouts (`proxy.edge`). A request whose body
        was left unread reaches its view with `request.gateway_refusal` set and an empty body."""
        path = scope["path"]
        if path == edge.UPLOAD_PATH and scope["method"] == "POST":
            # A file upload streams its body to the upstream itself (proxy.files), never read here.
            response = await files.upload(scope, receive)
            response["x-content-type-options"] = "nosniff"
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
                refusal = "request_too_large"
            except edge.BodyTimeout:
                response = typed_response(path, "request_timeout")
                response["connection"] = "close"
                response["x-content-type-options"] = "nosniff"
                await self.send_response(response, send)
                return
        body_file = io.BytesIO(body)
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            await self.send_response(error_response, send)
            return
        request.gateway_refusal = refusal

        async def process_request() -> HttpResponseBase:
            response = await self.run_get_response(request)
            if refusal is not None:
                # The rest of the body may still be on its way: close rather than read it to reuse
                # the connection.
                response["connection"] = "close"
            with contextlib.suppress(asyncio.CancelledError):  # the client left during the send
                await self.send_response(response, send)
            return response

        process = asyncio.create_task(process_request())
        # With its body unread, the next message would be body, not a disconnect; such an answer
        # needs nothing slow (no upstream), so there is nothing to watch.
        watched = [process]
        if refusal is None:
            watched.insert(0, asyncio.create_task(self.listen_for_disconnect(receive)))
        try:
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            for task in watched:  # the disconnect first: cancel the view on it
                if task.done():
                    with contextlib.suppress(RequestAborted):
                        task.result()
                else:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if not process.cancelled():
                # HttpResponse.close() without the request_finished signal: the same resource
                # closers, run here (they are the response's own, and cheap).
                response = process.result()
                for closer in response._resource_closers:
                    with contextlib.suppress(Exception):
                        closer()
                response._resource_closers.clear()
                response.closed = True
        finally:
            body_file.close()

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        self._middleware_chain = api_responses(convert_exception_to_response(self._get_response_async))


# Django's own answers on the API (its HTML pages for an unknown path, a wrong method, an exception that
# escaped a view) become the API's typed errors; Django still logs the exception.
DJANGO_ANSWERS = {404: "not_found", 405: "method_not_allowed", 500: "internal_error"}


def api_responses(get_response):
    """What every `/v1/` response gets, with no middleware to give it: a typed JSON body whatever went
    wrong, and `nosniff` (SecurityMiddleware's header)."""

    async def respond(request):
        response = await get_response(request)
        code = DJANGO_ANSWERS.get(response.status_code)
        if code is not None and not response.get("content-type", "").startswith("application/json"):
            allow = response.get("allow")
            response = typed_response(request.path, code)
            if allow:
                response["allow"] = allow
        response["x-content-type-options"] = "nosniff"
        return response

    return respond


async def lifespan(scope, receive, send) -> None:
    """Servers that speak ASGI lifespan (uvicorn) tell us when they stop: drain the ledger then.
    uvicorn ends its process by re-raising SIGTERM, so an atexit hook would never run there
    (daphne sends no lifespan events; the ledger's atexit hook covers it)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            shutdown.install()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await asyncio.to_thread(ledger.writer.flush)
            await upstream.close_client()
            await send({"type": "lifespan.shutdown.complete"})
            return


application = ProtocolTypeRouter(
    {
        "http": URLRouter([re_path(r"^v1/", ApiHandler()), re_path(r"", django_asgi_app)]),
        "websocket": URLRouter(websocket_urlpatterns),
        "lifespan": lifespan,
    }
)
