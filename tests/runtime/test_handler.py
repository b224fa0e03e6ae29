"""runtime.handler's contract with Django's ASGI handler: the internals it calls exist with the
signatures it calls them by and behave as it relies on (a probe serves real requests through it), and
what it skips (the request signals) is still what Django's own path sends, so the day Django stops
sending them this step around can go."""

import asyncio
import inspect

import pytest
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, reset_queries
from django.http import HttpResponse

from runtime.handler import BareHandler, close_without_signal
from tests.runtime import probe_urls


@pytest.fixture(autouse=True)
def _probe_urls(settings):
    settings.ROOT_URLCONF = "tests.runtime.probe_urls"
    probe_urls.closed.clear()
    probe_urls.cancelled.clear()


@pytest.fixture
def signals():
    """The request signals sent while the test runs, in order. Django's own database receivers are off
    meanwhile: these tests are about which signals are sent, and `close_old_connections` would touch
    a connection an earlier test of the same process left open (a test without database access)."""
    sent: list[str] = []

    def started(**kwargs):
        sent.append("request_started")

    def finished(**kwargs):
        sent.append("request_finished")

    djangos = [
        (signal, receiver)
        for signal, receiver in (
            (request_started, reset_queries),
            (request_started, close_old_connections),
            (request_finished, close_old_connections),
        )
        if signal.disconnect(receiver)
    ]
    request_started.connect(started)
    request_finished.connect(finished)
    yield sent
    request_started.disconnect(started)
    request_finished.disconnect(finished)
    for signal, receiver in djangos:
        signal.connect(receiver)


class Probe(BareHandler):
    """Reads the whole body, as a subclass does, and marks each response on its way out."""

    seen: list[tuple[str, str | None]]

    def around(self, get_response):
        self.seen = []

        async def respond(request):
            self.seen.append((request.path, getattr(request, "probe_mark", None)))
            response = await get_response(request)
            response["x-around"] = "yes"
            return response

        return respond

    async def handle(self, scope, receive, send):
        message = await receive()
        await self.serve(scope, receive, send, message.get("body", b""), setup=self.setup)

    def setup(self, request):
        request.probe_mark = "set"


def scope_for(path: str) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }


async def serve(handler, path: str, disconnect: bool = False) -> dict:
    """One request through `handler`; the answer's status, headers and body."""
    messages = [{"type": "http.request", "body": b"", "more_body": False}]
    gone = asyncio.Event()
    if disconnect:
        gone.set()

    async def receive():
        if messages:
            return messages.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    await asyncio.wait_for(handler(scope_for(path), receive, send), 10)
    gone.set()
    if not sent:
        return {}
    start = sent[0]
    return {
        "status": start["status"],
        "headers": dict(start["headers"]),
        "body": b"".join(m.get("body", b"") for m in sent[1:]),
    }


@pytest.mark.parametrize(
    ("method", "parameters"),
    [
        (ASGIHandler.create_request, ["self", "scope", "body_file"]),
        (ASGIHandler.run_get_response, ["self", "request"]),
        (ASGIHandler.send_response, ["self", "response", "send"]),
        (ASGIHandler.listen_for_disconnect, ["self", "receive"]),
        (BaseHandler._get_response_async, ["self", "request"]),
        (BaseHandler.load_middleware, ["self", "is_async"]),
    ],
)
def test_the_django_methods_it_calls_keep_their_signatures(method, parameters):
    assert list(inspect.signature(method).parameters) == parameters


def test_django_builds_its_chain_by_load_middleware_and_the_handler_replaces_every_part_of_it():
    handler = Probe()
    assert handler._view_middleware == []
    assert handler._template_response_middleware == []
    assert handler._exception_middleware == []
    assert handler.seen == []  # `around` ran when Django's __init__ loaded the chain


async def test_a_request_reaches_its_view_through_around_and_no_request_signal_is_sent(signals):
    handler = Probe()
    answer = await serve(handler, "/answer")
    assert (answer["status"], answer["body"]) == (200, b"answered")
    assert answer["headers"][b"x-around"] == b"yes"
    assert handler.seen == [("/answer", "set")]  # after `setup`
    assert probe_urls.closed == ["/answer"]  # the response's own closers still ran
    assert signals == []


async def test_a_client_disconnect_cancels_the_view():
    answer = await serve(Probe(), "/hang", disconnect=True)
    assert answer == {}
    assert probe_urls.cancelled == ["/hang"]


async def test_an_exception_in_the_view_is_still_djangos_500_through_around():
    answer = await serve(Probe(), "/fail")
    assert answer["status"] == 500
    assert answer["headers"][b"x-around"] == b"yes"


async def test_djangos_own_handler_still_sends_the_signals_this_one_skips(signals):
    answer = await serve(ASGIHandler(), "/answer")
    assert answer["status"] == 200
    assert signals == ["request_started", "request_finished"]


def test_djangos_close_runs_the_resource_closers_and_signals_and_close_without_signal_only_the_first(
    signals,
):
    ran: list[str] = []
    stock = HttpResponse()
    stock._resource_closers.append(lambda: ran.append("stock"))
    stock.close()
    assert (ran, signals, stock.closed) == (["stock"], ["request_finished"], True)

    ours = HttpResponse()
    ours._resource_closers.append(lambda: ran.append("ours"))
    close_without_signal(ours)
    assert (ran, signals, ours.closed, ours._resource_closers) == (
        ["stock", "ours"],
        ["request_finished"],
        True,
        [],
    )
