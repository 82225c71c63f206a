"""``Database``: how a store runs its functions, whichever database holds it.

A store writes its logic once, as synchronous functions of a
:class:`~playline.db.conn.Conn`, and hands them to :meth:`Database.read` (no
transaction) or :meth:`Database.write` (one transaction; retried from the start
when the database says it lost a race, so a write function must be re-runnable:
everything it does is in the transaction). The function runs on a thread of the
database's own, so the event loop keeps heartbeating while a lock is waited for.

Two engines implement it: :class:`~playline.db.sqlite.SqliteFile` (one file, one
thread, writes committed in groups) and :class:`~playline.db.postgres.PostgresPool`
(a pool of connections, one transaction per write).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from playline.db.conn import Conn
from playline.db.dialect import Dialect
from playline.db.migrations import Schema

__all__ = ["Database", "Fn"]

T = TypeVar("T")
#: a store function: runs against a connection, returns its result
Fn = Callable[[Conn], T]


class Database(Protocol):
    """See the module docstring."""

    #: how this database spells what differs (store code reads only this)
    dialect: Dialect
    #: where it is, without any password (for messages)
    where: str
    #: writes submitted in one event-loop tick are committed together (SQLite's group
    #: commit): a store need not group its calls itself before writing them
    groups_writes: bool

    async def read(self, fn: Callable[[Conn], T]) -> T:
        """Run ``fn`` outside a transaction (each statement sees committed data)."""
        ...

    async def write(self, fn: Callable[[Conn], T]) -> T:
        """Run ``fn`` in a transaction; return once it is committed. If ``fn`` raises,
        nothing it did is kept and the caller gets its exception."""
        ...

    async def migrate(self, schema: Schema, *, create: bool) -> int:
        """Apply ``schema``'s missing migrations (``create``) or check it is there."""
        ...

    async def close(self) -> None: ...
