"""Failure controls over real sockets (SPEC §5.6, §6.1, §6.2, §6.4, §7): each scenario asserts its
defined terminal behaviour, the ledger, and the hit count on every fake, so a wrong extra dispatch
(or a missing one) fails."""

import time

import httpx
import pytest

from devkit.behaviours import (
    codeless_404,
    error,
    fail_after_visible,
    fail_before_visible,
    generic_404,
    hang,
    model_not_found,
    quota,
    rate_limited,
    refusal,
    serve,
    unavailable,
)
from pools.models import GatewaySettings
from routing.models import Affinity, Circuit, Demotion
from tests.factories import OpenCircuitFactory
from tests.proxy.fixtures_e2e import (
    AUTH,
    CHAT,
    RESPONSES,
    TIMEOUT,
    assert_hits,
    attempt_statuses,
    attempts_of,
    chat_text,
    error_events,
    post,
    record_of,
    responses_text,
    sse_events,
    wait_for,
)

# The fakes' own words; the gateway must answer in its own (SPEC §4).
FAKE_MODEL_NOT_FOUND = "The model does not exist or you do not have access to it."
FAKE_MID_STREAM = "The server had an error while processing your request."
PROVIDER_WORDS = "provider-private-words-7731"


def _sanitized(response: httpx.Response, provider_message: str) -> dict:
    """The SPEC §4 error object of `response`; the provider's message is nowhere in the body."""
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "code", "param"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert provider_message not in response.text
    return body["error"]


# -- 404s ------------------------------------------------------------------------------------------


def test_a_generic_404_is_returned_sanitized_and_never_handed_off(gateway, two_assignments):
    a, b, _ = two_assignments
    a.script("gpt-5", generic_404())
    b.script("gpt-5", serve("served by b"))
    response = post(gateway, "/v1/chat/completions", CHAT)
    assert response.status_code == 404
    error = _sanitized(response, "Not found.")
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "unknown_url", None)
    assert response.headers["x-gateway-attempts"] == "1"
    assert_hits((a, 1), (b, 0))
    record = record_of(response)
    assert (attempt_statuses(record), record.retry_count, record.status_code) == (["failed"], 0, 404)
    assert not Circuit.objects.exists() and not Demotion.objects.exists()


def test_a_codeless_model_404_with_catalog_provenance_is_handed_off(gateway, two_assignments):
    a, b, (acct_a, _) = two_assignments
    a.script("gpt-5", codeless_404())
    b.script("gpt-5", serve("served by b"))
    response = post(gateway, "/v1/chat/completions", CHAT)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "served by b"
    assert response.headers["x-gateway-attempts"] == "2"
    assert_hits((a, 1), (b, 1))
    record = record_of(response)
    assert (attempt_statuses(record), record.retry_count) == (["retryable_failed", "succeeded"], 1)
    assert attempts_of(record)[0].failure_class == "model_unavailable"
    circuit = Circuit.objects.get()
    assert (circuit.assignment_id, circuit.reason) == (acct_a.pk, "upstream_model_unavailable")
    assert list(Demotion.objects.values_list("assignment_id", "model")) == [(acct_a.pk, "gpt-5")]


# -- failures after visible output -----------------------------------------------------------------


def _chat_ends(response, events, error) -> None:
    assert events[-1].data == {"error": error}
    assert "[DONE]" not in response.text


def _responses_ends(response, events, error) -> None:
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "error",
    ]


