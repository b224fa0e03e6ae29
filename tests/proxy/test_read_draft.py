"""A request decided from its key's last read while its own read is on the wire (routing.request_state
`Reader.read`, runtime.loopdb `fetch_within(meanwhile=...)`): the draft is kept only when the request's
own read finds the very rows the draft came from, so what the database says now always decides. On SQLite
(the read runs on the loop at once: nothing to wait for, no draft) the same requests must be decided the
same way."""

import asyncio
import json
import logging
import threading
import time

import httpx
import pytest
from django.db import connection

from devkit.behaviours import hang, serve
from pools.models import GatewayKey
from proxy import ingress
from proxy.ledger import recorder as ledger
from tests.factories import OpenCircuitFactory
from tests.gateway_fixtures import GATEWAY_KEY
from tests.proxy.test_websocket import create, open_ws

AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
CHAT = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}
POSTGRES = pytest.mark.skipif(connection.vendor != "postgresql", reason="no draft on SQLite")


@pytest.fixture(autouse=True)
def _batches_held(monkeypatch):
    """A ledger batch settles the key's spend, which changes the key's row: one landing between two of a
    test's requests would rightly stop the next one's draft, and the test would not exercise it."""
    monkeypatch.setattr(ledger, "LINGER_S", 30.0)


@pytest.fixture
def decided(monkeypatch) -> list[bool]:
    """One entry per decision the gateway makes (`ingress.route_request`): whether it was made outside
    any task, as the draft is (a loop callback while the read is out)."""
    made: list[bool] = []
    route_request = ingress.route_request

    def spy(*args, **kwargs):
        made.append(asyncio.current_task() is None)
        return route_request(*args, **kwargs)

    monkeypatch.setattr(ingress, "route_request", spy)
    return made


def _chat(gateway: str, **headers: str) -> httpx.Response:
    return httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, headers={**AUTH, **headers})


def _steady(gateway: str, fake, *, then: int = 0) -> None:
    """Three answered requests: from the third on, the key's last two reads found the same rows, so its
    requests are drafted (a key whose rows change with every request is not). `then`: the gpt-5
    requests `fake` had before."""
    for _ in range(3):
        assert _chat(gateway).status_code == 200
    assert fake.hit_count(model="gpt-5") == then + 3


def test_a_circuit_opened_since_the_keys_last_read_moves_its_next_request(gateway, two_assignments):
    a, b, (acct_a, _) = two_assignments
    _steady(gateway, a)
    OpenCircuitFactory(assignment=acct_a)
    response = _chat(gateway)
    assert response.status_code == 200
    assert (a.hit_count(model="gpt-5"), b.hit_count(model="gpt-5")) == (3, 1)


@pytest.mark.parametrize(
    ("change", "status", "code"),
    [
        ({"enabled": False}, 401, "authentication_error"),
        ({"allowed_models": ["gpt-4o"]}, 403, "permission_denied"),
    ],
)
def test_a_key_changed_since_its_last_read_is_judged_as_it_is_now(
    gateway, two_assignments, change, status, code
):
    a, _, _ = two_assignments
    _steady(gateway, a)
    GatewayKey.objects.filter(name="e2e").update(**change)  # as a revocation or an edit in admin
    response = _chat(gateway)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert a.hit_count(model="gpt-5") == 3


@pytest.mark.parametrize(
    ("disabled", "status", "code"),
    [(False, 400, "invalid_request"), (True, 401, "authentication_error")],
)
def test_a_malformed_header_is_refused_in_the_paths_order_and_the_draft_logs_nothing(
    gateway, two_assignments, caplog, disabled, status, code
):
    """The draft refuses the header too; that refusal is dropped (never an error in the log), and the
    request's own read refuses it after the key's check, as every request is."""
    a, _, _ = two_assignments
    _steady(gateway, a)
    if disabled:
        GatewayKey.objects.filter(name="e2e").update(enabled=False)
    with caplog.at_level(logging.ERROR):
        response = _chat(gateway, **{"x-gateway-requirements": "teleport"})
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@POSTGRES
def test_a_steady_keys_request_is_decided_while_its_read_is_on_the_wire(gateway, two_assignments, decided):
    """Decided once, by the loop between sending the read and reading its rows (a loop callback, not the
    request's task); once the rows differ from the draft's, decided a second time in the request's task,
    from its own rows."""
    a, b, (acct_a, _) = two_assignments
    _steady(gateway, a)
    assert decided == [False, False, True]  # no draft before the key's rows were read twice alike
    decided.clear()

    assert _chat(gateway).status_code == 200
    assert decided == [True]

    decided.clear()
    OpenCircuitFactory(assignment=acct_a)
    assert _chat(gateway).status_code == 200
    assert decided == [True, False]  # the draft from the old rows, then the decision that was used
    assert b.hit_count(model="gpt-5") == 1


@POSTGRES
def test_a_request_is_not_drafted_while_another_is_being_answered(gateway, two_assignments, decided):
    """With another request in flight the loop has that one's work to do while a read is out: a draft
    would only put this request's decision ahead of it (`READER.answering`)."""
    a, _, _ = two_assignments
    _steady(gateway, a)
    a.script("gpt-5", hang(1.0), serve())
    held = threading.Thread(target=_chat, args=(gateway,))
    held.start()
    deadline = time.monotonic() + 5
    while a.hit_count(model="gpt-5") < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    decided.clear()
    assert _chat(gateway).status_code == 200  # while the first is held upstream
    held.join(10)
    assert decided == [False]


def _held_upstream(fake, count: int) -> None:
    """Until `fake` has been sent its `count`th gpt-5 request (HTTP or websocket)."""
    deadline = time.monotonic() + 5
    while fake.hit_count(model="gpt-5") < count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fake.hit_count(model="gpt-5") == count


@POSTGRES
def test_a_request_is_not_drafted_while_a_websocket_turn_is_being_answered(gateway, two_assignments, decided):
    """A websocket turn in flight is a request being answered as much as an HTTP one: the loop has its
    work to do while another request's read is out."""
    a, _, _ = two_assignments
    _steady(gateway, a)
    a.script("gpt-5", hang(1.0), serve())
    with open_ws(gateway) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "gpt-5", "input": "hi"}))
        _held_upstream(a, 4)
        decided.clear()
        assert _chat(gateway).status_code == 200  # while the turn is held upstream
        assert decided == [False]


@POSTGRES
def test_a_websocket_turn_is_drafted_alone_and_not_beside_another_request(gateway, two_assignments, decided):
    """A steady key's websocket turn is decided while its read is out when it is the only request being
    answered, and in its own task from its own read while an HTTP request is held upstream. (Each turn
    on a new connection: a connection's next turn is pinned and continues the conversation, so its read
    names the key's affinities and is not the one the draft is kept for.)"""
    a, _, _ = two_assignments
    _steady(gateway, a)
    with open_ws(gateway) as ws:
        decided.clear()
        assert create(ws)[-1]["type"] == "response.completed"
        assert decided == [True]

    # The turn's ledger row, settled by `create`, changed the key's spend: its rows steady again first.
    _steady(gateway, a, then=4)
    a.script("gpt-5", hang(1.0), serve())
    held = threading.Thread(target=_chat, args=(gateway,))
    held.start()
    _held_upstream(a, 8)
    with open_ws(gateway) as ws:
        decided.clear()
        assert create(ws)[-1]["type"] == "response.completed"
        assert decided == [False]
    held.join(10)
