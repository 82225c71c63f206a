"""One SQLite file, one long-lived thread, writes committed in groups.

A store's SQLite connection lives on a thread of its own, so the event loop keeps
heartbeating while SQLite waits for the file lock (another process may hold it)
or a long load runs. Everything the store does goes to that thread:

* :meth:`SqliteDatabase.read` runs one function there (autocommit reads);
* :meth:`SqliteDatabase.write` queues one function and waits for it to be
  *committed*. Writes queued in the same event-loop tick, or while the previous
  group was being committed, go to the thread together and run in one
  ``BEGIN IMMEDIATE`` ... ``COMMIT`` (group commit, see
  :mod:`~playline.db.coalesce`): one thread hop, one lock, one commit and one
  loop wake-up for the whole group, instead of one each per call. Each function
  runs under its own ``SAVEPOINT``, so one that raises undoes only its own
  changes and gets its own exception; if the commit fails, every function of the
  group gets that error and nothing of the group is stored.

A caller's ``await write(...)`` returns only once its change is committed, so
"recorded before it is reported" holds exactly as with one transaction per call.
WAL mode lets readers in other processes proceed during a write.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from playline.db.coalesce import Coalescer
from playline.db.errors import StoreNotFound
from playline.db.sqlite import commit_group, connect
from playline.stores.migrations import Migration, migrate_sqlite

__all__ = ["SqliteDatabase"]

T = TypeVar("T")
_Write = Callable[[sqlite3.Connection], Any]


class SqliteDatabase:
    """A connection to one SQLite file on its own thread. See the module docstring.

    Args:
        path: the database file.
        migrations: the file's schema (applied when ``create`` is set).
        create: create the file and migrate it (a worker); otherwise the file
            must already hold a playline store (a client reading it), and
            :class:`~playline.db.errors.StoreNotFound` says where it
            looked. Nothing is ever created by a client.
    """

    def __init__(
        self, path: str | Path, migrations: Sequence[Migration], *, create: bool = True
    ) -> None:
        self.path = Path(path)
        if not create and not self.path.is_file():
            raise StoreNotFound(
                f"no playline store at {self.path}; set PLAYLINE_HOME or PLAYLINE_STORE_URL "
                "to the workers' store"
            )
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"sqlite-{self.path.name}")
        try:
            self._conn = self._thread.submit(self._connect, migrations, create).result()
        except BaseException:
            self._thread.shutdown(wait=False)
            raise
        self._writes: Coalescer[_Write, Any] = Coalescer(self._send_group)

    def _connect(self, migrations: Sequence[Migration], create: bool) -> sqlite3.Connection:
        conn = connect(self.path, create=create)
        try:
            migrate_sqlite(conn, migrations, where=str(self.path), create=create)
        except BaseException:
            conn.close()
            raise
        return conn

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on the database thread, outside any transaction."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, self._conn)

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` in the next group transaction; return once committed."""
        result: T = await self._writes.submit(fn)
        return result

    async def _send_group(self, group: list[_Write]) -> list[Any]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._commit_group, group)

    def _commit_group(self, group: list[_Write]) -> list[Any]:
        return commit_group(self._conn, group, self._conn)

    async def close(self) -> None:
        """Wait for queued writes to commit, then close the connection and the thread."""
        await self._writes.drain()
        await asyncio.get_running_loop().run_in_executor(self._thread, self._conn.close)
        self._thread.shutdown(wait=True)
