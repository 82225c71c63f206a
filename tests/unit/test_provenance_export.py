"""How a cell's provenance reads in an export: its source, credits, time and miss."""

from __future__ import annotations

from typing import Any

import pytest

from playline.stores.provenance_cells import (
    credits_text,
    csv_columns,
    date_utc,
    iso_utc,
    provenance_cells,
    source_text,
    with_provenance_cells,
)

DAY = 1_796_378_400.0  # 2026-12-04T10:00:00Z


def test_the_header_puts_each_computed_column_with_its_provenance_after_the_inputs() -> None:
    assert csv_columns(["id", "name", "email", "phone"], ["phone", "email"]) == [
        "id",
        "name",
        "email",
        "email__source",
        "email__credits",
        "email__fetched_at",
        "email__miss",
        "phone",
        "phone__source",
        "phone__credits",
        "phone__fetched_at",
        "phone__miss",
    ]
    assert csv_columns(["id", "email"], []) == ["id", "email"]


@pytest.mark.parametrize(
    ("value", "text"),
    [(1.5, "1.5"), (0, "0"), (0.0, "0"), (2.0, "2"), (3, "3"), (0.1 + 0.2, "0.30000000000000004"),
     (1e-7, "0.0000001"), (1e21, "1000000000000000000000"), (None, ""), (True, "")],
)  # fmt: skip
def test_credits_are_plain_numbers(value: Any, text: str) -> None:
    assert credits_text(value) == text


def test_times_are_utc() -> None:
    assert iso_utc(DAY) == "2026-12-04T10:00:00Z"
    assert iso_utc(DAY + 0.75) == "2026-12-04T10:00:00Z"
    assert date_utc(DAY) == "2026-12-04"
    assert iso_utc(None) == date_utc(None) == ""


@pytest.mark.parametrize(
    ("provenance", "text"),
    [
        ({"tool": "mailfox_email", "provider": "mailfox", "receipt": "paid", "receipt_at": DAY},
         "mailfox_email via mailfox, paid"),
        ({"tool": "mailfox_email", "provider": "mailfox", "receipt": "reused", "receipt_at": DAY},
         "mailfox_email via mailfox, reused 2026-12-04"),
        ({"tool": "mailfox_email", "provider": "mailfox", "receipt": "reused", "receipt_at": None},
         "mailfox_email via mailfox, reused"),
        ({"tool": "mailfox_email", "provider": "mailfox", "receipt": "shared", "receipt_at": DAY},
         "mailfox_email via mailfox, shared"),
        ({"tool": "mailfox_email", "provider": None, "receipt": None}, "mailfox_email"),
        ({"tool": None, "provider": "mailfox", "receipt": "paid"}, ""),
        ({}, ""),
    ],
)  # fmt: skip
def test_the_source_names_tool_provider_and_receipt(provenance: dict[str, Any], text: str) -> None:
    assert source_text(provenance) == text


def test_a_cell_with_a_value_and_one_without() -> None:
    paid = {"tool": "t", "provider": "p", "receipt": "paid", "credits": 1.5, "fetched_at": DAY}
    assert provenance_cells("email", paid) == {
        "email__source": "t via p, paid",
        "email__credits": "1.5",
        "email__fetched_at": "2026-12-04T10:00:00Z",
        "email__miss": "",
    }
    missed = {"tool": None, "credits": 2, "miss": "p: no_match", "fetched_at": None}
    assert provenance_cells("email", missed) == {
        "email__source": "",
        "email__credits": "2",
        "email__fetched_at": "",
        "email__miss": "p: no_match",
    }
    assert set(provenance_cells("email", None).values()) == {""}


def test_a_row_gains_the_cells_of_every_computed_column() -> None:
    row = with_provenance_cells(
        {"id": "a", "email": "x", "phone": None},
        ["email", "phone"],
        {"email": {"tool": "t", "provider": "p", "receipt": "paid", "credits": 1}},
    )
    assert row["id"] == "a" and row["email"] == "x"
    assert row["email__source"] == "t via p, paid" and row["email__credits"] == "1"
    assert row["phone__source"] == row["phone__credits"] == row["phone__miss"] == ""
    assert with_provenance_cells({"id": "a"}, ["email"], None)["email__credits"] == ""
