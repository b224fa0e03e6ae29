"""The file pin (SPEC §5.2): a request that references an uploaded file is hard-pinned to the account
that holds it, over HTTP, SSE and the Responses websocket; it never reaches another account, even when
the holder fails in a way that would otherwise be handed on. Real sockets throughout."""

import json

import httpx
import openai
import pytest
from websockets.sync.client import connect

from devkit.behaviours import serve, unavailable
from pools.models import Assignment
from routing.models import Affinity
from tests.factories import GatewayKeyFactory, PoolFactory
from tests.gateway_fixtures import GATEWAY_KEY
from tests.proxy.fixtures_e2e import AUTH, TIMEOUT, ledger_settled, post, record_of, sse_events, wait_for
from tests.proxy.test_websocket import read_response, ws_url

OTHER_KEY = "sk-gw-e2e-file-pin-other-4242"


def upload_to_b(gateway, two_assignments) -> str:
    """A file uploaded through the gateway and held by acct-b (acct-a refused the upload once)."""
    a, b, (_, acct_b) = two_assignments
    a.script_files(unavailable(503), serve())
    with openai.OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, max_retries=0) as client:
        created = client.files.create(file=("notes.txt", b"remember this"), purpose="user_data")
    assert list(b.files) == [created.id]
    wait_for(lambda: Affinity.objects.filter(key=created.id, assignment=acct_b).first(), what="file affinity")
    ledger_settled()  # SQLite's shared-cache test database: a test's own write must not meet the writer's
    return created.id


def chat(file_id: str, **extra) -> dict:
    part = {"type": "file", "file": {"file_id": file_id}}
    return {"model": "gpt-5", "messages": [{"role": "user", "content": [part]}], **extra}


def responses(*file_ids: str, **extra) -> dict:
    parts = [{"type": "input_file", "file_id": f} for f in file_ids]
    return {"model": "gpt-5", "input": [{"role": "user", "content": parts}], **extra}


def test_a_request_referencing_a_file_goes_to_its_holder_not_the_preferred_account(gateway, two_assignments):
    a, b, _ = two_assignments
    file_id = upload_to_b(gateway, two_assignments)
    response = post(gateway, "/v1/chat/completions", chat(file_id))
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "hello from b"
    assert a.hit_count(path="/v1/chat/completions") == 0
    assert b.hits[-1].body["messages"][0]["content"][0]["file"]["file_id"] == file_id


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_a_pinned_request_whose_holder_fails_is_never_handed_to_another_account(
    gateway, two_assignments, path, stream
):
    a, b, _ = two_assignments
    file_id = upload_to_b(gateway, two_assignments)
    b.script("gpt-5", unavailable(503))  # handed on, without the pin; acct-a would serve it
    body = (
        chat(file_id, stream=stream) if path == "/v1/chat/completions" else responses(file_id, stream=stream)
    )
    response = post(gateway, path, body)
    assert response.status_code == 503
    assert response.headers["x-gateway-attempts"] == "1"
    assert a.hit_count(path=path) == 0 and b.hit_count(path=path) == 1
    assert [a.status for a in record_of(response).attempts.all()] == ["failed"]


def test_over_a_websocket_a_pinned_frame_never_reaches_another_account(gateway, two_assignments):
    a, b, _ = two_assignments
    file_id = upload_to_b(gateway, two_assignments)
    b.script("gpt-5", unavailable(503), serve("b again"))
    with connect(ws_url(gateway), additional_headers=AUTH, open_timeout=5) as ws:
        ws.send(json.dumps({"type": "response.create", **responses(file_id)}))
        failed = read_response(ws)
        ws.send(json.dumps({"type": "response.create", **responses(file_id)}))
        served = read_response(ws)
    assert failed[-1]["type"] == "error" and failed[-1]["status"] == 503
    assert served[-1]["type"] == "response.completed"
    assert "".join(e["delta"] for e in served if e["type"] == "response.output_text.delta") == "b again"
    assert a.hit_count(path="/v1/responses") == 0 and b.hit_count(path="/v1/responses") == 2


