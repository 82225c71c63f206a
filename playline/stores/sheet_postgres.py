"""``PostgresSheetStore``: sources, sheet rows and run manifests in PostgreSQL.

See :mod:`playline.stores.sheet` for the contract. The shapes that matter for a
fleet and a million rows:

* a source is loaded with one ``COPY`` fed page by page from its iterator (the
  pages are pulled on a thread, so a file being parsed never blocks the loop);
* a run is admitted by SQL: the row keys are computed in Python page by page
  (:func:`~playline.stores.sheet.row_key_of`, one rule for every backend; a run
  without a key numbers its rows in SQL), copied into a temporary table, and dedup,
  ``net_new``, the first repeated keys and the manifest are ``INSERT ... SELECT``
  statements;
* a chunk's rows are one ``SELECT``, its results one statement whatever the
  number of rows (cells merge into the row's jsonb with ``||``).

The tables come from the stores' schema (``postgres_db.MIGRATIONS``, component
``stores``); what the sheet added later is its own component, ``sheet``
(:data:`SHEET_MIGRATIONS`), applied the first time a worker prepares a run.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from itertools import islice
from typing import Any

import psycopg

from playline.contract import RunMode
from playline.errors import InvalidPlayInput
from playline.stores.migrations import Migration, migrate_postgres, postgres_version
from playline.stores.postgres_db import PostgresDatabase
from playline.stores.sheet import (
    PAGE_ROWS,
    SHOWN_DUPLICATE_KEYS,
    RowResult,
    RunInfo,
    RunRow,
    missing_key_fields,
    row_key_of,
    run_columns,
)
from playline.stores.sheet_changes import changes_report, merge_changes

__all__ = ["SHEET_MIGRATIONS", "PostgresSheetStore"]

#: The sheet's own steps on top of the stores' schema (component ``sheet``).
SHEET_MIGRATIONS = (
    Migration(
        1,
        "runs keep their first repeated row keys",
        ("ALTER TABLE playline_runs ADD COLUMN duplicate_keys jsonb",),
    ),
    Migration(
        2,
        "run rows keep their cells' provenance (JSON text, per run)",
        ("ALTER TABLE playline_run_rows ADD COLUMN IF NOT EXISTS provenance text",),
    ),
    Migration(
        3,
        "sheet rows keep per-cell metadata; run rows keep what each run changed",
        (
            "ALTER TABLE playline_sheet_rows ADD COLUMN IF NOT EXISTS cell_meta jsonb",
            "ALTER TABLE playline_run_rows ADD COLUMN IF NOT EXISTS changes jsonb",
            "ALTER TABLE playline_run_rows ADD COLUMN IF NOT EXISTS compared jsonb",
        ),
    ),
)
#: The sheet component's version from which run rows have ``provenance``...
_PROVENANCE_VERSION = 2
#: ... and sheet rows ``cell_meta``, run rows ``changes`` and ``compared``.
_CHANGES_VERSION = 3

_NOW = "COALESCE(%(now)s::float8, extract(epoch FROM statement_timestamp()))"

_WRITE_RESULTS = (
    "WITH u AS (SELECT dataset FROM playline_runs WHERE run_ref = %(run)s),"
    " v AS (SELECT * FROM unnest(%(seqs)s::int[], %(keys)s::text[], %(cells)s::jsonb[],"
    " %(metas)s::jsonb[], %(statuses)s::text[], %(errors)s::text[], %(provenance)s::text[],"
    " %(touched)s::bool[], %(changes)s::jsonb[], %(compared)s::jsonb[])"
    " AS v(seq, row_key, cells, meta, status, error, provenance, touched, changes, compared)),"
    " merged AS (UPDATE playline_sheet_rows AS s SET data = s.data || v.cells,"
    " cell_meta = CASE WHEN v.meta IS NULL THEN s.cell_meta"
    " ELSE COALESCE(s.cell_meta, '{}'::jsonb) || v.meta END,"
    " updated_at = " + _NOW + " FROM v, u"
    " WHERE s.dataset = u.dataset AND s.row_key = v.row_key"
    " AND (v.cells <> '{}'::jsonb OR v.meta IS NOT NULL) RETURNING 1),"
    " marked AS (UPDATE playline_run_rows AS r SET status = v.status, error = v.error,"
    " provenance = COALESCE(v.provenance, r.provenance),"
    " changes = CASE WHEN v.touched THEN v.changes ELSE r.changes END,"
    " compared = CASE WHEN v.touched THEN v.compared ELSE r.compared END"
    " FROM v, u WHERE r.run_ref = %(run)s AND r.seq = v.seq RETURNING 1)"
    " SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM merged),"
    " (SELECT count(*) FROM marked)"
)
#: The written columns the rows had before (locked: the write compares against them).
_STORED_CELLS = (
    "SELECT s.row_key, COALESCE((SELECT jsonb_object_agg(e.key, e.value)"
    " FROM jsonb_each(s.data) AS e WHERE e.key = ANY(%(columns)s)), '{}'::jsonb)"
    " FROM playline_sheet_rows s WHERE s.dataset = %(dataset)s AND s.row_key = ANY(%(keys)s)"
    " ORDER BY s.row_key FOR UPDATE OF s"
)
_MANIFEST_CHANGES = (
    "SELECT seq, changes, compared FROM playline_run_rows WHERE run_ref = %s"
    " AND seq = ANY(%s) ORDER BY seq FOR UPDATE"
)


_READ_RUN_ROWS_FROM = (
    " FROM playline_run_rows r"
    " JOIN playline_runs u ON u.run_ref = r.run_ref"
    " JOIN playline_sheet_rows s ON s.dataset = u.dataset AND s.row_key = r.row_key"
    " WHERE r.run_ref = %s AND r.seq >= %s AND r.seq < %s ORDER BY r.seq"
)
_READ_RUN_ROWS = (
    "SELECT r.seq, r.row_key, s.data, r.status, r.error, r.provenance, s.cell_meta"
    + _READ_RUN_ROWS_FROM
)
#: Schemas from before cell metadata, or provenance (a client reading what older
#: workers wrote).
_READ_RUN_ROWS_NO_META = (
    "SELECT r.seq, r.row_key, s.data, r.status, r.error, r.provenance, NULL" + _READ_RUN_ROWS_FROM
)
_READ_RUN_ROWS_OLD = (
    "SELECT r.seq, r.row_key, s.data, r.status, r.error, NULL, NULL" + _READ_RUN_ROWS_FROM
)


class PostgresSheetStore:
    """Sheet rows in PostgreSQL, shared by every worker and client of a fleet.

    Args:
        db: the stores' database (opened, migrated); the caller closes it.
        clock: seconds since the epoch for timestamps; default: the server's clock.
    """

    def __init__(self, db: PostgresDatabase, *, clock: Callable[[], float] | None = None) -> None:
        self._db = db
        self._clock = clock
        self._migrated = False
        self._migrating = asyncio.Lock()
        #: the sheet component's schema version (a client may read a schema older
        #: workers migrated, and never migrates it); read again until the latest
        self._version = 0

    async def _has(self, conn: psycopg.AsyncConnection[Any], version: int) -> bool:
        """Whether this schema's sheet component has reached ``version``."""
        if self._version < len(SHEET_MIGRATIONS):
            self._version = await postgres_version(conn, "sheet")
        return self._version >= version

    async def _provenance_column(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Whether ``playline_run_rows.provenance`` exists in this schema."""
        return await self._has(conn, _PROVENANCE_VERSION)

    async def _migrate(self) -> None:
        """Apply :data:`SHEET_MIGRATIONS` once per store (a worker's, about to prepare a
        run: a client that only reads never changes the schema)."""
        if self._migrated:
            return
        async with self._migrating:
            if not self._migrated:
                async with self._db.connection() as conn:
                    await migrate_postgres(
                        conn, SHEET_MIGRATIONS, component="sheet", where=self._db.where, create=True
                    )
                self._migrated = True

    def _now(self) -> float | None:
        return None if self._clock is None else self._clock()

    async def put_source(
        self, dataset_id: str, columns: Sequence[str], rows: Iterable[Sequence[str]]
    ) -> int:
        names = list(columns)

        async def tx(conn: psycopg.AsyncConnection[Any]) -> int:
            # Two workers loading the same file take turns; the second finds it stored.
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext('playline:source:' || %s))", [dataset_id]
            )
            cur = await conn.execute(
                "SELECT count FROM playline_sources WHERE dataset_id = %s", [dataset_id]
            )
            existing = await cur.fetchone()
            if existing is not None:
                return int(existing[0])
            stream = iter(rows)
            count = 0
            async with conn.cursor().copy(
                "COPY playline_source_rows (dataset_id, pos, data) FROM STDIN"
            ) as copy:
                while page := await asyncio.to_thread(_next_page, stream):
                    for values in page:
                        data = json.dumps(dict(zip(names, values, strict=True)))
                        await copy.write_row((dataset_id, count, data))
                        count += 1
            await conn.execute(
                "INSERT INTO playline_sources (dataset_id, columns, count, created_at)"
                " VALUES (%(id)s, %(columns)s, %(count)s, " + _NOW + ")",
                {
                    "id": dataset_id,
                    "columns": json.dumps(names),
                    "count": count,
                    "now": self._now(),
                },
            )
            return count

        return await self._db.transaction(tx)

    async def source(self, dataset_id: str) -> tuple[list[str], int] | None:
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT columns, count FROM playline_sources WHERE dataset_id = %s", [dataset_id]
            )
            row = await cur.fetchone()
        return None if row is None else (list(row[0]), int(row[1]))

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
        await self._migrate()

        async def tx(conn: psycopg.AsyncConnection[Any]) -> RunInfo:
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext('playline:run:' || %s))", [run_ref]
            )
            existing = await _read_run_info(conn, run_ref)
            if existing is not None:  # idempotent: a retried activity sees the same manifest
                return replace(existing, duplicate_keys=tuple(await _duplicate_keys(conn, run_ref)))
            cur = await conn.execute(
                "SELECT columns, count FROM playline_sources WHERE dataset_id = %s", [source_id]
            )
            src = await cur.fetchone()
            if src is None:
                raise InvalidPlayInput(f"dataset {source_id!r} does not exist in the sheet store")
            source_columns: list[str] = list(src[0])
            missing_key_fields(source_id, source_columns, fields)
            await _stage_keys(conn, source_id, fields)
            await conn.execute(
                "CREATE TEMP TABLE picked ON COMMIT DROP AS"
                " SELECT (row_number() OVER (ORDER BY pos) - 1)::int AS seq, pos, row_key FROM"
                " (SELECT min(pos) AS pos, row_key FROM staged_keys GROUP BY row_key) AS f"
                " WHERE %(mode)s = 'upsert' OR NOT EXISTS (SELECT 1 FROM playline_sheet_rows s"
                " WHERE s.dataset = %(dataset)s AND s.row_key = f.row_key)",
                {"mode": mode, "dataset": dataset},
            )
            cur = await conn.execute(
                "SELECT (SELECT count(*) FROM staged_keys),"
                " (SELECT count(DISTINCT row_key) FROM staged_keys), (SELECT count(*) FROM picked)"
            )
            counts = await cur.fetchone()
            assert counts is not None
            staged, distinct, admitted = (int(n) for n in counts)
            repeated = await _first_repeated_keys(conn) if staged > distinct else []
            await conn.execute(
                "INSERT INTO playline_run_rows (run_ref, seq, row_key, status)"
                " SELECT %s, seq, row_key, 'pending' FROM picked",
                [run_ref],
            )
            await conn.execute(
                "INSERT INTO playline_sheet_rows AS t (dataset, row_key, data, first_run,"
                " updated_at)"
                " SELECT %(dataset)s, p.row_key, s.data, %(run)s, " + _NOW + " FROM picked p"
                " JOIN playline_source_rows s ON s.dataset_id = %(source)s AND s.pos = p.pos"
                " ON CONFLICT (dataset, row_key) DO UPDATE SET data = t.data || EXCLUDED.data,"
                " updated_at = EXCLUDED.updated_at",
                {"dataset": dataset, "run": run_ref, "source": source_id, "now": self._now()},
            )
            await conn.execute(
                "INSERT INTO playline_runs (run_ref, dataset, source_id, mode, total, admitted,"
                " duplicates, seen_before, columns, created_at, duplicate_keys) VALUES (%(run)s,"
                " %(dataset)s, %(source)s, %(mode)s, %(total)s, %(admitted)s, %(duplicates)s,"
                " %(seen)s, %(columns)s, " + _NOW + ", %(repeated)s)",
                {
                    "run": run_ref,
                    "dataset": dataset,
                    "source": source_id,
                    "mode": mode,
                    "total": int(src[1]),
                    "admitted": admitted,
                    "duplicates": staged - distinct,
                    "seen": distinct - admitted,
                    "columns": json.dumps(run_columns(source_columns, computed_columns)),
                    "now": self._now(),
                    "repeated": json.dumps(repeated),
                },
            )
            info = await _read_run_info(conn, run_ref)
            assert info is not None
            return replace(info, duplicate_keys=tuple(repeated))

        return await self._db.transaction(tx)

    async def duplicate_keys(self, run_ref: str) -> list[str]:
        await self._migrate()
        async with self._db.connection() as conn:
            return await _duplicate_keys(conn, run_ref)

    async def run_info(self, run_ref: str) -> RunInfo | None:
        async with self._db.connection() as conn:
            return await _read_run_info(conn, run_ref)

    async def read_run_rows(self, run_ref: str, start: int, end: int) -> list[RunRow]:
        async with self._db.connection() as conn:
            if await self._has(conn, _CHANGES_VERSION):
                query = _READ_RUN_ROWS
            elif await self._provenance_column(conn):
                query = _READ_RUN_ROWS_NO_META
            else:
                query = _READ_RUN_ROWS_OLD
            cur = await conn.execute(query, [run_ref, start, end])
            rows = await cur.fetchall()
        return [
            RunRow(seq, key, data, status, err, _loaded(prov), dict(meta or {}))
            for seq, key, data, status, err, prov, meta in rows
        ]

    async def read_provenance(
        self, run_ref: str, start: int, end: int
    ) -> list[tuple[int, dict[str, Any]]]:
        async with self._db.connection() as conn:
            if not await self._provenance_column(conn):
                return []
            cur = await conn.execute(
                "SELECT seq, provenance FROM playline_run_rows WHERE run_ref = %s"
                " AND seq >= %s AND seq < %s AND provenance IS NOT NULL ORDER BY seq",
                [run_ref, start, end],
            )
            rows = await cur.fetchall()
        return [(int(seq), json.loads(prov)) for seq, prov in rows]

    async def write_results(self, run_ref: str, results: Sequence[RowResult]) -> None:
        if not results:
            return
        # The run may have been prepared by a worker of an older playline: this one
        # brings the sheet's schema up to date before it writes provenance.
        await self._migrate()

        async def tx(conn: psycopg.AsyncConnection[Any]) -> None:
            found = await _run_changes_of(conn, run_ref, results)
            if found is None:
                raise InvalidPlayInput(f"run {run_ref!r} has no manifest")
            changes = [found.get(r.seq) for r in results]
            await conn.execute(
                _WRITE_RESULTS,
                {
                    "run": run_ref,
                    "seqs": [r.seq for r in results],
                    "keys": [r.row_key for r in results],
                    "cells": [json.dumps(r.cells) for r in results],
                    "metas": [json.dumps(r.cell_meta) if r.cell_meta else None for r in results],
                    "statuses": [r.status for r in results],
                    "errors": [r.error for r in results],
                    "provenance": [_dumped(r.provenance) for r in results],
                    "touched": [c is not None for c in changes],
                    "changes": [_dumped(c[0] or None) if c else None for c in changes],
                    "compared": [_dumped(c[1] or None) if c else None for c in changes],
                    "now": self._now(),
                },
            )

        await self._db.transaction(tx)

    async def run_changes(self, run_ref: str) -> dict[str, dict[str, int]]:
        async with self._db.connection() as conn:
            if not await self._has(conn, _CHANGES_VERSION):
                return {}
            cur = await conn.execute(
                "SELECT c.key, c.value, count(*) FROM playline_run_rows r,"
                " jsonb_each_text(r.compared) AS c WHERE r.run_ref = %s"
                " AND r.compared IS NOT NULL GROUP BY c.key, c.value",
                [run_ref],
            )
            counts = await cur.fetchall()
        return changes_report([(str(k), str(v), int(n)) for k, v, n in counts])

    async def read_changes(
        self, run_ref: str, start: int, end: int
    ) -> list[tuple[int, str, dict[str, Any]]]:
        async with self._db.connection() as conn:
            if not await self._has(conn, _CHANGES_VERSION):
                return []
            cur = await conn.execute(
                "SELECT seq, row_key, changes FROM playline_run_rows WHERE run_ref = %s"
                " AND seq >= %s AND seq < %s AND changes IS NOT NULL ORDER BY seq",
                [run_ref, start, end],
            )
            rows = await cur.fetchall()
        return [(int(seq), str(key), dict(found)) for seq, key, found in rows]

    async def read_cells(
        self, dataset: str, row_keys: Sequence[str]
    ) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
        async with self._db.connection() as conn:
            meta = "cell_meta" if await self._has(conn, _CHANGES_VERSION) else "NULL"
            cur = await conn.execute(
                f"SELECT row_key, data, {meta} FROM playline_sheet_rows"
                " WHERE dataset = %s AND row_key = ANY(%s)",
                [dataset, list(row_keys)],
            )
            rows = await cur.fetchall()
        return {str(key): (dict(data), dict(cells or {})) for key, data, cells in rows}

    async def run_counts(self, run_ref: str) -> dict[str, int]:
        counts = {"pending": 0, "ok": 0, "error": 0}
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT status, count(*) FROM playline_run_rows WHERE run_ref = %s GROUP BY status",
                [run_ref],
            )
            for status, n in await cur.fetchall():
                counts[status] = int(n)
        return counts

    async def read_source_rows(
        self, dataset_id: str, offset: int, limit: int
    ) -> list[dict[str, Any]]:
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT data FROM playline_source_rows WHERE dataset_id = %s AND pos >= %s"
                " ORDER BY pos LIMIT %s",
                [dataset_id, offset, limit],
            )
            return [row[0] for row in await cur.fetchall()]

    async def close(self) -> None:
        """Nothing of its own to close; the database is closed by its owner."""


def _dumped(provenance: dict[str, Any] | None) -> str | None:
    """A row's provenance as stored (JSON text, as SQLite stores it), or ``None``."""
    return None if provenance is None else json.dumps(provenance, separators=(",", ":"))


async def _run_changes_of(
    conn: psycopg.AsyncConnection[Any], run_ref: str, results: Sequence[RowResult]
) -> dict[int, tuple[dict[str, Any], dict[str, Any]]] | None:
    """Per written result's ``seq``, its manifest row's ``changes`` and ``compared``
    after this write (:func:`~playline.stores.sheet_changes.merge_changes`), read
    under row locks; ``None`` when the run has no manifest."""
    cur = await conn.execute("SELECT dataset FROM playline_runs WHERE run_ref = %s", [run_ref])
    run = await cur.fetchone()
    if run is None:
        return None
    written = [r for r in results if r.cells]
    if not written:
        return {}
    cur = await conn.execute(
        _STORED_CELLS,
        {
            "columns": sorted({c for r in written for c in r.cells}),
            "dataset": run[0],
            "keys": [r.row_key for r in written],
        },
    )
    stored: dict[str, dict[str, Any]] = {k: dict(d) for k, d in await cur.fetchall()}
    cur = await conn.execute(_MANIFEST_CHANGES, [run_ref, [r.seq for r in written]])
    manifest = {int(seq): (ch, cmp) for seq, ch, cmp in await cur.fetchall()}
    return {
        r.seq: merge_changes(stored[r.row_key], r.cells, *manifest[r.seq])
        for r in written
        if r.row_key in stored and r.seq in manifest
    }


def _loaded(stored: str | None) -> dict[str, Any] | None:
    return None if stored is None else dict(json.loads(stored))


def _next_page(stream: Iterator[Sequence[str]]) -> list[Sequence[str]]:
    return list(islice(stream, PAGE_ROWS))


async def _stage_keys(
    conn: psycopg.AsyncConnection[Any], source_id: str, key_fields: list[str]
) -> None:
    """``staged_keys``: every source position with its row key, page by page."""
    await conn.execute(
        "CREATE TEMP TABLE staged_keys (pos integer PRIMARY KEY, row_key text NOT NULL)"
        " ON COMMIT DROP"
    )
    if not key_fields:  # sheet.positional_key, in SQL
        await conn.execute(
            "INSERT INTO staged_keys SELECT pos, '#' || dataset_id || ':' || pos"
            " FROM playline_source_rows WHERE dataset_id = %s",
            [source_id],
        )
    else:
        after = -1
        while True:
            cur = await conn.execute(
                "SELECT pos, ARRAY(SELECT data ->> f FROM unnest(%(fields)s::text[])"
                " WITH ORDINALITY AS k(f, i) ORDER BY i)"
                " FROM playline_source_rows WHERE dataset_id = %(source)s AND pos > %(after)s"
                " ORDER BY pos LIMIT %(limit)s",
                {"fields": key_fields, "source": source_id, "after": after, "limit": PAGE_ROWS},
            )
            page = await cur.fetchall()
            if not page:
                break
            async with conn.cursor().copy("COPY staged_keys (pos, row_key) FROM STDIN") as copy:
                for pos, values in page:
                    row = dict(zip(key_fields, values, strict=True))
                    await copy.write_row((pos, row_key_of(row, key_fields, pos)))
            after = page[-1][0]
    await conn.execute("ANALYZE staged_keys")


async def _first_repeated_keys(conn: psycopg.AsyncConnection[Any]) -> list[str]:
    """The first few staged keys that occur more than once, by their first position."""
    cur = await conn.execute(
        "SELECT row_key FROM staged_keys GROUP BY row_key HAVING count(*) > 1"
        " ORDER BY min(pos) LIMIT %s",
        [SHOWN_DUPLICATE_KEYS],
    )
    return [str(row[0]) for row in await cur.fetchall()]


async def _duplicate_keys(conn: psycopg.AsyncConnection[Any], run_ref: str) -> list[str]:
    cur = await conn.execute(
        "SELECT duplicate_keys FROM playline_runs WHERE run_ref = %s", [run_ref]
    )
    row = await cur.fetchone()
    return [str(k) for k in row[0]] if row is not None and row[0] else []


async def _read_run_info(conn: psycopg.AsyncConnection[Any], run_ref: str) -> RunInfo | None:
    cur = await conn.execute(
        "SELECT run_ref, dataset, total, admitted, duplicates, seen_before, columns"
        " FROM playline_runs WHERE run_ref = %s",
        [run_ref],
    )
    row = await cur.fetchone()
    if row is None:
        return None
    return RunInfo(
        run_ref=row[0],
        dataset=row[1],
        total=int(row[2]),
        admitted=int(row[3]),
        duplicates=int(row[4]),
        seen_before=int(row[5]),
        columns=list(row[6]),
    )
