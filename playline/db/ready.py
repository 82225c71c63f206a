"""``ReadyOnFirstUse``: a store's database, opened and migrated by the store's first use.

The budget and job ledgers are written by workers and clients alike (``playline
budgets set`` before any run), so whoever uses one first creates it; a process that
never touches it creates nothing, not even an empty file. On SQLite that means the
file is opened on first use (and closed with the store); on PostgreSQL the pool is
shared by every store of the process, and first use only migrates the store's
component (the pool is closed by whoever opened it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from playline.db.engine import Database
from playline.db.migrations import Schema

__all__ = ["ReadyOnFirstUse"]


@dataclass(eq=False)
class ReadyOnFirstUse:
    """Call it for the store's database, ready to use. Build with :meth:`file` or
    :meth:`shared`.

    Args:
        open_db: opens the database (called once, on first use).
        schema: the store's tables, migrated right after.
        where: where it is (for messages and tests).
        owned: close the database with the store (a file of its own).
        create: create and migrate what is missing (the ledgers, a worker's stores);
            ``False`` for a client of stores only workers create (receipts, sheet):
            the file must exist and the schema is only checked, nothing is created.
    """

    _open_db: Callable[[], Awaitable[Database]]
    _schema: Schema
    _: KW_ONLY
    where: str
    owned: bool
    create: bool = True
    _db: Database | None = field(default=None, init=False)
    _opening: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)

    @classmethod
    def file(cls, path: str | Path, schema: Schema, *, create: bool = True) -> ReadyOnFirstUse:
        """A SQLite file of the store's own, created by its first use (``create``)."""
        from playline.db.sqlite import SqliteFile

        async def open_db() -> Database:
            return await asyncio.to_thread(SqliteFile, path, create=create)

        return cls(open_db, schema, where=str(path), owned=True, create=create)

    @classmethod
    def shared(cls, db: Database, schema: Schema, *, create: bool = True) -> ReadyOnFirstUse:
        """A database other stores share (PostgreSQL), not closed with this store."""

        async def open_db() -> Database:
            return db

        return cls(open_db, schema, where=db.where, owned=False, create=create)

    @property
    def opened(self) -> bool:
        return self._db is not None

    async def __call__(self) -> Database:
        if self._db is None:
            async with self._opening:
                if self._db is None:
                    db = await self._open_db()
                    try:
                        await db.migrate(self._schema, create=self.create)
                    except BaseException:
                        if self.owned:
                            await db.close()
                        raise
                    self._db = db
        return self._db

    async def close(self) -> None:
        async with self._opening:
            if self._db is not None and self.owned:
                await self._db.close()
            self._db = None
