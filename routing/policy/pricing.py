"""Integer cost in micros (SPEC §5.3 budget, §7.3 ledger).

Contract: the one place cost is computed, for the pre-dispatch reservation (estimated prompt
tokens + max output tokens) and for the recorded cost of an attempt (usage tokens). Prices are
micros per million tokens; the result is rounded up to a whole micro so a reservation never
under-holds. An unknown price (either side) gives None, never 0: unknown cost is recorded as NULL.

Cached input (SPEC §7.3): `input_tokens` is every input token the provider counted, cached or not;
`cached_read_tokens` and `cached_write_tokens` are the parts of it read from and written to the
provider's prompt cache. The uncached rest is priced at the input rate, reads at the cached-input
rate and writes at the cache-write rate; a cached rate the price does not have is the input rate
(never a guessed discount). The parts are untrusted: together they never count more than
`input_tokens`, so a bogus report cannot price more input than was counted.
"""

from routing.policy.types import Price, PriceSource

TOKENS_PER_PRICE_UNIT = 1_000_000


def cost_micros(
    price: Price,
    *,
    input_tokens: int,
    output_tokens: int,
    cached_read_tokens: int = 0,
    cached_write_tokens: int = 0,
) -> int | None:
    rate = price.input_per_mtok_micros
    if rate is None or price.output_per_mtok_micros is None:
        return None
    read = min(cached_read_tokens, input_tokens)
    write = min(cached_write_tokens, input_tokens - read)
    read_rate = rate if price.cached_input_per_mtok_micros is None else price.cached_input_per_mtok_micros
    write_rate = rate if price.cache_write_per_mtok_micros is None else price.cache_write_per_mtok_micros
    scaled = (
        rate * (input_tokens - read - write)
        + read_rate * read
        + write_rate * write
        + price.output_per_mtok_micros * output_tokens
    )
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
