"""Failure semantics against upstreams that fail the way real provider accounts do (SPEC §5.2-§7.1,
changed 2026-12-01): an account answering 503 for minutes, a revoked key, a slow or dripping account,
a stream that ends without its terminal event. Real sockets: the gateway under uvicorn, fake upstreams
on loopback, httpx, the openai SDK and a websocket client."""

import json
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from io import StringIO

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone
from openai import OpenAI
from websockets.sync.client import connect

from catalog.models import Provenance
from devkit.behaviours import (
    ApiError,
    Reject,
    Serve,
    drip,
    end_without_terminal,
    error,
    hang,
    revoked_key,
    serve,
    slow_stream,
    slow_unavailable,
    unavailable,
)
from pools.models import GatewaySettings
from routing.models import Circuit, Demotion
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory
from tests.gateway_fixtures import GATEWAY_KEY, UPSTREAM_KEY, UPSTREAM_KEY_ENV
from tests.proxy.fixtures_e2e import (
    AUTH,
    CHAT,
    RESPONSES,
    assert_hits,
    attempts_of,
    chat_text,
    error_events,
    ledger_settled,
    post,
    record_of,
    sse_events,
    wait_for,
)

TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}


def _settings(**fields) -> None:
    GatewaySettings.objects.update_or_create(pk=1, defaults={"backoff_base_ms": 0, **fields})


def _chat(gateway: str, *, stream: bool, headers: dict[str, str] | None = None) -> httpx.Response:
    return post(gateway, "/v1/chat/completions", {**CHAT, "stream": stream}, headers=headers)


def _served_text(response: httpx.Response, stream: bool) -> str:
    if stream:
        return chat_text(sse_events(response.text))
    return response.json()["choices"][0]["message"]["content"]


def _ws_create(gateway: str, **body) -> list[dict]:
    """One response.create on a fresh client websocket (a live connection would pin the next one)."""
    url = gateway.replace("http://", "ws://") + "/v1/responses"
    with connect(url, additional_headers=AUTH, open_timeout=5) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "gpt-5", "input": "hi", **body}))
        events = []
        while True:
            event = json.loads(ws.recv(timeout=15))
            events.append(event)
            if event["type"] in TERMINAL:
                ledger_settled()
                return events


