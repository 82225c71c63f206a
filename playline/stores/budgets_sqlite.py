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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from playline.stores.budgets import (
    BudgetLine,
    BudgetState,
    Draw,
    NamedBudget,
    OpenReservation,
    Period,
    Refusal,
    RunEnd,
    adjusted_limit,
    call_end,
    carried,
    check_adjustment,
    check_amount,
    check_budget_id,
    check_name,
    check_period,
    creation_limit,
    ended,
    first_refusal,
    named_name,
    period_id,
    period_start,
    reservation_kind,
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
    Migration(
        2,
        "the play run of each reservation (NULL before: not ended by run); what a "
        "named budget's period took over from periods of another length",
        (
            "ALTER TABLE budget_reservations ADD COLUMN run TEXT",
            "CREATE INDEX budget_reservations_open_by_run ON budget_reservations (run)"
            " WHERE status = 'open'",
            "ALTER TABLE budgets ADD COLUMN carried REAL NOT NULL DEFAULT 0",
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
        self,
        key: str,
        credits: float,
        lines: Sequence[BudgetLine],
        *,
        run: str | None = None,
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
                    "created_at, run) VALUES (?, ?, ?, ?, 'open', ?, ?)",
                    (key, draw.budget, draw.drawn_on, amount, now, run),
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
                _settle(conn, key, budget, charged, now)

        await (await self._database()).write(tx)

    async def release(self, key: str, budgets: Sequence[str]) -> None:
        names = unique(check_budget_id(b) for b in budgets)
        now = self._clock()

        def tx(conn: sqlite3.Connection) -> None:
            for budget in names:
                _release(conn, key, budget, now)

        await (await self._database()).write(tx)

    async def open_reservations(self, run: str) -> list[OpenReservation]:
        def read(conn: sqlite3.Connection) -> list[OpenReservation]:
            return _open_of_run(conn, run)

        return await (await self._database()).read(read)

    async def end_run(self, run: str, sent: Mapping[str, float | None]) -> RunEnd:
        figures = {k: None if v is None else check_amount("a charge", v) for k, v in sent.items()}
        now = self._clock()

        def tx(conn: sqlite3.Connection) -> RunEnd:
            opened = _open_of_run(conn, run)
            steps: list[tuple[OpenReservation, float | None, bool]] = []
            for reservation in opened:  # calls first: the rows' budgets count them
                if reservation.what != "call":
                    continue
                amount = call_end(reservation, figures)
                if amount is None:
                    _release(conn, reservation.key, reservation.budget, now)
                else:
                    _settle(conn, reservation.key, reservation.budget, amount, now)
                worst = reservation.key in figures and figures[reservation.key] is None
                steps.append((reservation, amount, worst))
            for reservation in opened:
                if reservation.what != "row":
                    continue
                own = _state(conn, reservation.key)
                used = 0.0 if own is None else own.used
                _settle(conn, reservation.key, reservation.budget, used, now)
                steps.append((reservation, used, False))
            return ended(run, steps)

        return await (await self._database()).write(tx)

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
            before = _definition(conn, name)
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
            if before is not None and before.period != checked.period:
                carry = _carry(conn, name, checked.period, now)
                conn.execute(
                    "UPDATE budgets SET spent = spent + ?, carried = carried + ? WHERE id = ?",
                    (carry, carry, drawn_on),
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


def _settle(conn: sqlite3.Connection, key: str, budget: str, charged: float, now: float) -> None:
    """Settle ``(key, budget)`` at ``charged`` if it is open."""
    found = _open_reservation(conn, key, budget)
    if found is None:
        return
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


def _release(conn: sqlite3.Connection, key: str, budget: str, now: float) -> None:
    """Remove ``(key, budget)`` and give its credits back if it is open."""
    found = _open_reservation(conn, key, budget)
    if found is None:
        return
    drawn_on, reserved = found
    conn.execute(
        f"UPDATE budgets SET {_GIVE_BACK}, updated_at = :now WHERE id = :id",
        {"credits": reserved, "now": now, "id": drawn_on},
    )
    conn.execute("DELETE FROM budget_reservations WHERE key = ? AND budget = ?", (key, budget))


def _open_of_run(conn: sqlite3.Connection, run: str) -> list[OpenReservation]:
    rows = conn.execute(
        "SELECT key, budget, drawn_on, credits FROM budget_reservations"
        " WHERE run = ? AND status = 'open' ORDER BY key, budget",
        (run,),
    ).fetchall()
    return [
        OpenReservation(key, budget, drawn_on, credits, run, reservation_kind(key))
        for key, budget, drawn_on, credits in rows
    ]


def _carry(conn: sqlite3.Connection, name: str, period: Period, now: float) -> float:
    """What a named budget spent this ``period`` under periods of the other length
    (its length just changed to ``period``): per month, the month's days; per day,
    today's share of the month (what its reservations settled today, and those open)."""
    if period == "month":
        prefix = period_id(name, "month", now) + "-"
        rows = conn.execute(
            "SELECT spent, carried, reserved FROM budgets"
            " WHERE substr(id, 1, ?) = ? AND length(id) = ?",
            (len(prefix), prefix, len(prefix) + 2),
        ).fetchall()
        return carried((r[0], r[1], r[2]) for r in rows)
    month = period_id(name, "month", now)
    row = conn.execute(
        "SELECT COALESCE(SUM(CASE WHEN status = 'open' THEN credits ELSE 0 END), 0),"
        " COALESCE(SUM(CASE WHEN status = 'settled' AND settled_at >= ? THEN charged"
        " ELSE 0 END), 0) FROM budget_reservations WHERE drawn_on = ?",
        (period_start("day", now), month),
    ).fetchone()
    return carried([(float(row[1]), 0.0, float(row[0]))])


def _open_reservation(conn: sqlite3.Connection, key: str, budget: str) -> tuple[str, float] | None:
    """(drawn_on, credits) of ``key``'s open reservation on ``budget``."""
    row = conn.execute(
        "SELECT drawn_on, credits FROM budget_reservations "
        "WHERE key = ? AND budget = ? AND status = 'open'",
        (key, budget),
    ).fetchone()
    return None if row is None else (row[0], row[1])
