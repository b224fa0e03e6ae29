"""SSE relay over real sockets (SPEC §6.2): pre-visible failover, the exhausted plan, the ledger and
shared state of a streamed failover, and write-through (the stream is never buffered whole)."""

import time

import httpx
import pytest

from devkit.behaviours import fail_before_visible, model_not_found, serve, slow_stream
from routing.models import Circuit, Demotion
from tests.proxy.fixtures_e2e import (
    AUTH,
    CHAT,
    RESPONSES,
    TIMEOUT,
    assert_hits,
    attempt_statuses,
    chat_text,
    error_events,
    post,
    record_of,
    responses_text,
    sse_events,
)

FAKE_MODEL_NOT_FOUND = "The model does not exist or you do not have access to it."
RESPONSES_LEAD = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
]


@pytest.mark.parametrize("terminal", ["response.failed", "error"])
def test_responses_stream_failing_before_visible_output_is_served_by_the_next_candidate_once(
    gateway, two_assignments, terminal
):
    a, b, _ = two_assignments
    a.script("gpt-5", fail_before_visible(terminal))
    b.script("gpt-5", serve("served by b"))
    response = post(gateway, "/v1/responses", {**RESPONSES, "stream": True})
    assert response.status_code == 200
    events = sse_events(response.text)
    types = [e.type for e in events]
    assert types.count("response.created") == 1 and types.count("response.in_progress") == 1
    assert "response.failed" not in types and "error" not in types
    assert FAKE_MODEL_NOT_FOUND not in response.text
    assert responses_text(events) == "served by b"
    # The one lifecycle the client saw is b's: the same response from created to completed.
    created = events[types.index("response.created")].data["response"]["id"]
    (completed,) = [e.data["response"] for e in events if e.type == "response.completed"]
    assert completed["id"] == created
    assert [e.data["sequence_number"] for e in events] == list(range(len(events)))
    assert_hits((a, 1), (b, 1))
    assert attempt_statuses(record_of(response)) == ["retryable_failed", "succeeded"]


def test_chat_stream_failing_before_visible_output_is_served_by_the_next_candidate_once(
    gateway, two_assignments
):
    a, b, _ = two_assignments
    a.script("gpt-5", fail_before_visible())
    b.script("gpt-5", serve("served by b"))
    response = post(gateway, "/v1/chat/completions", {**CHAT, "stream": True})
    assert response.status_code == 200
    events = sse_events(response.text)
    chunks = [e.data for e in events if isinstance(e.data, dict)]
    roles = [c for c in chunks for choice in c.get("choices", []) if choice["delta"].get("role")]
    assert len(roles) == 1
    assert error_events(events) == [] and FAKE_MODEL_NOT_FOUND not in response.text
    assert chat_text(events) == "served by b"
    assert len({c["id"] for c in chunks}) == 1  # every chunk is from b's one completion
    assert [e.data for e in events if isinstance(e.data, str)] == ["[DONE]"]
    assert_hits((a, 1), (b, 1))
    assert attempt_statuses(record_of(response)) == ["retryable_failed", "succeeded"]


@pytest.mark.parametrize(
    "first",
    [pytest.param(model_not_found(), id="http-404"), pytest.param(fail_before_visible(), id="in-stream")],
)
def test_a_streamed_responses_failover_records_the_ledger_and_shared_state(gateway, two_assignments, first):
    a, b, (acct_a, _) = two_assignments
    a.script("gpt-5", first)
    b.script("gpt-5", serve("served by b"))
    response = post(gateway, "/v1/responses", {**RESPONSES, "stream": True})
    assert response.status_code == 200
    events = sse_events(response.text)
    assert [e.type for e in events].count("response.created") == 1
    assert responses_text(events) == "served by b"
    assert response.headers["x-gateway-attempts"] == "2"
    assert_hits((a, 1), (b, 1))
    assert [h.body["model"] for h in a.hits + b.hits] == ["gpt-5", "gpt-5"]
    record = record_of(response)
    assert (record.transport, record.outcome, record.retry_count) == ("sse", "ok", 1)
    assert attempt_statuses(record) == ["retryable_failed", "succeeded"]
    circuit = Circuit.objects.get()
    assert (circuit.assignment_id, circuit.route_class, circuit.reason, circuit.consecutive_failures) == (
        acct_a.pk,
        "sse",
        "upstream_model_unavailable",
        1,
    )
    assert list(Demotion.objects.values_list("assignment_id", "model")) == [(acct_a.pk, "gpt-5")]


def test_an_exhausted_responses_stream_relays_the_last_withheld_events_once_and_one_error(
    gateway, two_assignments
):
    a, b, _ = two_assignments
    a.script("gpt-5", fail_before_visible())
    b.script("gpt-5", fail_before_visible())
    response = post(gateway, "/v1/responses", {**RESPONSES, "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert [e.type for e in events] == [*RESPONSES_LEAD, "error"]
    (error,) = error_events(events)
    assert (error["code"], error["param"]) == ("model_not_found", None)
    assert FAKE_MODEL_NOT_FOUND not in response.text
    assert_hits((a, 1), (b, 1))
    assert attempt_statuses(record_of(response)) == ["retryable_failed", "failed"]


def test_an_exhausted_chat_stream_relays_the_last_withheld_chunk_once_and_one_error(gateway, two_assignments):
    a, b, _ = two_assignments
    a.script("gpt-5", fail_before_visible())
    b.script("gpt-5", fail_before_visible())
    response = post(gateway, "/v1/chat/completions", {**CHAT, "stream": True})
    assert response.status_code == 200
    events = sse_events(response.text)
    assert len(events) == 2
    assert events[0].data["choices"][0]["delta"]["role"] == "assistant"
    (error,) = error_events(events)
    assert events[1].data == {"error": error}
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "model_not_found",
        "model",
    )
    assert FAKE_MODEL_NOT_FOUND not in response.text
    assert_hits((a, 1), (b, 1))
    assert attempt_statuses(record_of(response)) == ["retryable_failed", "failed"]


WORDS = "one two three four five six seven eight nine ten"


@pytest.mark.parametrize(
    ("path", "body", "text_of"),
    [
        pytest.param("/v1/chat/completions", CHAT, chat_text, id="chat"),
        pytest.param("/v1/responses", RESPONSES, responses_text, id="responses"),
    ],
)
def test_a_slow_stream_is_written_through_not_buffered_whole(gateway, two_assignments, path, body, text_of):
    a, b, _ = two_assignments
    a.script("gpt-5", slow_stream(0.08, WORDS))
    first_visible = None
    text = ""
    started = time.monotonic()
    with httpx.stream(
        "POST", f"{gateway}{path}", json={**body, "stream": True}, headers=AUTH, timeout=TIMEOUT
    ) as r:
        assert r.status_code == 200
        for chunk in r.iter_text():
            text += chunk
            if first_visible is None and text_of(sse_events(text)):
                first_visible = time.monotonic() - started
    total = time.monotonic() - started
    assert text_of(sse_events(text)) == WORDS
    assert total > 0.8  # the fake paused before each of its 13+ events
    assert first_visible is not None and first_visible < 0.5 * total
    assert_hits((a, 1), (b, 0))