def _ws_text(events: list[dict]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


def _cooled_circuit(assignment, *, reason: str, route_class: str = "http", model: str = "gpt-5") -> Circuit:
    """A circuit that opened a while ago and whose cooldown just ended: the next request may probe."""
    return Circuit.objects.create(
        pool=assignment.pool,
        assignment=assignment,
        model=model,
        route_class=route_class,
        state="open",
        reason=reason,
        consecutive_failures=3,
        cooldown_seconds=60,
        open_until=timezone.now() - timedelta(seconds=1),
    )


# -- §5.4: an open circuit gets no traffic while another candidate can serve ----------------------------


@pytest.mark.parametrize("transport", ["http", "sse", "websocket"])
def test_an_open_tier0_gets_no_request_while_tier1_serves(gateway, two_assignments, transport):
    a, b, (acct_a, _) = two_assignments
    _settings(failure_threshold=3, cooldown_seconds=600, max_cooldown_seconds=600)
    a.script("gpt-5", unavailable(503))  # an account answering 503 for minutes
    b.script("gpt-5", serve("served by b"))

    def one() -> str:
        if transport == "websocket":
            return _ws_text(_ws_create(gateway))
        response = _chat(gateway, stream=transport == "sse")
        assert response.status_code == 200
        return _served_text(response, transport == "sse")

    for _ in range(3):  # the threshold: each request fails over from a to b
        assert one() == "served by b"
    assert a.hit_count() == 3
    # A stream's bookkeeping may end just after its last byte reached the client: wait for it.
    circuit = wait_for(
        lambda: Circuit.objects.filter(assignment=acct_a, state="open").first(), what="the open circuit"
    )
    assert (circuit.route_class, circuit.reason) == (transport, "upstream_unavailable")
    for _ in range(3):  # open: acct-a is ordered after acct-b (§5.4 group 3), whatever its tier
        assert one() == "served by b"
    assert a.hit_count() == 3
    assert b.hit_count() == 6


# -- §5.6 credential_rejected --------------------------------------------------------------------------


def test_a_revoked_key_on_tier0_is_answered_by_tier1_in_the_same_request(gateway, two_assignments):
    a, b, (acct_a, _) = two_assignments
    a.require_key = "sk-the-key-this-account-has-now"  # ours was revoked: OpenAI's 401 invalid_api_key
    b.script("gpt-5", serve("served by b"))
    client = OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, max_retries=0)
    completion = client.chat.completions.with_raw_response.create(
        model="gpt-5", messages=[{"role": "user", "content": "hi"}]
    )
    assert completion.parse().choices[0].message.content == "served by b"
    assert completion.headers["x-gateway-attempts"] == "2"
    assert_hits((a, 1), (b, 1))
    record = record_of(completion.http_response)
    assert [(x.status, x.failure_class, x.upstream_status) for x in attempts_of(record)] == [
        ("retryable_failed", "credential_rejected", 401),
        ("succeeded", "", 200),
    ]
    # One circuit for the whole assignment (every model and route class), opened at once.
    circuit = Circuit.objects.get(assignment=acct_a)
    assert (circuit.model, circuit.route_class, circuit.state, circuit.reason) == (
        "*",
        "*",
        "open",
        "credential_rejected",
    )
    # It governs every route class: a streamed request does not try acct-a at all.
    streamed = _chat(gateway, stream=True)
    assert (streamed.status_code, streamed.headers["x-gateway-attempts"]) == (200, "1")
    assert a.hit_count() == 1

    # The label, where operators look: /metrics, routing_explain and the panel.
    scraped = httpx.get(f"{gateway}/metrics", timeout=5).text
    wide = 'assignment="acct-a",model="*",pool="main",reason="credential_rejected",route_class="assignment"'
    assert f"gateway_open_circuits{{{wide}}} 1.0" in scraped
    assert 'gateway_handoffs_total{failure_class="credential_rejected"}' in scraped
    out = StringIO()
    call_command("routing_explain", "--key", "e2e", "--model", "gpt-5", "--route-class", "sse", stdout=out)
    plan = out.getvalue()
    assert "1. acct-b / gpt-5 [tier 1, healthy]" in plan
    assert "2. acct-a / gpt-5 [tier 0, cooling]" in plan
    from proxy.console.upstreams import upstreams_panel_load

    admin = get_user_model().objects.create_superuser("ops", "ops@example.com", "x")
    panel = upstreams_panel_load(user=admin, now=timezone.now())
    (row_a,) = [r for p in panel.pools for r in p.assignments if r.name == "acct-a"]
    assert row_a.credential is not None and row_a.credential.reason_text == "credential rejected"
    assert {s.reason_text for m in row_a.models for s in m.signals} == {"credential rejected"}


def test_with_every_key_revoked_the_last_failure_comes_back_sanitized_and_both_circuits_open(
    gateway, two_assignments
):
    a, b, rows = two_assignments
    a.script("gpt-5", revoked_key())
    b.script("gpt-5", revoked_key())
    response = _chat(gateway, stream=False)
    # SPEC §5.6: with no later candidate the final failure is returned as it came (status, type, code),
    # in the gateway's own words: the provider's message never reaches the client.
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert "Incorrect API key" not in response.text
    assert_hits((a, 1), (b, 1))
    wide = Circuit.objects.filter(model="*", route_class="*", state="open", reason="credential_rejected")
    assert sorted(wide.values_list("assignment_id", flat=True)) == sorted(r.pk for r in rows)


