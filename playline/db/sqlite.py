"""``SqliteFile``: one SQLite file, one long-lived thread, writes committed in groups.

The connection lives on a thread of its own, so the event loop keeps heartbeating
while SQLite waits for the file lock (another process may hold it) or a long load
runs. Everything goes to that thread:

* :meth:`SqliteFile.read` runs one function there (autocommit reads);
* :meth:`SqliteFile.write` queues one function and waits for it to be *committed*.
  Writes queued in the same event-loop tick, or while the previous group was being
  committed, go to the thread together and run in one ``BEGIN IMMEDIATE`` ...
  ``COMMIT`` (group commit, :mod:`~playline.db.coalesce`): one thread hop, one lock,
  one commit for the whole group. Each function runs under its own ``SAVEPOINT``,
  so one that raises undoes only its own changes and gets its own exception; if the
  commit fails, every function of the group gets that error and nothing is stored.

``BEGIN IMMEDIATE`` takes the file's write lock, so a write function's reads and
writes are one step for every process sharing the file (the dialect's
``for_update`` is empty here). WAL mode lets readers in other processes proceed
during a write.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from playline.db.coalesce import Coalescer
from playline.db.conn import Conn, Params
from playline.db.dialect import SQLITE
from playline.db.errors import StoreNotFound
from playline.db.migrations import Schema, migrate

__all__ = ["WAL_SWITCH_TIMEOUT_S", "SqliteFile", "commit_group", "connect", "enable_wal"]

T = TypeVar("T")
A = TypeVar("A")
_Write = Callable[[Conn], Any]


class SqliteFile:
    """A connection to one SQLite file on its own thread. See the module docstring.

    Args:
        path: the database file.
        create: create the file (and its folder) if missing; otherwise it must
            exist (a client reading it), and :class:`~playline.db.errors.StoreNotFound`
            says where it looked. Nothing is ever created by a client.
    """

    dialect = SQLITE
    groups_writes = True

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        self.path = Path(path)
        self.where = str(self.path)
        if not create and not self.path.is_file():
            raise StoreNotFound(
                f"no playline store at {self.path}; set PLAYLINE_HOME or PLAYLINE_STORE_URL "
                "to the workers' store"
            )
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"sqlite-{self.path.name}")
        try:
            self._conn = self._thread.submit(self._connect, create).result()
        except BaseException:
            self._thread.shutdown(wait=False)
            raise
        self._writes: Coalescer[_Write, Any] = Coalescer(self._send_group)

    def _connect(self, create: bool) -> Conn:
        self._raw = raw = connect(self.path, create=create)

        def executemany(sql: str, rows: list[Params]) -> None:
            raw.executemany(sql, rows)

        return Conn(raw, SQLITE, executemany)

    async def _on_thread(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn)

    async def read(self, fn: Callable[[Conn], T]) -> T:
        """Run ``fn(conn)`` on the database thread, outside any transaction."""
        return await self._on_thread(lambda: fn(self._conn))

    async def write(self, fn: Callable[[Conn], T]) -> T:
        """Run ``fn(conn)`` in the next group transaction; return once committed."""
        result: T = await self._writes.submit(fn)
        return result

    async def migrate(self, schema: Schema, *, create: bool) -> int:
        return await self._on_thread(
            lambda: migrate(self._conn, schema, where=self.where, create=create)
        )

    async def _send_group(self, group: list[_Write]) -> list[Any]:
        return await self._on_thread(lambda: self._commit_group(group))

    def _commit_group(self, group: list[_Write]) -> list[Any]:
        return commit_group(self._raw, group, self._conn)

    async def close(self) -> None:
        """Wait for queued writes to commit, then close the connection and the thread."""
        await self._writes.drain()
        await self._on_thread(self._raw.close)
        self._thread.shutdown(wait=True)


def connect(path: Path, *, create: bool) -> sqlite3.Connection:
    """A connection in autocommit (transactions are begun by hand), to a file created
    in WAL mode (``create``) or one that must exist (opened read-write, never created)."""
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        raw = sqlite3.connect(path, timeout=30.0, isolation_level=None)
    else:
        uri = f"{path.resolve().as_uri()}?mode=rw"
        raw = sqlite3.connect(uri, uri=True, timeout=30.0, isolation_level=None)
    try:
        if create:
            enable_wal(raw)
        raw.execute("PRAGMA synchronous=NORMAL")
        raw.execute("PRAGMA temp_store=FILE")
    except BaseException:
        raw.close()
        raise
    return raw


def commit_group(raw: sqlite3.Connection, group: list[Callable[[A], Any]], arg: A) -> list[Any]:
    """On the database thread: ``fn(arg)`` for each of ``group`` in one transaction,
    one savepoint each; one result or exception per function, in order."""
    results: list[Any] = []
    raw.execute("BEGIN IMMEDIATE")
    try:
        for fn in group:
            raw.execute("SAVEPOINT op")
            try:
                results.append(fn(arg))
            except Exception as err:
                raw.execute("ROLLBACK TO op")
                results.append(err)
            raw.execute("RELEASE op")
        raw.execute("COMMIT")
    except BaseException:
        if raw.in_transaction:
            raw.execute("ROLLBACK")
        raise
    return results


#: How long to keep asking for WAL mode while other processes open the same new file.
WAL_SWITCH_TIMEOUT_S = 30.0


def enable_wal(conn: sqlite3.Connection) -> None:
    """Switch the file to WAL, waiting out other processes doing the same.

    The switch needs the file to itself for an instant, and SQLite's busy handler
    does not cover it: several workers creating one store at once get "database is
    locked" at once instead of waiting. So it is retried, briefly, like a busy wait.
    """
    deadline = time.monotonic() + WAL_SWITCH_TIMEOUT_S
    delay = 0.01
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(0.5, delay * 2)
