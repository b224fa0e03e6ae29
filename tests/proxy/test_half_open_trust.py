"""How long a request trusts the circuits it read (proxy/health.py `HealthWrites.current`, issue 21's
`half_open_probes`): a circuit's cooldown counts from when the failure that opened it was computed,
which can be before the request read the circuit closed, when that failure's write committed only
after the read. The full 3-node soak showed it: a request trusted its view of a closed circuit, and
dispatched to it without the probe lease beside the lease holder once the cooldown (started before
the request's read) was over."""

import threading
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from django.db import connection

from pools.models import GatewayKey, GatewaySettings
from routing.models import Circuit
from routing.vocabulary import CircuitReason, CircuitState
from tests.proxy.test_budget import AUTH, BODY, _price
from tests.proxy.test_stalled_database import _stalled, _wait_for_a_lock_wait


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a row lock that leaves other tables writable")
def test_a_circuit_whose_opening_committed_after_the_read_is_read_again_before_its_cooldown_is_over(
    gateway, two_assignments
):
    """The request reads acct-a closed, then waits (its budget reservation) 1.3 s of a 2 s cooldown.
    Meanwhile a failure computed 0.9 s before the read commits: acct-a is open since 2.2 s, so
    half-open with another request's probe in flight. Trusting its view (younger than the cooldown)
    the request would try acct-a first; it reads the circuit again and takes acct-b."""
    a, b, (acct_a, _) = two_assignments
    _price(1_000_000, 1_000_000)
    GatewaySettings.objects.filter(pk=1).update(cooldown_seconds=2)
    GatewayKey.objects.update(budget_micros=1_000_000)
    key = GatewayKey.objects.get()
    answer: list[httpx.Response] = []
    with _stalled(f"SELECT 1 FROM {GatewayKey._meta.db_table} WHERE id = {key.pk} FOR UPDATE"):
        request = threading.Thread(
            target=lambda: answer.append(
                httpx.post(
                    f"{gateway}/v1/chat/completions",
                    content=BODY,
                    headers={**AUTH, "x-gateway-deadline-ms": "10000"},
                    timeout=15,
                )
            )
        )
        request.start()
        _wait_for_a_lock_wait()  # it has read acct-a closed and waits for its reservation...
        time.sleep(1.3)  # ...for less than the cooldown
        now = datetime.now(UTC)
        Circuit.objects.create(  # the late failure write, then another request's probe
            pool=acct_a.pool,
            assignment=acct_a,
            model="gpt-5",
            route_class="sse",  # BODY is a stream
            state=CircuitState.HALF_OPEN,
            reason=CircuitReason.UPSTREAM_UNAVAILABLE,
            consecutive_failures=3,
            cooldown_seconds=2,
            open_until=now - timedelta(seconds=0.2),
            probes_in_flight=1,
            probe_lease_expires_at=now + timedelta(seconds=60),
        )
    request.join(15)
    assert answer and answer[0].status_code == 200
    assert a.hits == [] and len(b.hits) == 1
