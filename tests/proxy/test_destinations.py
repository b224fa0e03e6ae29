"""SPEC §9/§11 at dispatch: an upstream host is checked again after name resolution, on every path that
connects to an upstream (HTTP and SSE, the Responses websocket, catalog discovery). A name that resolves
to a link-local or metadata address (a changed record, DNS rebinding) is refused with nothing sent, and
the next candidate serves.

Name resolution is the one thing faked here (this machine's DNS is not ours to change): `socket.getaddrinfo`
answers for two test names, everything else goes over real loopback sockets. `rebind.test` resolves to
the fake upstream's loopback address *and* a metadata address, so without the check the request would
reach the fake (and the test would see its hit)."""

import json
import logging
import socket

import pytest
from websockets.sync.client import connect

from catalog.services import catalog_sync
from devkit.behaviours import serve
from proxy.ledger.models import Attempt
from tests.proxy.fixtures_e2e import AUTH, CHAT, post, record_of

REAL_GETADDRINFO = socket.getaddrinfo
NAMES = {
    "upstream.test": ["127.0.0.1"],
    "rebind.test": ["127.0.0.1", "169.254.169.254"],
    "mapped.test": ["::ffff:169.254.169.254"],
}


@pytest.fixture
def fake_dns(monkeypatch):
    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        addresses = NAMES.get(host.decode() if isinstance(host, bytes) else host)
        if addresses is None:
            return REAL_GETADDRINFO(host, port, family, type, proto, flags)
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (a, int(port or 0), 0, 0))
            if ":" in a
            else (socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, int(port or 0)))
            for a in addresses
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def _point(assignment, host: str, fake) -> None:
    assignment.base_url = fake.base_url.replace("127.0.0.1", host)
    assignment.save(update_fields=["base_url"])


def test_a_name_that_resolves_to_a_safe_address_is_served(gateway, two_assignments, fake_dns):
    a, _, (acct_a, _) = two_assignments
    _point(acct_a, "upstream.test", a)
    a.script("gpt-5", serve("from a"))
    response = post(gateway, "/v1/chat/completions", CHAT)
    assert response.status_code == 200
    assert a.hit_count(model="gpt-5") == 1


@pytest.mark.parametrize("host", ["rebind.test", "mapped.test"])
def test_a_name_that_resolves_to_a_metadata_address_is_refused_unsent_and_the_next_serves(
    gateway, two_assignments, fake_dns, host, caplog
):
    a, b, (acct_a, _) = two_assignments
    _point(acct_a, host, a)
    b.script("gpt-5", serve("from b"))
    with caplog.at_level(logging.WARNING, logger="gateway"):
        response = post(gateway, "/v1/chat/completions", CHAT)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "from b"
    assert a.hit_count() == 0
    first = Attempt.objects.get(request=record_of(response), ordinal=1)
    assert (first.failure_class, first.dispatch_state) == ("unavailable", "not_sent")
    assert "forbidden" in caplog.text


def test_a_forbidden_address_written_around_validation_is_refused_at_dispatch(
    gateway, two_assignments, caplog
):
    _, b, (acct_a, _) = two_assignments
    # A row written by raw SQL or an old release skips the model's validators; dispatch checks again.
    type(acct_a).objects.filter(pk=acct_a.pk).update(base_url="http://169.254.169.254/v1")
    b.script("gpt-5", serve("from b"))
    with caplog.at_level(logging.WARNING, logger="gateway"):
        response = post(gateway, "/v1/chat/completions", CHAT)
    assert response.json()["choices"][0]["message"]["content"] == "from b"
    assert "'169.254.169.254' is a forbidden destination" in caplog.text


def test_the_websocket_upstream_is_checked_after_resolution(gateway, two_assignments, fake_dns):
    a, b, (acct_a, _) = two_assignments
    _point(acct_a, "rebind.test", a)
    b.script("gpt-5", serve("from b"))
    with connect(gateway.replace("http://", "ws://") + "/v1/responses", additional_headers=AUTH) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "gpt-5", "input": "hi"}))
        events = []
        while not events or events[-1]["type"] not in ("response.completed", "error", "response.failed"):
            events.append(json.loads(ws.recv(timeout=10)))
    assert events[-1]["type"] == "response.completed"
    assert a.ws_connections == 0 and a.hit_count() == 0


def test_catalog_discovery_is_checked_after_resolution(two_assignments, fake_dns):
    a, _, (acct_a, _) = two_assignments
    _point(acct_a, "rebind.test", a)
    type(acct_a).objects.filter(pk=acct_a.pk).update(discovery=True)
    summary = catalog_sync(assignment=acct_a.name)
    assert [r.ok for r in summary.results] == [False]
    assert a.hit_count() == 0
    _point(acct_a, "upstream.test", a)  # the same path reaches an allowed name
    assert [r.ok for r in catalog_sync(assignment=acct_a.name).results] == [True]
