"""Budget periods (SPEC §7.4).

Contract: `period_start(period, now)` is the UTC start of the budget period that contains `now`:
`day` at 00:00, `week` on Monday 00:00 (ISO weeks), `month` on the 1st at 00:00; None for a lifetime
budget (no period). A key's spend counts only while its stored period start equals the current one;
an older one means the period rolled over and the spend starts again from zero. `now` must be aware.
"""

from datetime import UTC, datetime, timedelta

from routing.vocabulary import BudgetPeriod


def period_start(period: str | None, now: datetime) -> datetime | None:
    if not period:
        return None
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == BudgetPeriod.DAY:
        return day
    if period == BudgetPeriod.WEEK:
        return day - timedelta(days=day.weekday())
    if period == BudgetPeriod.MONTH:
        return day.replace(day=1)
    raise ValueError(f"unknown budget period: {period!r}")


def spent_in_period(spent: int, stored_start: datetime | None, current_start: datetime | None) -> int:
    """What a key has spent in the current period: all of it for a lifetime budget, nothing once the
    period it was counted in has ended."""
    if current_start is None:
        return spent
    return spent if stored_start is not None and stored_start >= current_start else 0