@pytest.mark.parametrize(
    "path, body, text_of, ends_with_the_error",
    [
        pytest.param("/v1/chat/completions", CHAT, chat_text, _chat_ends, id="chat"),
        pytest.param("/v1/responses", RESPONSES, responses_text, _responses_ends, id="responses"),
    ],
)
def test_a_stream_failing_after_visible_output_ends_with_one_sanitized_error_and_no_retry(
    gateway, two_assignments, path, body, text_of, ends_with_the_error
):
    a, b, _ = two_assignments
    a.script("gpt-5", fail_after_visible())
    b.script("gpt-5", serve("served by b"))
    response = post(gateway, path, {**body, "stream": True})
    assert response.status_code == 200
    events = sse_events(response.text)
    assert text_of(events) == "hello"  # a's first visible delta, then nothing from b
    (error,) = error_events(events)
    ends_with_the_error(response, events, error)
    assert (error["type"], error["code"]) == ("server_error", None)
    assert FAKE_MID_STREAM not in response.text
    assert_hits((a, 1), (b, 0))
    record = record_of(response)
    assert (attempt_statuses(record), record.retry_count) == (["failed"], 0)
    # Not retried, but counted: a server error after output cools acct-a like one before output.
    (attempt,) = attempts_of(record)
    assert attempt.failure_class == "unavailable"
    circuit = Circuit.objects.get(assignment__name="acct-a")
    assert (circuit.reason, circuit.consecutive_failures, circuit.route_class) == (
        "upstream_unavailable",
        1,
        "sse",
    )


# -- compact ---------------------------------------------------------------------------------------


def test_compact_makes_exactly_one_attempt_and_returns_its_rejection(gateway, two_assignments):
    a, b, (acct_a, _) = two_assignments
    a.script("gpt-5", model_not_found())
    b.script("gpt-5", serve("served by b"))
    body = {"model": "gpt-5", "input": [{"role": "user", "content": "hi"}]}
    response = post(gateway, "/v1/responses/compact", body)
    assert response.status_code == 404
    error = _sanitized(response, FAKE_MODEL_NOT_FOUND)
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "model_not_found",
        "model",
    )
    assert response.headers["x-gateway-attempts"] == "1"
    assert_hits((a, 1), (b, 0))
    assert a.hits[0].path == "/v1/responses/compact"
    record = record_of(response)
    assert (attempt_statuses(record), record.retry_count) == (["failed"], 0)
    # A classified model_unavailable records its circuit failure even on the only candidate (SPEC §7.1).
    assert Circuit.objects.get().assignment_id == acct_a.pk


def test_compact_relays_a_success_as_is(gateway, two_assignments):
    a, b, _ = two_assignments
    body = {"model": "gpt-5", "input": [{"role": "user", "content": "hi"}]}
    response = post(gateway, "/v1/responses/compact", body)
    assert response.status_code == 200
    assert response.json()["object"] == "response.compaction"
    assert response.json()["output"][0]["type"] == "compaction"
    assert_hits((a, 1), (b, 0))
    assert attempt_statuses(record_of(response)) == ["succeeded"]


# -- hard pin ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
def test_previous_response_id_is_hard_pinned_to_the_assignment_that_created_it(
    gateway, two_assignments, stream
):
    a, b, (_, acct_b) = two_assignments
    a.script("gpt-5", model_not_found(), serve("served by a"))
    b.script("gpt-5", serve("served by b"), unavailable(503))
    first = post(gateway, "/v1/responses", {**RESPONSES, "stream": stream})
    assert first.status_code == 200
    if stream:
        events = sse_events(first.text)
        (completed,) = [e for e in events if e.type == "response.completed"]
        response_id = completed.data["response"]["id"]
        assert responses_text(events) == "served by b"
    else:
        response_id = first.json()["id"]
        assert first.json()["output"][0]["content"][0]["text"] == "served by b"
    assert_hits((a, 1), (b, 1))
    pin = wait_for(
        lambda: Affinity.objects.filter(kind="response", key=response_id).first(),
        what="the response affinity",
    )
    assert pin.assignment_id == acct_b.pk

    # b now fails with a 503 that would normally be handed off; a (which would serve) is never tried.
    second = post(
        gateway, "/v1/responses", {**RESPONSES, "stream": stream, "previous_response_id": response_id}
    )
    assert second.status_code == 503
    error = _sanitized(second, "The server is overloaded")
    assert (error["type"], error["code"]) == ("server_error", None)
    assert_hits((a, 1), (b, 2))
    assert b.hits[-1].body["previous_response_id"] == response_id
    assert attempt_statuses(record_of(second)) == ["failed"]


