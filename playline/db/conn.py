"""``Conn``: the five calls a store function makes on either database.

A store's logic is plain synchronous functions ``fn(conn) -> T``, run by a
:class:`~playline.db.engine.Database` inside a transaction (writes) or outside one
(reads). They see only this wrapper, never ``sqlite3`` or ``psycopg``: both drivers'
connections have ``execute`` returning a cursor, so one wrapper serves both, with
the SQL translated by the :class:`~playline.db.dialect.Dialect`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from playline.db.dialect import Dialect

__all__ = ["Conn", "Params", "chunks"]

#: positional parameters of one statement
Params = Sequence[Any]


class _Cursor(Protocol):
    rowcount: int

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class _Driver(Protocol):
    """What ``sqlite3.Connection`` and ``psycopg.Connection`` both offer."""

    def execute(self, sql: Any, params: Any = ..., /) -> Any: ...


class Conn:
    """A driver connection, its dialect, and the clock store functions read.

    Args:
        raw: the ``sqlite3`` or ``psycopg`` connection.
        dialect: how its SQL is spelled.
        executemany: runs one statement for many rows (the drivers differ here).
    """

    def __init__(
        self,
        raw: _Driver,
        dialect: Dialect,
        executemany: Callable[[str, list[Params]], None],
    ) -> None:
        self._raw = raw
        self.dialect = dialect
        self._executemany = executemany

    def _run(self, sql: str, params: Params) -> _Cursor:
        cursor: _Cursor = self._raw.execute(self.dialect.sql(sql), tuple(params))
        return cursor

    def execute(self, sql: str, params: Params = ()) -> int:
        """Run one statement; how many rows it changed."""
        return int(self._run(sql, params).rowcount)

    def one(self, sql: str, params: Params = ()) -> tuple[Any, ...] | None:
        """The first row of a query, ``None`` if it has none."""
        row = self._run(sql, params).fetchone()
        return None if row is None else tuple(row)

    def all(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        """Every row of a query."""
        return [tuple(row) for row in self._run(sql, params).fetchall()]

    def scalar(self, sql: str, params: Params = ()) -> Any:
        """The first column of the first row (``None`` if there is no row)."""
        row = self.one(sql, params)
        return None if row is None else row[0]

    def many(self, sql: str, rows: Iterable[Params]) -> None:
        """Run one statement for each of ``rows``, in order (one round trip where the
        driver can: psycopg pipelines them)."""
        batch: list[Params] = [tuple(row) for row in rows]
        if batch:
            self._executemany(self.dialect.sql(sql), batch)

    def now(self) -> float:
        """The database's clock in epoch seconds (SQLite: this machine's)."""
        if self.dialect.now_sql is None:
            return time.time()
        return float(self.scalar(self.dialect.now_sql))


def chunks(values: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    """``values`` in slices of at most ``size`` (for ``IN (...)`` lists)."""
    for start in range(0, len(values), size):
        yield values[start : start + size]
