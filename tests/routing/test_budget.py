"""Budget periods (SPEC §7.4): pure, with a fixed `now`."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from routing.budget import period_start, spent_in_period

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
