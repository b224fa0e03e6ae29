"""The pure view-model of the operator panel: signals come from `breaker.health`, unknowns stay unknown."""

from datetime import UTC, datetime, timedelta

import pytest

from routing.breaker import BreakerSettings, CircuitSnapshot
from routing.panel import (
    NOT_ADVERTISED,
    DemotionFacts,
    ModelFacts,
    UsageRow,
    leaderboard,
    model_rows,
    signal,
)
from routing.types import CircuitReason, CircuitState, Health, RouteClass, TriState

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
