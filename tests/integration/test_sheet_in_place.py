"""Sheet stores created by the code before ``playline.db`` open in place with today's.

Each test builds a sheet with the old schema and rows (:mod:`tests.old_schemas`), on
SQLite (``sheet.db``) and on PostgreSQL (the tables the ``stores`` component made,
the ``sheet`` component's later columns), reads it as a client would (which changes
nothing), then opens it as a worker would (which migrates it) and checks that every
source row, sheet row, run and run row is there and still works.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from playline.db.migrations import Schema
from playline.db.postgres import PostgresPool
from playline.stores.sheet import RowResult, RowsQuery, RunInfo, RunRow
from playline.stores.sheet_ledger import SCHEMA, SheetLedger
from playline.stores.sheet_pace import PaceSample
from tests.old_schemas import old_postgres_sheet, old_sqlite_sheet
from tests.pg import pg_schema

Opener = Callable[[bool], Awaitable[SheetLedger]]

PAID = {"tool": "mailfox_email", "provider": "mailfox", "receipt": "paid", "credits": 1.5}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def where(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A fresh place for a sheet of each backend: a file path, or a PostgreSQL URL."""
    if request.param == "sqlite":
        yield str(tmp_path / "sheet.db")
        return
    async with pg_schema() as url:
        yield url


@pytest.fixture
async def open_sheet(where: str) -> AsyncIterator[Opener]:
    """Opens the sheet at ``where`` as a worker (``True``) or a client (``False``)."""
    pools: list[PostgresPool] = []
    opened: list[SheetLedger] = []

    async def opener(create: bool) -> SheetLedger:
        if where.startswith("postgres"):
            pools.append(await PostgresPool.open(where))
            sheet = SheetLedger.in_database(pools[-1], create=create)
        else:
            sheet = SheetLedger.in_file(where, create=create)
        opened.append(sheet)
        return sheet

    yield opener
    for sheet in opened:
        await sheet.close()
    for pool in pools:
        await pool.close()


def _postgres(where: str) -> bool:
    return where.startswith("postgres")


def _old(where: str, version: int, rows: list[tuple[str, list[Any]]]) -> None:
    """The rows in a sheet of the old code's schema ``version`` (named per backend:
    ``{sources}`` is ``sources`` in a SQLite file, ``playline_sources`` in PostgreSQL)."""
    prefix = "playline_" if _postgres(where) else ""
    names = {n: prefix + n for n in ("sources", "source_rows", "sheet_rows", "runs", "run_rows")}
    statements = [(sql.format_map(names), params) for sql, params in rows]
    if _postgres(where):
        old_postgres_sheet(where, version, statements)
    else:
        old_sqlite_sheet(Path(where), version, statements)


#: A keyed source of three rows (``b`` twice), and run ``r0`` of it into ``people``
#: as the old code left them: ``a`` enriched (provenance, cell metadata, a change
#: against an earlier value), ``b`` failed.
_SOURCE_AND_RUN = [
    (
        "INSERT INTO {sources} (dataset_id, columns, count, created_at) VALUES (?, ?, 3, 1)",
        ["src@1", '["id", "name"]'],
    ),
    (
        "INSERT INTO {source_rows} (dataset_id, pos, data) VALUES (?, 0, ?), (?, 1, ?), (?, 2, ?)",
        [
            "src@1",
            '{"id": "a", "name": "Ann"}',
            "src@1",
            '{"id": "b", "name": "Bob"}',
            "src@1",
            '{"id": "b", "name": "Bea"}',
        ],
    ),
    (
        "INSERT INTO {runs} (run_ref, dataset, source_id, mode, total, admitted, duplicates,"
        " seen_before, columns, created_at, duplicate_keys)"
        " VALUES ('r0', 'people', 'src@1', 'upsert', 3, 2, 1, 0, ?, 2, ?)",
        ['["id", "name", "email"]', '["b"]'],
    ),
]
_ENRICHED = [
    (
        "INSERT INTO {sheet_rows} (dataset, row_key, data, first_run, updated_at, cell_meta)"
        " VALUES ('people', 'a', ?, 'r0', 3, ?), ('people', 'b', ?, 'r0', 3, NULL)",
        [
            '{"id": "a", "name": "Ann", "email": "a@x"}',
            '{"email": {"at": 3, "in": "d1"}}',
            '{"id": "b", "name": "Bob"}',
        ],
    ),
    (
        "INSERT INTO {run_rows} (run_ref, seq, row_key, status, error, provenance, changes,"
        " compared) VALUES ('r0', 0, 'a', 'ok', NULL, ?, ?, ?),"
        " ('r0', 1, 'b', 'error', 'boom', NULL, NULL, NULL)",
        [
            json.dumps({"email": PAID}),
            '{"email": {"old": "old@x", "new": "a@x"}}',
            '{"email": "changed"}',
        ],
    ),
]