def test_a_403_for_the_account_is_handed_on_and_a_403_for_the_request_is_not(gateway, two_assignments):
    a, b, _ = two_assignments
    account = ApiError(
        "invalid_request_error", "Your organization has been deactivated.", "account_deactivated"
    )
    a.script("gpt-5", Reject(403, account))
    b.script("gpt-5", serve("served by b"))
    response = _chat(gateway, stream=False)
    assert (response.status_code, _served_text(response, False)) == (200, "served by b")
    Circuit.objects.all().delete()
    a.script(
        "gpt-5", Reject(403, ApiError("invalid_request_error", "Unsupported region.", "unsupported_country"))
    )
    refused = _chat(gateway, stream=False)
    assert refused.status_code == 403  # the request's own problem: returned as it came, no handoff
    assert refused.json()["error"]["code"] == "unsupported_country"
    assert b.hit_count() == 1
    assert not Circuit.objects.exists()


def test_a_revoked_key_over_the_websocket_is_answered_by_the_next_account(gateway, two_assignments):
    a, b, (acct_a, _) = two_assignments
    a.script("gpt-5", revoked_key())
    b.script("gpt-5", serve("served by b"))
    assert _ws_text(_ws_create(gateway)) == "served by b"
    assert Circuit.objects.get(assignment=acct_a).reason == "credential_rejected"
    assert _ws_text(_ws_create(gateway)) == "served by b"
    assert a.hit_count() == 1  # the open credential circuit keeps the next response.create off it


# -- 429: demotion until retry-after, never a circuit ----------------------------------------------------


RATE_LIMIT = {"error": {"message": "Rate limit reached.", "type": "requests", "code": "rate_limit_exceeded"}}


@pytest.mark.parametrize(
    ("retry_after", "seconds"),
    [("120", 120), ("not-a-number", 60), ("99999999", 3600)],
    ids=["honoured", "unreadable-default", "huge-bounded"],
)
def test_a_429_demotes_until_retry_after_and_opens_no_circuit(gateway, two_assignments, retry_after, seconds):
    a, b, (acct_a, _) = two_assignments
    _settings(failure_threshold=1, demotion_seconds=60)
    a.script("gpt-5", error(429, RATE_LIMIT, headers={"retry-after": retry_after}))
    b.script("gpt-5", serve("served by b"))
    before = timezone.now()
    response = _chat(gateway, stream=False)
    assert (response.status_code, _served_text(response, False)) == (200, "served by b")
    assert not Circuit.objects.exists()  # even with failure_threshold 1
    demotion = Demotion.objects.get(assignment=acct_a)
    assert demotion.reason == "rate_limited"
    expected = before + timedelta(seconds=seconds)
    assert expected - timedelta(seconds=5) <= demotion.until <= expected + timedelta(seconds=5)
    # Demoted, not excluded: the next request goes to acct-b first.
    again = _chat(gateway, stream=False)
    assert (again.headers["x-gateway-attempts"], a.hit_count()) == ("1", 1)


def test_the_final_relayed_429_keeps_the_upstream_retry_after(gateway, two_assignments):
    a, b, _ = two_assignments
    a.script("gpt-5", error(429, RATE_LIMIT, headers={"retry-after": "30"}))
    b.script("gpt-5", error(429, RATE_LIMIT, headers={"retry-after": "7"}))
    response = _chat(gateway, stream=False)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    assert not Circuit.objects.exists()


# -- §6.0 deadlines ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
def test_a_dripping_upstream_is_cut_at_the_deadline(gateway, two_assignments, stream):
    a, b, _ = two_assignments
    a.script("gpt-5", drip(1.0))  # one byte per second: every read succeeds, the answer never ends
    started = time.monotonic()
    response = _chat(gateway, stream=stream, headers={"x-gateway-deadline-ms": "2000"})
    elapsed = time.monotonic() - started
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "upstream_dispatch_unknown"
    assert elapsed < 3.0, f"answered after {elapsed:.1f} s with a 2 s deadline"
    assert_hits((a, 1), (b, 0))  # the request may have executed: never replayed
    (attempt,) = attempts_of(record_of(response))
    assert attempt.failure_class == "deadline"
    assert not Circuit.objects.exists()  # the client's deadline, not the account's fault


