"""Affinities belong to the key that created them (SPEC §7.2, §11), tried from the attacker's side over
real sockets: key 2 holds key 1's response id or session name and tries to use it."""

import uuid

import pytest
from websockets.sync.client import connect

from catalog.models import Provenance
from devkit.behaviours import serve, unavailable
from routing.models import Affinity
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory
from tests.gateway_fixtures import UPSTREAM_KEY_ENV
from tests.proxy.fixtures_e2e import (
    RESPONSES,
    ledger_settled,
    post,
    wait_for,
)
from tests.proxy.test_websocket import read_response, ws_url

OTHER_KEY = "sk-gw-e2e-attacker-key-9876543210"
OTHER = {"authorization": f"Bearer {OTHER_KEY}"}


@pytest.fixture
def other_pool(two_assignments, fake_upstream_factory):
    """Key 2 (`attacker`) on its own pool `other` with its own account `acct-c`."""
    c = fake_upstream_factory("c", models=("gpt-5",))
    pool = PoolFactory(name="other")
    acct_c = AssignmentFactory(pool=pool, name="acct-c", base_url=c.base_url, api_key_env=UPSTREAM_KEY_ENV)
    CatalogEntryFactory(assignment=acct_c, model="gpt-5", provenance=Provenance.CONFIGURED)
    GatewayKeyFactory(name="attacker", raw_key=OTHER_KEY, pools=[pool])
    return c


def _victims_response(gateway) -> str:
    first = post(gateway, "/v1/responses", RESPONSES)
    assert first.status_code == 200
    response_id = first.json()["id"]
    wait_for(lambda: Affinity.objects.filter(key=response_id).first(), what="the victim's affinity")
    return response_id


def _unknown_like(response_id: str) -> str:
    return "resp_" + uuid.uuid4().hex[: len(response_id) - 5].ljust(len(response_id) - 5, "0")


def _answer(response) -> tuple[int, object]:
    return response.status_code, response.json()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
def test_another_pools_response_id_gets_the_unknown_id_answer_and_never_reaches_its_account(
    gateway, two_assignments, other_pool, stream
):
    a, b, _ = two_assignments
    c = other_pool
    response_id = _victims_response(gateway)
    assert (a.hit_count(), b.hit_count()) == (1, 0)

    stolen = post(
        gateway,
        "/v1/responses",
        {**RESPONSES, "stream": stream, "previous_response_id": response_id},
        headers=OTHER,
    )
    unknown = post(
        gateway,
        "/v1/responses",
        {**RESPONSES, "stream": stream, "previous_response_id": _unknown_like(response_id)},
        headers=OTHER,
    )
    # Not 503 pin_unavailable (which told the attacker the id exists elsewhere): exactly what an id
    # nobody ever created gets, OpenAI's "not found", from the gateway: no account is asked.
    assert _answer(stolen) == _answer(unknown)
    assert stolen.status_code == 400
    error = stolen.json()["error"]
    assert (error["code"], error["param"]) == ("previous_response_not_found", "previous_response_id")
    assert (a.hit_count(), b.hit_count(), c.hit_count()) == (1, 0, 0)


def test_over_a_websocket_another_keys_response_id_reads_as_unknown(gateway, two_assignments, other_pool):
    a, _, _ = two_assignments
    c = other_pool
    response_id = _victims_response(gateway)
    answers = []
    with connect(ws_url(gateway), additional_headers=OTHER, open_timeout=5) as ws:
        for previous in (response_id, _unknown_like(response_id)):
            ws.send(
                '{"type": "response.create", "model": "gpt-5", "input": "hi", '
                f'"previous_response_id": "{previous}"}}'
            )
            answers.append(read_response(ws))
    assert answers[0] == answers[1]
    assert answers[0][-1]["type"] == "error" and answers[0][-1]["status"] == 400
    assert (a.hit_count(), c.hit_count()) == (1, 0)


def test_in_a_shared_pool_another_keys_response_id_is_never_served(gateway, two_assignments):
    """Key 1's response was served by acct-b; key 2 (same pool) naming it gets the unknown id's
    answer from the gateway, whichever account it would have landed on; key 1 continues it on b."""
    a, b, (_, acct_b) = two_assignments
    GatewayKeyFactory(name="neighbour", raw_key=OTHER_KEY, pools=[acct_b.pool])
    a.script("gpt-5", unavailable(503), serve())
    response_id = _victims_response(gateway)
    assert (a.hit_count(), b.hit_count()) == (1, 1)

    stolen = post(gateway, "/v1/responses", {**RESPONSES, "previous_response_id": response_id}, headers=OTHER)
    assert stolen.status_code == 400
    assert stolen.json()["error"]["code"] == "previous_response_not_found"
    assert (a.hit_count(), b.hit_count()) == (1, 1)
    own = post(gateway, "/v1/responses", {**RESPONSES, "previous_response_id": response_id})
    assert own.status_code == 200
    assert (a.hit_count(), b.hit_count()) == (1, 2)


def test_another_key_cannot_overwrite_or_follow_a_session(gateway, two_assignments):
    a, _, (acct_a, acct_b) = two_assignments
    GatewayKeyFactory(name="neighbour", raw_key=OTHER_KEY, pools=[acct_b.pool])
    a.script("gpt-5", unavailable(503), serve("a"))
    session = {"x-gateway-session": "team-session"}
    chat = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}

    first = post(gateway, "/v1/chat/completions", chat, headers=session)  # a fails once: b serves
    assert first.json()["choices"][0]["message"]["content"] == "hello from b"
    # Key 2 names the same session: it is its own (empty) session, so it goes by preference to a.
    theirs = post(gateway, "/v1/chat/completions", chat, headers={**OTHER, **session})
    assert theirs.json()["choices"][0]["message"]["content"] == "a"
    ledger_settled()
    rows = dict(Affinity.objects.filter(kind="session").values_list("gateway_key__name", "assignment_id"))
    assert rows == {"e2e": acct_b.pk, "neighbour": acct_a.pk}
    # Key 1's session still returns to b.
    again = post(gateway, "/v1/chat/completions", chat, headers=session)
    assert again.json()["choices"][0]["message"]["content"] == "hello from b"
