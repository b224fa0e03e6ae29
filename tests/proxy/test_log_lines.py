"""The log an on-call reads (issue 47 point 4): one JSON line per request (when, whose key, which model,
pools, assignments and their failure classes, tokens, cost, duration, the limit that refused it) and
one per failed attempt, sanitized; under `GATEWAY_LOG_FORMAT=json` every line of the production server,
uvicorn's and Django's included, is a JSON object; no key, credential, prompt, completion or upstream
message in any line."""

import json

import httpx
import pytest

from devkit.behaviours import error, serve
from proxy.ledger.models import RequestRecord
from tests.gateway_fixtures import GATEWAY_KEY, UPSTREAM_KEY
from tests.proxy.fixtures_e2e import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = "prompt-canary-5be1"
COMPLETION = "completion-canary-77d0"
UPSTREAM_MESSAGE = "upstream-message-canary-c3a9"


def _lines(text: str) -> list[dict]:
    lines = []
    for raw in text.splitlines():
        if raw.strip():
            line = json.loads(raw)  # every line, or the test fails here naming it
            assert isinstance(line, dict) and {"time", "level", "logger"} <= line.keys(), raw
            lines.append(line)
    return lines


def test_every_line_of_the_production_server_is_json_and_names_who_what_and_where_never_content(
    gateway_nodes, two_assignments
):
    (a, b, _) = two_assignments
    # acct-a's credential is refused, in words that quote it; acct-b answers.
    a.script(
        "gpt-5",
        error(
            401,
            {
                "error": {
                    "message": f"Incorrect API key {UPSTREAM_KEY} {UPSTREAM_MESSAGE}",
                    "type": "invalid_request_error",
                    "code": "invalid_api_key",
                }
            },
        ),
    )
    b.script("gpt-5", serve(COMPLETION), serve(COMPLETION))
    (node,) = gateway_nodes.start(1, GATEWAY_LOG_FORMAT="json", GATEWAY_LOG_LEVEL="INFO")
    auth = {"authorization": f"Bearer {GATEWAY_KEY}"}
    body = {"model": "gpt-5", "messages": [{"role": "user", "content": PROMPT}]}
    answer = httpx.post(f"{node}/v1/chat/completions", json=body, headers=auth, timeout=10)
    assert answer.status_code == 200 and COMPLETION in answer.text
    streamed = httpx.post(
        f"{node}/v1/chat/completions", json={**body, "stream": True}, headers=auth, timeout=10
    )
    assert streamed.status_code == 200
    refused = httpx.post(
        f"{node}/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-gw-nope"}
    )
    assert refused.status_code == 401
    # Django's own pages under ASGI: the admin's login page and a static file WhiteNoise serves.
    assert httpx.get(f"{node}/admin/login/", timeout=10).status_code == 200
    assert httpx.get(f"{node}/static/admin/css/base.css", timeout=10).status_code == 200
    wait_for(lambda: RequestRecord.objects.count() == 3 or None, what="three records")
    gateway_nodes.stop()

    text = (gateway_nodes.log_dir / "node-0.log").read_text()
    lines = _lines(text)
    for canary in (PROMPT, COMPLETION, UPSTREAM_MESSAGE, UPSTREAM_KEY, GATEWAY_KEY, "sk-gw-nope"):
        assert canary not in text
    assert "StreamingHttpResponse" not in text  # Django's warning about a synchronous iterator
    assert any(
        line["logger"].startswith("uvicorn") and "Started server process" in line["message"] for line in lines
    )

    requests = [line for line in lines if line.get("event") == "request"]
    served = next(line for line in requests if line["request_id"] == answer.headers["x-request-id"])
    assert served["time"].endswith("+00:00") and served["level"] == "INFO"
    assert {
        k: served[k] for k in ("key", "requested_model", "served_model", "pools", "outcome", "status")
    } == {
        "key": "e2e",
        "requested_model": "gpt-5",
        "served_model": "gpt-5",
        "pools": ["main"],
        "outcome": "ok",
        "status": 200,
    }
    assert [(x["assignment"], x["status"], x["failure_class"]) for x in served["assignments"]] == [
        ("acct-a", "retryable_failed", "credential_rejected"),
        ("acct-b", "succeeded", None),
    ]
    assert served["input_tokens"] == 10 and served["output_tokens"] > 0 and served["duration_ms"] > 0
    assert {line["status"] for line in requests} == {200, 401}

    (failed,) = [line for line in lines if line.get("event") == "attempt_failed"]
    assert {
        k: failed[k] for k in ("request_id", "key", "assignment", "pool", "upstream_status", "error_code")
    } == {
        "request_id": served["request_id"],
        "key": "e2e",
        "assignment": "acct-a",
        "pool": "main",
        "upstream_status": 401,
        "error_code": "invalid_api_key",
    }
    assert failed["level"] == "WARNING"
