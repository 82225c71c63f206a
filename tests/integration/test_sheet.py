"""The sheet store's contract, on a real SQLite file and a real PostgreSQL schema:
sources, run admission (dedup, net_new), chunks, results, counts."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from playline.config import Settings
from playline.errors import InvalidPlayInput
from playline.stores.backends import Stores, open_stores
from playline.stores.sheet import RowResult, RunInfo, SheetStore, positional_key
from playline.stores.sheet_ledger import SCHEMA, SheetLedger
from tests.integration.conftest import Clock
from tests.old_schemas import old_sqlite_sheet
from tests.pg import pg_schema

COLUMNS = ["id", "name"]


@pytest.fixture
def sheet(stores: Stores) -> SheetStore:
    return stores.sheet


def people(*ids: str) -> list[list[str]]:
    return [[i, f"name-{i}"] for i in ids]


async def prepare(
    sheet: SheetStore,
    run_ref: str,
    source_id: str,
    *,
    key: Sequence[str] = ("id",),
    mode: str = "upsert",
    dataset: str = "people",
) -> tuple[int, int, int, int]:
    info = await sheet.prepare_run(
        run_ref,
        source_id=source_id,
        dataset=dataset,
        key_fields=key,
        mode=mode,  # type: ignore[arg-type]
        computed_columns=["email", "name"],
    )
    return info.total, info.admitted, info.duplicates, info.seen_before


async def test_a_source_is_stored_once_and_read_in_order(sheet: SheetStore) -> None:
    assert await sheet.put_source("src@1", COLUMNS, people("a", "b", "c")) == 3
    consumed = []

    def never_read() -> Iterator[list[str]]:
        consumed.append(True)
        yield ["x", "y"]

    assert await sheet.put_source("src@1", COLUMNS, never_read()) == 3
    assert not consumed  # already stored: its rows are not read again
    assert await sheet.source("src@1") == (COLUMNS, 3)
    assert await sheet.source("nope") is None
    assert await sheet.read_source_rows("src@1", 1, 5) == [
        {"id": "b", "name": "name-b"},
        {"id": "c", "name": "name-c"},
    ]


async def test_a_source_whose_rows_fail_midway_stores_nothing(sheet: SheetStore) -> None:
    def rows() -> Iterator[list[str]]:
        for i in range(5000):  # more than one page
            if i == 4321:
                raise InvalidPlayInput("bad.csv: line 4323: 1 field(s) but the header has 2")
            yield [str(i), "x"]

    with pytest.raises(InvalidPlayInput, match="line 4323"):
        await sheet.put_source("src@bad", COLUMNS, rows())
    assert await sheet.source("src@bad") is None
    assert await sheet.read_source_rows("src@bad", 0, 10) == []
    # ...and the same id loads cleanly afterwards.
    assert await sheet.put_source("src@bad", COLUMNS, people("a")) == 1


async def test_a_run_admits_the_first_row_of_each_key_in_source_order(sheet: SheetStore) -> None:
    await sheet.put_source("src@1", COLUMNS, people("b", "a", "b", "c", "a"))
    assert await prepare(sheet, "run1", "src@1") == (5, 3, 2, 0)
    rows = await sheet.read_run_rows("run1", 0, 10)
    assert [(r.seq, r.row_key, r.status) for r in rows] == [
        (0, "b", "pending"),
        (1, "a", "pending"),
        (2, "c", "pending"),
    ]
    assert rows[0].data == {"id": "b", "name": "name-b"}
    info = await sheet.run_info("run1")
    assert info is not None and info.columns == ["id", "name", "email"]
    assert await sheet.run_counts("run1") == {"pending": 3, "ok": 0, "error": 0}


async def test_preparing_a_run_again_returns_the_same_manifest(sheet: SheetStore) -> None:
    await sheet.put_source("src@1", COLUMNS, people("a", "b"))
    first = await prepare(sheet, "run1", "src@1")
    await sheet.put_source("src@2", COLUMNS, people("z"))
    assert await prepare(sheet, "run1", "src@2") == first  # a retried activity
    assert len(await sheet.read_run_rows("run1", 0, 10)) == 2


async def test_net_new_skips_keys_the_dataset_already_has(sheet: SheetStore) -> None:
    await sheet.put_source("src@1", COLUMNS, people("a", "b"))
    await prepare(sheet, "run1", "src@1")
    await sheet.put_source("src@2", COLUMNS, people("b", "c", "c", "d"))
    assert await prepare(sheet, "run2", "src@2", mode="net_new") == (4, 2, 1, 1)
    assert [r.row_key for r in await sheet.read_run_rows("run2", 0, 10)] == ["c", "d"]
    # upsert takes every first occurrence again
    assert await prepare(sheet, "run3", "src@2") == (4, 3, 1, 0)


async def test_a_run_without_a_key_admits_every_row_by_source_and_position(
    sheet: SheetStore,
) -> None:
    await sheet.put_source("src@1", COLUMNS, people("a", "a"))
    assert await prepare(sheet, "run1", "src@1", key=()) == (2, 2, 0, 0)
    rows = await sheet.read_run_rows("run1", 0, 10)
    assert [r.row_key for r in rows] == [positional_key("src@1", 0), "#src@1:1"]


async def test_keyless_runs_over_different_sources_keep_their_rows_apart(
    sheet: SheetStore,
) -> None:
    """Row 0 of another file is another row: nothing of the first file's row 0 (its
    computed cells, its extra columns) shows through, while the same file finds its
    rows (and their cells) again."""
    await sheet.put_source("first@1", ["id", "name", "ssn"], [["a", "Ann", "123-45"]])
    await prepare(sheet, "run1", "first@1", key=())
    await sheet.write_results("run1", [RowResult(0, "#first@1:0", {"email": "ann@x"}, "ok")])
    await sheet.put_source("second@2", COLUMNS, people("z"))
    await prepare(sheet, "run2", "second@2", key=())
    [row] = await sheet.read_run_rows("run2", 0, 5)
    assert row.data == {"id": "z", "name": "name-z"}
    await prepare(sheet, "run3", "first@1", key=())
    [again] = await sheet.read_run_rows("run3", 0, 5)
    assert again.data == {"id": "a", "name": "Ann", "ssn": "123-45", "email": "ann@x"}


async def test_a_run_keeps_its_first_repeated_keys(sheet: SheetStore) -> None:
    await sheet.put_source("src@1", COLUMNS, people("b", "a", "b", "c", "a", "d", "d", "e", "e"))
    info = await sheet.prepare_run(
        "run1",
        source_id="src@1",
        dataset="people",
        key_fields=["id"],
        mode="upsert",
        computed_columns=[],
    )
    assert (info.duplicates, info.duplicate_keys) == (4, ("b", "a", "d"))
    assert await sheet.duplicate_keys("run1") == ["b", "a", "d"]
    again = await sheet.prepare_run(  # a retried activity
        "run1",
        source_id="src@1",
        dataset="people",
        key_fields=["id"],
        mode="upsert",
        computed_columns=[],
    )
    assert again.duplicate_keys == ("b", "a", "d")
    assert (await sheet.run_info("run1")) == replace(info, duplicate_keys=())
    await sheet.put_source("src@2", COLUMNS, people("x", "y"))
    await prepare(sheet, "run2", "src@2")
    assert await sheet.duplicate_keys("run2") == []
    assert await sheet.duplicate_keys("nope") == []


async def test_composite_keys_and_bad_keys(sheet: SheetStore) -> None:
    await sheet.put_source("src@1", COLUMNS, [["a", "x"], ["a", "y"], ["a", "x"]])
    assert await prepare(sheet, "run1", "src@1", key=("id", "name")) == (3, 2, 1, 0)
    assert [r.row_key for r in await sheet.read_run_rows("run1", 0, 9)] == ["a\x1fx", "a\x1fy"]
    with pytest.raises(InvalidPlayInput, match=r"row key field\(s\) \['email'\] are not columns"):
        await prepare(sheet, "run2", "src@1", key=("email",))
    await sheet.put_source("src@2", COLUMNS, [["a", "x"], ["  ", "y"]])
    with pytest.raises(InvalidPlayInput, match="row 2 has an empty key field 'id'"):
        await prepare(sheet, "run3", "src@2")
    assert await sheet.run_info("run3") is None  # nothing of the failed run was stored
    with pytest.raises(InvalidPlayInput, match="does not exist in the sheet store"):
        await prepare(sheet, "run4", "src@missing")


async def test_results_merge_into_rows_and_survive_the_next_load(
    sheet: SheetStore, clock: Clock
) -> None:
    await sheet.put_source("src@1", COLUMNS, people("a", "b", "c"))
    await prepare(sheet, "run1", "src@1")
    nested = {"score": 0.5, "tags": ["x"], "none": None}
    await sheet.write_results(
        "run1",
        [
            RowResult(0, "a", {"email": "a@x", "extra": nested}, "ok"),
            RowResult(2, "c", {"email": None}, "error", "boom"),
        ],
    )
    rows = await sheet.read_run_rows("run1", 0, 3)
    assert [(r.status, r.error) for r in rows] == [
        ("ok", None),
        ("pending", None),
        ("error", "boom"),
    ]
    assert rows[0].data == {"id": "a", "name": "name-a", "email": "a@x", "extra": nested}
    assert rows[2].data == {"id": "c", "name": "name-c", "email": None}
    assert await sheet.run_counts("run1") == {"pending": 1, "ok": 1, "error": 1}
    # A later load of the same keys: source columns win, computed cells stay.
    clock.now += 10
    await sheet.put_source("src@2", COLUMNS, [["a", "Ann"], ["b", "Bo"]])
    await prepare(sheet, "run2", "src@2")
    [a, b] = await sheet.read_run_rows("run2", 0, 2)
    assert a.data == {"id": "a", "name": "Ann", "email": "a@x", "extra": nested}
    assert b.data == {"id": "b", "name": "Bo"}
    assert a.status == "pending"  # a new run starts its rows afresh
    with pytest.raises(InvalidPlayInput, match="has no manifest"):
        await sheet.write_results("nope", [RowResult(0, "a", {}, "ok")])


async def test_datasets_are_kept_apart(sheet: SheetStore) -> None:
    await sheet.put_source("src@1", COLUMNS, people("a"))
    await prepare(sheet, "run1", "src@1", dataset="one")
    await sheet.write_results("run1", [RowResult(0, "a", {"email": "one@x"}, "ok")])
    assert await prepare(sheet, "run2", "src@1", dataset="two", mode="net_new") == (1, 1, 0, 0)
    [row] = await sheet.read_run_rows("run2", 0, 1)
    assert "email" not in row.data


async def test_ten_thousand_rows_go_in_and_come_back_in_chunks(sheet: SheetStore) -> None:
    n = 10_000
    await sheet.put_source("big@1", COLUMNS, ([str(i), f"n{i}"] for i in range(n)))
    assert await prepare(sheet, "run1", "big@1") == (n, n, 0, 0)
    await sheet.write_results(
        "run1", [RowResult(i, str(i), {"email": f"{i}@x"}, "ok") for i in range(0, n, 2)]
    )
    chunk = await sheet.read_run_rows("run1", 5000, 5025)
    assert [r.seq for r in chunk] == list(range(5000, 5025))
    assert chunk[0].data["email"] == "5000@x" and "email" not in chunk[1].data
    assert await sheet.run_counts("run1") == {"pending": n // 2, "ok": n // 2, "error": 0}


async def test_a_sqlite_sheet_of_the_first_schema_gains_the_repeated_keys(
    tmp_path: Path,
) -> None:
    """A sheet file written before runs kept their repeated keys opens, migrated: its
    runs read back as they were, with no keys."""
    path = tmp_path / "sheet.db"
    old_sqlite_sheet(
        path,
        1,
        [
            (
                "INSERT INTO runs VALUES ('r', 'people', 'src@1', 'upsert', 2, 1, 1, 0, "
                "'[\"id\"]', 1)",
                [],
            )
        ],
    )
    store = SheetLedger.in_file(path)
    try:
        assert await store.run_info("r") == RunInfo("r", "people", 2, 1, 1, 0, ["id"])
        assert await store.duplicate_keys("r") == []
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA.latest


async def test_a_postgres_sheet_adds_its_own_schema_step_on_the_first_run() -> None:
    """The sheet's later columns are its own schema component, applied once by a worker
    that prepares a run (a client that only reads changes nothing)."""
    async with pg_schema() as url:
        stores = await open_stores(Settings(store_url=url), create=True)
        try:
            assert await _sheet_version(url) == 0
            await stores.sheet.put_source("src@1", COLUMNS, people("a", "a"))
            await prepare(stores.sheet, "run1", "src@1")
            assert await _sheet_version(url) == SCHEMA.latest
            assert await stores.sheet.duplicate_keys("run1") == ["a"]
        finally:
            await stores.close()


async def _sheet_version(url: str) -> int:
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT to_regclass('playline_schema') IS NOT NULL")
        if not (await cur.fetchone() or (False,))[0]:
            return 0
        cur = await conn.execute("SELECT version FROM playline_schema WHERE component = 'sheet'")
        row = await cur.fetchone()
        return 0 if row is None else int(row[0])
