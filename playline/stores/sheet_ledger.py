"""``SheetLedger``: the sheet store, one implementation for SQLite and PostgreSQL.

See :mod:`playline.stores.sheet` for what each table holds and the contract. Every
change is one function run by :meth:`Database.write
<playline.db.engine.Database.write>`, so it is all or nothing; the shapes that
matter for a fleet and a million rows:

* a source is inserted page by page from its iterator, as multi-row ``INSERT``
  statements run by ``Conn.many`` (:func:`_insert_rows`; pipelined on PostgreSQL),
  so memory never holds a file;
* its ``sources`` row is inserted *first* (count 0, set at the end of the same
  transaction): a second loader of the same source waits on that row's key
  (PostgreSQL) or on the file lock (SQLite), then finds it stored and reads nothing;
* a run is admitted by SQL over temporary tables: the row keys are computed in
  Python page by page (:func:`~playline.stores.sheet.row_key_of`, one rule; a run
  without a key numbers its rows in SQL), and dedup, ``net_new``, the first repeated
  keys, the manifest and the merge into the sheet rows are ``INSERT ... SELECT``
  statements. Its ``runs`` row, too, is claimed first, so a run prepared twice at
  once is prepared once;
* a chunk's results read the rows they change locked (the dialect's ``FOR
  UPDATE``), merge cells, cell metadata and what changed
  (:func:`~playline.stores.sheet_changes.merge_changes`) in Python, and write them
  back with two ``Conn.many`` statements.

JSON columns are ``jsonb`` on PostgreSQL and text on SQLite; a rerun merges a
source row into its sheet row in SQL with the dialect's ``json_merge`` (``||``;
SQLite's ``json_patch``, exact here since source values are strings), and
:func:`_json` reads either.

The schema continues both old ones: on SQLite (``sheet.db``, version = ``PRAGMA
user_version``) versions 1-4 are ``sheet_sqlite``'s as they were, and 5 gives the
tables PostgreSQL's names; on PostgreSQL the component ``sheet`` (whose versions
1-3 the old store already recorded for its later columns) has a version 1 that
creates every table ``IF NOT EXISTS`` in its final shape, so a database the old
code made (its tables under the ``stores`` component) is adopted as it is. A
worker migrates by its first use; a client (``create=False``) never does, and
reads an older store as it finds it (:class:`_Shape`). Version 6 added the outcomes
and facts the sheet view queries, 7 the runs' pace samples
(:mod:`~playline.stores.sheet_pace`), on both databases alike.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path
from typing import Any, Self

from playline.contract import RunMode
from playline.db.conn import Conn, chunks
from playline.db.dialect import marks
from playline.db.engine import Database
from playline.db.migrations import Migration, Schema
from playline.db.ready import ReadyOnFirstUse
from playline.db.store import LedgerStore
from playline.errors import InvalidPlayInput
from playline.spend import NO_STEP
from playline.stores.sheet import (
    PAGE_ROWS,
    SHOWN_DUPLICATE_KEYS,
    RowResult,
    RowsPage,
    RowsQuery,
    RunFigures,
    RunInfo,
    RunRow,
    SpendPoint,
    StepFigures,
    missing_key_fields,
    row_key_of,
    run_columns,
)
from playline.stores.sheet_changes import changes_report, merge_changes
from playline.stores.sheet_index import (
    FACT_PAID,
    FACT_STEP,
    FACT_WON,
    NO_CELLS,
    like_escape,
    outcome_pattern,
    outcomes_text,
    row_facts,
)
from playline.stores.sheet_pace import (
    CREATE_PACE,
    INDEX_PACE,
    PaceSample,
    PaceSeries,
    read_series,
    write_samples,
)

__all__ = ["SCHEMA", "SheetLedger"]

#: The columns the old PostgreSQL store added after its first tables (its ``sheet``
#: component's versions 1-3), each ``IF NOT EXISTS``.
_POSTGRES_LATER_COLUMNS = {
    1: ("ALTER TABLE playline_runs ADD COLUMN IF NOT EXISTS duplicate_keys jsonb",),
    2: ("ALTER TABLE playline_run_rows ADD COLUMN IF NOT EXISTS provenance text",),
    3: (
        "ALTER TABLE playline_sheet_rows ADD COLUMN IF NOT EXISTS cell_meta jsonb",
        "ALTER TABLE playline_run_rows ADD COLUMN IF NOT EXISTS changes jsonb",
        "ALTER TABLE playline_run_rows ADD COLUMN IF NOT EXISTS compared jsonb",
    ),
}

#: One row per derived figure of a run row's cell (:class:`~playline.stores.sheet_index.Fact`).
#: Indexed by run and row only (a row's facts are replaced whole, and read by run): a
#: narrow index is cheaper to keep up as chunks write.
_CREATE_FACTS = (
    "CREATE TABLE IF NOT EXISTS playline_run_facts (run_ref {text} NOT NULL,"
    " seq {int} NOT NULL, col {text} NOT NULL, kind {text} NOT NULL, pos {int} NOT NULL,"
    " name {text} NOT NULL, hits {int} NOT NULL, credits {real} NOT NULL, at {real})"
)
_INDEX_FACTS = (
    "CREATE INDEX IF NOT EXISTS playline_run_facts_row ON playline_run_facts (run_ref, seq)"
)

SCHEMA = Schema(
    "sheet",
    (
        Migration(
            1,
            "sources, sheet rows, runs and run manifests",
            sqlite=(
                "CREATE TABLE IF NOT EXISTS sources (dataset_id TEXT PRIMARY KEY, "
                "columns TEXT NOT NULL, count INTEGER NOT NULL, created_at REAL)",
                "CREATE TABLE IF NOT EXISTS source_rows (dataset_id TEXT NOT NULL, "
                "pos INTEGER NOT NULL, data TEXT NOT NULL, PRIMARY KEY (dataset_id, pos))",
                "CREATE TABLE IF NOT EXISTS sheet_rows (dataset TEXT NOT NULL, "
                "row_key TEXT NOT NULL, data TEXT NOT NULL, first_run TEXT, updated_at REAL, "
                "PRIMARY KEY (dataset, row_key))",
                "CREATE TABLE IF NOT EXISTS runs (run_ref TEXT PRIMARY KEY, "
                "dataset TEXT NOT NULL, source_id TEXT NOT NULL, mode TEXT NOT NULL, "
                "total INTEGER NOT NULL, admitted INTEGER NOT NULL, duplicates INTEGER NOT NULL, "
                "seen_before INTEGER NOT NULL, columns TEXT NOT NULL, created_at REAL)",
                "CREATE TABLE IF NOT EXISTS run_rows (run_ref TEXT NOT NULL, "
                "seq INTEGER NOT NULL, row_key TEXT NOT NULL, status TEXT NOT NULL, error TEXT, "
                "PRIMARY KEY (run_ref, seq))",
            ),
            # The final shape; a database of the old code (tables from the ``stores``
            # component, maybe some later columns) is adopted as it is.
            postgres=(
                "CREATE TABLE IF NOT EXISTS playline_sources (dataset_id text PRIMARY KEY,"
                " columns jsonb NOT NULL, count integer NOT NULL, created_at float8)",
                "CREATE TABLE IF NOT EXISTS playline_source_rows (dataset_id text NOT NULL,"
                " pos integer NOT NULL, data jsonb NOT NULL, PRIMARY KEY (dataset_id, pos))",
                "CREATE TABLE IF NOT EXISTS playline_sheet_rows (dataset text NOT NULL,"
                " row_key text NOT NULL, data jsonb NOT NULL, first_run text,"
                " updated_at float8, cell_meta jsonb, PRIMARY KEY (dataset, row_key))",
                "CREATE TABLE IF NOT EXISTS playline_runs (run_ref text PRIMARY KEY,"
                " dataset text NOT NULL, source_id text NOT NULL, mode text NOT NULL,"
                " total integer NOT NULL, admitted integer NOT NULL,"
                " duplicates integer NOT NULL, seen_before integer NOT NULL,"
                " columns jsonb NOT NULL, created_at float8, duplicate_keys jsonb)",
                "CREATE TABLE IF NOT EXISTS playline_run_rows (run_ref text NOT NULL,"
                " seq integer NOT NULL, row_key text NOT NULL, status text NOT NULL,"
                " error text, provenance text, changes jsonb, compared jsonb,"
                " PRIMARY KEY (run_ref, seq))",
                *(s for step in _POSTGRES_LATER_COLUMNS.values() for s in step),
            ),
        ),
        Migration(
            2,
            "runs keep their first repeated row keys (a JSON list); PostgreSQL: run rows"
            " keep their cells' provenance (the old component's version 2)",
            sqlite=("ALTER TABLE runs ADD COLUMN duplicate_keys TEXT",),
            postgres=_POSTGRES_LATER_COLUMNS[2],
        ),
        Migration(
            3,
            "run rows keep their cells' provenance (JSON, per run); PostgreSQL: cell"
            " metadata and changes (the old component's version 3)",
            sqlite=("ALTER TABLE run_rows ADD COLUMN provenance TEXT",),
            postgres=_POSTGRES_LATER_COLUMNS[3],
        ),
        Migration(
            4,
            "sheet rows keep per-cell metadata; run rows keep what each run changed (JSON)",
            sqlite=(
                "ALTER TABLE sheet_rows ADD COLUMN cell_meta TEXT",
                "ALTER TABLE run_rows ADD COLUMN changes TEXT",
                "ALTER TABLE run_rows ADD COLUMN compared TEXT",
            ),
            postgres=(),
        ),
        Migration(
            5,
            "one name per table on both databases (SQLite's tables take PostgreSQL's)",
            sqlite=(
                "ALTER TABLE sources RENAME TO playline_sources",
                "ALTER TABLE source_rows RENAME TO playline_source_rows",
                "ALTER TABLE sheet_rows RENAME TO playline_sheet_rows",
                "ALTER TABLE runs RENAME TO playline_runs",
                "ALTER TABLE run_rows RENAME TO playline_run_rows",
            ),
            postgres=(),
        ),
        Migration(
            6,
            "run rows keep their cells' outcomes; each row's paid providers, waterfall"
            " steps and answers are kept narrow (playline_run_facts), for the sheet view",
            sqlite=(
                "ALTER TABLE playline_run_rows ADD COLUMN outcomes TEXT",
                _CREATE_FACTS,
                _INDEX_FACTS,
            ),
            postgres=(
                "ALTER TABLE playline_run_rows ADD COLUMN IF NOT EXISTS outcomes text",
                _CREATE_FACTS,
                _INDEX_FACTS,
            ),
        ),
        Migration(
            7,
            "runs keep their pace: per worker and provider, calls, 429s and the rate in"
            " force every few seconds (playline_run_pace), for the sheet view's charts",
            statements=(CREATE_PACE, INDEX_PACE),
        ),
    ),
    clients_read_older=True,
)


@dataclass(frozen=True, slots=True)
class _Shape:
    """The tables as a reader finds them: their names, and which later columns they
    have (a client reads a store older workers left, and never migrates it)."""

    sources: str
    source_rows: str
    sheet_rows: str
    runs: str
    run_rows: str
    duplicate_keys: bool
    provenance: bool
    #: sheet rows' ``cell_meta``, run rows' ``changes`` and ``compared``
    changes: bool
    #: run rows' ``outcomes`` and the ``playline_run_facts`` table
    indexed: bool = False
    #: the ``playline_run_pace`` table
    paced: bool = False


_LATEST = _Shape(
    "playline_sources",
    "playline_source_rows",
    "playline_sheet_rows",
    "playline_runs",
    "playline_run_rows",
    duplicate_keys=True,
    provenance=True,
    changes=True,
    indexed=True,
    paced=True,
)


def _shape(dialect: str, version: int) -> _Shape:
    """The shape of a store of schema ``version``. The one place this store asks
    which database it is on: the old stores numbered their versions apart (SQLite
    from its first tables, PostgreSQL's ``sheet`` from its first later column)."""
    if version >= SCHEMA.latest:
        return _LATEST
    if version >= 5:  # both databases: today's names, outcomes and facts from 6
        return replace(_LATEST, indexed=version >= 6, paced=False)
    if dialect == "sqlite":
        old = _Shape("sources", "source_rows", "sheet_rows", "runs", "run_rows", *([False] * 3))
        return replace(
            old, duplicate_keys=version >= 2, provenance=version >= 3, changes=version >= 4
        )
    return replace(
        _LATEST,
        duplicate_keys=version >= 1,
        provenance=version >= 2,
        changes=version >= 3,
        indexed=False,
        paced=False,
    )


_INSERT_SOURCE_ROWS = "INSERT INTO playline_source_rows (dataset_id, pos, data) VALUES"
_TEMP_KEYS = "CREATE TEMP TABLE staged_keys (pos {int} PRIMARY KEY, row_key {text} NOT NULL)"
_TEMP_PICKED = (
    "CREATE TEMP TABLE picked (seq {int} PRIMARY KEY, pos {int} NOT NULL, row_key {text} NOT NULL)"
)


class SheetLedger(LedgerStore):
    """The sheet store on either database; safe across processes and workers.

    Build it with :meth:`in_file` (SQLite, ``Settings.sheet_path``) or
    :meth:`in_database` (PostgreSQL); ``create=False`` for a client, which finds the
    workers' store (:class:`~playline.db.errors.StoreNotFound`, naming where it
    looked, if there is none) and changes nothing about it. ``clock``: for the
    rows' timestamps (default: the database's).
    """

    SCHEMA = SCHEMA

    def __init__(self, ready: ReadyOnFirstUse, *, clock: Callable[[], float] | None = None) -> None:
        super().__init__(ready, clock=clock)
        self._shape: _Shape | None = None
        #: runs whose rows all have outcomes and facts (:meth:`_indexed`)
        self._indexed_runs: set[str] = set()

    @classmethod
    def in_file(
        cls,
        path: str | Path,
        *,
        clock: Callable[[], float] | None = None,
        create: bool = True,
    ) -> Self:
        """The store in its SQLite file, created (``create``) by its first use."""
        return cls(ReadyOnFirstUse.file(path, cls.SCHEMA, create=create), clock=clock)

    @classmethod
    def in_database(
        cls,
        db: Database,
        *,
        clock: Callable[[], float] | None = None,
        create: bool = True,
    ) -> Self:
        """The store in the database shared with the other stores (PostgreSQL)."""
        return cls(ReadyOnFirstUse.shared(db, cls.SCHEMA, create=create), clock=clock)

    async def open(self) -> None:
        """Open (and, for a worker, migrate) the store now rather than by first use:
        a worker's open leaves the SQLite file a client looks for."""
        await self._ready()

    async def _db(self) -> tuple[Database, _Shape]:
        """The database, and the shape its tables have (read again until latest)."""
        db = await self._ready()
        if self._shape is not _LATEST:
            self._shape = _shape(db.dialect.name, await db.migrate(self.SCHEMA, create=False))
        assert self._shape is not None
        return db, self._shape

    # -------------------------------------------------------------------- sources

    async def put_source(
        self, dataset_id: str, columns: Sequence[str], rows: Iterable[Sequence[str]]
    ) -> int:
        names = list(columns)
        stream = iter(rows)
        started = False

        def tx(conn: Conn) -> int:
            nonlocal started
            claimed = conn.execute(
                "INSERT INTO playline_sources (dataset_id, columns, count, created_at)"
                " VALUES (?, ?, 0, ?) ON CONFLICT (dataset_id) DO NOTHING",
                [dataset_id, json.dumps(names), self._now(conn)],
            )
            if not claimed:  # stored already (maybe by a loader we waited for)
                return int(
                    conn.scalar(
                        "SELECT count FROM playline_sources WHERE dataset_id = ?", [dataset_id]
                    )
                )
            if started:  # run again after a lost race: the rows read are gone
                raise RuntimeError(f"the load of {dataset_id!r} was interrupted; load it again")
            started = True
            count = 0
            while page := list(islice(stream, PAGE_ROWS)):
                _insert_rows(
                    conn,
                    _INSERT_SOURCE_ROWS,
                    [
                        (dataset_id, count + i, json.dumps(dict(zip(names, values, strict=True))))
                        for i, values in enumerate(page)
                    ],
                )
                count += len(page)
            conn.execute(
                "UPDATE playline_sources SET count = ? WHERE dataset_id = ?", [count, dataset_id]
            )
            return count

        db, _ = await self._db()
        return await db.write(tx)

    async def source(self, dataset_id: str) -> tuple[list[str], int] | None:
        db, shape = await self._db()

        def read(conn: Conn) -> tuple[list[str], int] | None:
            row = conn.one(
                f"SELECT columns, count FROM {shape.sources} WHERE dataset_id = ?", [dataset_id]
            )
            return None if row is None else (list(_json(row[0])), int(row[1]))

        return await db.read(read)

    async def read_source_rows(
        self, dataset_id: str, offset: int, limit: int
    ) -> list[dict[str, Any]]:
        db, shape = await self._db()

        def read(conn: Conn) -> list[dict[str, Any]]:
            rows = conn.all(
                f"SELECT data FROM {shape.source_rows} WHERE dataset_id = ? AND pos >= ?"
                " ORDER BY pos LIMIT ?",
                [dataset_id, offset, limit],
            )
            return [dict(_json(row[0])) for row in rows]

        return await db.read(read)

    # ----------------------------------------------------------------------- runs

    async def prepare_run(
        self,
        run_ref: str,
        *,
        source_id: str,
        dataset: str,
        key_fields: Sequence[str],
        mode: RunMode,
        computed_columns: Sequence[str],
    ) -> RunInfo:
        fields = list(key_fields)

        def tx(conn: Conn) -> RunInfo:
            now = self._now(conn)
            src = conn.one(
                "SELECT columns, count FROM playline_sources WHERE dataset_id = ?", [source_id]
            )
            if src is None:
                existing = _read_run_info(conn, _LATEST, run_ref)
                if existing is not None:
                    return replace(
                        existing, duplicate_keys=tuple(_duplicate_keys(conn, _LATEST, run_ref))
                    )
                raise InvalidPlayInput(f"dataset {source_id!r} does not exist in the sheet store")
            source_columns = [str(c) for c in _json(src[0])]
            columns = json.dumps(run_columns(source_columns, computed_columns))
            # The run's row first: a second preparer of this run waits on its key
            # (PostgreSQL) and then finds the manifest; idempotent for a retried activity.
            claimed = conn.execute(
                "INSERT INTO playline_runs (run_ref, dataset, source_id, mode, total, admitted,"
                " duplicates, seen_before, columns, created_at, duplicate_keys)"
                " VALUES (?, ?, ?, ?, ?, 0, 0, 0, ?, ?, '[]') ON CONFLICT (run_ref) DO NOTHING",
                [run_ref, dataset, source_id, mode, int(src[1]), columns, now],
            )
            if not claimed:
                existing = _read_run_info(conn, _LATEST, run_ref)
                assert existing is not None
                return replace(
                    existing, duplicate_keys=tuple(_duplicate_keys(conn, _LATEST, run_ref))
                )
            missing_key_fields(source_id, source_columns, fields)
            _stage_keys(conn, source_id, fields)
            # First occurrence of each key, minus (net_new) keys the dataset already
            # has, numbered in source order: the manifest.
            conn.execute(_TEMP_PICKED.format_map(conn.dialect.types))
            conn.execute(
                "INSERT INTO picked (seq, pos, row_key)"
                " SELECT ROW_NUMBER() OVER (ORDER BY pos) - 1, pos, row_key FROM"
                " (SELECT MIN(pos) AS pos, row_key FROM staged_keys GROUP BY row_key) AS f"
                " WHERE ? = 'upsert' OR NOT EXISTS (SELECT 1 FROM playline_sheet_rows s"
                " WHERE s.dataset = ? AND s.row_key = f.row_key)",
                [mode, dataset],
            )
            counts = conn.one("SELECT count(*), count(DISTINCT row_key) FROM staged_keys")
            assert counts is not None
            staged, distinct = int(counts[0]), int(counts[1])
            repeated = _first_repeated_keys(conn) if staged > distinct else []
            admitted = int(conn.scalar("SELECT count(*) FROM picked"))
            conn.execute(
                "INSERT INTO playline_run_rows (run_ref, seq, row_key, status)"
                " SELECT ?, seq, row_key, 'pending' FROM picked",
                [run_ref],
            )
            # Source values are strings: the merge is exactly {**current, **row}.
            merged = conn.dialect.json_merge.format("playline_sheet_rows.data", "excluded.data")
            conn.execute(
                "INSERT INTO playline_sheet_rows (dataset, row_key, data, first_run, updated_at)"
                " SELECT ?, p.row_key, s.data, ?, ? FROM picked p"
                " JOIN playline_source_rows s ON s.dataset_id = ? AND s.pos = p.pos WHERE true"
                f" ON CONFLICT (dataset, row_key) DO UPDATE SET data = {merged},"
                " updated_at = excluded.updated_at",
                [dataset, run_ref, now, source_id],
            )
            conn.execute("DROP TABLE picked")
            conn.execute("DROP TABLE staged_keys")
            conn.execute(
                "UPDATE playline_runs SET admitted = ?, duplicates = ?, seen_before = ?,"
                " duplicate_keys = ? WHERE run_ref = ?",
                [admitted, staged - distinct, distinct - admitted, json.dumps(repeated), run_ref],
            )
            info = _read_run_info(conn, _LATEST, run_ref)
            assert info is not None
            return replace(info, duplicate_keys=tuple(repeated))

        db, _ = await self._db()
        return await db.write(tx)

    async def duplicate_keys(self, run_ref: str) -> list[str]:
        db, shape = await self._db()
        return await db.read(lambda conn: _duplicate_keys(conn, shape, run_ref))

    async def run_info(self, run_ref: str) -> RunInfo | None:
        db, shape = await self._db()
        return await db.read(lambda conn: _read_run_info(conn, shape, run_ref))

    async def read_run_rows(self, run_ref: str, start: int, end: int) -> list[RunRow]:
        db, shape = await self._db()
        query = _run_rows_sql(shape, "r.seq >= ? AND r.seq < ?") + " ORDER BY r.seq"
        return await db.read(lambda conn: _run_rows(conn.all(query, [run_ref, start, end])))

    async def query_run_rows(self, run_ref: str, query: RowsQuery) -> RowsPage | None:
        db, shape = await self._db()
        if not await self._indexed(db, shape, run_ref):
            return None

        def read(conn: Conn) -> RowsPage | None:
            found = conn.one(
                "SELECT dataset, admitted FROM playline_runs WHERE run_ref = ?", [run_ref]
            )
            if found is None:
                return None
            dataset, admitted = str(found[0]), int(found[1])
            offset, limit = max(0, query.offset), max(1, query.limit)
            picked = _pick_seqs(conn, run_ref, dataset, query, offset, limit)
            if picked is None:  # neither filtered nor sorted: one range of the manifest
                sql = _run_rows_sql(_LATEST, "r.seq >= ? AND r.seq < ?") + " ORDER BY r.seq"
                rows = _run_rows(conn.all(sql, [run_ref, offset, offset + limit]))
                return RowsPage(rows, admitted)
            seqs, matching = picked
            if not seqs:
                return RowsPage([], matching)
            sql = _run_rows_sql(_LATEST, f"r.seq IN ({marks(len(seqs))})")
            by_seq = {row.seq: row for row in _run_rows(conn.all(sql, [run_ref, *seqs]))}
            return RowsPage([by_seq[seq] for seq in seqs if seq in by_seq], matching)

        return await db.read(read)

    async def run_figures(self, run_ref: str, buckets: int) -> RunFigures | None:
        db, shape = await self._db()
        if not await self._indexed(db, shape, run_ref):
            return None

        def read(conn: Conn) -> RunFigures | None:
            if conn.one("SELECT 1 FROM playline_runs WHERE run_ref = ?", [run_ref]) is None:
                return None
            return _run_figures(conn, run_ref, max(1, buckets))

        return await db.read(read)

    async def write_pace(self, samples: Sequence[PaceSample]) -> None:
        if not samples:
            return
        db, _ = await self._db()
        await db.write(lambda conn: write_samples(conn, samples))

    async def pace_series(self, run_ref: str, buckets: int, least_s: float) -> PaceSeries | None:
        db, shape = await self._db()
        if not shape.paced:
            return None
        return await db.read(lambda conn: read_series(conn, run_ref, max(1, buckets), least_s))

    async def _indexed(self, db: Database, shape: _Shape, run_ref: str) -> bool:
        """Whether every finished row of the run has its outcomes and facts (a row
        written before the store kept them has provenance without outcomes). Once
        true it stays true: this code writes both with every provenance."""
        if not shape.indexed:
            return False
        if run_ref in self._indexed_runs:
            return True
        older = await db.read(
            lambda conn: conn.one(
                "SELECT 1 FROM playline_run_rows WHERE run_ref = ? AND outcomes IS NULL"
                " AND provenance IS NOT NULL LIMIT 1",
                [run_ref],
            )
        )
        if older is None:
            self._indexed_runs.add(run_ref)
        return older is None

    async def read_provenance(
        self, run_ref: str, start: int, end: int
    ) -> list[tuple[int, dict[str, Any]]]:
        db, shape = await self._db()
        if not shape.provenance:
            return []

        def read(conn: Conn) -> list[tuple[int, dict[str, Any]]]:
            rows = conn.all(
                f"SELECT seq, provenance FROM {shape.run_rows} WHERE run_ref = ? AND seq >= ?"
                " AND seq < ? AND provenance IS NOT NULL ORDER BY seq",
                [run_ref, start, end],
            )
            return [(int(seq), json.loads(prov)) for seq, prov in rows]

        return await db.read(read)

    async def write_results(self, run_ref: str, results: Sequence[RowResult]) -> None:
        if not results:
            return

        def tx(conn: Conn) -> None:
            dataset = conn.scalar("SELECT dataset FROM playline_runs WHERE run_ref = ?", [run_ref])
            if dataset is None:
                raise InvalidPlayInput(f"run {run_ref!r} has no manifest")
            _write_results(conn, run_ref, str(dataset), results, self._now(conn))

        db, _ = await self._db()
        await db.write(tx)

    async def run_counts(self, run_ref: str) -> dict[str, int]:
        db, shape = await self._db()

        def read(conn: Conn) -> dict[str, int]:
            counts = {"pending": 0, "ok": 0, "error": 0}
            for status, n in conn.all(
                f"SELECT status, count(*) FROM {shape.run_rows} WHERE run_ref = ? GROUP BY status",
                [run_ref],
            ):
                counts[str(status)] = int(n)
            return counts

        return await db.read(read)

    async def run_changes(self, run_ref: str) -> dict[str, dict[str, int]]:
        db, shape = await self._db()
        if not shape.changes:
            return {}

        def read(conn: Conn) -> dict[str, dict[str, int]]:
            counts = conn.all(
                f"SELECT c.key, c.value, count(*) FROM {shape.run_rows} r,"
                f" {conn.dialect.json_each}(r.compared) c WHERE r.run_ref = ?"
                " AND r.compared IS NOT NULL GROUP BY c.key, c.value",
                [run_ref],
            )
            return changes_report([(str(k), str(v), int(n)) for k, v, n in counts])

        return await db.read(read)

    async def read_changes(
        self, run_ref: str, start: int, end: int
    ) -> list[tuple[int, str, dict[str, Any]]]:
        db, shape = await self._db()
        if not shape.changes:
            return []

        def read(conn: Conn) -> list[tuple[int, str, dict[str, Any]]]:
            rows = conn.all(
                f"SELECT seq, row_key, changes FROM {shape.run_rows} WHERE run_ref = ?"
                " AND seq >= ? AND seq < ? AND changes IS NOT NULL ORDER BY seq",
                [run_ref, start, end],
            )
            return [(int(seq), str(key), dict(_json(found))) for seq, key, found in rows]

        return await db.read(read)

    async def read_cells(
        self, dataset: str, row_keys: Sequence[str]
    ) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
        keys = list(dict.fromkeys(row_keys))
        db, shape = await self._db()
        meta = "cell_meta" if shape.changes else "NULL"

        def read(conn: Conn) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
            found: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
            for page in chunks(keys, conn.dialect.max_params - 1):
                rows = conn.all(
                    f"SELECT row_key, data, {meta} FROM {shape.sheet_rows} WHERE dataset = ?"
                    f" AND row_key IN ({marks(len(page))})",
                    [dataset, *page],
                )
                for key, data, cells in rows:
                    found[str(key)] = (dict(_json(data)), dict(_json(cells) or {}))
            return found

        return await db.read(read)


def _write_results(
    conn: Conn, run_ref: str, dataset: str, results: Sequence[RowResult], now: float
) -> None:
    """Cells and cell metadata into their sheet rows, statuses, provenance and what
    the cells changed onto the run's manifest rows (inside the caller's transaction).

    The rows are read locked, in key order (two writers of one dataset queue, never
    deadlock), and the results applied in order: a row written twice in one batch
    sees its first write."""
    touched = [r for r in results if r.cells or r.cell_meta]
    sheet = _locked_sheet_rows(conn, dataset, sorted({r.row_key for r in touched}))
    manifest = _locked_manifest(conn, run_ref, sorted({r.seq for r in touched if r.cells}))
    repeated = {k for k, n in Counter(r.row_key for r in touched).items() if n > 1}
    sheet_updates: dict[str, tuple[str, str | None]] = {}
    changed: dict[int, tuple[str | None, str | None]] = {}
    for res in touched:
        if res.row_key not in sheet:
            continue  # no sheet row (nothing to merge into): only the status is kept
        stored, before = sheet[res.row_key]
        data = json.dumps({**stored, **res.cells})
        meta = {**before, **(res.cell_meta or {})}
        sheet_updates[res.row_key] = (data, _dumped(meta or None))
        if res.row_key in repeated:  # its next write compares with this one, as stored
            sheet[res.row_key] = (json.loads(data), meta)
        if res.cells and res.seq in manifest:
            changes, compared = merge_changes(stored, res.cells, *manifest[res.seq])
            manifest[res.seq] = (changes, compared)
            changed[res.seq] = (_dumped(changes or None), _dumped(compared or None))
    conn.many(
        "UPDATE playline_sheet_rows SET data = ?, cell_meta = ?, updated_at = ?"
        " WHERE dataset = ? AND row_key = ?",
        [(data, meta, now, dataset, key) for key, (data, meta) in sheet_updates.items()],
    )
    conn.many(
        "UPDATE playline_run_rows SET status = ?, error = ?,"
        " provenance = COALESCE(?, provenance), outcomes = COALESCE(?, outcomes),"
        " changes = CASE WHEN ? THEN ? ELSE changes END,"
        " compared = CASE WHEN ? THEN ? ELSE compared END"
        " WHERE run_ref = ? AND seq = ?",
        [
            (
                res.status,
                res.error,
                _dumped(res.provenance),
                outcomes_text(res.status, res.provenance, res.cells),
                res.seq in changed,
                changed.get(res.seq, (None, None))[0],
                res.seq in changed,
                changed.get(res.seq, (None, None))[1],
                run_ref,
                res.seq,
            )
            for res in results
        ],
    )
    _write_facts(conn, run_ref, results)


def _write_facts(conn: Conn, run_ref: str, results: Sequence[RowResult]) -> None:
    """The facts of each result's provenance, in place of the row's earlier ones (a
    result without provenance keeps them, as it keeps the provenance)."""
    latest = {res.seq: res.provenance for res in results if res.provenance is not None}
    if not latest:
        return
    # One statement per few hundred rows (one per row costs PostgreSQL a round of
    # parse, bind and execute each, more than the delete itself).
    for page in chunks(sorted(latest), conn.dialect.max_params - 1):
        conn.execute(
            f"DELETE FROM playline_run_facts WHERE run_ref = ? AND seq IN ({marks(len(page))})",
            [run_ref, *page],
        )
    _insert_rows(
        conn,
        "INSERT INTO playline_run_facts (run_ref, seq, col, kind, pos, name, hits, credits, at)"
        " VALUES",
        [(run_ref, seq, *fact) for seq, prov in latest.items() for fact in row_facts(prov)],
    )


def _run_rows_sql(shape: _Shape, where: str) -> str:
    """The query of a run's rows (``RunRow`` fields) with ``r.run_ref = ?`` and
    ``where`` (on the manifest ``r``), unordered."""
    provenance = "r.provenance" if shape.provenance else "NULL"
    meta = "s.cell_meta" if shape.changes else "NULL"
    return (
        f"SELECT r.seq, r.row_key, s.data, r.status, r.error, {provenance}, {meta}"
        f" FROM {shape.run_rows} r JOIN {shape.runs} u ON u.run_ref = r.run_ref"
        f" JOIN {shape.sheet_rows} s ON s.dataset = u.dataset AND s.row_key = r.row_key"
        f" WHERE r.run_ref = ? AND {where}"
    )


def _run_rows(found: list[tuple[Any, ...]]) -> list[RunRow]:
    return [
        RunRow(
            int(seq),
            str(key),
            dict(_json(data)),
            status,
            error,
            _loaded(prov),
            dict(_json(cells) or {}),
        )
        for seq, key, data, status, error, prov, cells in found
    ]


#: A row whose outcomes name no cell is judged by its status alone (pending: not run
#: yet, error: failed), as :func:`~playline.stores.sheet_index.cell_outcome` judges a
#: cell without provenance.
_BY_STATUS = {"not_run": "pending", "failed": "error"}


def _pick_seqs(
    conn: Conn, run_ref: str, dataset: str, query: RowsQuery, offset: int, limit: int
) -> tuple[list[int], int] | None:
    """The ``seq`` of the page's rows, in order, and how many rows match; ``None``
    for a query that neither filters nor sorts (the page is a range of ``seq``)."""
    where: list[str] = ["r.run_ref = ?"]
    params: list[Any] = [run_ref]
    if query.outcome:
        test = "r.outcomes LIKE ? ESCAPE '\\'"
        params.append(outcome_pattern(query.outcome, query.outcome_column))
        if query.outcome in _BY_STATUS:
            test = f"({test} OR ((r.outcomes IS NULL OR r.outcomes = ?) AND r.status = ?))"
            params += [NO_CELLS, _BY_STATUS[query.outcome]]
        where.append(test)
    text = query.text_column and query.text
    if text:
        where.append("lower(s.data ->> CAST(? AS TEXT)) LIKE ? ESCAPE '\\'")
        params += [query.text_column, f"%{like_escape(str(query.text).lower())}%"]
    if not where[1:] and not query.sort:
        return None
    join = ""
    if text or query.sort:
        join = " JOIN playline_sheet_rows s ON s.dataset = ? AND s.row_key = r.row_key"
        params.insert(0, dataset)
    filtered = f"FROM playline_run_rows r{join} WHERE {' AND '.join(where)}"
    if not query.sort:
        found = conn.all(
            f"SELECT r.seq, count(*) OVER () {filtered} ORDER BY r.seq LIMIT ? OFFSET ?",
            [*params, limit, offset],
        )
    else:
        way = " DESC" if query.descending else ""
        number = conn.dialect.json_number.format("s.data", "CAST(? AS TEXT)")
        found = conn.all(
            "SELECT seq, count(*) OVER () FROM (SELECT r.seq AS seq,"
            f" s.data ->> CAST(? AS TEXT) AS v, {number} AS n {filtered}) AS m"
            " ORDER BY CASE WHEN v IS NULL OR v = '' THEN 2 WHEN n IS NOT NULL THEN 0"
            f" ELSE 1 END, n{way}, COALESCE(lower(v), ''){way}, seq LIMIT ? OFFSET ?",
            [query.sort, *_repeat(query.sort, number), *params, limit, offset],
        )
    if found:
        return [int(row[0]) for row in found], int(found[0][1])
    matching = conn.scalar(f"SELECT count(*) {filtered}", params)
    return [], int(matching or 0)


def _repeat(value: str, template: str) -> list[str]:
    """``value`` once per placeholder in ``template``."""
    return [value] * template.count("?")


def _run_figures(conn: Conn, run_ref: str, buckets: int) -> RunFigures:
    """The charts' sums from the run's facts (inside a read)."""
    span = conn.one(
        "SELECT min(at), max(at) FROM playline_run_facts WHERE run_ref = ? AND kind = ?"
        " AND at IS NOT NULL",
        [run_ref, FACT_PAID],
    )
    start, end = (
        (None, None) if span is None or span[0] is None else (float(span[0]), float(span[1]))
    )
    spend: dict[tuple[str, int], float] = {}
    if start is not None and end is not None:
        scale = buckets / max(end - start, 1e-9)
        slot = conn.dialect.floor.format("(at - ?) * ?")
        for provider, bucket, credits in conn.all(
            f"SELECT name, {slot} AS b, sum(credits) FROM playline_run_facts"
            " WHERE run_ref = ? AND kind = ? AND at IS NOT NULL GROUP BY name, b",
            [start, scale, run_ref, FACT_PAID],
        ):
            key = (str(provider), min(buckets - 1, int(bucket)))
            spend[key] = spend.get(key, 0.0) + float(credits)
    answered: dict[tuple[str, str], int] = {
        (str(col), str(name)): int(n)
        for col, name, n in conn.all(
            "SELECT col, name, count(*) FROM playline_run_facts WHERE run_ref = ? AND kind = ?"
            " GROUP BY col, name",
            [run_ref, FACT_WON],
        )
    }
    steps: dict[str, list[StepFigures]] = {}
    for col, name, calls, hits, credits in conn.all(
        "SELECT col, name, count(*), sum(hits), sum(credits) FROM playline_run_facts"
        " WHERE run_ref = ? AND kind = ? GROUP BY col, name ORDER BY col, min(pos), name",
        [run_ref, FACT_STEP],
    ):
        steps.setdefault(str(col), []).append(
            StepFigures(
                str(col),
                str(name),
                answered.get((str(col), str(name)), 0),
                int(calls),
                int(hits or 0),
                float(credits or 0.0),
            )
        )
    unanswered = {col: n for (col, name), n in answered.items() if name == NO_STEP}
    return RunFigures(
        start,
        end,
        [SpendPoint(p, b, c) for (p, b), c in sorted(spend.items())],
        dict(sorted(steps.items())),
        unanswered,
    )


def _locked_sheet_rows(
    conn: Conn, dataset: str, keys: list[str]
) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """``{row_key: (data, cell_meta)}`` of the dataset's rows among ``keys``, locked."""
    found: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for page in chunks(keys, conn.dialect.max_params - 1):
        for key, data, meta in conn.all(
            "SELECT row_key, data, cell_meta FROM playline_sheet_rows WHERE dataset = ?"
            f" AND row_key IN ({marks(len(page))}) ORDER BY row_key{conn.dialect.for_update}",
            [dataset, *page],
        ):
            found[str(key)] = (dict(_json(data)), dict(_json(meta) or {}))
    return found


def _locked_manifest(
    conn: Conn, run_ref: str, seqs: list[int]
) -> dict[int, tuple[dict[str, Any] | None, dict[str, Any] | None]]:
    """``{seq: (changes, compared)}`` of the run's manifest rows among ``seqs``, locked."""
    found: dict[int, tuple[dict[str, Any] | None, dict[str, Any] | None]] = {}
    for page in chunks(seqs, conn.dialect.max_params - 1):
        for seq, changes, compared in conn.all(
            "SELECT seq, changes, compared FROM playline_run_rows WHERE run_ref = ?"
            f" AND seq IN ({marks(len(page))}) ORDER BY seq{conn.dialect.for_update}",
            [run_ref, *page],
        ):
            found[int(seq)] = (_json(changes), _json(compared))
    return found


def _insert_rows(conn: Conn, insert: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """``insert`` (``INSERT INTO t (a, b) VALUES``) of ``rows``, as many rows per
    statement as the dialect's placeholders allow, the full statements in one
    ``Conn.many``: one statement per row costs PostgreSQL a parse, a bind and an
    execute per row, several times what the row itself costs."""
    if not rows:
        return
    width = len(rows[0])
    per = max(1, conn.dialect.max_params // width)
    one = f"({marks(width)})"
    full = len(rows) - len(rows) % per
    if full:
        conn.many(
            f"{insert} {', '.join([one] * per)}",
            [
                [v for row in rows[start : start + per] for v in row]
                for start in range(0, full, per)
            ],
        )
    if full < len(rows):
        tail = rows[full:]
        conn.execute(f"{insert} {', '.join([one] * len(tail))}", [v for row in tail for v in row])


def _json(stored: Any) -> Any:
    """A JSON column's value: PostgreSQL's ``jsonb`` arrives parsed, SQLite's text not
    (every JSON column holds an object or a list, never a bare string)."""
    return json.loads(stored) if isinstance(stored, str) else stored


#: compact JSON for the maps the manifest rows keep (one encoder: ``json.dumps`` with
#: ``separators`` builds a new one per call, four calls per row written)
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def _dumped(value: dict[str, Any] | None) -> str | None:
    """A JSON map as stored (compact), ``None`` when there is none."""
    return None if value is None else _COMPACT.encode(value)


def _loaded(stored: str | None) -> dict[str, Any] | None:
    return None if stored is None else dict(json.loads(stored))


def _stage_keys(conn: Conn, source_id: str, key_fields: list[str]) -> None:
    """Temporary ``staged_keys``: every source position with its row key, page by page
    (without a key: :func:`~playline.stores.sheet.positional_key`, in SQL)."""
    conn.execute(_TEMP_KEYS.format_map(conn.dialect.types))
    if not key_fields:
        conn.execute(
            "INSERT INTO staged_keys (pos, row_key) SELECT pos, '#' || dataset_id || ':' || pos"
            " FROM playline_source_rows WHERE dataset_id = ?",
            [source_id],
        )
    else:
        after = -1
        while page := conn.all(
            "SELECT pos, data FROM playline_source_rows WHERE dataset_id = ? AND pos > ?"
            " ORDER BY pos LIMIT ?",
            [source_id, after, PAGE_ROWS],
        ):
            _insert_rows(
                conn,
                "INSERT INTO staged_keys (pos, row_key) VALUES",
                [(pos, row_key_of(_json(data), key_fields, pos)) for pos, data in page],
            )
            after = int(page[-1][0])
    conn.execute("ANALYZE staged_keys")


def _first_repeated_keys(conn: Conn) -> list[str]:
    """The first few staged keys that occur more than once, by their first position."""
    rows = conn.all(
        "SELECT row_key FROM staged_keys GROUP BY row_key HAVING count(*) > 1"
        " ORDER BY min(pos) LIMIT ?",
        [SHOWN_DUPLICATE_KEYS],
    )
    return [str(row[0]) for row in rows]


def _duplicate_keys(conn: Conn, shape: _Shape, run_ref: str) -> list[str]:
    if not shape.duplicate_keys:
        return []
    found = conn.scalar(f"SELECT duplicate_keys FROM {shape.runs} WHERE run_ref = ?", [run_ref])
    return [str(k) for k in _json(found)] if found else []


def _read_run_info(conn: Conn, shape: _Shape, run_ref: str) -> RunInfo | None:
    row = conn.one(
        "SELECT run_ref, dataset, total, admitted, duplicates, seen_before, columns"
        f" FROM {shape.runs} WHERE run_ref = ?",
        [run_ref],
    )
    if row is None:
        return None
    return RunInfo(
        run_ref=str(row[0]),
        dataset=str(row[1]),
        total=int(row[2]),
        admitted=int(row[3]),
        duplicates=int(row[4]),
        seen_before=int(row[5]),
        columns=[str(c) for c in _json(row[6])],
    )
