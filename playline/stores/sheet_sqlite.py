"""``SqliteSheetStore``: sources, sheet rows and run manifests in one SQLite file.

See :mod:`playline.stores.sheet` for what each table holds and the contract.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from playline.contract import RunMode
from playline.errors import InvalidPlayInput
from playline.stores.sheet import RowResult, RunInfo, RunRow, row_key_of
from playline.stores.sqlite_db import SqliteDatabase, write_transaction

__all__ = ["SqliteSheetStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sources (
    dataset_id TEXT PRIMARY KEY, columns TEXT NOT NULL, count INTEGER NOT NULL, created_at REAL
);
CREATE TABLE IF NOT EXISTS source_rows (
    dataset_id TEXT NOT NULL, pos INTEGER NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (dataset_id, pos)
);
CREATE TABLE IF NOT EXISTS sheet_rows (
    dataset TEXT NOT NULL, row_key TEXT NOT NULL, data TEXT NOT NULL,
    first_run TEXT, updated_at REAL,
    PRIMARY KEY (dataset, row_key)
);
CREATE TABLE IF NOT EXISTS runs (
    run_ref TEXT PRIMARY KEY, dataset TEXT NOT NULL, source_id TEXT NOT NULL, mode TEXT NOT NULL,
    total INTEGER NOT NULL, admitted INTEGER NOT NULL, duplicates INTEGER NOT NULL,
    seen_before INTEGER NOT NULL, columns TEXT NOT NULL, created_at REAL
);
CREATE TABLE IF NOT EXISTS run_rows (
    run_ref TEXT NOT NULL, seq INTEGER NOT NULL, row_key TEXT NOT NULL,
    status TEXT NOT NULL, error TEXT,
    PRIMARY KEY (run_ref, seq)
);
"""


