"""SPEC §5.6: a code-less 404 (`invalid_request_error`, `param: "model"`, no code) is a model failure
only when the catalog holds provenance for (assignment, model). The relay reads it from the candidate
it dispatched to (the selector fills it from the catalog entry), never assumes it."""

import json
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


def _relay() -> Relay:
    exchange = Exchange("r", None, "/chat/completions", "http", "gpt-5", datetime.now(UTC))
    return Relay(
        exchange=exchange,
        view=RoutingView(policy=ModelPolicy(), max_attempts=4, routes={}),
        plan=Plan(order=(), ineligible=(), beyond_shortlist=(), disallowed=()),
        breaker_settings=BreakerSettings(),
        demotion_seconds=60,
        backoff_base_ms=0,
        requirements=Requirements(),
        deadline=0.0,
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