def test_a_stream_handed_on_before_output_remembers_the_response_id_the_client_was_given(
    gateway, two_assignments
):
    """The failed attempt's withheld `response.created` named its own response id: the affinity is
    the serving attempt's id (the one the client saw), on the assignment that served it."""
    a, b, (acct_a, acct_b) = two_assignments
    a.script("gpt-5", fail_before_visible())
    b.script("gpt-5", serve("served by b"))
    first = post(gateway, "/v1/responses", {**RESPONSES, "stream": True})
    events = sse_events(first.text)
    (completed,) = [e for e in events if e.type == "response.completed"]
    response_id = completed.data["response"]["id"]
    assert responses_text(events) == "served by b"
    assert_hits((a, 1), (b, 1))
    pin = wait_for(
        lambda: Affinity.objects.filter(kind="response", key=response_id).first(),
        what="the response affinity",
    )
    assert pin.assignment_id == acct_b.pk
    assert not Affinity.objects.filter(kind="response", assignment_id=acct_a.pk).exists()


# -- exhaustion ----------------------------------------------------------------------------------------


def test_the_shortlist_caps_attempts_and_returns_the_last_failure_sanitized(gateway, three_assignments):
    (a, b, c), _ = three_assignments
    GatewaySettings.objects.filter(pk=1).update(max_attempts=2)
    a.script("gpt-5", unavailable(503))
    b.script("gpt-5", model_not_found())
    c.script("gpt-5", rate_limited())
    response = post(gateway, "/v1/chat/completions", CHAT)
    assert response.status_code == 404
    error = _sanitized(response, FAKE_MODEL_NOT_FOUND)
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "model_not_found",
        "model",
    )
    assert response.headers["x-gateway-attempts"] == "2"
    assert_hits((a, 1), (b, 1), (c, 0))
    record = record_of(response)
    assert (attempt_statuses(record), record.retry_count) == (["retryable_failed", "failed"], 1)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
def test_the_final_candidates_failure_is_returned_as_it_came(gateway, two_assignments, stream):
    a, b, _ = two_assignments
    a.script("gpt-5", unavailable(503))
    failure = {
        "error": {
            "message": PROVIDER_WORDS,
            "type": "tokens_exhausted",
            "code": "rate_limit_exceeded",
            "param": "max_tokens",
        }
    }
    b.script("gpt-5", error(429, failure))
    response = post(gateway, "/v1/chat/completions", {**CHAT, "stream": stream})
    assert response.status_code == 429
    got = _sanitized(response, PROVIDER_WORDS)
    assert (got["type"], got["code"], got["param"]) == (
        "tokens_exhausted",
        "rate_limit_exceeded",
        "max_tokens",
    )
    assert_hits((a, 1), (b, 1))
    record = record_of(response)
    assert (attempt_statuses(record), record.retry_count) == (["retryable_failed", "failed"], 1)
    assert record.outcome != "no_eligible_backend" and record.status_code == 429


# -- terminal outcomes ------------------------------------------------------------------------------


def _refused(path: str, stream: bool, response: httpx.Response) -> bool:
    if stream:
        events = sse_events(response.text)
        if path == "/v1/chat/completions":
            return any(
                c.get("finish_reason") == "content_filter"
                for e in events
                if isinstance(e.data, dict)
                for c in e.data.get("choices", [])
            )
        (done,) = [e for e in events if e.type == "response.incomplete"]
        return done.data["response"]["incomplete_details"]["reason"] == "content_filter"
    if path == "/v1/chat/completions":
        return response.json()["choices"][0]["finish_reason"] == "content_filter"
    return response.json()["incomplete_details"]["reason"] == "content_filter"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
def test_a_safety_refusal_is_terminal_and_relayed(gateway, two_assignments, path, stream):
    a, b, _ = two_assignments
    a.script("gpt-5", refusal())
    b.script("gpt-5", serve("served by b"))
    body = CHAT if path == "/v1/chat/completions" else RESPONSES
    response = post(gateway, path, {**body, "stream": stream})
    assert response.status_code == 200
    assert _refused(path, stream, response)
    assert "served by b" not in response.text
    assert_hits((a, 1), (b, 0))
    record = record_of(response)
    assert (record.outcome, record.retry_count) == ("terminal_refusal", 0)
    assert [x.failure_class for x in attempts_of(record)] == ["safety_refusal"]
    assert not Circuit.objects.exists() and not Demotion.objects.exists()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
