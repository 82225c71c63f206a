"""Each computed cell's provenance, on a real SQLite file and a real PostgreSQL schema:
kept with the run's manifest rows (a rerun keeps its own), read back page by page,
and exported next to the values only when asked."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from playline.config import Settings
from playline.datasets import export_run
from playline.stores.backends import Stores, open_stores
from playline.stores.sheet import RowResult, SheetStore
from playline.stores.sheet_ledger import SCHEMA, SheetLedger
from tests.old_schemas import old_sqlite_sheet
from tests.pg import pg_schema

COLUMNS = ["id", "name"]
DAY = 1_796_378_400.0  # 2026-12-04T10:00:00Z

PAID: dict[str, Any] = {
    "tool": "mailfox_email",
    "provider": "mailfox",
    "receipt": "paid",
    "receipt_at": DAY,
    "credits": 1.5,
    "credits_source": "provider",
    "fetched_at": DAY,
    "miss": None,
    "steps": None,
}
REUSED: dict[str, Any] = {
    **PAID,
    "receipt": "reused",
    "credits": 0,
    "credits_source": None,
    "fetched_at": DAY - 86_400,
    "receipt_at": DAY - 86_400,
}
MISSED: dict[str, Any] = {
    "tool": None,
    "provider": None,
    "receipt": None,
    "receipt_at": None,
    "credits": 2,
    "credits_source": "rule",
    "fetched_at": None,
    "miss": "=mailfox: no_match; prospectr: invalid (status risky)",
    "steps": [
        {"tool": "mailfox_email", "provider": "mailfox", "outcome": "no_match",
         "reason": None, "credits": 1.0, "receipt": "paid"},
        {"tool": "prospectr_email", "provider": "prospectr", "outcome": "invalid",
         "reason": "status risky", "credits": 1.0, "receipt": "paid"},
    ],
}  # fmt: skip


@pytest.fixture
def sheet(stores: Stores) -> SheetStore:
    return stores.sheet


async def prepared_run(sheet: SheetStore, run_ref: str, rows: list[list[str]] | None) -> None:
    """A run of the ``people`` dataset computing ``email``, over ``rows`` stored as the
    source first (``None``: the source is stored already)."""
    if rows is not None:
        await sheet.put_source("src@1", COLUMNS, rows)
    await sheet.prepare_run(
        run_ref,
        source_id="src@1",
        dataset="people",
        key_fields=["id"],
        mode="upsert",
        computed_columns=["email"],
    )


async def run_with_provenance(sheet: SheetStore, run_ref: str = "run1") -> None:
    """Three rows: a paid email, a reused one, and one no provider found."""
    await prepared_run(sheet, run_ref, [["a", "Ann"], ["b", "Bo"], ["c", "Cy"]])
    await sheet.write_results(
        run_ref,
        [
            RowResult(0, "a", {"email": "ann@x"}, "ok", provenance={"email": PAID}),
            RowResult(1, "b", {"email": "bo@x"}, "ok", provenance={"email": REUSED}),
            RowResult(2, "c", {"email": None}, "ok", provenance={"email": MISSED}),
        ],
    )


async def test_provenance_is_kept_with_the_run_and_read_back(sheet: SheetStore) -> None:
    await run_with_provenance(sheet)
    assert await sheet.read_provenance("run1", 0, 3) == [
        (0, {"email": PAID}),
        (1, {"email": REUSED}),
        (2, {"email": MISSED}),
    ]
    assert await sheet.read_provenance("run1", 1, 2) == [(1, {"email": REUSED})]
    rows = await sheet.read_run_rows("run1", 0, 3)
    assert [r.provenance for r in rows] == [{"email": PAID}, {"email": REUSED}, {"email": MISSED}]
    # A result written again without provenance (a retried write) keeps what was there.
    await sheet.write_results("run1", [RowResult(0, "a", {}, "ok")])
    assert (await sheet.read_run_rows("run1", 0, 1))[0].provenance == {"email": PAID}


async def test_rows_without_provenance_are_left_out(sheet: SheetStore) -> None:
    await prepared_run(sheet, "run1", [["a", "Ann"], ["b", "Bo"]])
    await sheet.write_results("run1", [RowResult(1, "b", {"email": "x"}, "ok")])
    assert await sheet.read_provenance("run1", 0, 2) == []
    assert [r.provenance for r in await sheet.read_run_rows("run1", 0, 2)] == [None, None]


async def test_a_rerun_of_the_same_dataset_keeps_its_own_provenance(sheet: SheetStore) -> None:
    await run_with_provenance(sheet, "run1")
    await prepared_run(sheet, "run2", None)
    again = {**PAID, "receipt": "reused", "credits": 0}
    await sheet.write_results(
        "run2", [RowResult(0, "a", {"email": "ann@x"}, "ok", provenance={"email": again})]
    )
    assert await sheet.read_provenance("run2", 0, 3) == [(0, {"email": again})]
    assert (await sheet.read_provenance("run1", 0, 1)) == [(0, {"email": PAID})]
    [first] = await sheet.read_run_rows("run2", 0, 1)
    assert first.provenance == {"email": again}


async def test_csv_export_with_provenance_adds_four_columns_per_computed_column(
    sheet: SheetStore, tmp_path: Path
) -> None:
    await run_with_provenance(sheet)
    path = tmp_path / "out.csv"
    assert await export_run(sheet, "run1", str(path), provenance=True) == 3
    with path.open(newline="", encoding="utf-8") as handle:
        lines = list(csv.reader(handle))
    assert lines[0] == [
        "id",
        "name",
        "email",
        "email__source",
        "email__credits",
        "email__fetched_at",
        "email__miss",
    ]
    assert lines[1] == [
        "a",
        "Ann",
        "ann@x",
        "mailfox_email via mailfox, paid",
        "1.5",
        "2026-12-04T10:00:00Z",
        "",
    ]
    assert lines[2] == [
        "b",
        "Bo",
        "bo@x",
        "mailfox_email via mailfox, reused 2026-12-03",
        "0",
        "2026-12-03T10:00:00Z",
        "",
    ]
    # The miss text is a cell like any other: a leading "=" is made inert.
    assert lines[3] == [
        "c",
        "Cy",
        "",
        "",
        "2",
        "",
        "'=mailfox: no_match; prospectr: invalid (status risky)",
    ]


async def test_jsonl_export_with_provenance_adds_one_key_per_row(
    sheet: SheetStore, tmp_path: Path
) -> None:
    await run_with_provenance(sheet)
    path = tmp_path / "out.jsonl"
    assert await export_run(sheet, "run1", str(path), "jsonl", provenance=True) == 3
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["_provenance"] for r in rows] == [
        {"email": PAID},
        {"email": REUSED},
        {"email": MISSED},
    ]
    assert rows[0] == {"id": "a", "name": "Ann", "email": "ann@x", "_provenance": {"email": PAID}}


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
async def test_export_without_provenance_is_unchanged(
    sheet: SheetStore, tmp_path: Path, fmt: str
) -> None:
    await run_with_provenance(sheet)
    path = tmp_path / f"out.{fmt}"
    await export_run(sheet, "run1", str(path), fmt)
    if fmt == "csv":
        assert path.read_bytes() == b"id,name,email\r\na,Ann,ann@x\r\nb,Bo,bo@x\r\nc,Cy,\r\n"
    else:
        assert path.read_text().splitlines() == [
            '{"email": "ann@x", "id": "a", "name": "Ann"}',
            '{"email": "bo@x", "id": "b", "name": "Bo"}',
            '{"email": null, "id": "c", "name": "Cy"}',
        ]


async def test_a_run_without_provenance_exports_empty_provenance_columns_if_asked(
    sheet: SheetStore, tmp_path: Path
) -> None:
    """A run recorded before provenance existed (none in any row) exports its plain
    columns; JSONL rows get an empty ``_provenance``."""
    await prepared_run(sheet, "run1", [["a", "Ann"]])
    await sheet.write_results("run1", [RowResult(0, "a", {"email": "x"}, "ok")])
    path = tmp_path / "out.csv"
    await export_run(sheet, "run1", str(path), provenance=True)
    assert path.read_bytes() == b"id,name,email\r\na,Ann,x\r\n"
    jsonl = tmp_path / "out.jsonl"
    await export_run(sheet, "run1", str(jsonl), "jsonl", provenance=True)
    assert json.loads(jsonl.read_text())["_provenance"] == {}


async def test_a_sqlite_sheet_of_an_older_schema_gains_provenance(tmp_path: Path) -> None:
    """A file from before provenance is read (by a client, which does not migrate) with
    none, and a worker's open migrates it."""
    path = tmp_path / "sheet.db"
    old_sqlite_sheet(path, 2)
    older = SheetLedger.in_file(path, create=False)
    try:
        await run_rows_of_an_old_file(older)
    finally:
        await older.close()
    store = SheetLedger.in_file(path)
    try:
        await run_with_provenance(store, "run2")
        assert await store.read_provenance("run2", 0, 1) == [(0, {"email": PAID})]
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA.latest


async def run_rows_of_an_old_file(store: SheetLedger) -> None:
    assert await store.read_provenance("nope", 0, 10) == []
    assert await store.read_run_rows("nope", 0, 10) == []


async def test_a_postgres_store_of_an_older_sheet_schema_gains_provenance() -> None:
    """A client reading a schema older workers migrated sees no provenance; a worker
    writing results brings the sheet's schema up to date first (idempotently)."""
    async with pg_schema() as url:
        settings = Settings(store_url=url)
        async with await open_stores(settings, create=True) as worker:
            await worker.sheet.put_source("src@1", COLUMNS, [["a", "Ann"]])
            async with await open_stores(settings, create=False) as client:
                assert await client.sheet.read_provenance("run1", 0, 1) == []
            await run_with_provenance(worker.sheet)
            assert await worker.sheet.read_provenance("run1", 0, 1) == [(0, {"email": PAID})]
        async with await open_stores(settings, create=False) as client:
            [row] = await client.sheet.read_run_rows("run1", 0, 1)
            assert row.provenance == {"email": PAID}
