"""Budget periods (SPEC §7.4): pure, with a fixed `now`."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from routing.policy.budget import (
    micros_from_usd,
    period_end,
    period_start,
    refusal_message,
    spent_in_period,
    usd,
)

NOW = datetime(2026, 12, 3, 15, 30, tzinfo=UTC)  # a Thursday


@pytest.mark.parametrize(
    ("period", "start"),
    [
        ("day", datetime(2026, 12, 3, tzinfo=UTC)),
        ("week", datetime(2026, 11, 30, tzinfo=UTC)),  # Monday
        ("month", datetime(2026, 12, 1, tzinfo=UTC)),
        ("", None),
        (None, None),
    ],
)
def test_the_period_starts_at_utc_midnight_of_its_first_day(period, start):
    assert period_start(period, NOW) == start


def test_periods_are_utc_whatever_the_clock_zone():
    tokyo = NOW.astimezone(timezone(timedelta(hours=9)))  # already Friday 00:30 there
    assert period_start("day", tokyo) == datetime(2026, 12, 3, tzinfo=UTC)


def test_an_unknown_period_is_refused():
    with pytest.raises(ValueError):
        period_start("year", NOW)


def test_spend_counts_only_in_its_own_period():
    today = period_start("day", NOW)
    assert spent_in_period(70, today, today) == 70
    assert spent_in_period(70, today - timedelta(days=1), today) == 0
    assert spent_in_period(70, None, today) == 0
    assert spent_in_period(70, None, None) == 70  # a lifetime budget never resets


@pytest.mark.parametrize(
    ("period", "end"),
    [
        ("day", datetime(2026, 12, 4, tzinfo=UTC)),
        ("week", datetime(2026, 12, 7, tzinfo=UTC)),
        ("month", datetime(2027, 1, 1, tzinfo=UTC)),  # across the year
        ("", None),
    ],
)
def test_a_period_ends_where_the_next_one_starts(period, end):
    assert period_end(period, NOW) == end
    if end is not None:
        assert period_start(period, end) == end


@pytest.mark.parametrize(
    ("micros", "text"),
    [
        (5_000_000, "$5.00"),
        (829, "$0.000829"),
        (1_500_000, "$1.50"),
        (0, "$0.00"),
        (123_456_789, "$123.456789"),
    ],
)
def test_micros_read_as_dollars(micros, text):
    assert usd(micros) == text
    assert micros_from_usd(text) == micros


@pytest.mark.parametrize(("value", "micros"), [("50.00", 50_000_000), (50, 50_000_000), (0.25, 250_000)])
def test_dollars_are_read_exactly(value, micros):
    assert micros_from_usd(value) == micros


@pytest.mark.parametrize("value", ["-1", "0.0000001", "fifty", "nan", "inf", True, None, [50]])
def test_an_amount_that_is_not_whole_micros_of_dollars_is_refused(value):
    with pytest.raises(ValueError):
        micros_from_usd(value)


def test_a_refusal_names_spent_held_allowed_and_the_reset():
    assert refusal_message(budget=2_000, spent=829, held=1_100, period="month", now=NOW) == (
        "This key's budget cannot cover this request: $0.000829 spent (and $0.0011 held by requests in "
        "flight) of $0.002 this month; it resets at 2027-01-01T00:00:00Z."
    )
    assert refusal_message(budget=2_000, spent=2_000, held=0, period="", now=NOW).endswith(
        "$0.002 spent of $0.002 (a lifetime budget: it never resets)."
    )
