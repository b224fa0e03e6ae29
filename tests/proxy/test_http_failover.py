"""Pre-visible failover over real sockets: the gateway between a client and two fake upstreams."""

import httpx
import pytest

from devkit.behaviours import model_not_found, serve
from proxy.ledger.models import Attempt, RequestRecord
from proxy.ledger.recorder import writer
from routing.models import Circuit, Demotion
from tests.gateway_fixtures import GATEWAY_KEY

AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
CHAT = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}


def _attempts(record):
    return list(Attempt.objects.filter(request=record).order_by("ordinal").values_list("status", flat=True))


@pytest.mark.parametrize("stream", [False, True])
def test_model_not_found_on_the_first_assignment_is_served_by_the_second(gateway, two_assignments, stream):
    a, b, (acct_a, _) = two_assignments
    a.script("gpt-5", model_not_found())
    b.script("gpt-5", serve("served by b"))
    response = httpx.post(f"{gateway}/v1/chat/completions", json={**CHAT, "stream": stream}, headers=AUTH)
    assert response.status_code == 200
    if stream:
        assert "served" in response.text and "[DONE]" in response.text
    else:
        assert response.json()["choices"][0]["message"]["content"] == "served by b"
    assert response.headers["x-gateway-attempts"] == "2"
    assert response.headers["x-gateway-served-model"] == "gpt-5"
    assert a.hit_count(model="gpt-5") == 1 and b.hit_count(model="gpt-5") == 1
    assert [h.body["model"] for h in a.hits + b.hits] == ["gpt-5", "gpt-5"]
    writer.flush()
    record = RequestRecord.objects.get(request_id=response.headers["x-gateway-request-id"])
    assert (record.retry_count, record.outcome, record.transport) == (1, "ok", "sse" if stream else "http")
    assert _attempts(record) == ["retryable_failed", "succeeded"]
    circuit = Circuit.objects.get(assignment=acct_a)
    assert (circuit.reason, circuit.consecutive_failures) == ("upstream_model_unavailable", 1)
    assert Demotion.objects.filter(assignment=acct_a, model="gpt-5").count() == 1


def test_the_final_candidate_failure_is_returned_sanitized(gateway, two_assignments):
    a, b, _ = two_assignments
    a.script("gpt-5", model_not_found())
    b.script("gpt-5", model_not_found())
    response = httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, headers=AUTH)
    assert response.status_code == 404
    error = response.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (
        "model_not_found",
        "model",
        "invalid_request_error",
    )
    assert "does not exist" not in error["message"]  # the fake's own words never reach the client
    writer.flush()
    record = RequestRecord.objects.get()
    assert _attempts(record) == ["retryable_failed", "failed"]


def test_bad_input_and_missing_keys_get_typed_errors_and_no_upstream_hit(gateway, two_assignments):
    a, b, _ = two_assignments
    cases = [
        ({}, b"{}", 401, "authentication_error"),
        (AUTH, b"{not json", 400, "invalid_request"),
        (AUTH, b'{"model": "gpt-5", "messages": [], "stream": "yes"}', 400, "invalid_request"),
        (AUTH, b'{"model": "gpt-5"}' + b"\xff", 400, "invalid_request"),
        (AUTH, b'{"model": "no-such-model", "messages": []}', 404, "model_not_found"),
    ]
    for headers, body, status, code in cases:
        response = httpx.post(
            f"{gateway}/v1/chat/completions",
            content=body,
            headers={**headers, "content-type": "application/json"},
        )
        assert (response.status_code, response.json()["error"]["code"]) == (status, code)
    assert a.hits == [] and b.hits == []
    writer.flush()
    assert RequestRecord.objects.count() == len(cases)


def test_models_lists_the_pool_union(gateway, two_assignments):
    response = httpx.get(f"{gateway}/v1/models", headers=AUTH)
    assert [m["id"] for m in response.json()["data"]] == ["gpt-5"]
    assert httpx.get(f"{gateway}/v1/models").status_code == 401
