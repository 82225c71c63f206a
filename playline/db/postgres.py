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

A store on the call path (fleet pacing) opens its pool with bounds instead of
waiting: a short ``wait_s`` for a connection, a ``statement_timeout_s``, and
``retry_lost`` (a call whose pooled connection turns out cut, the server having
restarted since, runs once more on a new one). It catches :attr:`PostgresPool.driver_error`
to tell a failing database from its own bugs without importing psycopg.
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

    def __init__(
        self,
        pool: ConnectionPool[Any],
        where: str,
        threads: int,
        *,
        wait_s: float | None = None,
        retry_lost: bool = False,
        statement_timeout_ms: str | None = None,
    ) -> None:
        self._pool = pool
        self.where = where
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="playline-pg")
        self._wait_s = wait_s
        self._retry_lost = retry_lost
        self._statement_timeout_ms = statement_timeout_ms

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout_s: int = 10,
        wait_s: float | None = None,
        statement_timeout_s: float | None = None,
        retry_lost: bool = False,
    ) -> PostgresPool:
        """Connect (:class:`~playline.db.errors.StoreUnavailable` with the server's
        reason when it cannot be reached), then open the pool.

        Args:
            connect_timeout_s: how long one connection attempt may take.
            wait_s: how long a call waits for a connection of the pool before the
                driver's error (``None``: the pool's default, 30 s).
            statement_timeout_s: the server cancels a statement of a read or a write
                running longer (``None``: the server's setting; a migration has none:
                it may wait for another process's, or rewrite a big table).
            retry_lost: run a call once more on a new connection when its pooled one
                turns out cut. A statement that was running when the connection was
                cut may have been applied: only for stores whose calls may run twice.
        """
        where = redact_url(url)
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError as err:
            raise psycopg_missing() from err

        timeout_ms = None
        if statement_timeout_s is not None:
            timeout_ms = str(max(1, round(statement_timeout_s * 1000)))

        def configure(raw: psycopg.Connection[Any]) -> None:
            if timeout_ms is not None:
                raw.execute("SELECT set_config('statement_timeout', %s, false)", [timeout_ms])

        def connect() -> ConnectionPool[Any]:
            # One connection first: a wrong URL fails at once with the server's reason.
            try:
                psycopg.connect(url, autocommit=True, connect_timeout=connect_timeout_s).close()
            except psycopg.Error as err:
                raise unreachable(where, err) from None
            pool: ConnectionPool[Any] = ConnectionPool(
                url,
                min_size=min_size,
                max_size=max_size,
                kwargs={"autocommit": True, "connect_timeout": connect_timeout_s},
                configure=configure,
                open=False,
                name="playline-db",
            )
            pool.open(wait=True, timeout=30.0)
            return pool

        pool = await asyncio.to_thread(connect)
        return cls(
            pool,
            where,
            max_size,
            wait_s=wait_s,
            retry_lost=retry_lost,
            statement_timeout_ms=timeout_ms,
        )

    @property
    def driver_error(self) -> type[Exception]:
        """The base class of every error the database or its driver raises (a server
        gone, a statement cancelled, a constraint broken), so a store above this
        package can tell them from its own bugs without importing the driver."""
        import psycopg

        return psycopg.Error

    async def _on_thread(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn)

    async def read(self, fn: Callable[[Conn], T]) -> T:
        return await self._on_thread(lambda: self._run(fn, transaction=False))

    async def write(self, fn: Callable[[Conn], T]) -> T:
        return await self._on_thread(lambda: self._transaction(fn))

    def _run(self, fn: Callable[[Conn], T], *, transaction: bool) -> T:
        """``fn`` on a connection of the pool (in a transaction, or autocommit); once
        more if the connection was cut and ``retry_lost`` allows, after the pool has
        dropped every other cut one (a restart cuts them all)."""
        from psycopg import OperationalError

        for attempt in (1, 2):
            with self._pool.connection(timeout=self._wait_s) as raw:
                try:
                    if not transaction:
                        return fn(_conn(raw))
                    with raw.transaction():
                        return fn(_conn(raw))
                except OperationalError:
                    if attempt == 2 or not (self._retry_lost and raw.broken):
                        raise
            self._pool.check()
        raise AssertionError("unreachable")  # pragma: no cover

    def _transaction(self, fn: Callable[[Conn], T]) -> T:
        from psycopg import errors

        for attempt in range(1, RETRIES + 1):
            try:
                return self._run(fn, transaction=True)
            except (errors.DeadlockDetected, errors.SerializationFailure):
                if attempt == RETRIES:
                    raise
                time.sleep(0.01 * attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    async def migrate(self, schema: Schema, *, create: bool) -> int:
        def run() -> int:
            with self._pool.connection(timeout=self._wait_s) as raw:
                conn, timeout_ms = _conn(raw), self._statement_timeout_ms
                if timeout_ms is None:
                    return migrate(conn, schema, where=self.where, create=create)
                conn.execute("SELECT set_config('statement_timeout', '0', false)")
                try:
                    return migrate(conn, schema, where=self.where, create=create)
                finally:
                    if not raw.broken:
                        conn.execute(
                            "SELECT set_config('statement_timeout', ?, false)", [timeout_ms]
                        )

        return await self._on_thread(run)

    async def close(self) -> None:
        await asyncio.to_thread(self._pool.close)
        self._threads.shutdown(wait=True)


def _conn(raw: psycopg.Connection[Any]) -> Conn:
    def executemany(sql: str, rows: list[Params]) -> None:
        with raw.cursor() as cursor:
            cursor.executemany(sql, rows)

    return Conn(raw, POSTGRES, executemany)
