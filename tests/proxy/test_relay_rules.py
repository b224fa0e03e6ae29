"""Attempt-loop rules checked on the Relay itself, without sockets (the end-to-end behaviour is in
test_failure_semantics.py):
- SPEC §5.6: a code-less 404 (`invalid_request_error`, `param: "model"`, no code) is a model failure
  only when the catalog holds provenance for (assignment, model); the relay reads it from the
  candidate it dispatched to (the selector fills it from the catalog entry), never assumes it.
- SPEC §5.3/§6.0: the backoff between hops is full jitter (uniform from 0) and never sleeps past the
  one deadline of the whole sequence."""

import json
import time
from datetime import UTC, datetime

import pytest

from proxy.relay import AttemptLog, Exchange, Relay
from routing.breaker import BreakerSettings
from routing.failures import FailureClass
from routing.plan import Plan
from routing.resolution import ModelPolicy
from routing.route import RoutingView
from routing.types import Candidate, Requirements, RouteClass

CODELESS_404 = json.dumps(
    {"error": {"message": "The model does not exist.", "type": "invalid_request_error", "param": "model"}}
).encode()


async def _finish(exchange: Exchange) -> None:
    return None


def _relay(*, deadline: float = 0.0, backoff_base_ms: int = 0) -> Relay:
    exchange = Exchange("r", None, "/chat/completions", "http", "gpt-5", datetime.now(UTC))
    return Relay(
        exchange=exchange,
        view=RoutingView(policy=ModelPolicy(), max_attempts=4, routes={}),
        plan=Plan(order=(), ineligible=(), beyond_shortlist=(), disallowed=()),
        breaker_settings=BreakerSettings(),
        demotion_seconds=60,
        backoff_base_ms=backoff_base_ms,
        requirements=Requirements(),
        deadline=deadline,
        path="/chat/completions",
        body={},
        route_class=RouteClass.HTTP,
        dialect=None,
        on_finish=_finish,
    )


@pytest.mark.parametrize(
    ("provenance", "expected"),
    [
        ("configured", FailureClass.MODEL_UNAVAILABLE),
        ("observed", FailureClass.MODEL_UNAVAILABLE),
        ("preserved", FailureClass.MODEL_UNAVAILABLE),
        (None, FailureClass.CLIENT_ERROR),  # no catalog provenance: a generic-looking 404, no circuit
    ],
)
def test_a_codeless_404_is_a_model_failure_only_with_catalog_provenance(provenance, expected):
    c = Candidate(assignment_id=1, model="gpt-5", provenance=provenance)
    log = AttemptLog(1, 1, "gpt-5", "http", "failed")
    failure = _relay().plain(c, log, None, 404, CODELESS_404)  # type: ignore[arg-type]
    assert failure.failure is expected


async def test_the_backoff_is_full_jitter_and_never_sleeps_past_the_deadline(monkeypatch):
    drawn, slept = [], []

    def uniform(low, high):
        drawn.append((low, high))
        return high  # the longest wait the jitter can draw

    async def sleep(seconds):
        slept.append(seconds)

    monkeypatch.setattr("proxy.relay.random.uniform", uniform)
    monkeypatch.setattr("proxy.relay.asyncio.sleep", sleep)
    relay = _relay(deadline=time.monotonic() + 0.5, backoff_base_ms=1000)
    for ordinal in (1, 2):
        relay.x.attempts.append(AttemptLog(ordinal, ordinal, "gpt-5", "http", "retryable_failed"))
    await relay._backoff()
    assert drawn == [(0, 2.0)]  # full jitter: anywhere from 0 to base x 2^(hops-1)
    assert 0 < slept[0] <= 0.5  # but never past what is left of the deadline
