"""Attempt-loop rules checked on the Relay itself, without sockets (the end-to-end behaviour is in
test_failure_semantics.py):
- SPEC §5.6: a code-less 404 (`invalid_request_error`, `param: "model"`, no code) is a model failure
  only when the catalog holds provenance for (assignment, model); the relay reads it from the
  candidate it dispatched to (the selector fills it from the catalog entry), never assumes it.
- SPEC §5.2: the fallback model's candidates only when every primary one is blocked by an
  upstream_model_unavailable circuit, even when that shows only at their turn.
- SPEC §5.3/§6.0: the backoff between hops is full jitter (uniform from 0) and never sleeps past the
  one deadline of the whole sequence."""

import json
import time
from datetime import UTC, datetime

import pytest

from proxy.dispatch import HttpDispatch
from proxy.ledger.exchange import AttemptLog, Exchange
from proxy.output import plain_answer
from proxy.relay import Relay
from proxy.transport import Answer
from routing import services
from routing.policy.breaker import BreakerSettings, CircuitSnapshot
from routing.policy.failures import FailureClass
from routing.policy.plan import Plan
from routing.policy.resolution import ModelPolicy
from routing.policy.route import RoutingView, Target
from routing.policy.types import Candidate, CircuitReason, CircuitState, Health, Requirements, RouteClass

CODELESS_404 = json.dumps(
    {"error": {"message": "The model does not exist.", "type": "invalid_request_error", "param": "model"}}
).encode()


async def _finish(exchange: Exchange) -> None:
    return None


def _relay(*, deadline: float = 0.0, backoff_base_ms: int = 0, **given) -> Relay:
    exchange = Exchange("r", None, "/chat/completions", "http", "gpt-5", datetime.now(UTC))
    arguments = {
        "exchange": exchange,
        "view": RoutingView(policy=ModelPolicy(), max_attempts=4, routes={}),
        "plan": Plan(order=(), ineligible=(), beyond_shortlist=(), disallowed=()),
        "breaker_settings": BreakerSettings(),
        "demotion_seconds": 60,
        "backoff_base_ms": backoff_base_ms,
        "requirements": Requirements(),
        "deadline": deadline,
        "client_deadline": False,
        "path": "/chat/completions",
        "body": {},
        "route_class": RouteClass.HTTP,
        "dialect": None,
        "on_finish": _finish,
        "dispatch": HttpDispatch(),
    }
    return Relay(**{**arguments, **given})


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
    c = Candidate(assignment_id=1, model="gpt-5", adapter="openai", provenance=provenance)
    log = AttemptLog(1, 1, "gpt-5", "http", "failed")
    exchange = Exchange("r", None, "/chat/completions", "http", "gpt-5", datetime.now(UTC))
    failure, _ = plain_answer(Answer(404, CODELESS_404), None, candidate=c, log=log, exchange=exchange)  # type: ignore[arg-type]
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
        relay.exchange.attempts.append(AttemptLog(ordinal, ordinal, "gpt-5", "http", "retryable_failed"))
    await relay._backoff()
    assert drawn == [(0, 2.0)]  # full jitter: anywhere from 0 to base x 2^(hops-1)
    assert 0 < slept[0] <= 0.5  # but never past what is left of the deadline


class _Serves(HttpDispatch):
    """A transport that answers every attempt at once, recording which candidates it was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[int, str]] = []

    async def open(self, c, call, *, stream):
        self.sent.append(c.key)
        return Answer(200, b'{"choices": []}')


async def test_the_fallback_model_is_tried_when_every_primary_turns_out_blocked_at_its_turn(monkeypatch):
    """SPEC §5.2: cross-model candidates are reached when every primary candidate is excluded by a
    circuit open for upstream_model_unavailable. Here the primary's circuit admitted a probe when the
    plan was read, but another request took the lease first: it is excluded at its turn, and the
    fallback model's candidate serves."""
    monkeypatch.setattr(services, "circuit_take_probe", lambda **kw: False)  # another request won it

    async def inline(fn, *args, **kwargs):  # no database here: the service is replaced above
        return fn(*args, **kwargs)

    monkeypatch.setattr("proxy.relay.db.run", inline)
    monkeypatch.setattr("proxy.relay.db.write", inline)  # taking a probe is a write
    primary = Candidate(assignment_id=1, model="gpt-5.2", health=Health.PROBE, provenance="configured")
    sibling = Candidate(assignment_id=2, model="gpt-5.1", cross_model=True, provenance="configured")
    snapshot = CircuitSnapshot(
        state=CircuitState.OPEN,
        reason=CircuitReason.UPSTREAM_MODEL_UNAVAILABLE,
        consecutive_failures=3,
        cooldown_seconds=60,
        open_until=datetime.now(UTC),
    )
    targets = {n: Target(n, f"acct-{n}", 1, "openai", "http://127.0.0.1:9/v1", "UNSET") for n in (1, 2)}
    transport = _Serves()
    relay = _relay(
        deadline=time.monotonic() + 10,
        dispatch=transport,
        plan=Plan(order=(primary, sibling), ineligible=(), beyond_shortlist=(), disallowed=()),
        body={"model": "gpt-5.2", "messages": [{"role": "user", "content": "hi"}]},
        view=RoutingView(
            policy=ModelPolicy(), max_attempts=4, routes={}, circuits={primary.key: snapshot}, targets=targets
        ),
    )
    result = await relay.run()
    assert result.status == 200
    assert transport.sent == [(2, "gpt-5.1")]
    assert [(a.assignment_id, a.status, a.ineligible_reason) for a in relay.exchange.attempts] == [
        (1, "ineligible", "circuit_open"),
        (2, "succeeded", ""),
    ]
    assert relay.exchange.model_fallback is True


async def test_a_primary_passed_over_for_another_reason_never_crosses_the_model_boundary(monkeypatch):
    primary = Candidate(assignment_id=1, model="gpt-5.2", min_deadline_ms=60_000, provenance="configured")
    sibling = Candidate(assignment_id=2, model="gpt-5.1", cross_model=True, provenance="configured")
    targets = {n: Target(n, f"acct-{n}", 1, "openai", "http://127.0.0.1:9/v1", "UNSET") for n in (1, 2)}
    transport = _Serves()
    relay = _relay(
        deadline=time.monotonic() + 10,
        dispatch=transport,
        plan=Plan(order=(primary, sibling), ineligible=(), beyond_shortlist=(), disallowed=()),
        body={"model": "gpt-5.2", "messages": [{"role": "user", "content": "hi"}]},
        view=RoutingView(policy=ModelPolicy(), max_attempts=4, routes={}, targets=targets),
    )
    result = await relay.run()
    assert transport.sent == []  # the deadline excluded the primary: no_eligible_backend, not the sibling
    assert (result.status, json.loads(result.body)["error"]["param"]) == (503, "deadline")
