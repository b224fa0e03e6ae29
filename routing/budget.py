"""Budget periods (SPEC §7.4).

Contract: `period_start(period, now)` is the UTC start of the budget period that contains `now`:
`day` at 00:00, `week` on Monday 00:00 (ISO weeks), `month` on the 1st at 00:00; None for a lifetime
budget (no period). A key's spend counts only while its stored period start equals the current one;
an older one means the period rolled over and the spend starts again from zero. `now` must be aware.
`period_end` is when it starts again (the next period's start).

Amounts are integer micros (a millionth of a US dollar) everywhere inside; operators read and write
dollars: `usd` formats micros as dollars, `micros_from_usd` reads a dollar amount (a decimal string or
number, at most six decimals) into micros.
"""

from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation

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


def period_end(period: str | None, now: datetime) -> datetime | None:
    """When the period that contains `now` ends and the spend starts again; None for a lifetime budget."""
    start = period_start(period, now)
    if start is None:
        return None
    if period == BudgetPeriod.DAY:
        return start + timedelta(days=1)
    if period == BudgetPeriod.WEEK:
        return start + timedelta(days=7)
    return (start + timedelta(days=32)).replace(day=1)


MICROS = 1_000_000  # micros per dollar


def usd(micros: int) -> str:
    """`$5.00`, `$0.000829`: dollars with cents, and every further decimal that is not zero."""
    text = f"{Decimal(micros) / MICROS:.6f}".rstrip("0")
    whole, _, cents = text.partition(".")
    return f"${whole}.{cents.ljust(2, '0')}"


def micros_from_usd(value: object) -> int:
    """A dollar amount (`"50.00"`, `50`, `0.25`) in micros; ValueError for anything else, a negative
    amount, or a fraction of a micro."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError('expected an amount in dollars, e.g. "50.00"')
    try:
        amount = Decimal(str(value).strip().removeprefix("$")) * MICROS
    except InvalidOperation:
        raise ValueError(f'{value!r} is not an amount in dollars, e.g. "50.00"') from None
    if not amount.is_finite() or amount < 0 or amount != amount.to_integral_value():
        raise ValueError(f"{value!r}: expected a non-negative amount with at most six decimals")
    return int(amount)


def refusal_message(*, budget: int, spent: int, held: int, period: str | None, now: datetime) -> str:
    """A budget refusal in the gateway's words (SPEC §7.4): spent (and held by requests in flight),
    allowed, and when the period starts again."""
    in_flight = f" (and {usd(held)} held by requests in flight)" if held else ""
    ends = period_end(period, now)
    resets = (
        f"this {period}; it resets at {ends.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        if ends is not None
        else "(a lifetime budget: it never resets)"
    )
    spent_text = f"{usd(spent)} spent{in_flight} of {usd(budget)}"
    return f"This key's budget cannot cover this request: {spent_text} {resets}."
