"""Credits shown as money where the catalog states a credit's price."""

from __future__ import annotations

from playline.calls.catalog import Catalog
from playline.money import money_text, prices_of

PRICES = {
    "acme": {"credit_price": 0.012, "currency": "USD"},
    "firmo": {"credit_price": 0.02, "currency": "USD"},
    "eurodata": {"credit_price": 0.5, "currency": "EUR"},
}


def test_credits_become_money_per_currency_naming_providers_without_a_price() -> None:
    assert money_text({"acme": 100, "firmo": 50}, PRICES) == "≈ 2.20 USD"
    assert money_text({"acme": 100, "eurodata": 3}, PRICES) == "≈ 1.50 EUR + 1.20 USD"
    assert money_text({"acme": 100, "nopay": 7}, PRICES) == "≈ 1.20 USD (no price for nopay)"
    assert money_text({"nopay": 7}, PRICES) is None
    assert money_text({"acme": 100, "nopay": 0}, PRICES) == "≈ 1.20 USD"  # nothing unpriced spent


def test_prices_come_from_the_catalog_for_the_providers_used() -> None:
    catalog = Catalog.model_validate(
        {
            "providers": {
                "acme": {"base_url": "http://a", "credit_price": 0.012},
                "firmo": {"base_url": "http://f", "credit_price": 2, "currency": "EUR"},
                "free": {"base_url": "http://x"},
            },
            "tools": {},
        }
    )
    assert prices_of(catalog, ["acme", "free", "firmo", "unknown"]) == {
        "acme": {"credit_price": 0.012, "currency": "USD"},
        "firmo": {"credit_price": 2.0, "currency": "EUR"},
    }
