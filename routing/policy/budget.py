"""Budget periods (SPEC §7.4).

Contract: `period_start(period, now)` is the UTC start of the budget period that contains `now`:
`day` at 00:00, `week` on Monday 00:00 (ISO weeks), `month` on the 1st at 00:00; None for a lifetime
budget (no period). A key's spend counts only while its stored period start equals the current one;
an older one means the period rolled over and the spend starts again from zero. `now` must be aware.
`period_end` is when it starts again (the next period's start).

`reservation_micros(candidate, requirements)` is what a key's budget holds for one candidate before
dispatch (SPEC §7.4): the candidate's price over the estimated prompt and the most output the request
can be answered with, its own limit (`max_tokens`, `max_completion_tokens`, `max_output_tokens`), else
the model's output limit from the catalog (`max_output_tokens`), else DEFAULT_MAX_OUTPUT_TOKENS; None
for an unknown price. So a reservation never under-holds what the answer can cost but by the prompt
estimate's error, and concurrent requests pass a budget by at most that.

Amounts are integer micros (a millionth of a US dollar) everywhere inside; operators read and write
dollars: `usd` formats micros as dollars, `micros_from_usd` reads a dollar amount (a decimal string or
number, at most six decimals) into micros.
"""

from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation

from routing.policy.pricing import cost_micros
from routing.policy.types import Candidate, Requirements
from routing.policy.vocabulary import BudgetPeriod

# What a request that sets no output limit reserves for its answer when the catalog does not know its
# model's output limit (`CatalogEntry.max_output_tokens`). Reserving for the prompt alone let 100
# concurrent requests spend 4.1x their key's budget (issue 45 finding 6). 32,768 is the output limit of
# GPT-4.1 and about Claude Opus 4.1's; models that answer with more (GPT-5: 128,000) are exact only with
# their limit in the catalog.
DEFAULT_MAX_OUTPUT_TOKENS = 32_768


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


def reserved_output_tokens(requested: int, model_limit: int | None) -> int:
    """The output tokens a reservation covers: the request's own limit (`requested`, 0: none), else the
    model's (`model_limit`, None: unknown), else DEFAULT_MAX_OUTPUT_TOKENS."""
    if requested > 0:
        return requested
    return model_limit if model_limit else DEFAULT_MAX_OUTPUT_TOKENS


def reservation_micros(candidate: Candidate, requirements: Requirements) -> int | None:
    """What a key's budget holds for `candidate` before dispatch (module docstring); None: unknown price."""
    output = reserved_output_tokens(requirements.max_output_tokens, candidate.max_output_tokens)
    return cost_micros(candidate.price, input_tokens=requirements.prompt_tokens, output_tokens=output)