async def _everything_is_there(sheet: SheetLedger) -> None:
    """Every row the old code left (:data:`_SOURCE_AND_RUN`, :data:`_ENRICHED`)."""
    assert await sheet.source("src@1") == (["id", "name"], 3)
    assert await sheet.read_source_rows("src@1", 1, 5) == [
        {"id": "b", "name": "Bob"},
        {"id": "b", "name": "Bea"},
    ]
    assert await sheet.run_info("r0") == RunInfo(
        "r0", "people", 3, 2, 1, 0, ["id", "name", "email"]
    )
    assert await sheet.duplicate_keys("r0") == ["b"]
    assert await sheet.read_run_rows("r0", 0, 5) == [
        RunRow(
            0,
            "a",
            {"id": "a", "name": "Ann", "email": "a@x"},
            "ok",
            None,
            {"email": PAID},
            {"email": {"at": 3, "in": "d1"}},
        ),
        RunRow(1, "b", {"id": "b", "name": "Bob"}, "error", "boom", None, {}),
    ]
    assert await sheet.read_provenance("r0", 0, 5) == [(0, {"email": PAID})]
    assert await sheet.run_counts("r0") == {"pending": 0, "ok": 1, "error": 1}
    assert await sheet.run_changes("r0") == {
        "email": {"changed": 1, "appeared": 0, "disappeared": 0}
    }
    assert await sheet.read_changes("r0", 0, 5) == [
        (0, "a", {"email": {"old": "old@x", "new": "a@x"}})
    ]
    assert await sheet.read_cells("people", ["a", "z"]) == {
        "a": ({"id": "a", "name": "Ann", "email": "a@x"}, {"email": {"at": 3, "in": "d1"}})
    }


