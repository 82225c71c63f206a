"""``SyncLedger``: what each sink last wrote, per record and field; SQLite and PostgreSQL.

A sink writes *changes only*: a field is sent when its value differs from what this
sink last wrote for that record, so a second sync of the same run sends nothing and
a re-run that changed seven values sends those seven fields. The ledger is the
memory that makes it so, kept next to the other stores (SQLite: ``sync.db``;
PostgreSQL: the ``sync`` component of ``playline_schema``), created by its first use.

A field's entry also records what the sink *decided* without writing: a value an
``if_blank`` field kept out because the destination already held one is remembered
(``kept``), so the next sync does not ask the destination again for the same value.

Written only after the destination acknowledged the batch (its receipt completed
first, see :mod:`playline.sinks.engine`), so an entry is never ahead of the
destination.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playline.config import Settings
from playline.db.conn import Conn, chunks
from playline.db.dialect import marks
from playline.db.migrations import Migration, Schema
from playline.db.store import LedgerStore
from playline.stores.receipts import stored_json

__all__ = ["SCHEMA", "SyncLedger", "WrittenRecord", "open_sync_ledger", "sync_ledger_path"]

SCHEMA = Schema(
    "sync",
    (
        Migration(
            1,
            "what each sink last wrote, per record and field, and each record's object id",
            (
                "CREATE TABLE playline_sync_fields (sink {text} NOT NULL, record {text} NOT NULL,"
                " field {text} NOT NULL, value {text} NOT NULL, state {text} NOT NULL,"
                " written_at {real} NOT NULL, PRIMARY KEY (sink, record, field))",
                "CREATE TABLE playline_sync_records (sink {text} NOT NULL,"
                " record {text} NOT NULL, object_id {text}, outcome {text} NOT NULL,"
                " synced_at {real} NOT NULL, PRIMARY KEY (sink, record))",
            ),
        ),
    ),
)

#: A field the destination holds because this sink wrote it.
WRITTEN = "written"
#: A field this sink did not write (``if_blank``: the destination had a value).
KEPT = "kept"


@dataclass(frozen=True, slots=True)
class WrittenRecord:
    """One record the destination acknowledged.

    Attributes:
        record: the record's id (the value of the sync's id column).
        object_id: the destination's id for it (HubSpot's object id), if it said.
        outcome: ``created`` or ``updated``.
        written: the fields written, with their values.
        kept: the fields left as the destination had them, with the value not written.
    """

    record: str
    object_id: str | None
    outcome: str
    written: dict[str, Any] = field(default_factory=dict)
    kept: dict[str, Any] = field(default_factory=dict)


class SyncLedger(LedgerStore):
    """The sync ledger on either database (see the module docstring)."""

    SCHEMA = SCHEMA

    async def last_written(
        self, sink: str, records: Sequence[str]
    ) -> dict[str, dict[str, tuple[Any, str]]]:
        """``{record: {field: (value, state)}}`` for the records this sink wrote before."""

        def read(conn: Conn) -> dict[str, dict[str, tuple[Any, str]]]:
            found: dict[str, dict[str, tuple[Any, str]]] = {}
            for part in chunks(list(records), 500):
                rows = conn.all(
                    "SELECT record, field, value, state FROM playline_sync_fields"
                    f" WHERE sink = ? AND record IN ({marks(len(part))})",
                    [sink, *part],
                )
                for record, name, value, state in rows:
                    found.setdefault(record, {})[name] = (json.loads(value), state)
            return found

        db = await self._ready()
        return await db.read(read)

    async def record(self, sink: str, written: Sequence[WrittenRecord]) -> None:
        """Remember what the destination acknowledged (one transaction)."""

        def write(conn: Conn) -> None:
            now = self._now(conn)
            rows = [
                (sink, w.record, name, stored_json(value), state, now)
                for w in written
                for state, fields in ((WRITTEN, w.written), (KEPT, w.kept))
                for name, value in fields.items()
            ]
            conn.many(
                "INSERT INTO playline_sync_fields (sink, record, field, value, state, written_at)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (sink, record, field) DO UPDATE SET"
                " value = excluded.value, state = excluded.state, written_at = excluded.written_at",
                rows,
            )
            conn.many(
                "INSERT INTO playline_sync_records (sink, record, object_id, outcome, synced_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (sink, record) DO UPDATE SET"
                " object_id = COALESCE(excluded.object_id, playline_sync_records.object_id),"
                " outcome = excluded.outcome, synced_at = excluded.synced_at",
                [(sink, w.record, w.object_id, w.outcome, now) for w in written],
            )

        if written:
            db = await self._ready()
            await db.write(write)

    async def object_ids(self, sink: str) -> dict[str, str | None]:
        """``{record: object id}`` of every record this sink wrote (tests, reports)."""

        def read(conn: Conn) -> dict[str, str | None]:
            rows = conn.all(
                "SELECT record, object_id FROM playline_sync_records WHERE sink = ?", [sink]
            )
            return {record: object_id for record, object_id in rows}

        db = await self._ready()
        return await db.read(read)


def sync_ledger_path(settings: Settings) -> Path:
    """The SQLite ledger's file, next to the other stores."""
    return (settings.sqlite_dir or settings.home) / "sync.db"


async def open_sync_ledger(
    settings: Settings, *, clock: Callable[[], float] | None = None
) -> tuple[SyncLedger, Callable[[], Any]]:
    """The ledger where ``settings.store`` keeps the stores, and what closes it."""
    if settings.store_is_postgres:
        from playline.db.postgres import PostgresPool

        pool = await PostgresPool.open(settings.store, max_size=2)
        ledger = SyncLedger.in_database(pool, clock=clock)

        async def close_pool() -> None:
            await ledger.close()
            await pool.close()

        return ledger, close_pool
    ledger = SyncLedger.in_file(sync_ledger_path(settings), clock=clock)
    return ledger, ledger.close