class SqliteSheetStore:
    """Sheet rows in one SQLite file (WAL), shared by every activity of a worker."""

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        self._db = SqliteDatabase(path, _SCHEMA)
        self.path = self._db.path
        self._clock = clock

    async def put_source(
        self, dataset_id: str, columns: Sequence[str], rows: Iterable[Sequence[str]]
    ) -> int:
        now = self._clock()

        def tx(conn: sqlite3.Connection) -> int:
            existing = conn.execute(
                "SELECT count FROM sources WHERE dataset_id = ?", (dataset_id,)
            ).fetchone()
            if existing is not None:
                return int(existing[0])
            with write_transaction(conn):
                count = 0
                batch: list[tuple[str, int, str]] = []
                for pos, values in enumerate(rows):
                    batch.append(
                        (dataset_id, pos, json.dumps(dict(zip(columns, values, strict=True))))
                    )
                    count += 1
                    if len(batch) >= 1000:
                        conn.executemany("INSERT INTO source_rows VALUES (?, ?, ?)", batch)
                        batch.clear()
                conn.executemany("INSERT INTO source_rows VALUES (?, ?, ?)", batch)
                conn.execute(
                    "INSERT INTO sources VALUES (?, ?, ?, ?)",
                    (dataset_id, json.dumps(list(columns)), count, now),
                )
            return count

        return await self._db.run(tx)

    async def source(self, dataset_id: str) -> tuple[list[str], int] | None:
        def tx(conn: sqlite3.Connection) -> tuple[list[str], int] | None:
            row = conn.execute(
                "SELECT columns, count FROM sources WHERE dataset_id = ?", (dataset_id,)
            ).fetchone()
            return None if row is None else (json.loads(row[0]), int(row[1]))

        return await self._db.run(tx)

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
            if existing is not None:
                return existing  # idempotent: a retried activity sees the same manifest
            src = conn.execute(
                "SELECT columns, count FROM sources WHERE dataset_id = ?", (source_id,)
            ).fetchone()
            if src is None:
                raise InvalidPlayInput(f"dataset {source_id!r} does not exist in the sheet store")
            source_columns: list[str] = json.loads(src[0])
            missing = [f for f in key_fields if f not in source_columns]
            if missing:
                raise InvalidPlayInput(
                    f"row key field(s) {missing} are not columns of {source_id!r} "
                    f"(columns: {source_columns})"
                )
            with write_transaction(conn):
                seen: set[str] = set()
                duplicates = seen_before = admitted = 0
                manifest: list[tuple[str, int, str, str]] = []
                cursor = conn.execute(
                    "SELECT pos, data FROM source_rows WHERE dataset_id = ? ORDER BY pos",
                    (source_id,),
                )
                for pos, raw in cursor.fetchall():
                    row = json.loads(raw)
                    key = row_key_of(row, key_fields, pos)
                    if key in seen:
                        duplicates += 1
                        continue
                    seen.add(key)
                    current = conn.execute(
                        "SELECT data FROM sheet_rows WHERE dataset = ? AND row_key = ?",
                        (dataset, key),
                    ).fetchone()
                    if current is not None and mode == "net_new":
                        seen_before += 1
                        continue
                    merged = {**(json.loads(current[0]) if current else {}), **row}
                    conn.execute(
                        "INSERT INTO sheet_rows VALUES (?, ?, ?, ?, ?) "
                        "ON CONFLICT(dataset, row_key) DO UPDATE SET data = excluded.data, "
                        "updated_at = excluded.updated_at",
                        (dataset, key, json.dumps(merged), run_ref, now),
                    )
                    manifest.append((run_ref, admitted, key, "pending"))
                    admitted += 1
                conn.executemany(
                    "INSERT INTO run_rows (run_ref, seq, row_key, status) VALUES (?, ?, ?, ?)",
                    manifest,
                )
                columns = list(source_columns) + [
                    c for c in computed_columns if c not in source_columns
                ]
                conn.execute(
                    "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        run_ref,
                        dataset,
                        source_id,
                        mode,
                        int(src[1]),
                        admitted,
                        duplicates,
                        seen_before,
                        json.dumps(columns),
                        now,
                    ),
                )
            info = _read_run_info(conn, run_ref)
            assert info is not None
            return info

        return await self._db.run(tx)

    async def run_info(self, run_ref: str) -> RunInfo | None:
        return await self._db.run(lambda conn: _read_run_info(conn, run_ref))

    async def read_run_rows(self, run_ref: str, start: int, end: int) -> list[RunRow]:
        def tx(conn: sqlite3.Connection) -> list[RunRow]:
            rows = conn.execute(
                "SELECT r.seq, r.row_key, s.data, r.status, r.error FROM run_rows r "
                "JOIN runs u ON u.run_ref = r.run_ref "
                "JOIN sheet_rows s ON s.dataset = u.dataset AND s.row_key = r.row_key "
                "WHERE r.run_ref = ? AND r.seq >= ? AND r.seq < ? ORDER BY r.seq",
                (run_ref, start, end),
            ).fetchall()
            return [
                RunRow(seq, key, json.loads(data), status, err)
                for seq, key, data, status, err in rows
            ]

        return await self._db.run(tx)

    async def write_results(self, run_ref: str, results: Sequence[RowResult]) -> None:
        if not results:
            return
        now = self._clock()

        def tx(conn: sqlite3.Connection) -> None:
            info = _read_run_info(conn, run_ref)
            if info is None:
                raise InvalidPlayInput(f"run {run_ref!r} has no manifest")
            with write_transaction(conn):
                for res in results:
                    if res.cells:
                        current = conn.execute(
                            "SELECT data FROM sheet_rows WHERE dataset = ? AND row_key = ?",
                            (info.dataset, res.row_key),
                        ).fetchone()
                        merged = {**(json.loads(current[0]) if current else {}), **res.cells}
                        conn.execute(
                            "UPDATE sheet_rows SET data = ?, updated_at = ? "
                            "WHERE dataset = ? AND row_key = ?",
                            (json.dumps(merged), now, info.dataset, res.row_key),
                        )
                    conn.execute(
                        "UPDATE run_rows SET status = ?, error = ? WHERE run_ref = ? AND seq = ?",
                        (res.status, res.error, run_ref, res.seq),
                    )

        await self._db.run(tx)

    async def run_counts(self, run_ref: str) -> dict[str, int]:
        def tx(conn: sqlite3.Connection) -> dict[str, int]:
            counts = {"pending": 0, "ok": 0, "error": 0}
            for status, n in conn.execute(
                "SELECT status, COUNT(*) FROM run_rows WHERE run_ref = ? GROUP BY status",
                (run_ref,),
            ):
                counts[status] = int(n)
            return counts

        return await self._db.run(tx)

    async def read_source_rows(
        self, dataset_id: str, offset: int, limit: int
    ) -> list[dict[str, Any]]:
        def tx(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            rows = conn.execute(
                "SELECT data FROM source_rows WHERE dataset_id = ? AND pos >= ? "
                "ORDER BY pos LIMIT ?",
                (dataset_id, offset, limit),
            ).fetchall()
            return [json.loads(r[0]) for r in rows]

        return await self._db.run(tx)

    async def close(self) -> None:
        self._db.close()


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
