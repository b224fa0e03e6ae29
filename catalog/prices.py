"""The bundled list-price table (`catalog/prices.yaml`) and the one rule that picks a route's price
(SPEC §3, issue 20 point 2).

Contract: `route_price(model, input, output, cached_input=, cache_write=)` is the price of an
(assignment, model): the catalog entry's configured price when it declares any rate (configured
always wins, even half-declared: a missing input or output rate then stays unknown, a missing cached
rate prices those tokens at the input rate; never the bundled table's cached rate beside another
seller's input rate), else the bundled list price of the model, else unknown.
Unknown is never zero. The table is read once per process from the file beside this module; the
selectors call this while building the cached routing snapshot, so it costs no query and no file
read on the request path, and the pure routing core never sees where a price came from except
through `Price.provenance`.
"""

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from routing.policy.types import Price, PriceSource

TABLE_PATH = Path(__file__).with_name("prices.yaml")
_DATE_SUFFIX = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8})$")


@dataclass(frozen=True, slots=True)
class BundledTable:
    date: str
    sources: dict[str, str]
    prices: dict[str, Price]


@cache
def bundled_table() -> BundledTable:
    data = yaml.safe_load(TABLE_PATH.read_text(encoding="utf-8"))
    prices = {}
    for model, row in data["models"].items():
        rates = [row["input"], row["output"], row.get("cached_input"), row.get("cache_write")]
        if not all(isinstance(r, int) for r in rates[:2]) or not all(
            r is None or isinstance(r, int) for r in rates[2:]
        ):
            raise ValueError(f"{TABLE_PATH.name}: models.{model}: prices are integer micros")
        if any(r is not None and r < 0 for r in rates):
            raise ValueError(f"{TABLE_PATH.name}: models.{model}: prices are not negative")
        prices[model] = Price(rates[0], rates[1], PriceSource.BUNDLED, rates[2], rates[3])
    return BundledTable(date=str(data["date"]), sources=dict(data["sources"]), prices=prices)


def bundled_price(model: str) -> Price | None:
    """The list price of `model`, matched exactly, then without a `vendor/` prefix, then without a
    date suffix; None when the table does not name it."""
    prices = bundled_table().prices
    candidates = [model]
    if "/" in model:
        candidates.append(model.rsplit("/", 1)[1])
    candidates.extend(_DATE_SUFFIX.sub("", m) for m in list(candidates))
    for name in candidates:
        if name in prices:
            return prices[name]
    return None


def route_price(
    model: str,
    input_per_mtok_micros: int | None,
    output_per_mtok_micros: int | None,
    *,
    cached_input: int | None = None,
    cache_write: int | None = None,
) -> Price:
    configured = (input_per_mtok_micros, output_per_mtok_micros, cached_input, cache_write)
    if any(rate is not None for rate in configured):
        return Price(*configured[:2], PriceSource.CONFIGURED, *configured[2:])
    return bundled_price(model) or Price(source=PriceSource.UNKNOWN)
