"""Cached input priced at the cached rates (routing.policy.pricing, SPEC §7.3): `input_tokens` counts every
input token, its cached parts are priced at their own rates, and a rate the price does not have is the
input rate."""

import pytest

from routing.policy.pricing import cost_micros
from routing.policy.types import Price, PriceSource

# $3 input, $15 output, $0.30 cache read, $3.75 cache write per million tokens (Anthropic-like).
FULL = Price(3_000_000, 15_000_000, PriceSource.BUNDLED, 300_000, 3_750_000)
M = 1_000_000


@pytest.mark.parametrize(
    ("price", "read", "write", "expected"),
    [
        # 1M input of which 600k read and 200k written, 100k output:
        # 200k * $3 + 600k * $0.30 + 200k * $3.75 + 100k * $15 = 0.6 + 0.18 + 0.75 + 1.5 dollars.
        (FULL, 600_000, 200_000, 600_000 + 180_000 + 750_000 + 1_500_000),
        (FULL, 0, 0, 3_000_000 + 1_500_000),  # nothing cached: the plain input rate
        (FULL, M, 0, 300_000 + 1_500_000),  # all read from the cache
        # Unknown cached rates: those tokens at the input rate (never a guessed discount, never free).
        (Price(3_000_000, 15_000_000), 600_000, 200_000, 3_000_000 + 1_500_000),
        (
            Price(3_000_000, 15_000_000, cached_input_per_mtok_micros=300_000),
            600_000,
            200_000,
            200_000 * 3 + 180_000 + 200_000 * 3 + 1_500_000,
        ),
        # An explicit 0 is a real free cache read, not unknown.
        (Price(3_000_000, 15_000_000, cached_input_per_mtok_micros=0), M, 0, 1_500_000),
        # Cached rates do not make an unknown input or output price known.
        (Price(None, 15_000_000, cached_input_per_mtok_micros=300_000), M, 0, None),
    ],
)
def test_cached_input_is_priced_at_the_cached_rates(price, read, write, expected):
    found = cost_micros(
        price, input_tokens=M, output_tokens=100_000, cached_read_tokens=read, cached_write_tokens=write
    )
    assert found == expected


def test_cached_parts_never_price_more_input_than_was_counted():
    """Untrusted counts: reads and writes beyond input_tokens are cut to it (a bogus report can neither
    bill more input than counted nor make the uncached part negative)."""
    assert cost_micros(FULL, input_tokens=M, output_tokens=0, cached_read_tokens=5 * M) == 300_000
    assert cost_micros(
        FULL, input_tokens=M, output_tokens=0, cached_read_tokens=M, cached_write_tokens=M
    ) == (300_000)
    assert cost_micros(FULL, input_tokens=M, output_tokens=0, cached_write_tokens=2 * M) == 3_750_000


def test_the_reservation_estimate_is_unchanged_by_cached_rates():
    """The pre-dispatch reservation names no cached tokens: it holds the full input rate."""
    assert cost_micros(FULL, input_tokens=M, output_tokens=0) == 3_000_000