def test_no_hop_is_dispatched_with_less_than_min_attempt_ms_left(gateway, two_assignments):
    a, b, (acct_a, acct_b) = two_assignments
    _settings(min_attempt_ms=800)
    a.script("gpt-5", slow_unavailable(0.5))  # fails after 0.5 s of a 1 s deadline: 0.5 s < 0.8 s left
    b.script("gpt-5", serve("served by b"))
    response = _chat(gateway, stream=False, headers={"x-gateway-deadline-ms": "1000"})
    assert response.status_code == 503  # acct-a's failure, returned as it came
    assert_hits((a, 1), (b, 0))
    record = record_of(response)
    # No handoff happened, so the failed attempt is not retryable_failed and nothing was retried.
    assert [(x.assignment_id, x.status, x.ineligible_reason) for x in attempts_of(record)] == [
        (acct_a.pk, "failed", ""),
        (acct_b.pk, "ineligible", "deadline"),
    ]
    assert record.retry_count == 0


def test_with_enough_of_the_deadline_left_the_next_hop_is_dispatched(gateway, two_assignments):
    a, b, _ = two_assignments
    _settings(min_attempt_ms=100)
    a.script("gpt-5", slow_unavailable(0.5))
    b.script("gpt-5", serve("served by b"))
    response = _chat(gateway, stream=False, headers={"x-gateway-deadline-ms": "1000"})
    assert (response.status_code, _served_text(response, False)) == (200, "served by b")
    assert record_of(response).retry_count == 1


def test_full_jitter_backoff_never_runs_past_the_deadline(gateway, two_assignments):
    a, _, _ = two_assignments
    _settings(backoff_base_ms=60_000)  # a jittered wait of up to a minute between hops
    a.script("gpt-5", unavailable(503))
    started = time.monotonic()
    response = _chat(gateway, stream=False, headers={"x-gateway-deadline-ms": "1500"})
    assert time.monotonic() - started < 2.5
    assert response.status_code in (200, 503)  # served by b if the jitter drew a short wait, else a's 503


def test_after_visible_output_a_silent_stream_ends_after_the_idle_limit(gateway, two_assignments, settings):
    a, b, _ = two_assignments
    settings.GATEWAY_STREAM_IDLE_S = 0.6
    a.script("gpt-5", slow_stream(1.0, "one two three"))  # a second between events
    started = time.monotonic()
    response = _chat(gateway, stream=True, headers={"x-gateway-deadline-ms": "30000"})
    assert time.monotonic() - started < 5
    events = sse_events(response.text)
    assert chat_text(events) == "one"  # the first visible event came within the deadline, then silence
    assert [e["code"] for e in error_events(events)] == ["upstream_interrupted"]
    assert b.hit_count() == 0  # never retried after output


# -- §7.1 neutral ends --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", CHAT), ("/v1/responses", RESPONSES)])
def test_a_stream_closed_without_its_terminal_event_is_interrupted_never_a_success(
    gateway, two_assignments, path, body
):
    a, b, (acct_a, _) = two_assignments
    probe = _cooled_circuit(acct_a, reason="upstream_unavailable", route_class="sse")
    a.script("gpt-5", end_without_terminal())
    response = post(gateway, path, {**body, "stream": True})
    assert response.status_code == 200
    assert [e["code"] for e in error_events(sse_events(response.text))] == ["upstream_interrupted"]
    record = record_of(response)
    assert record.outcome == "upstream_interrupted"
    assert [(x.status, x.failure_class) for x in attempts_of(record)] == [("failed", "interrupted")]
    assert b.hit_count() == 0
    probe.refresh_from_db()
    # Neutral: the probe slot is free again, and the circuit neither closed (a success) nor reopened.
    assert (probe.state, probe.probes_in_flight) == ("half_open", 0)