def test_the_client_deadline_is_a_typed_504_and_leaves_the_circuit_alone(gateway, two_assignments, stream):
    a, b, (acct_a, _) = two_assignments
    a.script("gpt-5", hang(30))
    b.script("gpt-5", serve("served by b"))
    started = time.monotonic()
    response = post(
        gateway, "/v1/chat/completions", {**CHAT, "stream": stream}, headers={"x-gateway-deadline-ms": "1000"}
    )
    assert time.monotonic() - started < 10
    assert response.status_code == 504
    error = _sanitized(response, "served by b")
    assert error["code"] == "upstream_dispatch_unknown"
    assert_hits((a, 1), (b, 0))
    record = record_of(response)
    assert record.outcome == "upstream_dispatch_unknown"
    (attempt,) = attempts_of(record)
    assert (attempt.assignment_id, attempt.status, attempt.dispatch_state, attempt.failure_class) == (
        acct_a.pk,
        "failed",
        "unknown",
        "deadline",
    )
    # The client's own short deadline says nothing about the account (SPEC §5.6): no circuit row.
    assert not Circuit.objects.exists()


def _cut_by_its_deadline(gateway: str, stream: bool, headers: dict[str, str] | None = None):
    """One request to the hung `acct-a`: the deadline cuts it, a typed 504, never replayed on acct-b."""
    response = post(gateway, "/v1/chat/completions", {**CHAT, "stream": stream}, headers=headers)
    assert response.status_code == 504
    assert _sanitized(response, "served by b")["code"] == "upstream_dispatch_unknown"
    (attempt,) = attempts_of(record_of(response))
    return attempt


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
def test_the_gateway_default_deadline_is_its_own_timeout_and_cools_a_hung_account(
    gateway, two_assignments, stream
):
    """No x-gateway-deadline-ms: the deadline is `retry.default_deadline_ms`, the gateway's own, so its
    cut counts as `timeout` (SPEC §5.6, §6.0); after `failure_threshold` cuts the hung account is
    cooled and the next request meets its healthy sibling first."""
    a, b, (acct_a, _) = two_assignments
    GatewaySettings.objects.filter(pk=1).update(default_deadline_ms=1000)
    threshold = GatewaySettings.objects.get(pk=1).failure_threshold
    a.script("gpt-5", hang(30))
    b.script("gpt-5", serve("served by b"))
    for _ in range(threshold):
        attempt = _cut_by_its_deadline(gateway, stream)
        assert (attempt.assignment_id, attempt.dispatch_state, attempt.failure_class) == (
            acct_a.pk,
            "unknown",
            "dispatch_unknown",
        )
    circuit = Circuit.objects.get()
    assert (circuit.assignment_id, circuit.state, circuit.reason) == (acct_a.pk, "open", "timeout")
    response = post(gateway, "/v1/chat/completions", {**CHAT, "stream": stream})
    assert response.status_code == 200
    text = (
        chat_text(sse_events(response.text))
        if stream
        else response.json()["choices"][0]["message"]["content"]
    )
    assert text == "served by b"
    assert response.headers["x-gateway-attempts"] == "1"
    assert_hits((a, threshold), (b, 1))


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
def test_the_same_hang_cut_by_the_client_deadline_leaves_the_account_in_use(gateway, two_assignments, stream):
    a, b, _ = two_assignments
    threshold = GatewaySettings.objects.get(pk=1).failure_threshold
    a.script("gpt-5", hang(30))
    b.script("gpt-5", serve("served by b"))
    for _ in range(threshold + 1):
        attempt = _cut_by_its_deadline(gateway, stream, {"x-gateway-deadline-ms": "1000"})
        assert attempt.failure_class == "deadline"
    assert not Circuit.objects.exists()
    assert_hits((a, threshold + 1), (b, 0))  # never cooled: every request still meets acct-a first


