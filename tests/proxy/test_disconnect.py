"""A client that goes away before any output cancels its upstream call at once; once output began, the
rest of the stream is read, never relayed, for its usage (issue 45 finding 6). Either way the attempt
ends `cancelled`, neutral for the circuit."""

import time
from dataclasses import replace

import httpx
import pytest

from devkit.behaviours import hang, serve, slow_stream
from proxy.ledger.models import Attempt
from proxy.ledger.recorder import writer
from routing.models import Circuit
from tests.gateway_fixtures import GATEWAY_KEY

AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
CHAT = {"model": "gpt-5", "messages": [{"role": "user", "content": "one two three four five six"}]}


def _cancelled_attempt(timeout: float = 5.0) -> Attempt:
    deadline = time.monotonic() + timeout
    while True:
        writer.flush()
        attempt = Attempt.objects.filter(status="cancelled").first()
        if attempt is not None or time.monotonic() > deadline:
            assert attempt is not None, list(Attempt.objects.values_list("status", flat=True))
            return attempt
        time.sleep(0.05)


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_disconnect_while_waiting_cancels_the_upstream_call(gateway, two_assignments, stream):
    a, b, _ = two_assignments
    a.script("gpt-5", hang(seconds=5))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{gateway}/v1/chat/completions", json={**CHAT, "stream": stream}, headers=AUTH, timeout=0.5
        )
    attempt = _cancelled_attempt()
    # Ended when the client left (~0.5 s), not when the upstream would have given up (5 s).
    assert attempt.elapsed_ms < 3000
    assert attempt.dispatch_state == "unknown"
    assert b.hits == []  # never handed on: nobody is left to answer
    assert not Circuit.objects.exists()  # a disconnect says nothing about the upstream's health


def test_a_client_disconnect_mid_stream_reads_the_rest_for_its_usage(gateway, two_assignments):
    a, _, _ = two_assignments
    a.script("gpt-5", slow_stream(0.3))
    with httpx.stream(
        "POST", f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH, timeout=10
    ) as response:
        chunks = response.iter_bytes()
        assert b"data:" in next(chunks)  # output began
    attempt = _cancelled_attempt()
    assert attempt.request.outcome == "cancelled"
    assert (attempt.dispatch_state, attempt.input_tokens, attempt.output_tokens) == ("completed", 10, 3)
    assert not Circuit.objects.exists()


def test_a_client_that_leaves_at_done_while_the_upstream_lingers_was_served(gateway, two_assignments):
    """The SDKs close a stream at `[DONE]`; an upstream may hold its side open a moment longer. The client
    had the whole answer: the request is a success with its usage and cost, not a cancel."""
    a, _, _ = two_assignments
    a.script("gpt-5", replace(serve(), linger_s=3.0))
    with httpx.stream(
        "POST", f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH, timeout=10
    ) as response:
        lines = []
        for line in response.iter_lines():
            lines.append(line)
            if line == "data: [DONE]":
                break
    assert lines[-1] == "data: [DONE]"
    deadline = time.monotonic() + 5
    while (attempt := (writer.flush(), Attempt.objects.first())[1]) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert attempt is not None
    assert (attempt.status, attempt.dispatch_state) == ("succeeded", "completed")
    assert attempt.request.outcome == "ok"
