"""`make bench-pool`'s figures from the fake accounts' records (pure), and where its section goes."""

import pytest

from bench.pool import report, workload
from bench.pool.figures import (
    CircuitSample,
    Turn,
    affinity,
    busiest_share,
    client_outcomes,
    heal_times,
    per_account,
)
from devkit.pool_upstream import AccountSpec, Outage

SPECS = [
    AccountSpec("a", "openai", 60, 1000),
    AccountSpec("b", "openai", 60, 1000),
    AccountSpec("c", "openai", 60, 1000, (Outage(10, 20, "unavailable"),)),
]


def event(t, account, conversation, turn, status=200, headroom=0.5):
    return (t, account, conversation, turn, status, 100, 50, headroom)


def test_a_turn_hits_when_the_previous_turns_account_serves_it_and_counts_only_if_that_one_was_healthy():
    events = [
        event(1, "a", "x", 1),
        event(2, "a", "x", 2),  # hit
        event(3, "b", "x", 3),  # miss: a was healthy
        event(4, "b", "y", 1),
        event(5, "b", "y", 2, status=429),  # b answered 429 between y's turns: y's turn 2 is not counted
        event(5.1, "a", "y", 2),
        event(9, "c", "z", 1),
        event(12, "a", "z", 2),  # c in its outage at t=12: not counted
    ]
    found = affinity(events, SPECS, {"x": "gs", "y": "pck", "z": "gs"})
    assert found["counted"] == 2
    assert found["rate"] == 0.5
    assert found["by_kind"] == {"gs": (0.5, 2)}


def test_busiest_share_is_over_the_steady_accounts_mean_and_heal_time_from_the_first_serve_after_it():
    events = [event(1, "a", "", 0), event(2, "a", "", 0), event(3, "a", "", 0), event(4, "b", "", 0)]
    events += [event(15, "c", "", 0, status=503), event(24, "c", "", 0), event(26, "c", "", 0)]
    found = busiest_share(events, SPECS)
    assert (found["busiest"], found["share"], found["idle"]) == ("a", 1.5, 0)
    heals = heal_times(events, {"c": 20.0, "b": 30.0}, [])
    assert heals["c"] == {"after_s": 4.0, "cooldown_s": 0, "met": True, "first_new_s": None}
    assert heals["b"] == {"after_s": None, "cooldown_s": 0, "met": False, "first_new_s": None}
    accounts = per_account([*events, event(4.5, "b", "", 0, status=429, headroom=0.0)], SPECS, windows=2)
    assert accounts["a"]["served_by_window"] == [3, 0]
    assert (accounts["b"]["rate_limited"], accounts["b"]["headroom_least"]) == (1, 0.0)
    assert "c" not in accounts  # not a steady account


def test_a_heal_is_judged_against_the_cooldown_in_force_when_it_healed_not_the_configured_one():
    """c's circuit opened at 10 s for the configured 5 s, its probe failed at 15 s (open again for
    10 s: read only after the heal, its start is open_until less its cooldown); c healed at 20 s and
    served 12 s later: within 10 + 5 s, not within 5 + 5 s. b's circuit opened and closed long before
    b healed: closed at its heal, judged against the probe's 5 s alone."""
    circuits = [
        CircuitSample(11.0, "c", "m:http", "open", 5, 10.0),
        CircuitSample(15.5, "c", "m:http", "half_open", 5, 10.0),
        CircuitSample(21.0, "c", "m:http", "open", 10, 15.0),
        CircuitSample(32.5, "c", "m:http", "closed", 0, None),
        CircuitSample(1.5, "b", "m:http", "open", 5, 1.0),
        CircuitSample(6.5, "b", "m:http", "closed", 0, None),
    ]
    events = [event(15, "c", "x", 3, status=503), event(32, "c", "x", 4), event(36, "a", "y", 1)]
    events.append(event(37, "b", "y", 2))
    found = heal_times(events, {"c": 20.0, "b": 30.0}, circuits)
    assert found["c"] == {"after_s": 12.0, "cooldown_s": 10, "met": True, "first_new_s": 16.0}
    assert found["b"] == {"after_s": 7.0, "cooldown_s": 0, "met": False, "first_new_s": 6.0}
    assert report.heal_cell(found["c"]) == "**met**: 12.0 s (cooldown 10 s)"
    assert report.heal_cell(found["b"]) == (
        "**MISSED**: 7.0 s (circuit closed; the first new conversation came 6.0 s after the heal)"
    )


