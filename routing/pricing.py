"""Integer cost in micros (SPEC §5.3 budget, §7.3 ledger).

Contract: the one place cost is computed, for the pre-dispatch reservation (estimated prompt
tokens + max output tokens) and for the recorded cost of an attempt (usage tokens). Prices are
micros per million tokens; the result is rounded up to a whole micro so a reservation never
under-holds. An unknown price (either side) gives None, never 0: unknown cost is recorded as NULL.
"""

from routing.types import Price, PriceSource

TOKENS_PER_PRICE_UNIT = 1_000_000


def cost_micros(price: Price, *, input_tokens: int, output_tokens: int) -> int | None:
    if price.input_per_mtok_micros is None or price.output_per_mtok_micros is None:
        return None
    scaled = price.input_per_mtok_micros * input_tokens + price.output_per_mtok_micros * output_tokens
    return -(-scaled // TOKENS_PER_PRICE_UNIT)  # ceiling division in exact integers


def dollars(micros: int) -> str:
    """`1250000` -> `$1.25`, exactly (integer arithmetic, no float rounding)."""
    whole, frac = divmod(micros, 1_000_000)
    cents = f"{frac:06d}".rstrip("0").ljust(2, "0")
    return f"${whole:,}.{cents}"


def price_text(price: Price) -> str:
    """`bundled $1.25 / $10.00 per Mtok`, or `unknown` (never `$0`)."""
    if price.provenance is PriceSource.UNKNOWN:
        return "unknown"
    assert price.input_per_mtok_micros is not None and price.output_per_mtok_micros is not None
    return (
        f"{price.provenance} {dollars(price.input_per_mtok_micros)} / "
        f"{dollars(price.output_per_mtok_micros)} per Mtok"
    )
