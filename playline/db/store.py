"""``LedgerStore``: what a store written over :mod:`playline.db` needs to get started.

A store holds its database as a :class:`~playline.db.ready.ReadyOnFirstUse` (opened
and migrated by its first use) and a clock; it is built on a SQLite file of its own
(:meth:`LedgerStore.in_file`) or on a database shared with other stores
(:meth:`LedgerStore.in_database`). Subclasses name their :class:`Schema` and write
their logic as functions of a :class:`~playline.db.conn.Conn`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, Self

from playline.db.conn import Conn
from playline.db.engine import Database
from playline.db.migrations import Schema
from playline.db.ready import ReadyOnFirstUse

__all__ = ["LedgerStore"]


class LedgerStore:
    """A store over :mod:`playline.db`, created by its first use.

    Args:
        ready: the store's database, opened and migrated by first use.
        clock: seconds since the epoch for the store's timestamps (tests move it by
            hand); default: the database's clock (SQLite: this machine's).
    """

    #: the store's tables
    SCHEMA: ClassVar[Schema]

    def __init__(self, ready: ReadyOnFirstUse, *, clock: Callable[[], float] | None = None) -> None:
        self._ready = ready
        self._clock = clock

    @classmethod
    def in_file(cls, path: str | Path, *, clock: Callable[[], float] | None = None) -> Self:
        """The store in a SQLite file of its own, created by its first use."""
        return cls(ReadyOnFirstUse.file(path, cls.SCHEMA), clock=clock)

    @classmethod
    def in_database(cls, db: Database, *, clock: Callable[[], float] | None = None) -> Self:
        """The store in a database shared with other stores (PostgreSQL's pool)."""
        return cls(ReadyOnFirstUse.shared(db, cls.SCHEMA), clock=clock)

    @property
    def where(self) -> str:
        """Where the store is (a file, or the database's URL without a password)."""
        return self._ready.where

    def _now(self, conn: Conn) -> float:
        """The store's clock, read inside a store function."""
        return self._clock() if self._clock is not None else conn.now()

    async def close(self) -> None:
        """Close the store's own file (SQLite); a shared database is left open."""
        await self._ready.close()
