"""SPEC §7.1: circuit transitions as data in, data out, at a fixed `now`."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from routing.policy.breaker import (
    CLEAN,
    Admission,
    BreakerSettings,
    CircuitSnapshot,
    acquire_probe,
    admission,
    blocked_health,
    health,
    on_failure,
    on_neutral,
    on_success,
)
from routing.policy.types import CircuitReason, CircuitState, Health

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
IN_30S = NOW + timedelta(seconds=30)
IN_60S = NOW + timedelta(seconds=60)
S = BreakerSettings(
    failure_threshold=3,
    cooldown_seconds=60,
    max_cooldown_seconds=600,
    half_open_probes=1,
    probe_lease_seconds=30,
)
MU = CircuitReason.UPSTREAM_MODEL_UNAVAILABLE
UNAV = CircuitReason.UPSTREAM_UNAVAILABLE


def seconds(n: float) -> timedelta:
    return timedelta(seconds=n)


def opened(cooldown: int = 60, reason: CircuitReason = MU, until: datetime = IN_60S) -> CircuitSnapshot:
    return CircuitSnapshot(
        state=CircuitState.OPEN,
        reason=reason,
        consecutive_failures=3,
        cooldown_seconds=cooldown,
        open_until=until,
    )


def half_open(probes: int = 1, lease: datetime | None = IN_30S, cooldown: int = 60) -> CircuitSnapshot:
    return CircuitSnapshot(
        state=CircuitState.HALF_OPEN,
        reason=MU,
        consecutive_failures=3,
        cooldown_seconds=cooldown,
        open_until=NOW - seconds(1),
        probes_in_flight=probes,
        probe_lease_expires_at=lease,
    )


def test_failures_below_the_threshold_count_while_closed():
    first = on_failure(None, UNAV, S, NOW)
    assert first == CircuitSnapshot(state=CircuitState.CLOSED, reason=UNAV, consecutive_failures=1)
    second = on_failure(first, MU, S, NOW)
    assert (second.state, second.consecutive_failures, second.reason) == (CircuitState.CLOSED, 2, MU)
    assert admission(second, S, NOW) is Admission.ALLOWED


def test_threshold_consecutive_failures_open_the_circuit():
    snapshot = None
    for _ in range(3):
        snapshot = on_failure(snapshot, MU, S, NOW)
    assert snapshot == CircuitSnapshot(
        state=CircuitState.OPEN,
        reason=MU,
        consecutive_failures=3,
        cooldown_seconds=60,
        open_until=NOW + seconds(60),
    )


def test_a_success_resets_the_consecutive_count():
    snapshot = on_failure(on_failure(None, MU, S, NOW), MU, S, NOW)
    snapshot = on_success(snapshot)
    assert snapshot == CLEAN
    snapshot = on_failure(snapshot, MU, S, NOW)
    assert snapshot.state is CircuitState.CLOSED
    assert snapshot.consecutive_failures == 1


@pytest.mark.parametrize("threshold", [1, 2, 5])
def test_threshold_is_configurable(threshold):
    settings = replace(S, failure_threshold=threshold)
    snapshot = None
    for _ in range(threshold - 1):
        snapshot = on_failure(snapshot, UNAV, settings, NOW)
        assert snapshot.state is CircuitState.CLOSED
    assert on_failure(snapshot, UNAV, settings, NOW).state is CircuitState.OPEN


def test_first_cooldown_is_bounded_by_the_maximum():
    settings = replace(S, failure_threshold=1, cooldown_seconds=900, max_cooldown_seconds=600)
    assert on_failure(None, UNAV, settings, NOW).cooldown_seconds == 600


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (NOW, Admission.OPEN_BLOCKED),
        (NOW + seconds(59.999), Admission.OPEN_BLOCKED),
        (NOW + seconds(60), Admission.PROBE_NEEDED),
        (NOW + seconds(3600), Admission.PROBE_NEEDED),
    ],
)
def test_open_admits_a_probe_from_open_until(now, expected):
    assert admission(opened(), S, now) is expected


@pytest.mark.parametrize(
    ("snapshot", "settings", "expected"),
    [
        (half_open(probes=0), S, Admission.PROBE_NEEDED),  # a neutral ending freed the slot
        (half_open(probes=1), S, Admission.OPEN_BLOCKED),  # the one probe is in flight
        (half_open(probes=1), replace(S, half_open_probes=2), Admission.PROBE_NEEDED),
        (half_open(probes=2), replace(S, half_open_probes=2), Admission.OPEN_BLOCKED),
        (half_open(probes=1, lease=NOW), S, Admission.PROBE_NEEDED),  # lease expired exactly now
        (half_open(probes=1, lease=NOW + seconds(0.001)), S, Admission.OPEN_BLOCKED),
        (half_open(probes=1, lease=NOW - seconds(1)), S, Admission.PROBE_NEEDED),  # lost probe
    ],
)
def test_half_open_admission(snapshot, settings, expected):
    assert admission(snapshot, settings, NOW) is expected


@pytest.mark.parametrize("snapshot", [None, CLEAN, CircuitSnapshot(consecutive_failures=2, reason=UNAV)])
def test_closed_is_allowed(snapshot):
    assert admission(snapshot, S, NOW) is Admission.ALLOWED


def test_acquire_probe_from_open_after_cooldown():
    probe = acquire_probe(opened(until=NOW), S, NOW)
    assert probe is not None
    assert (probe.state, probe.probes_in_flight, probe.probe_lease_expires_at) == (
        CircuitState.HALF_OPEN,
        1,
        NOW + seconds(30),
    )
    assert (probe.reason, probe.cooldown_seconds) == (MU, 60)
    # Exactly one probe across all nodes: the next asker is blocked.
    assert admission(probe, S, NOW) is Admission.OPEN_BLOCKED
    assert acquire_probe(probe, S, NOW) is None


@pytest.mark.parametrize(
    "snapshot",
    [None, CLEAN, opened(), half_open(probes=1), CircuitSnapshot(consecutive_failures=1, reason=MU)],
)
def test_acquire_probe_refused_when_not_probe_admissible(snapshot):
    assert acquire_probe(snapshot, S, NOW) is None


def test_an_expired_lease_is_reacquired_and_the_lost_probe_forgotten():
    probe = acquire_probe(half_open(probes=1, lease=NOW - seconds(1)), S, NOW)
    assert probe is not None
    assert (probe.probes_in_flight, probe.probe_lease_expires_at) == (1, NOW + seconds(30))


def test_a_second_probe_slot_adds_to_the_count():
    probe = acquire_probe(half_open(probes=1), replace(S, half_open_probes=2), NOW)
    assert probe is not None
    assert probe.probes_in_flight == 2


@pytest.mark.parametrize(
    ("cooldown", "expected"),
    [(60, 120), (120, 240), (240, 480), (480, 600), (600, 600), (0, 120)],
)
def test_a_failed_probe_reopens_with_doubled_bounded_cooldown(cooldown, expected):
    result = on_failure(half_open(cooldown=cooldown), UNAV, S, NOW)
    assert result.state is CircuitState.OPEN
    assert result.cooldown_seconds == expected
    assert result.open_until == NOW + seconds(expected)
    assert (result.probes_in_flight, result.probe_lease_expires_at) == (0, None)
    assert result.reason is UNAV


def test_doubling_sequence_reaches_the_cap_and_stays():
    snapshot = opened(until=NOW)
    cooldowns = []
    now = NOW
    for _ in range(6):
        probe = acquire_probe(snapshot, S, now)
        assert probe is not None
        snapshot = on_failure(probe, MU, S, now)
        cooldowns.append(snapshot.cooldown_seconds)
        now = snapshot.open_until
    assert cooldowns == [120, 240, 480, 600, 600, 600]


def test_a_failure_after_the_cooldown_without_a_probe_also_doubles():
    result = on_failure(opened(until=NOW - seconds(1)), MU, S, NOW)
    assert (result.state, result.cooldown_seconds) == (CircuitState.OPEN, 120)


def test_a_failure_while_still_cooling_counts_but_does_not_extend():
    before = opened(reason=UNAV, until=NOW + seconds(10))
    result = on_failure(before, MU, S, NOW)
    assert result.open_until == before.open_until
    assert result.cooldown_seconds == before.cooldown_seconds
    assert (result.consecutive_failures, result.reason) == (4, MU)


@pytest.mark.parametrize(
    "snapshot", [half_open(), opened(), CircuitSnapshot(consecutive_failures=2, reason=MU)]
)
def test_success_closes_from_any_unclean_state(snapshot):
    assert on_success(snapshot) == CLEAN


@pytest.mark.parametrize("snapshot", [None, CLEAN, CircuitSnapshot(reason=UNAV)])
def test_success_on_a_clean_closed_circuit_writes_nothing(snapshot):
    assert on_success(snapshot) is None


def test_neutral_frees_a_probe_slot_only():
    before = half_open(probes=1)
    after = on_neutral(before)
    assert after == replace(before, probes_in_flight=0, probe_lease_expires_at=None)
    assert admission(after, S, NOW) is Admission.PROBE_NEEDED


def test_neutral_with_probes_left_keeps_the_lease():
    before = half_open(probes=2)
    after = on_neutral(before)
    assert after == replace(before, probes_in_flight=1)


@pytest.mark.parametrize("snapshot", [None, CLEAN, opened(), half_open(probes=0)])
def test_neutral_without_a_held_probe_writes_nothing(snapshot):
    assert on_neutral(snapshot) is None


@pytest.mark.parametrize(
    ("snapshot", "now", "expected"),
    [
        (None, NOW, Health.HEALTHY),
        (CLEAN, NOW, Health.HEALTHY),
        (CircuitSnapshot(consecutive_failures=1, reason=UNAV), NOW, Health.FAILING),
        (opened(reason=MU), NOW, Health.BLOCKED),
        (opened(reason=UNAV), NOW, Health.COOLING),
        (opened(reason=CircuitReason.TIMEOUT), NOW, Health.COOLING),
        (opened(reason=CircuitReason.RATE_LIMITED), NOW, Health.COOLING),
        (opened(reason=MU), NOW + seconds(60), Health.PROBE),
        (half_open(probes=0), NOW, Health.PROBE),
        (half_open(probes=1), NOW, Health.BLOCKED),
        (replace(half_open(probes=1), reason=UNAV), NOW, Health.COOLING),
        (half_open(probes=1), NOW + seconds(30), Health.PROBE),
    ],
)
def test_health(snapshot, now, expected):
    assert health(snapshot, S, now) is expected


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (MU, Health.BLOCKED),
        (UNAV, Health.COOLING),
        (CircuitReason.TIMEOUT, Health.COOLING),
        (None, Health.COOLING),
    ],
)
def test_blocked_health(reason, expected):
    assert blocked_health(reason) is expected


def test_full_cycle_closed_open_probe_closed():
    snapshot = None
    for _ in range(3):
        snapshot = on_failure(snapshot, MU, S, NOW)
    assert health(snapshot, S, NOW) is Health.BLOCKED
    later = NOW + seconds(60)
    probe = acquire_probe(snapshot, S, later)
    assert probe is not None and health(probe, S, later) is Health.BLOCKED
    assert on_success(probe) == CLEAN
    assert on_success(CLEAN) is None
