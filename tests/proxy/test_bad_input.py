"""Bad input over real sockets (SPEC §4, §11): every bad request gets the typed OpenAI error shape,
reaches no upstream, and changes no state except its own ledger row."""

import json

from proxy.ledger.models import Attempt, RequestRecord
from routing.models import Affinity, Circuit, Demotion
from tests.gateway_fixtures import GATEWAY_KEY, UPSTREAM_KEY
from tests.proxy.fixtures_e2e import (
    assert_hits,
    post,
    record_of,
)

CHAT_PATH, RESPONSES_PATH = "/v1/chat/completions", "/v1/responses"
BOTH = (CHAT_PATH, RESPONSES_PATH)
VALID = json.dumps({"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}).encode()


def _assert_typed(response, status: int, code: str | None, case: str = "") -> None:
    """The SPEC §4 OpenAI error shape with `status` and `code` (None: any non-empty code)."""
    label = f"{case}: {response.status_code} {response.text[:200]}"
    assert response.status_code == status, label
    assert response.headers["content-type"].startswith("application/json"), label
    body = response.json()
    assert set(body) == {"error"}, label
    error = body["error"]
    assert set(error) == {"message", "type", "code", "param"}, label
    assert isinstance(error["message"], str) and error["message"], label
    assert isinstance(error["type"], str) and error["type"], label
    assert error["param"] is None or isinstance(error["param"], str), label
    if code is None:
        assert isinstance(error["code"], str) and error["code"], label
    else:
        assert error["code"] == code, label


def _assert_only_ledger_rows(responses, status: int) -> None:
    """Exactly one RequestRecord per request (with its typed outcome), and nothing else written."""
    records = [record_of(r) for r in responses]
    assert [(r.status_code, r.outcome) for r in records] == [
        (status, response.json()["error"]["code"]) for response in responses
    ]
    assert RequestRecord.objects.count() == len(responses)
    assert not Attempt.objects.exists()
    assert not (Circuit.objects.exists() or Demotion.objects.exists() or Affinity.objects.exists())


BAD_BODIES = {
    "malformed-json": (b"{not json", BOTH),
    "bad-utf8": (b'{"model": "gpt-5", "messages": [{"role": "user", "content": "\xff\xfe"}]}', BOTH),
    "empty-body": (b"", BOTH),
    "not-an-object": (b'[{"model": "gpt-5"}]', BOTH),
    "missing-model": (b'{"messages": [], "input": "hi"}', BOTH),
    "model-not-a-string": (b'{"model": 5, "messages": [], "input": "hi"}', BOTH),
    "model-a-list": (b'{"model": ["gpt-5"], "messages": [], "input": "hi"}', BOTH),
    "stream-a-string": (b'{"model": "gpt-5", "messages": [], "input": "hi", "stream": "yes"}', BOTH),
    "stream-a-number": (b'{"model": "gpt-5", "messages": [], "input": "hi", "stream": 1}', BOTH),
    "messages-not-a-list": (b'{"model": "gpt-5", "messages": "hi"}', (CHAT_PATH,)),
}


def test_every_bad_body_is_invalid_request_with_no_upstream_hit_and_no_state(gateway, two_assignments):
    a, b, _ = two_assignments
    responses = []
    for case, (content, paths) in BAD_BODIES.items():
        for path in paths:
            response = post(gateway, path, content=content)
            _assert_typed(response, 400, "invalid_request", f"{case} on {path}")
            responses.append(response)
    assert_hits((a, 0), (b, 0))
    _assert_only_ledger_rows(responses, 400)


BAD_HEADERS = {
    "requirements-unknown": {"x-gateway-requirements": "teleport"},
    "requirements-out-of-range": {"x-gateway-requirements": "min_quality=2"},
    "requirements-empty-region": {"x-gateway-requirements": "region="},
    "deadline-not-a-number": {"x-gateway-deadline-ms": "soon"},
    "deadline-negative": {"x-gateway-deadline-ms": "-5"},
    "deadline-zero": {"x-gateway-deadline-ms": "0"},
}


def test_every_bad_gateway_header_is_invalid_request_with_no_upstream_hit(gateway, two_assignments):
    a, b, _ = two_assignments
    responses = []
    for case, headers in BAD_HEADERS.items():
        response = post(gateway, CHAT_PATH, content=VALID, headers=headers)
        _assert_typed(response, 400, "invalid_request", case)
        responses.append(response)
    assert_hits((a, 0), (b, 0))
    _assert_only_ledger_rows(responses, 400)


def test_a_body_over_the_configured_limit_is_request_too_large(gateway, two_assignments, settings):
    a, b, _ = two_assignments
    settings.GATEWAY_MAX_BODY_BYTES = 1024
    big = json.dumps({"model": "gpt-5", "messages": [{"role": "user", "content": "x" * 2000}]}).encode()
    responses = [post(gateway, path, content=big) for path in BOTH]
    for response in responses:
        _assert_typed(response, 413, "request_too_large")
    assert_hits((a, 0), (b, 0))
    _assert_only_ledger_rows(responses, 413)


def test_a_body_exactly_at_the_configured_limit_is_served(gateway, two_assignments, settings):
    a, b, _ = two_assignments
    settings.GATEWAY_MAX_BODY_BYTES = 1024
    head = json.dumps({"model": "gpt-5", "messages": [{"role": "user", "content": ""}]}).encode()
    exact = head.replace(b'""', b'"' + b"x" * (1024 - len(head)) + b'"')
    assert len(exact) == 1024
    response = post(gateway, CHAT_PATH, content=exact)
    assert response.status_code == 200
    assert_hits((a, 1), (b, 0))


def test_a_huge_body_at_the_default_limit_is_request_too_large(gateway, two_assignments):
    a, b, _ = two_assignments
    huge = b'{"model": "gpt-5", "messages": [{"role": "user", "content": "' + b"x" * (9 << 20) + b'"}]}'
    responses = [post(gateway, CHAT_PATH, content=huge)]
    _assert_typed(responses[0], 413, "request_too_large")
    assert_hits((a, 0), (b, 0))
    _assert_only_ledger_rows(responses, 413)


AUTH_CASES = {
    "missing": {},
    "unknown-bearer": {"authorization": "Bearer sk-gw-not-a-real-key-000000"},
    "unknown-x-api-key": {"x-api-key": "sk-gw-not-a-real-key-000000"},
    "no-bearer-scheme": {"authorization": GATEWAY_KEY},
    "basic-scheme": {"authorization": f"Basic {GATEWAY_KEY}"},
}


def test_every_missing_or_unknown_key_is_401_with_no_upstream_hit(gateway, two_assignments):
    a, b, _ = two_assignments
    responses = []
    for case, headers in AUTH_CASES.items():
        for path in BOTH:
            response = post(gateway, path, content=VALID, headers=headers, auth=False)
            _assert_typed(response, 401, None, f"{case} on {path}")
            responses.append(response)
    assert_hits((a, 0), (b, 0))
    _assert_only_ledger_rows(responses, 401)


def test_the_key_in_x_api_key_is_accepted_and_never_forwarded(gateway, two_assignments):
    a, b, _ = two_assignments
    response = post(gateway, CHAT_PATH, content=VALID, headers={"x-api-key": GATEWAY_KEY}, auth=False)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "hello from a"
    assert_hits((a, 1), (b, 0))
    (hit,) = a.hits
    assert hit.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert GATEWAY_KEY not in json.dumps(hit.headers)


def test_a_bug_on_a_proxied_route_is_a_typed_500_logged_without_the_body(
    gateway, two_assignments, monkeypatch, caplog
):
    """What escapes the request path (a bug, never the client's mistake) is answered as Django's
    handler answered it on the API: a typed `internal_error`, and the traceback under `django.request`
    with the path, never the body."""
    from proxy import views

    async def broken(*args, **kwargs):
        raise RuntimeError("the request path broke")

    monkeypatch.setattr(views, "_proxy", broken)
    caplog.set_level("ERROR", logger="django.request")
    canary = "canary-prompt-7f3a"
    body = {"model": "gpt-5", "messages": [{"role": "user", "content": canary}]}
    response = post(gateway, CHAT_PATH, body)
    _assert_typed(response, 500, "internal_error")
    assert response.headers["x-content-type-options"] == "nosniff"
    logged = [r for r in caplog.records if r.name == "django.request"]
    assert [r.getMessage() for r in logged] == [f"Internal Server Error: {CHAT_PATH}"]
    assert "the request path broke" in caplog.text  # its traceback
    assert canary not in caplog.text
    a, b, _ = two_assignments
    assert_hits((a, 0), (b, 0))
