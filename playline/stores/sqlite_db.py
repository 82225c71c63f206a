"""One SQLite file shared by the stores of a worker: connection, thread hop, transactions.

SQLite calls run on a worker thread so the event loop keeps heartbeating while a
write waits for the file lock (another process may hold it). WAL mode lets readers
proceed during a write; ``BEGIN IMMEDIATE`` takes the write lock up front so a
multi-statement transaction never fails half-way on a lock upgrade.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class SqliteDatabase:
    """A connection to one SQLite file, used from one thread at a time."""

    def __init__(
        self,
        path: str | Path,
        schema: str,
        *,
        added_columns: dict[str, dict[str, str]] | None = None,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(
            self.path, timeout=30.0, isolation_level=None, check_same_thread=False
        )
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(schema)
        for table, columns in (added_columns or {}).items():
            present = {row[1] for row in self._conn.execute(f"PRAGMA table_info({table})")}
            for name, kind in columns.items():
                if name not in present:
                    self._conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on a worker thread, one call at a time."""

        def locked() -> T:
            with self._lock:
                return fn(self._conn)

        return await asyncio.to_thread(locked)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


@contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on any error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