def test_a_client_deadline_past_the_default_is_the_gateways_own(gateway, two_assignments):
    """A client asking for more than `retry.default_deadline_ms` gets the default: the gateway's own."""
    a, _, (acct_a, _) = two_assignments
    GatewaySettings.objects.filter(pk=1).update(default_deadline_ms=1000)
    a.script("gpt-5", hang(30))
    attempt = _cut_by_its_deadline(gateway, False, {"x-gateway-deadline-ms": "60000"})
    assert attempt.failure_class == "dispatch_unknown"
    circuit = Circuit.objects.get()
    assert (circuit.assignment_id, circuit.reason, circuit.consecutive_failures) == (acct_a.pk, "timeout", 1)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
def test_the_gateway_own_read_timeout_is_dispatch_unknown_counts_and_is_never_replayed(
    gateway, two_assignments, stream, settings
):
    a, b, (acct_a, _) = two_assignments
    settings.GATEWAY_UPSTREAM_READ_TIMEOUT_S = 0.5  # the gateway's own upstream timeout, below the deadline
    a.script("gpt-5", hang(30))
    b.script("gpt-5", serve("served by b"))
    response = post(
        gateway, "/v1/chat/completions", {**CHAT, "stream": stream}, headers={"x-gateway-deadline-ms": "8000"}
    )
    assert response.status_code == 504
    assert _sanitized(response, "served by b")["code"] == "upstream_dispatch_unknown"
    assert_hits((a, 1), (b, 0))
    (attempt,) = attempts_of(record_of(response))
    assert (attempt.status, attempt.dispatch_state, attempt.failure_class) == (
        "failed",
        "unknown",
        "dispatch_unknown",
    )
    # The gateway's own timeout cools the assignment's transient health (SPEC §5.6).
    circuit = Circuit.objects.get()
    assert (circuit.assignment_id, circuit.reason) == (acct_a.pk, "timeout")


# (behaviour, the circuit reason it records or None, whether it demotes (assignment, model))
HANDOFFS = [
    pytest.param(rate_limited(), None, True, id="429"),  # 429/quota: demotion, never a circuit (§5.6)
    pytest.param(quota(), None, True, id="429-quota"),
    pytest.param(unavailable(503), "upstream_unavailable", False, id="503"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
@pytest.mark.parametrize(("behaviour", "reason", "demoted"), HANDOFFS)
def test_rate_limits_and_unavailability_are_handed_to_the_next_candidate(
    gateway, two_assignments, behaviour, reason, demoted, stream
):
    a, b, (acct_a, _) = two_assignments
    a.script("gpt-5", behaviour)
    b.script("gpt-5", serve("served by b"))
    response = post(gateway, "/v1/chat/completions", {**CHAT, "stream": stream})
    assert response.status_code == 200
    if stream:
        assert chat_text(sse_events(response.text)) == "served by b"
    else:
        assert response.json()["choices"][0]["message"]["content"] == "served by b"
    assert response.headers["x-gateway-attempts"] == "2"
    assert_hits((a, 1), (b, 1))
    record = record_of(response)
    assert (attempt_statuses(record), record.retry_count) == (["retryable_failed", "succeeded"], 1)
    circuits = list(Circuit.objects.values_list("assignment_id", "reason"))
    assert circuits == ([(acct_a.pk, reason)] if reason else [])
    demotions = list(Demotion.objects.values_list("assignment_id", "reason"))
    assert demotions == ([(acct_a.pk, "rate_limited")] if demoted else [])


def test_all_candidates_circuit_open_is_no_eligible_backend_but_the_model_stays_listed(
    gateway, two_assignments
):
    a, b, rows = two_assignments
    for assignment in rows:
        OpenCircuitFactory(assignment=assignment, consecutive_failures=3, cooldown_seconds=300)
    response = post(gateway, "/v1/chat/completions", CHAT)
    assert response.status_code == 503
    error = _sanitized(response, "hello from")
    assert (error["code"], error["param"]) == ("no_eligible_backend", "circuit_open")
    assert_hits((a, 0), (b, 0))
    record = record_of(response)
    assert record.outcome == "no_eligible_backend"
    assert [(x.status, x.ineligible_reason) for x in attempts_of(record)] == [
        ("ineligible", "circuit_open")
    ] * 2
    listed = httpx.get(f"{gateway}/v1/models", headers=AUTH, timeout=TIMEOUT)
    assert [m["id"] for m in listed.json()["data"]] == ["gpt-5"]
