"""``PostgresPool``: the stores' PostgreSQL database, one transaction per write.

Every store of a fleet lives in one database, in the schema the URL's
``search_path`` selects (``?options=-csearch_path%3Dname``; by default ``public``),
every table named ``playline_*``. A store function runs on a worker thread with a
connection of a ``psycopg_pool.ConnectionPool``: a read in autocommit, a write in
one transaction, run again from the start (on a fresh transaction) when PostgreSQL
reports a deadlock or a serialization failure, so the function must be
re-runnable. Rows a write reads to change are locked with the dialect's
``for_update``; two writers of one row queue on it.

Synchronous psycopg on threads, not the async driver: the store logic is then the
same plain functions SQLite runs on its thread, with no ``await`` per statement.
psycopg (the ``postgres`` extra) is imported only when a pool is opened.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from playline.db.conn import Conn, Params
from playline.db.dialect import POSTGRES
from playline.db.errors import psycopg_missing, unreachable
from playline.db.migrations import Schema, migrate
from playline.db.urls import redact_url

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

__all__ = ["RETRIES", "PostgresPool"]

T = TypeVar("T")

#: A transaction that lost a deadlock or a serialization race is run this often at most.
RETRIES = 5


class PostgresPool:
    """A pool of connections to the stores' database. Open with :meth:`open`."""

    dialect = POSTGRES
    groups_writes = False

    def __init__(self, pool: ConnectionPool[Any], where: str, threads: int) -> None:
        self._pool = pool
        self.where = where
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="playline-pg")

    @classmethod
    async def open(cls, url: str, *, min_size: int = 1, max_size: int = 10) -> PostgresPool:
        """Connect (:class:`~playline.db.errors.StoreUnavailable` with the server's
        reason when it cannot be reached), then open the pool."""
        where = redact_url(url)
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError as err:
            raise psycopg_missing() from err

        def connect() -> ConnectionPool[Any]:
            # One connection first: a wrong URL fails at once with the server's reason.
            try:
                psycopg.connect(url, autocommit=True, connect_timeout=10).close()
            except psycopg.Error as err:
                raise unreachable(where, err) from None
            pool: ConnectionPool[Any] = ConnectionPool(
                url,
                min_size=min_size,
                max_size=max_size,
                kwargs={"autocommit": True},
                open=False,
                name="playline-db",
            )
            pool.open(wait=True, timeout=30.0)
            return pool

        return cls(await asyncio.to_thread(connect), where, max_size)

    async def _on_thread(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn)

    async def read(self, fn: Callable[[Conn], T]) -> T:
        def run() -> T:
            with self._pool.connection() as raw:
                return fn(_conn(raw))

        return await self._on_thread(run)

    async def write(self, fn: Callable[[Conn], T]) -> T:
        return await self._on_thread(lambda: self._transaction(fn))

    def _transaction(self, fn: Callable[[Conn], T]) -> T:
        from psycopg import errors

        for attempt in range(1, RETRIES + 1):
            try:
                with self._pool.connection() as raw, raw.transaction():
                    return fn(_conn(raw))
            except (errors.DeadlockDetected, errors.SerializationFailure):
                if attempt == RETRIES:
                    raise
                time.sleep(0.01 * attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    async def migrate(self, schema: Schema, *, create: bool) -> int:
        def run() -> int:
            with self._pool.connection() as raw:
                return migrate(_conn(raw), schema, where=self.where, create=create)

        return await self._on_thread(run)

    async def close(self) -> None:
        await asyncio.to_thread(self._pool.close)
        self._threads.shutdown(wait=True)


def _conn(raw: psycopg.Connection[Any]) -> Conn:
    def executemany(sql: str, rows: list[Params]) -> None:
        with raw.cursor() as cursor:
            cursor.executemany(sql, rows)

    return Conn(raw, POSTGRES, executemany)
