"""The bundled list-price table (issue 20 point 2, SPEC §3): where a price comes from (configured,
bundled, unknown), that a configured price always wins, that a model the table does not name stays
unknown (never zero), and that the router, routing_explain and the panel all say which it is."""

import re
from io import StringIO

import pytest
import yaml
from django.core.management import call_command
from django.utils import timezone

from catalog.models import Provenance
from catalog.prices import TABLE_PATH, bundled_price, bundled_table, route_price
from routing.policy.pricing import cost_micros, dollars, price_text
from routing.policy.types import Price, PriceSource, RouteClass
from routing.selectors import config_cache_clear, routing_view_load
from tests.admin.conftest import upstreams_url
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory

RAW = "sk-gw-prices-test-key-000000000000"


def test_the_table_states_its_date_and_sources_and_holds_integer_micros_per_model():
    raw = yaml.safe_load(TABLE_PATH.read_text())
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", raw["date"])
    assert {"openai", "anthropic", "google"} <= set(raw["sources"])
    assert all(url.startswith("https://") for url in raw["sources"].values())
    table = bundled_table()
    providers = {row["provider"] for row in raw["models"].values()}
    assert providers == {"openai", "anthropic", "google"}
    for model, price in table.prices.items():
        assert isinstance(price.input_per_mtok_micros, int) and isinstance(price.output_per_mtok_micros, int)
        assert 0 < price.input_per_mtok_micros <= price.output_per_mtok_micros, model
        assert price.provenance is PriceSource.BUNDLED


def test_lookups_match_exactly_then_without_a_vendor_prefix_then_without_a_date_suffix():
    gpt5 = bundled_price("gpt-5")
    assert gpt5 == Price(1_250_000, 10_000_000, PriceSource.BUNDLED, cached_input_per_mtok_micros=125_000)
    assert bundled_price("openai/gpt-5") == gpt5  # OpenRouter's id
    assert bundled_price("gpt-5-2025-08-07") == gpt5
    assert bundled_price("claude-haiku-4-5-20251001") == bundled_price("claude-haiku-4-5")
    assert bundled_price("gpt-5-mini") != gpt5  # no prefix matching: a sibling is another model
    assert bundled_price("house-model-1") is None
    assert bundled_price("gpt-5x") is None


def test_a_configured_price_always_wins_and_an_unnamed_model_stays_unknown():
    assert route_price("gpt-5", 1, 2) == Price(1, 2, PriceSource.CONFIGURED)
    # An explicit zero is a real (free) configured price, not unknown.
    assert route_price("gpt-5", 0, 0).provenance is PriceSource.CONFIGURED
    # Half-declared: the operator's configuration still wins, and the missing side stays unknown.
    half = route_price("gpt-5", 1_000_000, None)
    assert half.provenance is PriceSource.UNKNOWN
    assert cost_micros(half, input_tokens=10, output_tokens=10) is None
    assert route_price("gpt-5", None, None).provenance is PriceSource.BUNDLED
    unknown = route_price("house-model-1", None, None)
    assert unknown.provenance is PriceSource.UNKNOWN
    assert cost_micros(unknown, input_tokens=10, output_tokens=10) is None  # never 0


def test_the_table_has_the_cached_rates_each_provider_publishes():
    for model, price in bundled_table().prices.items():
        # Every model it lists has a cached-input rate, cheaper than its input rate.
        assert price.cached_input_per_mtok_micros is not None, model
        assert price.cached_input_per_mtok_micros < price.input_per_mtok_micros, model  # type: ignore[operator]
    haiku = bundled_price("claude-haiku-4-5")
    assert haiku is not None
    # Anthropic: a cache read is 0.1x the input rate, a (5-minute) cache write 1.25x.
    assert (haiku.cached_input_per_mtok_micros, haiku.cache_write_per_mtok_micros) == (100_000, 1_250_000)
    assert bundled_price("gpt-4o-mini") == Price(150_000, 600_000, PriceSource.BUNDLED, 75_000)
    assert bundled_price("gpt-5") is not None and bundled_price("gpt-5").cache_write_per_mtok_micros is None  # type: ignore[union-attr]


