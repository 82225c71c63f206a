"""``SqliteBudgetStore``: the budget ledger in its own SQLite file, ``budgets.db``.

See :mod:`playline.stores.budgets` for the contract. Every reserve, settle, release,
adjust and define is one function run by :meth:`SqliteDatabase.write
<playline.stores.sqlite_db.SqliteDatabase.write>`: inside ``BEGIN IMMEDIATE``, which
takes the file's write lock, so the check ("does the budget cover it?") and the
write ("reserve it") are one step for every process sharing the file, and a
reservation refused or failed half-way leaves nothing (its savepoint is undone).

The file is created (and migrated) by the store's first use, by a worker or a
client alike: unlike the receipt and sheet stores, which only workers create, the
budget ledger is something a client legitimately writes (``playline budgets set``
before any run), and a client that never touches budgets creates nothing.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from playline.stores.budgets import (
    BudgetLine,
    BudgetState,
    Draw,
    NamedBudget,
    Period,
    Refusal,
    adjusted_limit,
    check_adjustment,
    check_amount,
    check_budget_id,
    check_name,
    check_period,
    creation_limit,
    first_refusal,
    named_name,
    period_id,
    unique,
    unique_lines,
    unknown_budget,
)
from playline.stores.migrations import Migration
from playline.stores.sqlite_db import SqliteDatabase

__all__ = ["MIGRATIONS", "SqliteBudgetStore"]

MIGRATIONS = (
    Migration(
        1,
        "budgets (limit, spent, reserved), their reservations, named budgets",
        (
            """CREATE TABLE budgets (
                id TEXT PRIMARY KEY,
                credit_limit REAL NOT NULL,
                spent REAL NOT NULL DEFAULT 0,
                reserved REAL NOT NULL DEFAULT 0,
                created_at REAL NOT NULL,
                updated_at REAL NOT NULL
            )""",
            # budget: as the caller names it; drawn_on: the budget row it counts in
            # (a named budget's period), so it settles there after the period ends.
            """CREATE TABLE budget_reservations (
                key TEXT NOT NULL,
                budget TEXT NOT NULL,
                drawn_on TEXT NOT NULL,
                credits REAL NOT NULL,
                status TEXT NOT NULL,
                charged REAL,
                created_at REAL NOT NULL,
                settled_at REAL,
                PRIMARY KEY (key, budget)
            ) WITHOUT ROWID""",
            """CREATE TABLE named_budgets (
                name TEXT PRIMARY KEY,
                period TEXT NOT NULL,
                credit_limit REAL NOT NULL,
                created_at REAL NOT NULL,
                updated_at REAL NOT NULL
            )""",
        ),
    ),
)

#: ``reserved`` less a reservation's credits, a float residue (or a negative) made 0.
_GIVE_BACK = "reserved = CASE WHEN reserved - :credits < 1e-9 THEN 0 ELSE reserved - :credits END"


class SqliteBudgetStore:
    """The budget ledger in one SQLite file (WAL mode), safe across processes.

    Args:
        path: the file (``Settings.budgets_path``); created by the first use.
        clock: seconds since the epoch, for named budgets' periods and timestamps
            (tests move it by hand).
    """

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._clock = clock
        self._db: SqliteDatabase | None = None
        self._opening = asyncio.Lock()

    async def _database(self) -> SqliteDatabase:
        """The file, opened (created and migrated if need be) on first use."""
        if self._db is None:
            async with self._opening:
                if self._db is None:
                    self._db = await asyncio.to_thread(
                        SqliteDatabase, self.path, MIGRATIONS, create=True
                    )
        return self._db

    # ---------------------------------------------------------------- reservations

    async def reserve(
        self, key: str, credits: float, lines: Sequence[BudgetLine]
    ) -> Refusal | None:
        amount = check_amount("the credits to reserve", credits)
        wanted = unique_lines(lines)
        now = self._clock()

        def tx(conn: sqlite3.Connection) -> Refusal | None:
            draws: list[Draw] = []
            for line in wanted:
                if _reserved(conn, key, line.budget):
                    continue
                drawn_on, limit = _target(conn, line, now)
                state = _state(conn, drawn_on)
                new = state is None
                if state is None:
                    if limit is None:
                        raise unknown_budget(line.budget)
                    state = BudgetState(drawn_on, limit, 0.0, 0.0)
                draws.append(Draw(line.budget, drawn_on, state, new=new))
            refusal = first_refusal(draws, amount)
            if refusal is not None:
                return refusal
            for draw in draws:
                if draw.new:
                    _create(conn, draw.drawn_on, draw.state.limit, now)
                conn.execute(
                    "INSERT INTO budget_reservations (key, budget, drawn_on, credits, status, "
                    "created_at) VALUES (?, ?, ?, ?, 'open', ?)",
                    (key, draw.budget, draw.drawn_on, amount, now),
                )
                conn.execute(
                    "UPDATE budgets SET reserved = reserved + ?, updated_at = ? WHERE id = ?",
                    (amount, now, draw.drawn_on),
                )
            return None

        return await (await self._database()).write(tx)

    async def settle(self, key: str, credits: float, budgets: Sequence[str]) -> None:
        charged = check_amount("the credits charged", credits)
        names = unique(check_budget_id(b) for b in budgets)
        now = self._clock()

        def tx(conn: sqlite3.Connection) -> None:
            for budget in names:
                found = _open_reservation(conn, key, budget)
                if found is None:
                    continue
                drawn_on, reserved = found
                conn.execute(
                    f"UPDATE budgets SET {_GIVE_BACK}, spent = spent + :charged, "
                    "updated_at = :now WHERE id = :id",
                    {"credits": reserved, "charged": charged, "now": now, "id": drawn_on},
                )
                conn.execute(
                    "UPDATE budget_reservations SET status = 'settled', charged = ?, "
                    "settled_at = ? WHERE key = ? AND budget = ?",
                    (charged, now, key, budget),
                )

        await (await self._database()).write(tx)

    async def release(self, key: str, budgets: Sequence[str]) -> None:
        names = unique(check_budget_id(b) for b in budgets)
        now = self._clock()

        def tx(conn: sqlite3.Connection) -> None:
            for budget in names:
                found = _open_reservation(conn, key, budget)
                if found is None:
                    continue
                drawn_on, reserved = found
                conn.execute(
                    f"UPDATE budgets SET {_GIVE_BACK}, updated_at = :now WHERE id = :id",
                    {"credits": reserved, "now": now, "id": drawn_on},
                )
                conn.execute(
                    "DELETE FROM budget_reservations WHERE key = ? AND budget = ?", (key, budget)
                )

        await (await self._database()).write(tx)

    # -------------------------------------------------------------------- limits

    async def adjust(
        self,
        budget: str,
        *,
        add: float | None = None,
        set_to: float | None = None,
        create_with: float | None = None,
    ) -> BudgetState:
        check_budget_id(budget)
        check_adjustment(add, set_to)
        initial = None if create_with is None else check_amount("create_with", create_with)
        now = self._clock()

        def tx(conn: sqlite3.Connection) -> BudgetState:
            name = named_name(budget)
            if name is not None:
                definition = _definition(conn, name)
                if definition is None:
                    raise unknown_budget(budget)
                limit = adjusted_limit(budget, definition.limit, add=add, set_to=set_to)
                conn.execute(
                    "UPDATE named_budgets SET credit_limit = ?, updated_at = ? WHERE name = ?",
                    (limit, now, name),
                )
                drawn_on = period_id(name, definition.period, now)
                if _state(conn, drawn_on) is None:
                    _create(conn, drawn_on, definition.limit, now)
            else:
                drawn_on = budget
                if _state(conn, drawn_on) is None:
                    if initial is None:
                        raise unknown_budget(budget)
                    _create(conn, drawn_on, initial, now)
            current = _state(conn, drawn_on)
            assert current is not None
            limit = adjusted_limit(budget, current.limit, add=add, set_to=set_to)
            conn.execute(
                "UPDATE budgets SET credit_limit = ?, updated_at = ? WHERE id = ?",
                (limit, now, drawn_on),
            )
            updated = _state(conn, drawn_on)
            assert updated is not None
            return updated

        return await (await self._database()).write(tx)

    async def define(self, name: str, *, period: Period, limit: float) -> NamedBudget:
        check_name(name)
        checked = NamedBudget(name, check_period(period), check_amount("the limit", limit))
        now = self._clock()

        def tx(conn: sqlite3.Connection) -> NamedBudget:
            conn.execute(
                "INSERT INTO named_budgets (name, period, credit_limit, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                "period = excluded.period, credit_limit = excluded.credit_limit, "
                "updated_at = excluded.updated_at",
                (name, checked.period, checked.limit, now, now),
            )
            drawn_on = period_id(name, checked.period, now)
            conn.execute(
                "INSERT INTO budgets (id, credit_limit, created_at, updated_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                "credit_limit = excluded.credit_limit, updated_at = excluded.updated_at",
                (drawn_on, checked.limit, now, now),
            )
            return checked

        return await (await self._database()).write(tx)

    # --------------------------------------------------------------------- reads

    async def state(self, budget: str) -> BudgetState | None:
        check_budget_id(budget.partition("@")[0])
        now = self._clock()

        def read(conn: sqlite3.Connection) -> BudgetState | None:
            name = named_name(budget) if "@" not in budget else None
            if name is None:
                return _state(conn, budget)
            definition = _definition(conn, name)
            if definition is None:
                return None
            drawn_on = period_id(name, definition.period, now)
            return _state(conn, drawn_on) or BudgetState(drawn_on, definition.limit, 0.0, 0.0)

        return await (await self._database()).read(read)

    async def definitions(self) -> list[NamedBudget]:
        def read(conn: sqlite3.Connection) -> list[NamedBudget]:
            rows = conn.execute(
                "SELECT name, period, credit_limit FROM named_budgets ORDER BY name"
            ).fetchall()
            return [NamedBudget(name, check_period(period), limit) for name, period, limit in rows]

        return await (await self._database()).read(read)

    async def close(self) -> None:
        async with self._opening:
            if self._db is not None:
                await self._db.close()
                self._db = None


# ------------------------------------------------------------ in the transaction


def _state(conn: sqlite3.Connection, budget_id: str) -> BudgetState | None:
    row = conn.execute(
        "SELECT credit_limit, spent, reserved FROM budgets WHERE id = ?", (budget_id,)
    ).fetchone()
    return None if row is None else BudgetState(budget_id, row[0], row[1], row[2])


def _create(conn: sqlite3.Connection, budget_id: str, limit: float, now: float) -> None:
    conn.execute(
        "INSERT INTO budgets (id, credit_limit, created_at, updated_at) VALUES (?, ?, ?, ?)",
        (budget_id, limit, now, now),
    )


def _definition(conn: sqlite3.Connection, name: str) -> NamedBudget | None:
    row = conn.execute(
        "SELECT period, credit_limit FROM named_budgets WHERE name = ?", (name,)
    ).fetchone()
    return None if row is None else NamedBudget(name, check_period(row[0]), row[1])


def _target(conn: sqlite3.Connection, line: BudgetLine, now: float) -> tuple[str, float | None]:
    """The budget row a line draws on and the limit it is created with if missing."""
    name = named_name(line.budget)
    if name is None:
        return line.budget, creation_limit(line)
    definition = _definition(conn, name)
    if definition is None:
        raise unknown_budget(line.budget)
    return period_id(name, definition.period, now), definition.limit


def _reserved(conn: sqlite3.Connection, key: str, budget: str) -> bool:
    """Whether ``key`` holds a reservation (open or settled) on ``budget``."""
    return (
        conn.execute(
            "SELECT 1 FROM budget_reservations WHERE key = ? AND budget = ?", (key, budget)
        ).fetchone()
        is not None
    )


def _open_reservation(conn: sqlite3.Connection, key: str, budget: str) -> tuple[str, float] | None:
    """(drawn_on, credits) of ``key``'s open reservation on ``budget``."""
    row = conn.execute(
        "SELECT drawn_on, credits FROM budget_reservations "
        "WHERE key = ? AND budget = ? AND status = 'open'",
        (key, budget),
    ).fetchone()
    return None if row is None else (row[0], row[1])
