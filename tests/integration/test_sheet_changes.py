"""What a re-run changed, and per-cell metadata, on a real SQLite file and a real
PostgreSQL schema: the merge rules, the counts, the retried write, the old stores."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from playline.config import Settings
from playline.stores.backends import open_stores
from playline.stores.sheet import RowResult, SheetStore
from playline.stores.sheet_changes import change_kind, merge_changes
from playline.stores.sheet_ledger import SCHEMA, SheetLedger
from tests.old_schemas import old_postgres_sheet, old_sqlite_sheet
from tests.pg import pg_schema

COLUMNS = ["id", "name"]
IDS = ("a", "b", "c", "d", "e")


@pytest.fixture
def sheet(stores: Any) -> SheetStore:
    return stores.sheet


async def _run(sheet: SheetStore, run_ref: str, ids: tuple[str, ...] = IDS) -> None:
    source = f"src@{'-'.join(ids)}"
    await sheet.put_source(source, COLUMNS, [[i, f"name-{i}"] for i in ids])
    await sheet.prepare_run(
        run_ref,
        source_id=source,
        dataset="people",
        key_fields=["id"],
        mode="upsert",
        computed_columns=["email", "title"],
    )


def _ok(seq: int, key: str, cells: dict[str, Any], meta: dict[str, Any] | None = None) -> Any:
    return RowResult(seq, key, cells, "ok", cell_meta=meta)


async def _changes(sheet: SheetStore, run_ref: str) -> dict[str, dict[str, Any]]:
    return {key: found for _, key, found in await sheet.read_changes(run_ref, 0, 100)}


def test_the_kinds_of_change_follow_presence() -> None:
    assert change_kind("a@x", "b@x") == "changed"
    assert change_kind("a@x", "a@x") is None
    assert change_kind(None, "a@x") == "appeared"
    assert change_kind("", ["x"]) == "appeared"
    assert change_kind({"k": 1}, {}) == "disappeared"
    assert change_kind([], None) is None  # empty either way: no change
    # A column new to the row is not compared; a second write of the run keeps "old".
    changes, compared = merge_changes({"email": "a"}, {"email": "b", "title": "t"}, None, None)
    assert changes == {"email": {"old": "a", "new": "b"}}
    assert compared == {"email": "changed", "title": "first"}
    again = merge_changes(
        {"email": "b", "title": "t"}, {"email": "a", "title": "u"}, *[changes, compared]
    )
    assert again == ({}, {"email": "same", "title": "first"})


async def test_cell_meta_merges_column_by_column(sheet: SheetStore) -> None:
    await _run(sheet, "run1")
    at1 = {"at": 10.0, "in": "d1"}
    await sheet.write_results(
        "run1",
        [_ok(0, "a", {"email": "a@x", "title": "CEO"}, {"email": at1, "title": at1})],
    )
    rows = await sheet.read_run_rows("run1", 0, 2)
    assert rows[0].cell_meta == {"email": at1, "title": at1}
    assert rows[1].cell_meta == {}  # nothing computed yet
    # The next run recomputes the email only: the title keeps its entry.
    await _run(sheet, "run2")
    at2 = {"at": 20.0, "in": "d2"}
    await sheet.write_results("run2", [_ok(0, "a", {"email": "a2@x"}, {"email": at2})])
    (row,) = await sheet.read_run_rows("run2", 0, 1)
    assert row.cell_meta == {"email": at2, "title": at1}
    assert row.data["title"] == "CEO" and row.data["email"] == "a2@x"
    # A result without cell metadata leaves the row's as it was.
    await sheet.write_results("run2", [_ok(0, "a", {"title": "CTO"})])
    (row,) = await sheet.read_run_rows("run2", 0, 1)
    assert row.cell_meta == {"email": at2, "title": at1}
    assert await sheet.read_cells("people", ["a", "zz"]) == {"a": (row.data, row.cell_meta)}


async def test_a_rerun_reports_what_it_changed(sheet: SheetStore) -> None:
    await _run(sheet, "run1")
    first = [
        _ok(0, "a", {"email": "a@x", "title": "CEO"}),
        _ok(1, "b", {"email": None, "title": "CTO"}),
        _ok(2, "c", {"email": "c@x", "title": ""}),
        _ok(3, "d", {"email": "d@x"}),  # no title yet
    ]
    await sheet.write_results("run1", first)
    # The first run saw every column for the first time: nothing changed.
    assert await sheet.run_changes("run1") == {}
    assert await sheet.read_changes("run1", 0, 100) == []

    await _run(sheet, "run2")
    second = [
        _ok(0, "a", {"email": "a2@x", "title": "CEO"}),  # email changed
        _ok(1, "b", {"email": "b@x", "title": "CTO"}),  # email appeared
        _ok(2, "c", {"email": None, "title": "VP"}),  # email disappeared, title appeared
        _ok(3, "d", {"email": "d@x", "title": "Dev"}),  # title first seen: no change
        RowResult(4, "e", {"email": "e@x"}, "ok"),  # a row seen for the first time
    ]
    await sheet.write_results("run2", second)
    assert await sheet.run_changes("run2") == {
        "email": {"changed": 1, "appeared": 1, "disappeared": 1},
        "title": {"changed": 0, "appeared": 1, "disappeared": 0},
    }
    assert await sheet.read_changes("run2", 0, 100) == [
        (0, "a", {"email": {"old": "a@x", "new": "a2@x"}}),
        (1, "b", {"email": {"old": None, "new": "b@x"}}),
        (2, "c", {"email": {"old": "c@x", "new": None}, "title": {"old": "", "new": "VP"}}),
    ]
    assert [seq for seq, _, _ in await sheet.read_changes("run2", 1, 2)] == [1]
    # Each run keeps its own report.
    assert await sheet.run_changes("run1") == {}


async def test_a_row_written_twice_keeps_what_the_first_write_saw(sheet: SheetStore) -> None:
    await _run(sheet, "run1")
    await sheet.write_results(
        "run1", [_ok(0, "a", {"email": "a@x"}), _ok(1, "b", {"email": "b@x"})]
    )
    await _run(sheet, "run2", ("a", "b", "c"))
    second = [
        _ok(0, "a", {"email": "a2@x"}),
        _ok(1, "b", {"email": "b@x"}),
        _ok(2, "c", {"email": "c@x"}),
    ]
    await sheet.write_results("run2", second)
    await sheet.write_results("run2", second)  # a retried chunk: the same rows again
    expected = {"email": {"changed": 1, "appeared": 0, "disappeared": 0}}
    assert await sheet.run_changes("run2") == expected
    assert await _changes(sheet, "run2") == {"a": {"email": {"old": "a@x", "new": "a2@x"}}}
    # The retry computed other values: "old" stays the value before the run.
    await sheet.write_results(
        "run2",
        [_ok(0, "a", {"email": "a3@x"}), _ok(1, "b", {"email": "b2@x"}), _ok(2, "c", {})],
    )
    assert await _changes(sheet, "run2") == {
        "a": {"email": {"old": "a@x", "new": "a3@x"}},
        "b": {"email": {"old": "b@x", "new": "b2@x"}},
    }
    # Back to the value before the run: the entry is dropped, the column counts zero.
    await sheet.write_results(
        "run2", [_ok(0, "a", {"email": "a@x"}), _ok(1, "b", {"email": "b@x"})]
    )
    assert await sheet.read_changes("run2", 0, 100) == []
    assert await sheet.run_changes("run2") == {
        "email": {"changed": 0, "appeared": 0, "disappeared": 0}
    }
    # Row c was new to the dataset: its rewrite is no change either.
    await sheet.write_results("run2", [_ok(2, "c", {"email": None})])
    assert await sheet.read_changes("run2", 0, 100) == []


async def test_a_status_only_write_keeps_the_changes(sheet: SheetStore) -> None:
    await _run(sheet, "run1", ("a",))
    await sheet.write_results("run1", [_ok(0, "a", {"email": "a@x"})])
    await _run(sheet, "run2", ("a",))
    await sheet.write_results("run2", [_ok(0, "a", {"email": "b@x"})])
    await sheet.write_results("run2", [RowResult(0, "a", {}, "error", "boom")])
    assert await _changes(sheet, "run2") == {"a": {"email": {"old": "a@x", "new": "b@x"}}}
    assert (await sheet.run_counts("run2"))["error"] == 1


async def test_an_old_sqlite_sheet_is_upgraded_in_place(tmp_path: Path) -> None:
    """A file of schema 3 (before cell metadata and changes) keeps its rows: a client
    reads it as it is, a worker migrates it and then records changes against them."""
    path = tmp_path / "sheet.db"
    old_sqlite_sheet(
        path,
        3,
        [
            ("INSERT INTO sources VALUES ('src@1', '[\"id\"]', 1, 1)", []),
            ("INSERT INTO source_rows VALUES ('src@1', 0, '{\"id\": \"a\"}')", []),
            (
                "INSERT INTO sheet_rows VALUES ('people', 'a', ?, 'r0', 1)",
                ['{"id": "a", "email": "a@x"}'],
            ),
            (
                "INSERT INTO runs VALUES ('r0', 'people', 'src@1', 'upsert', 1, 1, 0, 0, "
                "'[\"id\", \"email\"]', 1, '[]')",
                [],
            ),
            ("INSERT INTO run_rows VALUES ('r0', 0, 'a', 'ok', NULL, NULL)", []),
        ],
    )
    client = SheetLedger.in_file(path, create=False)
    try:
        (row,) = await client.read_run_rows("r0", 0, 1)
        assert row.data["email"] == "a@x" and row.cell_meta == {}
        assert await client.run_changes("r0") == {}
        assert await client.read_changes("r0", 0, 10) == []
    finally:
        await client.close()
    store = SheetLedger.in_file(path)
    try:
        await store.prepare_run(
            "r1",
            source_id="src@1",
            dataset="people",
            key_fields=["id"],
            mode="upsert",
            computed_columns=["email"],
        )
        await store.write_results("r1", [_ok(0, "a", {"email": "b@x"}, {"email": {"at": 1}})])
        assert await store.run_changes("r1") == {
            "email": {"changed": 1, "appeared": 0, "disappeared": 0}
        }
        (row,) = await store.read_run_rows("r1", 0, 1)
        assert row.cell_meta == {"email": {"at": 1}}
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA.latest


async def test_an_old_postgres_sheet_is_upgraded_on_the_first_write() -> None:
    """A schema whose sheet component predates changes keeps its rows; the first write
    of a worker of this playline migrates it."""
    import psycopg

    async with pg_schema() as url:
        old_postgres_sheet(url, 2)  # the tables and the sheet's version-2 columns
        stores = await open_stores(Settings(store_url=url), create=True)
        try:
            sheet = stores.sheet
            await sheet.put_source("src@1", COLUMNS, [["a", "A"]])
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                await conn.execute(
                    "INSERT INTO playline_sheet_rows VALUES ('people', 'a',"
                    ' \'{"id": "a", "email": "a@x"}\', \'r0\', 1)'
                )
            await _run(sheet, "r1", ("a",))
            await sheet.write_results("r1", [_ok(0, "a", {"email": None}, {"email": {"at": 2}})])
            assert await sheet.run_changes("r1") == {
                "email": {"changed": 0, "appeared": 0, "disappeared": 1}
            }
            (row,) = await sheet.read_run_rows("r1", 0, 1)
            assert row.cell_meta == {"email": {"at": 2}} and row.data["name"] == "name-a"
        finally:
            await stores.close()
