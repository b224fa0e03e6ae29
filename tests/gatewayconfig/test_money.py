"""Amounts in dollars (issue 47 point 3, SPEC §7.4): a key's `budget_usd` and a model's `price` per
million tokens (`input_usd`, ...) are written in dollars, stored as micros and dumped back in dollars;
the `*_micros` names are still read."""

import pytest
import yaml
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog.models import CatalogEntry
from pools.models import GatewayKey
from tests.gatewayconfig.test_document import base, dump, environment, load, load_fails, writes  # noqa: F401 (environment: autouse)

pytestmark = pytest.mark.django_db


def _dollars() -> dict:
    doc = base()
    doc["keys"][0].pop("budget_micros")
    doc["keys"][0]["budget_usd"] = "50.00"
    doc["pools"][0]["assignments"][0]["models"][0]["price"] = {"input_usd": "1.25", "output_usd": 10}
    return doc


def test_dollars_are_stored_as_micros_and_dumped_back_in_dollars(tmp_path):
    load(tmp_path, _dollars())
    assert GatewayKey.objects.get(name="ci").budget_micros == 50_000_000
    gpt5 = CatalogEntry.objects.get(model="gpt-5")
    assert (gpt5.input_per_mtok_micros, gpt5.output_per_mtok_micros) == (1_250_000, 10_000_000)
    dumped = yaml.safe_load(dump())
    assert dumped["keys"][0]["budget_usd"] == "50.00" and "budget_micros" not in dumped["keys"][0]
    assert dumped["pools"][0]["assignments"][0]["models"][0]["price"] == {
        "input_usd": "1.25",
        "output_usd": "10.00",
    }


def test_the_dump_reloads_without_a_write(tmp_path):
    load(tmp_path, _dollars())
    with CaptureQueriesContext(connection) as ctx:
        load(tmp_path, yaml.safe_load(dump()))
    assert writes(ctx) == []


def test_the_micros_names_are_still_read(tmp_path):
    load(tmp_path, base())  # budget_micros: 5000000, price in *_per_mtok_micros
    assert GatewayKey.objects.get(name="ci").budget_micros == 5_000_000
    assert CatalogEntry.objects.get(model="gpt-5").input_per_mtok_micros == 1_250_000


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("-1", "keys[0].budget_usd: '-1': expected a non-negative amount with at most six decimals"),
        (
            "0.0000001",
            "keys[0].budget_usd: '0.0000001': expected a non-negative amount with at most six decimals",
        ),
        ("lots", "keys[0].budget_usd: 'lots' is not an amount in dollars, e.g. \"50.00\""),
    ],
)
def test_an_amount_that_is_not_dollars_is_refused(tmp_path, value, error):
    doc = _dollars()
    doc["keys"][0]["budget_usd"] = value
    assert error in load_fails(tmp_path, doc)


def test_dollars_and_micros_for_one_amount_are_refused(tmp_path):
    doc = _dollars()
    doc["keys"][0]["budget_micros"] = 5
    assert "keys[0].budget_micros: give either budget_usd or budget_micros, not both" in load_fails(
        tmp_path, doc
    )