def test_an_anthropic_file_source_is_pinned_too(gateway, two_assignments):
    a, b, (_, acct_b) = two_assignments
    file_id = upload_to_b(gateway, two_assignments)
    document = {"type": "document", "source": {"type": "file", "file_id": file_id}}
    body = {"model": "gpt-5", "max_tokens": 16, "messages": [{"role": "user", "content": [document]}]}
    response = post(gateway, "/v1/messages", body)
    # The holder is an OpenAI account, whose Chat API has no Anthropic document source: the pinned
    # candidate is passed over as unable to carry it (a typed 400 naming the field), and the request
    # is never sent to the account without the file instead.
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert a.hit_count(path="/v1/chat/completions") == 0 and b.hit_count(path="/v1/chat/completions") == 0
    # The plan held the holder alone: acct-a was never even considered.
    attempts = record_of(response).attempts.all()
    assert [(x.assignment_id, x.status) for x in attempts] == [(acct_b.pk, "ineligible")]


def test_two_files_on_different_accounts_are_a_conflict(gateway, two_assignments):
    a, b, _ = two_assignments
    on_b = upload_to_b(gateway, two_assignments)
    with openai.OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, max_retries=0) as client:
        on_a = client.files.create(file=("more.txt", b"and this"), purpose="user_data").id
    assert list(a.files) == [on_a]
    wait_for(lambda: Affinity.objects.filter(key=on_a).first(), what="the second file's affinity")
    hits = (a.hit_count(path="/v1/responses"), b.hit_count(path="/v1/responses"))
    response = post(gateway, "/v1/responses", responses(on_a, on_b))
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "file_assignment_conflict"
    assert (a.hit_count(path="/v1/responses"), b.hit_count(path="/v1/responses")) == hits


@pytest.mark.parametrize("how", ["moved", "disabled", "deleted"])
def test_a_file_whose_account_left_the_pool_is_a_conflict_not_a_reroute(gateway, two_assignments, how):
    a, _, (_, acct_b) = two_assignments
    file_id = upload_to_b(gateway, two_assignments)
    rows = Assignment.objects.filter(pk=acct_b.pk)
    if how == "moved":
        rows.update(pool=PoolFactory(name="elsewhere"))
    elif how == "disabled":
        rows.update(enabled=False)
    else:
        rows.delete()
    response = post(gateway, "/v1/chat/completions", chat(file_id))
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "file_assignment_conflict"
    assert a.hit_count(path="/v1/chat/completions") == 0


def test_another_keys_or_an_unknown_file_id_is_a_404_and_nothing_is_sent(gateway, two_assignments):
    """The gateway forwards only the file ids it saw this key upload (SPEC §7.2): another key's reads
    exactly like one nobody uploaded, answered by the gateway before any account is asked."""
    a, b, (acct_a, _) = two_assignments
    file_id = upload_to_b(gateway, two_assignments)
    GatewayKeyFactory(name="other", raw_key=OTHER_KEY, pools=[acct_a.pool])
    other = {"authorization": f"Bearer {OTHER_KEY}"}
    answers = [
        post(gateway, "/v1/chat/completions", chat(name), headers=other)
        for name in (file_id, "file-" + "0" * len(file_id[5:]))
    ]
    assert [r.status_code for r in answers] == [404, 404]
    assert answers[0].json() == answers[1].json()
    assert (answers[0].json()["error"]["code"], answers[0].json()["error"]["param"]) == (
        "file_not_found",
        "file_id",
    )
    assert a.hit_count(path="/v1/chat/completions") == 0 and b.hit_count(path="/v1/chat/completions") == 0
    # The uploader's own id is served, on the account that holds it.
    assert post(gateway, "/v1/chat/completions", chat(file_id)).status_code == 200
    assert b.hit_count(path="/v1/chat/completions") == 1


def test_a_request_referencing_too_many_files_is_a_typed_400(gateway, two_assignments):
    a, b, _ = two_assignments
    body = responses(*(f"file-{n}" for n in range(65)))
    response = post(gateway, "/v1/responses", body)
    assert response.status_code == 400
    assert (response.json()["error"]["code"], response.json()["error"]["param"]) == (
        "invalid_request",
        "file_id",
    )
    assert a.hit_count() == 0 and b.hit_count() == 0


def test_sse_success_on_the_holder(gateway, two_assignments):
    a, b, _ = two_assignments
    file_id = upload_to_b(gateway, two_assignments)
    response = httpx.post(
        f"{gateway}/v1/responses", json=responses(file_id, stream=True), headers=AUTH, timeout=TIMEOUT
    )
    assert response.status_code == 200
    assert sse_events(response.text)[-1].type == "response.completed"
    assert a.hit_count(path="/v1/responses") == 0 and b.hit_count(path="/v1/responses") == 1