def test_a_configured_price_never_borrows_the_bundled_cached_rate():
    configured = route_price("gpt-5", 2_000_000, 8_000_000)
    assert configured.cached_input_per_mtok_micros is None  # not gpt-5's bundled $0.125
    # ... so its cached tokens are priced at its own input rate (routing.policy.pricing).
    assert cost_micros(configured, input_tokens=10**6, output_tokens=0, cached_read_tokens=10**6) == 2_000_000
    full = route_price("gpt-5", 2_000_000, 8_000_000, cached_input=200_000, cache_write=2_500_000)
    assert full == Price(2_000_000, 8_000_000, PriceSource.CONFIGURED, 200_000, 2_500_000)
    # A cached rate alone is a configured price too, its input and output unknown: nothing is guessed.
    assert route_price("gpt-5", None, None, cached_input=1).provenance is PriceSource.UNKNOWN


def test_price_text_is_exact_and_says_unknown_rather_than_zero():
    assert dollars(1_250_000) == "$1.25"
    assert dollars(75_000) == "$0.075"
    assert dollars(15_000_000) == "$15.00"
    assert price_text(Price(1_250_000, 10_000_000, PriceSource.BUNDLED)) == "bundled $1.25 / $10.00 per Mtok"
    assert price_text(Price(0, 0)) == "configured $0.00 / $0.00 per Mtok"
    assert price_text(Price()) == "unknown"


@pytest.fixture
def priced_pool(db):
    pool = PoolFactory(name="main")
    a = AssignmentFactory(pool=pool, name="acct-a", tier=0)
    CatalogEntryFactory(
        assignment=a,
        model="gpt-5",
        input_per_mtok_micros=1,
        output_per_mtok_micros=2,
        cached_input_per_mtok_micros=3,
        cache_write_per_mtok_micros=4,
    )
    CatalogEntryFactory(assignment=a, model="gpt-5-mini", provenance=Provenance.OBSERVED)
    CatalogEntryFactory(assignment=a, model="house-model-1")
    GatewayKeyFactory(name="ci", raw_key=RAW, pools=[pool])
    config_cache_clear()
    return pool


def test_the_router_prices_each_candidate_with_its_provenance(priced_pool):
    view, _ = routing_view_load(pool_ids=(priced_pool.pk,), route_class=RouteClass.HTTP, now=timezone.now())
    price = {model: candidates[0].price for model, candidates in view.routes.items()}
    assert price["gpt-5"] == Price(1, 2, PriceSource.CONFIGURED, 3, 4)  # the entry's cached rates too
    assert price["gpt-5-mini"] == bundled_price("gpt-5-mini")
    assert price["house-model-1"].provenance is PriceSource.UNKNOWN


def test_routing_explain_prints_each_candidates_price_and_where_it_comes_from(priced_pool):
    out = StringIO()
    call_command("routing_explain", key="ci", model="gpt-5-mini", stdout=out)
    assert "acct-a / gpt-5-mini: bundled $0.25 / $2.00 per Mtok" in out.getvalue()
    out = StringIO()
    call_command("routing_explain", key="ci", model="house-model-1", stdout=out)
    assert "acct-a / house-model-1: unknown" in out.getvalue()
    out = StringIO()
    call_command("routing_explain", key="ci", model="gpt-5", stdout=out)
    assert "acct-a / gpt-5: configured $0.000001 / $0.000002 per Mtok" in out.getvalue()


PANEL_EXPECTED = (("gpt-5", "configured"), ("gpt-5-mini", "bundled"), ("house-model-1", "unknown"))


def test_the_panel_shows_each_models_price_provenance(admin_client, priced_pool):
    html = admin_client.get(upstreams_url()).content.decode()
    for model, provenance in PANEL_EXPECTED:
        row = html[html.index(f'<tr data-model="{model}">') :]
        row = row[: row.index("</tr>")]
        assert f'data-price-provenance="{provenance}"' in row, model
        if provenance == "unknown":
            assert "price unknown" in row and "$0" not in row
