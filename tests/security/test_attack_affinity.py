"""Another key's `previous_response_id` or `file_id` (issue 45, "Also"). Threat (SECURITY.md, Key holder):
a key holder who learnt another key's response or file id (the Affinity admin lists them) names it in its
own request; forwarded unpinned, it is served whenever it lands on the account that holds it.

The gateway forwards only the ids it saw the request's key create: any other is answered by the gateway,
as OpenAI answers an unknown id, before any account is asked. Against the production server
(`gateway_nodes`), with one account, so an id that were forwarded would land on its holder."""

from __future__ import annotations

import uuid

import httpx
import openai
import pytest
from websockets.sync.client import connect

from routing.models import Affinity
from tests.factories import GatewayKeyFactory
from tests.gateway_fixtures import GATEWAY_KEY
from tests.proxy.fixtures_e2e import RESPONSES, TIMEOUT, post, wait_for
from tests.proxy.test_websocket import read_response
from tests.security.conftest import responsive

pytestmark = pytest.mark.attack

THIEF_KEY = "sk-gw-attack-thief-key-0123456789"
THIEF = {"authorization": f"Bearer {THIEF_KEY}"}


@pytest.fixture
def one_account(build_assignments):
    """Pool `main` with one account, `acct-a`, used by the e2e key and by the thief's key."""
    (a,), (acct_a,) = build_assignments(1)
    GatewayKeyFactory(name="thief", raw_key=THIEF_KEY, pools=[acct_a.pool])
    return a


def _unknown_like(known: str, prefix: str) -> str:
    return prefix + uuid.uuid4().hex.ljust(len(known), "0")[: len(known) - len(prefix)]


def _error(response) -> tuple[int, dict]:
    return response.status_code, response.json()


def test_another_keys_response_id_is_never_served_and_reads_as_unknown(gateway_nodes, one_account):
    a = one_account
    (base,) = gateway_nodes.start(1)
    first = post(base, "/v1/responses", RESPONSES)
    assert first.status_code == 200
    response_id = first.json()["id"]
    wait_for(lambda: Affinity.objects.filter(key=response_id).first(), what="the owner's affinity")
    assert a.hit_count() == 1

    for stream in (False, True):
        stolen = post(
            base,
            "/v1/responses",
            {**RESPONSES, "stream": stream, "previous_response_id": response_id},
            headers=THIEF,
        )
        unknown = post(
            base,
            "/v1/responses",
            {**RESPONSES, "stream": stream, "previous_response_id": _unknown_like(response_id, "resp_")},
            headers=THIEF,
        )
        assert _error(stolen) == _error(unknown)
        status, body = _error(stolen)
        assert (status, body["error"]["code"], body["error"]["param"]) == (
            400,
            "previous_response_not_found",
            "previous_response_id",
        )
    assert a.hit_count() == 1  # nothing reached the account that holds the response

    # Over the Responses websocket, the same answer for both, nothing sent.
    with connect(
        base.replace("http", "ws") + "/v1/responses", additional_headers=THIEF, open_timeout=5
    ) as ws:
        answers = []
        for previous in (response_id, _unknown_like(response_id, "resp_")):
            ws.send(
                '{"type": "response.create", "model": "gpt-5", "input": "hi", '
                f'"previous_response_id": "{previous}"}}'
            )
            answers.append(read_response(ws))
    assert answers[0] == answers[1]
    assert answers[0][-1]["type"] == "error" and answers[0][-1]["status"] == 400
    assert a.hit_count() == 1

    # The owner's own id still continues its response.
    own = post(base, "/v1/responses", {**RESPONSES, "previous_response_id": response_id})
    assert own.status_code == 200, own.text
    assert a.hits[-1].body["previous_response_id"] == response_id
    assert responsive(base)


def test_another_keys_file_id_is_never_served_and_reads_as_unknown(gateway_nodes, one_account):
    a = one_account
    (base,) = gateway_nodes.start(1)
    with openai.OpenAI(base_url=f"{base}/v1", api_key=GATEWAY_KEY, max_retries=0) as client:
        file_id = client.files.create(file=("notes.txt", b"remember this"), purpose="user_data").id
    wait_for(lambda: Affinity.objects.filter(key=file_id).first(), what="the owner's file affinity")

    def chat(name: str) -> dict:
        part = {"type": "file", "file": {"file_id": name}}
        return {"model": "gpt-5", "messages": [{"role": "user", "content": [part]}]}

    def responses(name: str) -> dict:
        return {
            "model": "gpt-5",
            "input": [{"role": "user", "content": [{"type": "input_file", "file_id": name}]}],
        }

    for path, body in (("/v1/chat/completions", chat), ("/v1/responses", responses)):
        stolen = post(base, path, body(file_id), headers=THIEF)
        unknown = post(base, path, body(_unknown_like(file_id, "file-")), headers=THIEF)
        assert _error(stolen) == _error(unknown)
        status, error = _error(stolen)
        assert (status, error["error"]["code"], error["error"]["param"]) == (404, "file_not_found", "file_id")
        assert a.hit_count(path=path) == 0
    # As the Files API itself answers the thief.
    assert httpx.get(f"{base}/v1/files/{file_id}", headers=THIEF, timeout=TIMEOUT).status_code == 404

    # The owner's own id is served.
    own = post(base, "/v1/chat/completions", chat(file_id))
    assert own.status_code == 200, own.text
    assert a.hit_count(path="/v1/chat/completions") == 1
    assert responsive(base)