async def test_an_old_sheet_opens_in_place_and_keeps_every_row(
    where: str, open_sheet: Opener
) -> None:
    """The old code's latest schema (SQLite 4, PostgreSQL ``sheet`` 3), every column
    filled: a client reads it all as it is, a worker migrates it and reads it all too,
    then runs on it."""
    _old(where, 3 if _postgres(where) else 4, [*_SOURCE_AND_RUN, *_ENRICHED])
    await _everything_is_there(await open_sheet(False))  # a client: changes nothing
    assert _version(where) == (3 if _postgres(where) else 4)

    worker = await open_sheet(True)
    await _everything_is_there(worker)
    assert _version(where) == SCHEMA.latest
    if not _postgres(where):  # one name per table on both databases now
        with sqlite3.connect(where) as conn:
            tables = {
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
        conn.close()
        assert tables == {
            "playline_sources",
            "playline_source_rows",
            "playline_sheet_rows",
            "playline_runs",
            "playline_run_rows",
            "playline_run_facts",
            "playline_run_pace",
        }
    # Still usable: a rerun of the old source keeps the old rows' cells, records
    # what it changed against them, and loading the same source again reads nothing.
    assert await worker.put_source("src@1", ["id", "name"], iter(())) == 3
    info = await worker.prepare_run(
        "r1",
        source_id="src@1",
        dataset="people",
        key_fields=["id"],
        mode="upsert",
        computed_columns=["email"],
    )
    assert (info.admitted, info.duplicates, info.duplicate_keys) == (2, 1, ("b",))
    await worker.write_results(
        "r1",
        [
            RowResult(0, "a", {"email": "a2@x"}, "ok", cell_meta={"email": {"at": 9}}),
            RowResult(1, "b", {"email": "b@x"}, "ok"),
        ],
    )
    assert await worker.run_changes("r1") == {
        "email": {"changed": 1, "appeared": 0, "disappeared": 0}
    }
    first, _ = await worker.read_run_rows("r1", 0, 2)
    assert first.data == {"id": "a", "name": "Ann", "email": "a2@x"}
    assert first.cell_meta == {"email": {"at": 9}}
    client = await open_sheet(False)  # r0's manifest is as it was
    assert await client.read_provenance("r0", 0, 5) == [(0, {"email": PAID})]
    assert await client.read_changes("r0", 0, 5) == [
        (0, "a", {"email": {"old": "old@x", "new": "a@x"}})
    ]
    assert await client.run_counts("r0") == {"pending": 0, "ok": 1, "error": 1}


async def test_a_sheet_of_the_old_codes_first_schema_is_adopted(
    where: str, open_sheet: Opener
) -> None:
    """The oldest shape (SQLite 1; PostgreSQL: the ``stores`` tables alone, no ``sheet``
    row): a worker adds every later column and keeps every row."""
    postgres = _postgres(where)
    runs = [
        (
            "INSERT INTO {runs} (run_ref, dataset, source_id, mode, total, admitted,"
            " duplicates, seen_before, columns, created_at)"
            " VALUES ('r0', 'people', 'src@1', 'upsert', 3, 2, 1, 0, ?, 2)",
            ['["id", "name", "email"]'],
        ),
        (
            "INSERT INTO {sheet_rows} (dataset, row_key, data, first_run, updated_at)"
            " VALUES ('people', 'a', ?, 'r0', 3)",
            ['{"id": "a", "name": "Ann", "email": "a@x"}'],
        ),
        (
            "INSERT INTO {run_rows} (run_ref, seq, row_key, status, error)"
            " VALUES ('r0', 0, 'a', 'ok', NULL), ('r0', 1, 'b', 'pending', NULL)",
            [],
        ),
    ]
    _old(where, 0 if postgres else 1, [*_SOURCE_AND_RUN[:2], *runs])
    worker = await open_sheet(True)
    assert await worker.source("src@1") == (["id", "name"], 3)
    assert await worker.run_info("r0") == RunInfo(
        "r0", "people", 3, 2, 1, 0, ["id", "name", "email"]
    )
    assert await worker.duplicate_keys("r0") == []
    (row,) = await worker.read_run_rows("r0", 0, 1)
    assert (row.data["email"], row.provenance, row.cell_meta) == ("a@x", None, {})
    assert await worker.run_counts("r0") == {"pending": 1, "ok": 1, "error": 0}
    assert _version(where) == SCHEMA.latest
    await worker.write_results(
        "r0", [RowResult(0, "a", {"email": "a2@x"}, "ok", provenance={"email": PAID})]
    )
    assert await worker.read_provenance("r0", 0, 5) == [(0, {"email": PAID})]
    assert await worker.read_changes("r0", 0, 5) == [
        (0, "a", {"email": {"old": "a@x", "new": "a2@x"}})
    ]


class _BeforeOutcomes(SheetLedger):
    """The sheet store as it was before it kept outcomes and facts (version 5)."""

    SCHEMA = Schema("sheet", SCHEMA.migrations[:5], clients_read_older=True)


def _insert(where: str, rows: list[tuple[str, list[Any]]]) -> None:
    """Raw rows into today's table names (``{runs}``: ``playline_runs``)."""
    names = {
        n: f"playline_{n}" for n in ("sources", "source_rows", "sheet_rows", "runs", "run_rows")
    }
    if not _postgres(where):
        with sqlite3.connect(where) as conn:
            for sql, params in rows:
                conn.execute(sql.format_map(names), params)
        conn.close()
        return
    import psycopg

    with psycopg.connect(where, autocommit=True) as pg:
        for sql, params in rows:
            pg.execute(sql.format_map(names).replace("?", "%s"), params)


async def _create_with(where: str, old: type[SheetLedger]) -> None:
    """Create the store at ``where`` with an older version's schema (``old``), empty."""
    if _postgres(where):
        pool = await PostgresPool.open(where)
        before = old.in_database(pool)
    else:
        before = old.in_file(where)
    await before.open()
    await before.close()
    if _postgres(where):
        await pool.close()


async def test_a_sheet_from_before_outcomes_gains_them_in_place(
    where: str, open_sheet: Opener
) -> None:
    """A version-5 sheet with a run written then: a client reads it as it is (the sheet
    view falls back to reading the run in pages), a worker adds the outcomes column and
    the facts table, the old run still falls back (its rows have no outcomes), and a run
    written now is answered in SQL."""
    await _create_with(where, _BeforeOutcomes)
    _insert(where, [*_SOURCE_AND_RUN, *_ENRICHED])
    assert _version(where) == 5

    client = await open_sheet(False)
    assert await client.query_run_rows("r0", RowsQuery(outcome="hit")) is None
    assert await client.run_figures("r0", 10) is None
    await _everything_is_there(client)
    assert _version(where) == 5

    worker = await open_sheet(True)
    await _everything_is_there(worker)
    assert _version(where) == SCHEMA.latest
    assert await worker.query_run_rows("r0", RowsQuery(outcome="hit")) is None
    await worker.prepare_run(
        "r1",
        source_id="src@1",
        dataset="people",
        key_fields=["id"],
        mode="upsert",
        computed_columns=["email"],
    )
    paid = {**PAID, "by_provider": {"mailfox": 1.5}, "fetched_at": 7.0, "miss": None}
    await worker.write_results(
        "r1",
        [RowResult(0, "a", {"email": "a2@x"}, "ok", provenance={"email": paid})],
    )
    page = await worker.query_run_rows("r1", RowsQuery(outcome="hit"))
    assert page is not None and ([r.row_key for r in page.rows], page.matching) == (["a"], 1)
    pending = await worker.query_run_rows("r1", RowsQuery(outcome="not_run"))
    assert pending is not None and [r.row_key for r in pending.rows] == ["b"]
    figures = await worker.run_figures("r1", 4)
    assert figures is not None and (figures.start, figures.end) == (7.0, 7.0)
    assert [(p.provider, p.credits) for p in figures.spend] == [("mailfox", 1.5)]


class _BeforePace(SheetLedger):
    """The sheet store as it was before it kept runs' pace (version 6)."""

    SCHEMA = Schema("sheet", SCHEMA.migrations[:6], clients_read_older=True)


async def test_a_sheet_from_before_pace_samples_gains_their_table_in_place(
    where: str, open_sheet: Opener
) -> None:
    """A version-6 sheet with a run: a client reads it as it is (no pace, its rows and
    charts as before), a worker adds the pace table and the run's samples are kept and
    summed from then on."""
    await _create_with(where, _BeforePace)
    _insert(where, [*_SOURCE_AND_RUN, *_ENRICHED])
    assert _version(where) == 6

    client = await open_sheet(False)
    assert await client.pace_series("r0", 60, 2.0) is None
    await _everything_is_there(client)
    assert _version(where) == 6

    worker = await open_sheet(True)
    await _everything_is_there(worker)
    assert _version(where) == SCHEMA.latest == 7
    assert await worker.pace_series("r0", 60, 2.0) is None
    await worker.write_pace(
        [
            PaceSample("r0", "w1", 12.0, 2.0, "mailfox", 5, 1, 4.0, "catalog"),
            PaceSample("r0", "w2", 12.0, 2.0, "mailfox", 3, 0, 4.0, "catalog"),
        ]
    )
    series = await worker.pace_series("r0", 60, 2.0)
    assert series is not None
    assert [(p.provider, p.calls, p.limited, p.rate_rps) for p in series.points] == [
        ("mailfox", 8, 1, 4.0)
    ]
    # The client that opened the older store sees the table once it is there.
    later = await open_sheet(False)
    found = await later.pace_series("r0", 60, 2.0)
    assert found is not None and found.points == series.points


async def test_a_client_finds_no_sheet_where_no_worker_made_one(
    where: str, open_sheet: Opener
) -> None:
    from playline.db.errors import StoreNotFound

    client = await open_sheet(False)
    with pytest.raises(StoreNotFound) as info:
        await client.source("src@1")
    shown = "127.0.0.1" if _postgres(where) else where
    assert shown in str(info.value) and "\n" not in str(info.value)
    if not _postgres(where):
        assert not Path(where).exists()


def _version(where: str) -> int:
    """The sheet's recorded schema version (SQLite: the file's; PostgreSQL: its row)."""
    if not _postgres(where):
        with sqlite3.connect(where) as conn:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        conn.close()
        return version
    import psycopg

    with psycopg.connect(where, autocommit=True) as pg:
        row = pg.execute("SELECT version FROM playline_schema WHERE component = 'sheet'").fetchone()
    return 0 if row is None else int(row[0])
