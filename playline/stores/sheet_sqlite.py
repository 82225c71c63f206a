"""``SqliteSheetStore``: sources, sheet rows and run manifests in one SQLite file.

See :mod:`playline.stores.sheet` for what each table holds and the contract. Loads
and run preparation stream: a source is inserted page by page from its iterator
and a run's admission (dedup, ``net_new``, the first repeated keys) is done by SQL
over a temporary table of row keys, so neither holds a dataset in Python.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from itertools import islice
from pathlib import Path
from typing import Any

from playline.contract import RunMode
from playline.errors import InvalidPlayInput
from playline.stores.migrations import Migration
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
from playline.stores.sqlite_db import SqliteDatabase

__all__ = ["MIGRATIONS", "SqliteSheetStore"]

MIGRATIONS = (
    Migration(
        1,
        "sources, sheet rows, runs and run manifests",
        (
            "CREATE TABLE IF NOT EXISTS sources (dataset_id TEXT PRIMARY KEY, "
            "columns TEXT NOT NULL, count INTEGER NOT NULL, created_at REAL)",
            "CREATE TABLE IF NOT EXISTS source_rows (dataset_id TEXT NOT NULL, "
            "pos INTEGER NOT NULL, data TEXT NOT NULL, PRIMARY KEY (dataset_id, pos))",
            "CREATE TABLE IF NOT EXISTS sheet_rows (dataset TEXT NOT NULL, "
            "row_key TEXT NOT NULL, data TEXT NOT NULL, first_run TEXT, updated_at REAL, "
            "PRIMARY KEY (dataset, row_key))",
            "CREATE TABLE IF NOT EXISTS runs (run_ref TEXT PRIMARY KEY, dataset TEXT NOT NULL, "
            "source_id TEXT NOT NULL, mode TEXT NOT NULL, total INTEGER NOT NULL, "
            "admitted INTEGER NOT NULL, duplicates INTEGER NOT NULL, "
            "seen_before INTEGER NOT NULL, columns TEXT NOT NULL, created_at REAL)",
            "CREATE TABLE IF NOT EXISTS run_rows (run_ref TEXT NOT NULL, seq INTEGER NOT NULL, "
            "row_key TEXT NOT NULL, status TEXT NOT NULL, error TEXT, "
            "PRIMARY KEY (run_ref, seq))",
        ),
    ),
    Migration(
        2,
        "runs keep their first repeated row keys (a JSON list)",
        ("ALTER TABLE runs ADD COLUMN duplicate_keys TEXT",),
    ),
    Migration(
        3,
        "run rows keep their cells' provenance (JSON, per run)",
        ("ALTER TABLE run_rows ADD COLUMN provenance TEXT",),
    ),
    Migration(
        4,
        "sheet rows keep per-cell metadata; run rows keep what each run changed (JSON)",
        (
            "ALTER TABLE sheet_rows ADD COLUMN cell_meta TEXT",
            "ALTER TABLE run_rows ADD COLUMN changes TEXT",
            "ALTER TABLE run_rows ADD COLUMN compared TEXT",
        ),
    ),
)
#: The schema version from which run rows have ``provenance``.
_PROVENANCE_VERSION = 3
#: ... and sheet rows ``cell_meta``, run rows ``changes`` and ``compared``.
_CHANGES_VERSION = 4

#: Row keys per ``IN (...)`` query (SQLite caps a statement's parameters).
_KEYS_PER_QUERY = 500

_INSERT_SOURCE_ROW = "INSERT INTO source_rows (dataset_id, pos, data) VALUES (?, ?, ?)"


class SqliteSheetStore:
    """Sheet rows in one SQLite file (WAL), shared by every activity of a worker.

    Args:
        path: the database file.
        clock: seconds since the epoch.
        create: create and migrate the file (a worker) or only open an existing
            store (a client).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Callable[[], float] = time.time,
        create: bool = True,
    ) -> None:
        self._db = SqliteDatabase(path, MIGRATIONS, create=create)
        self.path = self._db.path
        self._clock = clock
        #: the file's schema version (a client may read a file an older worker wrote,
        #: which it never migrates); read again until it is the latest
        self._version = 0

    def _has(self, conn: sqlite3.Connection, version: int) -> bool:
        """Whether the file's schema has reached ``version``."""
        if self._version < len(MIGRATIONS):
            self._version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        return self._version >= version

    def _provenance_column(self, conn: sqlite3.Connection) -> str:
        """What to select for a row's provenance: the column, or NULL in a file of a
        schema from before it (read by a client, which does not migrate)."""
        return "r.provenance" if self._has(conn, _PROVENANCE_VERSION) else "NULL"

    async def put_source(
        self, dataset_id: str, columns: Sequence[str], rows: Iterable[Sequence[str]]
    ) -> int:
        now = self._clock()
        names = list(columns)

        def tx(conn: sqlite3.Connection) -> int:
            existing = conn.execute(
                "SELECT count FROM sources WHERE dataset_id = ?", (dataset_id,)
            ).fetchone()
            if existing is not None:
                return int(existing[0])
            count = 0
            stream = iter(rows)
            while page := list(islice(stream, PAGE_ROWS)):
                conn.executemany(
                    _INSERT_SOURCE_ROW,
                    [
                        (dataset_id, count + i, json.dumps(dict(zip(names, values, strict=True))))
                        for i, values in enumerate(page)
                    ],
                )
                count += len(page)
            conn.execute(
                "INSERT INTO sources VALUES (?, ?, ?, ?)",
                (dataset_id, json.dumps(names), count, now),
            )
            return count

        return await self._db.write(tx)

    async def source(self, dataset_id: str) -> tuple[list[str], int] | None:
        def read(conn: sqlite3.Connection) -> tuple[list[str], int] | None:
            row = conn.execute(
                "SELECT columns, count FROM sources WHERE dataset_id = ?", (dataset_id,)
            ).fetchone()
            return None if row is None else (json.loads(row[0]), int(row[1]))

        return await self._db.read(read)

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
        now = self._clock()

        def tx(conn: sqlite3.Connection) -> RunInfo:
            existing = _read_run_info(conn, run_ref)
            if existing is not None:  # idempotent: a retried activity sees the same manifest
                return replace(existing, duplicate_keys=tuple(_duplicate_keys(conn, run_ref)))
            src = conn.execute(
                "SELECT columns, count FROM sources WHERE dataset_id = ?", (source_id,)
            ).fetchone()
            if src is None:
                raise InvalidPlayInput(f"dataset {source_id!r} does not exist in the sheet store")
            source_columns: list[str] = json.loads(src[0])
            missing_key_fields(source_id, source_columns, key_fields)
            _stage_keys(conn, source_id, key_fields)
            # First occurrence of each key, minus (net_new) keys the dataset already
            # has, numbered in source order: the manifest.
            conn.execute(
                "CREATE TEMP TABLE picked (seq INTEGER PRIMARY KEY, pos INTEGER NOT NULL, "
                "row_key TEXT NOT NULL)"
            )
            conn.execute(
                "INSERT INTO picked (seq, pos, row_key) "
                "SELECT ROW_NUMBER() OVER (ORDER BY pos) - 1, pos, row_key FROM "
                "(SELECT MIN(pos) AS pos, row_key FROM staged_keys GROUP BY row_key) AS f "
                "WHERE ? = 'upsert' OR NOT EXISTS (SELECT 1 FROM main.sheet_rows s "
                "WHERE s.dataset = ? AND s.row_key = f.row_key)",
                (mode, dataset),
            )
            staged, distinct = conn.execute(
                "SELECT count(*), count(DISTINCT row_key) FROM staged_keys"
            ).fetchone()
            repeated = _first_repeated_keys(conn) if staged > distinct else []
            (admitted,) = conn.execute("SELECT count(*) FROM picked").fetchone()
            conn.execute(
                "INSERT INTO run_rows (run_ref, seq, row_key, status) "
                "SELECT ?, seq, row_key, 'pending' FROM picked",
                (run_ref,),
            )
            # Source values are strings, so json_patch is exactly {**current, **row}.
            conn.execute(
                "INSERT INTO sheet_rows (dataset, row_key, data, first_run, updated_at) "
                "SELECT ?, p.row_key, s.data, ?, ? FROM picked p "
                "JOIN source_rows s ON s.dataset_id = ? AND s.pos = p.pos WHERE true "
                "ON CONFLICT(dataset, row_key) DO UPDATE SET "
                "data = json_patch(sheet_rows.data, excluded.data), "
                "updated_at = excluded.updated_at",
                (dataset, run_ref, now, source_id),
            )
            conn.execute("DROP TABLE temp.picked")
            conn.execute("DROP TABLE temp.staged_keys")
            conn.execute(
                "INSERT INTO runs (run_ref, dataset, source_id, mode, total, admitted, "
                "duplicates, seen_before, columns, created_at, duplicate_keys) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_ref,
                    dataset,
                    source_id,
                    mode,
                    int(src[1]),
                    admitted,
                    staged - distinct,
                    distinct - admitted,
                    json.dumps(run_columns(source_columns, computed_columns)),
                    now,
                    json.dumps(repeated),
                ),
            )
            info = _read_run_info(conn, run_ref)
            assert info is not None
            return replace(info, duplicate_keys=tuple(repeated))

        return await self._db.write(tx)

    async def duplicate_keys(self, run_ref: str) -> list[str]:
        return await self._db.read(lambda conn: _duplicate_keys(conn, run_ref))

    async def run_info(self, run_ref: str) -> RunInfo | None:
        return await self._db.read(lambda conn: _read_run_info(conn, run_ref))

    async def read_run_rows(self, run_ref: str, start: int, end: int) -> list[RunRow]:
        def read(conn: sqlite3.Connection) -> list[RunRow]:
            rows = conn.execute(
                "SELECT r.seq, r.row_key, s.data, r.status, r.error, "
                f"{self._provenance_column(conn)}, "
                f"{'s.cell_meta' if self._has(conn, _CHANGES_VERSION) else 'NULL'} "
                "FROM run_rows r "
                "JOIN runs u ON u.run_ref = r.run_ref "
                "JOIN sheet_rows s ON s.dataset = u.dataset AND s.row_key = r.row_key "
                "WHERE r.run_ref = ? AND r.seq >= ? AND r.seq < ? ORDER BY r.seq",
                (run_ref, start, end),
            ).fetchall()
            return [
                RunRow(seq, key, json.loads(data), status, err, _loaded(prov), _loaded(meta) or {})
                for seq, key, data, status, err, prov, meta in rows
            ]

        return await self._db.read(read)

    async def read_provenance(
        self, run_ref: str, start: int, end: int
    ) -> list[tuple[int, dict[str, Any]]]:
        def read(conn: sqlite3.Connection) -> list[tuple[int, dict[str, Any]]]:
            if self._provenance_column(conn) == "NULL":
                return []
            rows = conn.execute(
                "SELECT seq, provenance FROM run_rows WHERE run_ref = ? AND seq >= ? "
                "AND seq < ? AND provenance IS NOT NULL ORDER BY seq",
                (run_ref, start, end),
            ).fetchall()
            return [(int(seq), json.loads(prov)) for seq, prov in rows]

        return await self._db.read(read)

    async def write_results(self, run_ref: str, results: Sequence[RowResult]) -> None:
        if not results:
            return
        now = self._clock()

        def tx(conn: sqlite3.Connection) -> None:
            found = conn.execute("SELECT dataset FROM runs WHERE run_ref = ?", (run_ref,))
            run = found.fetchone()
            if run is None:
                raise InvalidPlayInput(f"run {run_ref!r} has no manifest")
            dataset = run[0]
            for res in results:
                if res.cells or res.cell_meta:
                    _write_cells(conn, run_ref, dataset, res, now)
            conn.executemany(
                "UPDATE run_rows SET status = ?, error = ?, "
                "provenance = COALESCE(?, provenance) WHERE run_ref = ? AND seq = ?",
                [
                    (res.status, res.error, _dumped(res.provenance), run_ref, res.seq)
                    for res in results
                ],
            )

        await self._db.write(tx)

    async def run_changes(self, run_ref: str) -> dict[str, dict[str, int]]:
        def read(conn: sqlite3.Connection) -> dict[str, dict[str, int]]:
            if not self._has(conn, _CHANGES_VERSION):
                return {}
            counts = conn.execute(
                "SELECT c.key, c.value, count(*) FROM run_rows r, json_each(r.compared) c "
                "WHERE r.run_ref = ? AND r.compared IS NOT NULL GROUP BY c.key, c.value",
                (run_ref,),
            ).fetchall()
            return changes_report([(str(k), str(v), int(n)) for k, v, n in counts])

        return await self._db.read(read)

    async def read_changes(
        self, run_ref: str, start: int, end: int
    ) -> list[tuple[int, str, dict[str, Any]]]:
        def read(conn: sqlite3.Connection) -> list[tuple[int, str, dict[str, Any]]]:
            if not self._has(conn, _CHANGES_VERSION):
                return []
            rows = conn.execute(
                "SELECT seq, row_key, changes FROM run_rows WHERE run_ref = ? AND seq >= ? "
                "AND seq < ? AND changes IS NOT NULL ORDER BY seq",
                (run_ref, start, end),
            ).fetchall()
            return [(int(seq), str(key), json.loads(found)) for seq, key, found in rows]

        return await self._db.read(read)

    async def read_cells(
        self, dataset: str, row_keys: Sequence[str]
    ) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
        keys = list(dict.fromkeys(row_keys))

        def read(conn: sqlite3.Connection) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
            meta = "cell_meta" if self._has(conn, _CHANGES_VERSION) else "NULL"
            found: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
            for start in range(0, len(keys), _KEYS_PER_QUERY):
                page = keys[start : start + _KEYS_PER_QUERY]
                rows = conn.execute(
                    f"SELECT row_key, data, {meta} FROM sheet_rows WHERE dataset = ? "
                    f"AND row_key IN ({', '.join('?' * len(page))})",
                    (dataset, *page),
                ).fetchall()
                for key, data, cells in rows:
                    found[str(key)] = (json.loads(data), _loaded(cells) or {})
            return found

        return await self._db.read(read)

    async def run_counts(self, run_ref: str) -> dict[str, int]:
        def read(conn: sqlite3.Connection) -> dict[str, int]:
            counts = {"pending": 0, "ok": 0, "error": 0}
            for status, n in conn.execute(
                "SELECT status, COUNT(*) FROM run_rows WHERE run_ref = ? GROUP BY status",
                (run_ref,),
            ):
                counts[status] = int(n)
            return counts

        return await self._db.read(read)

    async def read_source_rows(
        self, dataset_id: str, offset: int, limit: int
    ) -> list[dict[str, Any]]:
        def read(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            rows = conn.execute(
                "SELECT data FROM source_rows WHERE dataset_id = ? AND pos >= ? "
                "ORDER BY pos LIMIT ?",
                (dataset_id, offset, limit),
            ).fetchall()
            return [json.loads(r[0]) for r in rows]

        return await self._db.read(read)

    async def close(self) -> None:
        await self._db.close()


def _write_cells(
    conn: sqlite3.Connection, run_ref: str, dataset: str, res: RowResult, now: float
) -> None:
    """One result's cells and cell metadata into its sheet row, and what they changed
    onto its manifest row (inside the caller's transaction)."""
    current = conn.execute(
        "SELECT data, cell_meta FROM sheet_rows WHERE dataset = ? AND row_key = ?",
        (dataset, res.row_key),
    ).fetchone()
    stored: dict[str, Any] = json.loads(current[0]) if current else {}
    before = (_loaded(current[1]) if current else None) or {}
    meta = {**before, **(res.cell_meta or {})}
    conn.execute(
        "UPDATE sheet_rows SET data = ?, cell_meta = ?, updated_at = ? "
        "WHERE dataset = ? AND row_key = ?",
        (json.dumps({**stored, **res.cells}), _dumped(meta or None), now, dataset, res.row_key),
    )
    if not res.cells:
        return
    manifest = conn.execute(
        "SELECT changes, compared FROM run_rows WHERE run_ref = ? AND seq = ?",
        (run_ref, res.seq),
    ).fetchone()
    if manifest is None:
        return
    changes, compared = merge_changes(stored, res.cells, _loaded(manifest[0]), _loaded(manifest[1]))
    conn.execute(
        "UPDATE run_rows SET changes = ?, compared = ? WHERE run_ref = ? AND seq = ?",
        (_dumped(changes or None), _dumped(compared or None), run_ref, res.seq),
    )


def _dumped(provenance: dict[str, Any] | None) -> str | None:
    """A row's provenance as stored (JSON), ``None`` when it has none."""
    return None if provenance is None else json.dumps(provenance, separators=(",", ":"))


def _loaded(stored: str | None) -> dict[str, Any] | None:
    return None if stored is None else dict(json.loads(stored))


def _stage_keys(conn: sqlite3.Connection, source_id: str, key_fields: Sequence[str]) -> None:
    """``temp.staged_keys``: every source position with its row key, page by page
    (without a key: :func:`~playline.stores.sheet.positional_key`, in SQL)."""
    conn.execute("CREATE TEMP TABLE staged_keys (pos INTEGER PRIMARY KEY, row_key TEXT NOT NULL)")
    if not key_fields:
        conn.execute(
            "INSERT INTO staged_keys SELECT pos, '#' || dataset_id || ':' || pos "
            "FROM source_rows WHERE dataset_id = ?",
            (source_id,),
        )
        return
    cursor = conn.execute(
        "SELECT pos, data FROM source_rows WHERE dataset_id = ? ORDER BY pos", (source_id,)
    )
    while page := cursor.fetchmany(PAGE_ROWS):
        conn.executemany(
            "INSERT INTO staged_keys (pos, row_key) VALUES (?, ?)",
            [(pos, row_key_of(json.loads(raw), key_fields, pos)) for pos, raw in page],
        )


def _first_repeated_keys(conn: sqlite3.Connection) -> list[str]:
    """The first few staged keys that occur more than once, by their first position."""
    rows = conn.execute(
        "SELECT row_key FROM staged_keys GROUP BY row_key HAVING count(*) > 1 "
        "ORDER BY min(pos) LIMIT ?",
        (SHOWN_DUPLICATE_KEYS,),
    ).fetchall()
    return [str(r[0]) for r in rows]


def _duplicate_keys(conn: sqlite3.Connection, run_ref: str) -> list[str]:
    row = conn.execute("SELECT duplicate_keys FROM runs WHERE run_ref = ?", (run_ref,)).fetchone()
    return [str(k) for k in json.loads(row[0])] if row is not None and row[0] else []


def _read_run_info(conn: sqlite3.Connection, run_ref: str) -> RunInfo | None:
    row = conn.execute(
        "SELECT run_ref, dataset, total, admitted, duplicates, seen_before, columns "
        "FROM runs WHERE run_ref = ?",
        (run_ref,),
    ).fetchone()
    if row is None:
        return None
    return RunInfo(
        run_ref=row[0],
        dataset=row[1],
        total=int(row[2]),
        admitted=int(row[3]),
        duplicates=int(row[4]),
        seen_before=int(row[5]),
        columns=json.loads(row[6]),
    )