def test_client_outcomes_count_429s_and_no_eligible_backend_apart():
    turns = [
        Turn(0, "gs", "x", 1, 200, ""),
        Turn(1, "gs", "x", 2, 429, "rate_limit_exceeded"),
        Turn(2, "gs", "x", 3, 503, "no_eligible_backend"),
        Turn(3, "gs", "x", 4, 0, "ServerDisconnectedError"),
    ]
    found = client_outcomes(turns)
    assert (found["sent"], found["ok"], found["rate_limited"], found["no_eligible_backend"]) == (4, 1, 1, 1)
    assert found["failures"]["0 ServerDisconnectedError"] == 1


def test_the_pace_stays_under_the_steady_accounts_capacity():
    for quick in (True, False):
        s = workload.settings(quick)
        pace = workload.pace(s, workload.accounts(s))
        assert max(pace.share_of_tokens, pace.share_of_requests) == pytest.approx(s.load)
        assert len(workload.steady(workload.accounts(s))) == 20


@pytest.mark.parametrize("present", [True, False])
def test_the_summary_replaces_its_own_in_results_md_or_goes_before_the_latency_tables(
    tmp_path, monkeypatch, present
):
    """bench/pool.md gets every figure, bench/results.md the summary, in the place of the old one and
    never over `make bench-scale`'s marker that follows it."""
    results = tmp_path / "results.md"
    old = "## Pool (make bench-pool)\n\nold figures\n\n" if present else ""
    scale = "<!-- bench-scale:begin -->\n## Scale (make bench-scale)\n\nrows\n<!-- bench-scale:end -->\n\n"
    results.write_text(f"# Benchmark results\n\n## Soak\n\nsoak\n\n{old}{scale}## Added latency\n\ntable\n")
    monkeypatch.setattr(report, "RESULTS_MD", results)
    monkeypatch.setattr(report, "POOL_MD", tmp_path / "pool.md")
    report.write("## Pool (make bench-pool)\n\nevery figure\n", "## Pool (make bench-pool)\n\nverdicts\n")
    text = results.read_text()
    assert "old figures" not in text and "every figure" not in text
    assert text.index("## Soak") < text.index("verdicts") < text.index("<!-- bench-scale:begin -->")
    assert text.index("<!-- bench-scale:end -->") < text.index("## Added latency")
    assert text.count("## Pool") == 1
    assert (tmp_path / "pool.md").read_text() == "## Pool (make bench-pool)\n\nevery figure\n"
    assert report.kept(results) == ["## Pool (make bench-pool)\n\nverdicts", ""]  # what `make bench` carries


def test_the_summary_counts_each_sides_verdicts_and_names_the_missed_ones(monkeypatch):
    canned = [
        ("turns sent (answered 200)", "", ["10 (10)", "10 (9)"]),
        ("client-visible 429", "0", ["**met**: 0", "**MISSED**: 3"]),
        ("affinity hit rate", ">= 95 %", ["**met**: 99%", "**MISSED**: 90%"]),
        ("heal", "<= 5 s", ["**met**: 1 s", "**met**: 2 s"]),
    ]
    monkeypatch.setattr(report, "rows", lambda ctx, phases: canned)
    text = report.summary({"date": "2026-12-05 19:00 UTC", "commit": "abc1234"}, {})
    assert text.startswith("## Pool (make bench-pool)\n\n")
    assert "features on: 3 of 3 targets met;" in text
    assert "features off: 1 of 3 targets met (missed: client-visible 429; affinity hit rate)." in text
    assert "[bench/pool.md](pool.md)" in text and len(text.splitlines()) == 3
