"""The stores' PostgreSQL database: a connection pool, the schema, transactions.

Both stores of a fleet live in one database (with the fleet pacing tables), in the
schema the URL's ``search_path`` selects (``?options=-csearch_path%3Dname``; by
default ``public``). Every table is named ``playline_*``. :meth:`PostgresDatabase.open`
applies the schema's migrations (:mod:`~playline.stores.migrations`) when a worker
starts; a client only checks that they were applied.

psycopg and psycopg-pool (the ``postgres`` extra) are imported only here and only
when a PostgreSQL store is opened.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from playline.db.errors import psycopg_missing, unreachable
from playline.db.urls import redact_url
from playline.stores.migrations import Migration, migrate_postgres

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import AsyncConnectionPool

__all__ = ["MIGRATIONS", "PostgresDatabase"]

T = TypeVar("T")

#: A transaction that lost a deadlock or a serialization race is run again this often.
_RETRIES = 3


_RECEIPTS = (
    "CREATE TABLE playline_receipts ("
    " key text PRIMARY KEY,"
    " tool_id text NOT NULL,"
    " status text NOT NULL,"
    " result text,"
    " error text,"
    " owner text,"
    " lease_id text,"
    " lease_expires_at float8,"
    " created_at float8 NOT NULL,"
    " completed_at float8,"
    " attempts integer NOT NULL DEFAULT 0,"
    " credits float8 NOT NULL DEFAULT 0,"
    " batch_key text,"
    " request text)"
)

#: The stores' schema in PostgreSQL. Receipt results stay text (the canonical JSON
#: the SQLite backend stores, byte for byte); sheet rows are jsonb so computed cells
#: merge in SQL (``data || cells``).
MIGRATIONS = (
    Migration(
        1,
        "receipts, sources, sheet rows, runs and run manifests",
        (
            _RECEIPTS,
            "CREATE INDEX playline_receipts_batch ON playline_receipts (batch_key)"
            " WHERE batch_key IS NOT NULL",
            "CREATE TABLE playline_sources (dataset_id text PRIMARY KEY, columns jsonb NOT NULL,"
            " count integer NOT NULL, created_at float8)",
            "CREATE TABLE playline_source_rows (dataset_id text NOT NULL, pos integer NOT NULL,"
            " data jsonb NOT NULL, PRIMARY KEY (dataset_id, pos))",
            "CREATE TABLE playline_sheet_rows (dataset text NOT NULL, row_key text NOT NULL,"
            " data jsonb NOT NULL, first_run text, updated_at float8,"
            " PRIMARY KEY (dataset, row_key))",
            "CREATE TABLE playline_runs (run_ref text PRIMARY KEY, dataset text NOT NULL,"
            " source_id text NOT NULL, mode text NOT NULL, total integer NOT NULL,"
            " admitted integer NOT NULL, duplicates integer NOT NULL,"
            " seen_before integer NOT NULL, columns jsonb NOT NULL, created_at float8)",
            "CREATE TABLE playline_run_rows (run_ref text NOT NULL, seq integer NOT NULL,"
            " row_key text NOT NULL, status text NOT NULL, error text,"
            " PRIMARY KEY (run_ref, seq))",
        ),
    ),
    Migration(
        2,
        "receipts: sent marks, generations and forcing runs (idempotency contracts)",
        (
            "ALTER TABLE playline_receipts ADD COLUMN sent_at float8",
            "ALTER TABLE playline_receipts ADD COLUMN generation integer NOT NULL DEFAULT 0",
            "ALTER TABLE playline_receipts ADD COLUMN forced_by text",
        ),
    ),
    Migration(
        3,
        "receipts: where the credits came from (the provider's report or the billing rule)",
        ("ALTER TABLE playline_receipts ADD COLUMN IF NOT EXISTS credits_source text",),
    ),
    Migration(
        4,
        "receipts: who paid for the answer (a dataset row), so its retry reads it as its own",
        ("ALTER TABLE playline_receipts ADD COLUMN IF NOT EXISTS paid_by text",),
    ),
    Migration(
        5,
        "receipts: a tool's latest completed receipts (an estimate's hit rates and prices)",
        (
            "CREATE INDEX IF NOT EXISTS playline_receipts_tool_completed ON playline_receipts"
            " (tool_id, completed_at) WHERE status = 'completed'",
        ),
    ),
    Migration(
        6,
        "receipts: what each answer cost on its own, how often a call was sent again (audit)",
        (
            "ALTER TABLE playline_receipts ADD COLUMN IF NOT EXISTS paid_credits float8",
            "ALTER TABLE playline_receipts ADD COLUMN IF NOT EXISTS resends integer"
            " NOT NULL DEFAULT 0",
        ),
    ),
)


class PostgresDatabase:
    """A pool of autocommit connections to the stores' database. Open with :meth:`open`.

    Store methods borrow a connection per statement or transaction
    (:meth:`connection`, :meth:`transaction`); the pool keeps ``min_size`` open and
    grows to ``max_size`` under load.
    """

    def __init__(self, pool: AsyncConnectionPool[Any], where: str) -> None:
        self._pool = pool
        #: the database's URL without a password, for messages
        self.where = where

    @classmethod
    async def open(
        cls, url: str, *, create: bool = True, min_size: int = 2, max_size: int = 10
    ) -> PostgresDatabase:
        """Connect, then migrate the schema (``create``) or check it is there.

        Raises :class:`~playline.db.errors.StoreUnavailable` when the database cannot be
        reached and
        :class:`~playline.db.errors.StoreNotFound` when a client
        (``create=False``) finds no store in it.
        """
        where = redact_url(url)
        try:
            import psycopg
            from psycopg_pool import AsyncConnectionPool
        except ImportError as err:
            raise psycopg_missing() from err
        # One connection first: a wrong URL fails at once with the server's reason,
        # and the schema is migrated (or checked) before any store uses it.
        try:
            conn = await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=10)
        except psycopg.Error as err:
            raise unreachable(where, err) from None
        try:
            await migrate_postgres(conn, MIGRATIONS, component="stores", where=where, create=create)
        finally:
            await conn.close()
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            kwargs={"autocommit": True},
            open=False,
            name="playline-stores",
        )
        await pool.open()
        return cls(pool, where)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled autocommit connection for one or more single statements."""
        async with self._pool.connection() as conn:
            yield conn

    async def transaction(
        self,
        fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]],
        *,
        pipeline: bool = False,
    ) -> T:
        """Run ``fn(conn)`` in one transaction, again if it lost a deadlock or race.

        ``fn`` must be safe to run again from the start (it is, when all it does is
        in the transaction). ``pipeline`` sends statements without waiting for each
        answer (psycopg's pipeline mode): a transaction whose statements only wait
        where they read a result takes that many round trips, not one per statement.
        """
        from psycopg import errors

        for attempt in range(1, _RETRIES + 1):
            try:
                async with self._pool.connection() as conn:
                    if pipeline:
                        async with conn.pipeline(), conn.transaction():
                            return await fn(conn)
                    async with conn.transaction():
                        return await fn(conn)
            except (errors.DeadlockDetected, errors.SerializationFailure):
                if attempt == _RETRIES:
                    raise
                await asyncio.sleep(0.01 * attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        await self._pool.close()
