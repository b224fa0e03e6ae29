"""The pure view-model of the operator panel: signals come from `breaker.health`, unknowns stay unknown."""

from datetime import UTC, datetime, timedelta

import pytest

from routing.policy.breaker import BreakerSettings, CircuitSnapshot
from routing.policy.panel import (
    NOT_ADVERTISED,
    DemotionFacts,
    HeadroomState,
    LatencyFacts,
    ModelFacts,
    UsageRow,
    headroom,
    leaderboard,
    model_rows,
    shares,
    signal,
)
from routing.policy.types import CircuitReason, CircuitState, Health, RouteClass, TriState

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
SETTINGS = BreakerSettings()
LATER = NOW + timedelta(seconds=90)
EARLIER = NOW - timedelta(seconds=1)


@pytest.mark.parametrize(
    ("snapshot", "state", "health", "until", "seconds_left", "text", "detail"),
    [
        (None, CircuitState.CLOSED, Health.HEALTHY, None, None, "closed", ""),
        (
            CircuitSnapshot(reason=CircuitReason.TIMEOUT, consecutive_failures=2),
            CircuitState.CLOSED,
            Health.FAILING,
            None,
            None,
            "closed",
            "2 recent failures",
        ),
        (
            CircuitSnapshot(
                state=CircuitState.OPEN, reason=CircuitReason.UPSTREAM_MODEL_UNAVAILABLE, open_until=LATER
            ),
            CircuitState.OPEN,
            Health.BLOCKED,
            LATER,
            90,
            "open until",
            "",
        ),
        (
            CircuitSnapshot(state=CircuitState.OPEN, reason=CircuitReason.RATE_LIMITED, open_until=LATER),
            CircuitState.OPEN,
            Health.COOLING,
            LATER,
            90,
            "open until",
            "",
        ),
        (
            CircuitSnapshot(state=CircuitState.OPEN, reason=CircuitReason.TIMEOUT, open_until=EARLIER),
            CircuitState.OPEN,
            Health.PROBE,
            EARLIER,
            0,
            "open until",
            "cooldown over, next request probes",
        ),
        (
            CircuitSnapshot(
                state=CircuitState.HALF_OPEN,
                reason=CircuitReason.UPSTREAM_UNAVAILABLE,
                open_until=EARLIER,
                probes_in_flight=1,
                probe_lease_expires_at=LATER,
            ),
            CircuitState.HALF_OPEN,
            Health.COOLING,
            None,
            None,
            "half-open",
            "1 probe in flight",
        ),
    ],
)
def test_signal_reads_the_circuit_as_the_router_does(
    snapshot, state, health, until, seconds_left, text, detail
):
    s = signal(RouteClass.SSE, snapshot, SETTINGS, NOW)
    assert (s.state, s.health, s.until, s.seconds_left) == (state, health, until, seconds_left)
    assert (s.state_text, s.detail, s.label) == (text, detail, "SSE")
    assert s.reason == (snapshot.reason if snapshot else None)


def test_reasons_read_as_words():
    s = signal(
        RouteClass.HTTP,
        CircuitSnapshot(
            state=CircuitState.OPEN, reason=CircuitReason.UPSTREAM_MODEL_UNAVAILABLE, open_until=LATER
        ),
        SETTINGS,
        NOW,
    )
    assert s.reason_text == "upstream model unavailable"


def test_model_rows_keep_unknowns_and_show_state_without_a_catalog_entry():
    entries = [ModelFacts("b-model", "observed", tools=TriState.TRUE), ModelFacts("a-model", "preserved")]
    circuits = {
        ("orphan", RouteClass.WEBSOCKET): CircuitSnapshot(
            state=CircuitState.OPEN, reason=CircuitReason.TIMEOUT, open_until=LATER
        )
    }
    demotions = {
        "b-model": DemotionFacts(CircuitReason.UPSTREAM_MODEL_UNAVAILABLE, LATER),
        "a-model": DemotionFacts(CircuitReason.TIMEOUT, EARLIER),  # expired: not active
    }
    rows = model_rows(entries, circuits, demotions, SETTINGS, NOW)
    assert [r.model for r in rows] == ["a-model", "b-model", "orphan"]
    a, b, orphan = rows
    assert (a.tools, a.vision, a.provenance, a.demotion) == (
        TriState.UNKNOWN,
        TriState.UNKNOWN,
        "preserved",
        None,
    )
    assert a.troubled is False
    assert (b.tools, b.demotion.until, b.troubled) == (TriState.TRUE, LATER, True)
    assert orphan.provenance == NOT_ADVERTISED and not orphan.advertised
    assert [s.state for s in orphan.signals] == [CircuitState.CLOSED, CircuitState.CLOSED, CircuitState.OPEN]
    assert [s.route_class for s in orphan.signals] == [RouteClass.HTTP, RouteClass.SSE, RouteClass.WEBSOCKET]


def test_unreported_tokens_are_unknown_and_the_leaderboard_is_busiest_first():
    rows = [
        UsageRow("quiet", 1, 1, 0, None, None),
        UsageRow("busy", 5, 4, 1, 100, None),
        UsageRow("tied-more-tokens", 1, 1, 0, 10, 5),
    ]
    assert rows[0].tokens is None
    assert rows[1].tokens == 100
    assert [r.model for r in leaderboard(rows)] == ["busy", "tied-more-tokens", "quiet"]
    assert [r.model for r in leaderboard(rows, size=1)] == ["busy"]


def test_a_share_is_of_its_own_pools_attempts_and_unknown_for_a_pool_without_traffic():
    pool_of = {1: 10, 2: 10, 3: 10, 4: 20, 5: 30}
    assert shares({1: 6, 2: 2, 4: 5}, pool_of) == {1: 0.75, 2: 0.25, 3: 0.0, 4: 1.0, 5: None}


@pytest.mark.parametrize(
    ("demotions", "answered", "expected"),
    [
        ((), False, (HeadroomState.UNKNOWN, None)),
        ((), True, (HeadroomState.AMPLE, None)),
        ((DemotionFacts(CircuitReason.RATE_LIMITED, LATER),), True, (HeadroomState.AMPLE, None)),
        ((DemotionFacts(CircuitReason.HEADROOM, EARLIER),), True, (HeadroomState.AMPLE, None)),
        (
            (
                DemotionFacts(CircuitReason.HEADROOM, LATER),
                DemotionFacts(CircuitReason.HEADROOM, NOW + timedelta(1)),
            ),
            False,
            (HeadroomState.LOW, NOW + timedelta(1)),
        ),
    ],
)
def test_headroom_is_low_while_a_headroom_demotion_runs_else_ample_if_it_answered(
    demotions, answered, expected
):
    h = headroom(demotions, answered=answered, now=NOW)
    assert (h.state, h.until) == expected


def test_a_model_with_only_a_latency_average_is_still_shown_with_it():
    rows = model_rows((), {}, {}, SETTINGS, NOW, latencies={"gone": LatencyFacts(80.0, 2)})
    assert [(m.model, m.provenance, m.latency) for m in rows] == [
        ("gone", NOT_ADVERTISED, LatencyFacts(80.0, 2))
    ]
    assert rows[0].latency is not None and rows[0].latency.text == "80 ms, 2 answers"
