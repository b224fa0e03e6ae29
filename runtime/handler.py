"""Django's ASGI handler with nothing around the view: no middleware, no request signals, no per-request
thread context, and a body its caller has already read (django.core.handlers.asgi, Django 5.2).

- No per-request `ThreadSensitiveContext`: it starts (and joins) a new thread for every request just to
  run the request signals' sync receivers.
- No `request_started`/`request_finished`: their receivers (close_old_connections, reset_queries,
  close_caches, reset_urlconf) are sync and cost two hops to asgiref's one sync thread per request,
  about 0.9 ms of a c=1 request, since the next request's request_started queued behind the previous
  one's request_finished. They tend state such a handler never uses: its database work runs on
  runtime.db's pool, whose threads age their own connections, and no middleware sets a urlconf.
- No middleware: Django's stock middleware is sync code that an async request must hop to a thread for;
  `around` wraps the view instead (what every response needs, async).

Still as Django does it: the request object, URL resolution and the view (`get_response_async`), the
conversion of an exception to a response (logged by Django), the response sent, and a client disconnect
watched and cancelling the view.

Internals relied on (tests/runtime/test_handler.py): ASGIHandler.create_request, run_get_response,
send_response and listen_for_disconnect; BaseHandler._get_response_async and the attributes
load_middleware sets; HttpResponseBase._resource_closers and closed (its close() without the signal).
"""

import asyncio
import contextlib
import io
from collections.abc import Awaitable, Callable

from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest, HttpResponseBase
from django.urls import set_script_prefix

GetResponse = Callable[[HttpRequest], Awaitable[HttpResponseBase]]


class BareHandler(ASGIHandler):
    """Subclasses read the body (or decide not to) in `handle`, then call `serve`."""

    def around(self, get_response: GetResponse) -> GetResponse:
        """What every response passes through, in place of a middleware chain (none by default)."""
        return get_response

    async def __call__(self, scope, receive, send) -> None:
        await self.handle(scope, receive, send)

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        self._middleware_chain = self.around(convert_exception_to_response(self._get_response_async))

    async def serve(
        self,
        scope,
        receive,
        send,
        body: bytes,
        *,
        setup: Callable[[HttpRequest], None] = lambda request: None,
        watch_disconnect: bool = True,
    ) -> None:
        """Build the request over `body`, `setup` it, run the view and send its answer.

        `watch_disconnect`: cancel the view when the client disconnects. Only when the whole body was
        read: with the body left unread, the next message would be body, not a disconnect."""
        body_file = io.BytesIO(body)
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            await self.send_response(error_response, send)
            return
        setup(request)

        async def process_request() -> HttpResponseBase:
            response = await self.run_get_response(request)
            with contextlib.suppress(asyncio.CancelledError):  # the client left during the send
                await self.send_response(response, send)
            return response

        process = asyncio.create_task(process_request())
        watched = [process]
        if watch_disconnect:
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
                close_without_signal(process.result())
        finally:
            body_file.close()


def close_without_signal(response: HttpResponseBase) -> None:
    """`HttpResponseBase.close()` without its request_finished signal: the response's own resource
    closers (cheap), run here."""
    for closer in response._resource_closers:
        with contextlib.suppress(Exception):
            closer()
    response._resource_closers.clear()
    response.closed = True