def test_a_probe_ending_in_a_failure_without_circuit_effect_frees_its_slot(gateway, two_assignments):
    a, b, (acct_a, _) = two_assignments
    probe = _cooled_circuit(acct_a, reason="timeout")
    a.script("gpt-5", Reject(400, ApiError("invalid_request_error", "Bad max_tokens.", None, "max_tokens")))
    response = _chat(gateway, stream=False)
    assert response.status_code == 400
    assert_hits((a, 1), (b, 0))  # the lease holder tried the half-open acct-a first
    probe.refresh_from_db()
    assert (probe.state, probe.probes_in_flight) == ("half_open", 0)
    # So the next request may probe it at once, rather than after probe_lease_seconds.
    a.script("gpt-5", serve("a is back"))
    again = _chat(gateway, stream=False)
    assert _served_text(again, False) == "a is back"
    probe.refresh_from_db()
    assert probe.state == "closed"


def test_the_lease_holder_probes_the_cooled_assignment_before_a_better_tier(gateway, three_assignments):
    # SPEC §5.4 as changed 2026-12-05: the probe comes first, whatever its tier (it used to wait behind
    # tier 0, and a healthy tier-0 account kept a recovered tier-1 one half-open for good).
    (a, b, c), (_, acct_b, _) = three_assignments
    probe = _cooled_circuit(acct_b, reason="upstream_unavailable")
    response = _chat(gateway, stream=False)
    assert _served_text(response, False).startswith("hello from b")
    probe.refresh_from_db()
    assert (probe.state, probe.probes_in_flight) == ("closed", 0)
    assert_hits((a, 0), (b, 1), (c, 0))


def test_a_reset_after_the_request_was_sent_is_never_replayed(gateway, two_assignments):
    a, b, _ = two_assignments
    a.script("gpt-5", hang(0.2))  # reads the request, then drops the connection without a byte
    response = _chat(gateway, stream=False)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "upstream_dispatch_unknown"
    assert_hits((a, 1), (b, 0))
    (attempt,) = attempts_of(record_of(response))
    assert (attempt.dispatch_state, attempt.failure_class) == ("unknown", "dispatch_unknown")


# -- §5.2 cross-model only after "not found" ------------------------------------------------------------


@pytest.fixture
def family(transactional_db, fake_upstream_factory, monkeypatch):
    """acct-a serves gpt-5.2 (a 1,000-token window); acct-b serves its family sibling gpt-5.1."""
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    _settings(model_fallback_family=True)
    a = fake_upstream_factory("a", models=("gpt-5.2",))
    b = fake_upstream_factory("b", models=("gpt-5.1",))
    pool = PoolFactory(name="main")
    for tier, (name, fake, model, window) in enumerate(
        (("acct-a", a, "gpt-5.2", 1000), ("acct-b", b, "gpt-5.1", 400_000))
    ):
        row = AssignmentFactory(
            pool=pool, name=name, base_url=fake.base_url, tier=tier, api_key_env=UPSTREAM_KEY_ENV
        )
        CatalogEntryFactory(
            assignment=row, model=model, context_window=window, provenance=Provenance.CONFIGURED
        )
    GatewayKeyFactory(name="e2e", raw_key=GATEWAY_KEY, pools=[pool])
    return a, b


def test_a_context_window_too_small_is_no_eligible_backend_not_the_sibling(gateway, family):
    a, b = family
    long = {"model": "gpt-5.2", "messages": [{"role": "user", "content": "word " * 4000}]}
    response = post(gateway, "/v1/chat/completions", long)
    assert response.status_code == 503
    error_body = response.json()["error"]
    assert (error_body["code"], error_body["param"]) == ("no_eligible_backend", "context_window")
    assert_hits((a, 0), (b, 0))


def test_a_transiently_failing_primary_is_returned_not_swapped_for_its_sibling(gateway, family):
    a, b = family
    a.script("gpt-5.2", unavailable(503))
    response = post(gateway, "/v1/chat/completions", {**CHAT, "model": "gpt-5.2"})
    assert response.status_code == 503
    assert_hits((a, 1), (b, 0))


