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


def test_the_ui_details_show_the_finished_rows_credits_in_money() -> None:
    from datetime import UTC, datetime

    from playline.contract import ChunkStats, DatasetRunState
    from playline.workflows.status import dataset_current_details

    stats = ChunkStats(
        credits=150,
        spend={"by_provider": {"acme": 100, "firmo": 50}},
        prices={k: v for k, v in PRICES.items() if k != "eurodata"},
    )
    state = DatasetRunState(
        dataset="leads", rows_total=10, rows_done=10, chunks_in_flight=0, stats=stats
    )
    text = dataset_current_details(state, datetime(2026, 1, 2, tzinfo=UTC))
    assert "- credits: 150 (≈ 2.20 USD for the finished rows)" in text
