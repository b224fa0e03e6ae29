"""ASGI entry point.

- `/v1/...`: the client API, served by a Django handler with NO middleware. Django's stock
  middleware is sync code that an async request must hop to a thread for (and WhiteNoise is
  sync-only, which forces the whole chain into a thread); the API authenticates with gateway keys,
  needs no session, CSRF or static files, and sets its own headers, so it skips all of it.
- everything else over HTTP (admin, health, metrics): the full Django stack.
- websockets: the proxy's consumers.
"""

import asyncio
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gatewaysite.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402
from django.core.handlers.exception import convert_exception_to_response  # noqa: E402
from django.urls import re_path  # noqa: E402

from proxy import ledger, shutdown, upstream  # noqa: E402
from proxy.routing import websocket_urlpatterns  # noqa: E402


class ApiHandler(ASGIHandler):
    """Django's ASGI handler with an empty middleware chain (the `/v1/` API)."""

    async def __call__(self, scope, receive, send) -> None:
        # No per-request ThreadSensitiveContext: it starts (and joins) a new thread for every request
        # just to run Django's request signals. Those few fast receivers share asgiref's one
        # long-lived sync thread instead; the proxy's own database work runs on proxy.db's pool.
        await self.handle(scope, receive, send)

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        self._middleware_chain = convert_exception_to_response(self._get_response_async)


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