def test_the_cross_model_path_after_an_upstream_not_found_still_works(gateway, family):
    a, b = family
    a.script("gpt-5.2", error(404, {"type": "error", "error": {"type": "not_found_error", "message": "x"}}))
    response = post(gateway, "/v1/chat/completions", {**CHAT, "model": "gpt-5.2"})
    assert response.status_code == 200
    assert response.headers["x-gateway-model-fallback"] == "gpt-5.1"
    assert_hits((a, 1), (b, 1))


# -- the same rules for each websocket response.create --------------------------------------------------


def test_a_websocket_response_is_cut_at_its_deadline_and_leaves_the_circuit_alone(gateway, two_assignments):
    a, b, _ = two_assignments
    a.script("gpt-5", hang(30))
    url = gateway.replace("http://", "ws://") + "/v1/responses"
    headers = {**AUTH, "x-gateway-deadline-ms": "1000"}
    with connect(url, additional_headers=headers, open_timeout=5) as ws:
        started = time.monotonic()
        ws.send(json.dumps({"type": "response.create", "model": "gpt-5", "input": "hi"}))
        event = json.loads(ws.recv(timeout=10))
        assert time.monotonic() - started < 2.0
    assert event["type"] == "error"
    assert (event["status"], event["error"]["code"]) == (504, "upstream_dispatch_unknown")
    assert_hits((a, 1), (b, 0))
    assert not Circuit.objects.exists()


def test_a_websocket_response_cut_by_the_gateway_default_deadline_counts_as_timeout(gateway, two_assignments):
    """No x-gateway-deadline-ms in the handshake: each frame's deadline is the gateway's own, and its cut
    counts for the circuit (SPEC §5.6, §6.0), as over HTTP."""
    a, b, (acct_a, _) = two_assignments
    GatewaySettings.objects.filter(pk=1).update(default_deadline_ms=1000)
    a.script("gpt-5", hang(30))
    url = gateway.replace("http://", "ws://") + "/v1/responses"
    with connect(url, additional_headers=AUTH, open_timeout=5) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "gpt-5", "input": "hi"}))
        event = json.loads(ws.recv(timeout=10))
    assert (event["status"], event["error"]["code"]) == (504, "upstream_dispatch_unknown")
    assert_hits((a, 1), (b, 0))
    circuit = Circuit.objects.get()
    assert (circuit.assignment_id, circuit.route_class, circuit.reason, circuit.consecutive_failures) == (
        acct_a.pk,
        "websocket",
        "timeout",
        1,
    )


def test_over_websockets_only_the_lease_holder_tries_the_half_open_account(gateway, two_assignments):
    a, b, (acct_a, _) = two_assignments
    _cooled_circuit(acct_a, reason="upstream_unavailable", route_class="websocket")
    a.script("gpt-5", Serve(text="probe answered", delay_s=0.5))
    b.script("gpt-5", serve("from b"))
    with ThreadPoolExecutor(4) as pool:
        texts = sorted(pool.map(lambda _: _ws_text(_ws_create(gateway)), range(4)))
    assert a.hit_count() == 1
    assert texts.count("from b") == 3


# -- one gathering of inputs: routing_explain shows what the router does ---------------------------------


def test_routing_explain_and_the_router_agree_on_an_unknown_previous_response_id(gateway, two_assignments):
    a, b, _ = two_assignments
    out = StringIO()
    call_command(
        "routing_explain", "--key", "e2e", "--model", "gpt-5", "--route", "/responses",
        "--previous-response-id", "resp_never_seen_by_the_gateway", stdout=out,
    )  # fmt: skip
    # An id the key never created is not forwarded (SPEC §7.2): no plan, as the router answers it.
    assert "no dispatch: previous_response_not_found" in out.getvalue()
    assert "plan:" not in out.getvalue()
    response = post(
        gateway, "/v1/responses", {**RESPONSES, "previous_response_id": "resp_never_seen_by_the_gateway"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "previous_response_not_found"
    assert_hits((a, 0), (b, 0))
