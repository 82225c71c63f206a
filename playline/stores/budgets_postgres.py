"""``PostgresBudgetStore``: the budget ledger of a fleet, in the stores' PostgreSQL database.

See :mod:`playline.stores.budgets` for the contract. The reserve, settle and release
calls of a worker are committed in groups (:mod:`~playline.db.coalesce`, as the
receipt store commits claims): one transaction per group
(:meth:`PostgresDatabase.transaction
<playline.stores.postgres_db.PostgresDatabase.transaction>`) creates the budget rows
its reservations need (``INSERT ... ON CONFLICT DO NOTHING``), locks every budget row
it touches (``SELECT ... FOR UPDATE``, in id order, so two workers never deadlock on
each other's rows), reads its keys' reservations under those locks, applies the calls
in order (:class:`~playline.stores.budgets_group.GroupLedger`: each one sees the
previous ones, exactly as separate transactions would) and writes the result back.
Every change to a reservation happens under its budget row's lock, so "does it cover
it?" and "reserve it" are one step for the whole fleet, and two attempts of one call
(same key) reserve once. ``adjust`` and ``define`` are transactions of their own.

``spent`` and ``reserved`` are columns of the budget row: a group costs a fixed
number of indexed statements whatever its size, never a sum over the ledger.

The tables are the ``budgets`` component of ``playline_schema``, migrated by the
store's first use, by a worker or a client alike (a client legitimately writes the
ledger: ``playline budgets set``); a client that never touches budgets changes nothing.
Times come from the database server's clock unless a ``clock`` is given (tests).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import psycopg

from playline.db.coalesce import Coalescer
from playline.errors import UnknownBudget
from playline.stores.budgets import (
    BudgetLine,
    BudgetState,
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
    named_name,
    period_id,
    period_start,
    reservation_kind,
    unique,
    unique_lines,
    unknown_budget,
)
from playline.stores.budgets_group import GroupLedger, Held, LedgerOp, Pair
from playline.stores.migrations import Migration, migrate_postgres
from playline.stores.postgres_db import PostgresDatabase

__all__ = ["MIGRATIONS", "PostgresBudgetStore"]

MIGRATIONS = (
    Migration(
        1,
        "budgets (limit, spent, reserved), their reservations, named budgets",
        (
            "CREATE TABLE playline_budgets (id text PRIMARY KEY,"
            " credit_limit float8 NOT NULL, spent float8 NOT NULL DEFAULT 0,"
            " reserved float8 NOT NULL DEFAULT 0, created_at float8 NOT NULL,"
            " updated_at float8 NOT NULL)",
            # budget: as the caller names it; drawn_on: the budget row it counts in
            # (a named budget's period), so it settles there after the period ends.
            "CREATE TABLE playline_budget_reservations (key text NOT NULL,"
            " budget text NOT NULL, drawn_on text NOT NULL, credits float8 NOT NULL,"
            " status text NOT NULL, charged float8, created_at float8 NOT NULL,"
            " settled_at float8, PRIMARY KEY (key, budget))",
            "CREATE TABLE playline_named_budgets (name text PRIMARY KEY, period text NOT NULL,"
            " credit_limit float8 NOT NULL, created_at float8 NOT NULL,"
            " updated_at float8 NOT NULL)",
        ),
    ),
    Migration(
        2,
        "the play run of each reservation (NULL before: not ended by run); what a "
        "named budget's period took over from periods of another length",
        (
            "ALTER TABLE playline_budget_reservations ADD COLUMN run text",
            "CREATE INDEX playline_budget_reservations_open_by_run"
            " ON playline_budget_reservations (run) WHERE status = 'open'",
            "ALTER TABLE playline_budgets ADD COLUMN carried float8 NOT NULL DEFAULT 0",
        ),
    ),
)

_Conn = psycopg.AsyncConnection[Any]


class PostgresBudgetStore:
    """The budget ledger in PostgreSQL, shared by every worker and client of a fleet.

    Args:
        db: the stores' database (opened); the caller closes it.
        clock: seconds since the epoch, for named budgets' periods and timestamps;
            default: the database server's clock.
    """

    def __init__(self, db: PostgresDatabase, *, clock: Callable[[], float] | None = None) -> None:
        self._db = db
        self._clock = clock
        self._migrated = False
        self._migrating = asyncio.Lock()
        #: reserve, settle and release calls of this worker, one transaction per group
        self._ops: Coalescer[LedgerOp, Refusal | None] = Coalescer(self._group)

    async def _ready(self) -> None:
        """Apply :data:`MIGRATIONS` once per store, on first use."""
        if self._migrated:
            return
        async with self._migrating:
            if not self._migrated:
                async with self._db.connection() as conn:
                    await migrate_postgres(
                        conn, MIGRATIONS, component="budgets", where=self._db.where, create=True
                    )
                self._migrated = True

    async def _now(self, conn: _Conn) -> float:
        if self._clock is not None:
            return self._clock()
        cur = await conn.execute("SELECT extract(epoch FROM statement_timestamp())::float8")
        row = await cur.fetchone()
        assert row is not None
        return float(row[0])

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
        op = LedgerOp("reserve", key, amount, lines=tuple(unique_lines(lines)), run=run)
        await self._ready()
        return await self._ops.submit(op)

    async def settle(self, key: str, credits: float, budgets: Sequence[str]) -> None:
        charged = check_amount("the credits charged", credits)
        names = tuple(unique(check_budget_id(b) for b in budgets))
        await self._ready()
        await self._ops.submit(LedgerOp("settle", key, charged, budgets=names))

    async def release(self, key: str, budgets: Sequence[str]) -> None:
        names = tuple(unique(check_budget_id(b) for b in budgets))
        await self._ready()
        await self._ops.submit(LedgerOp("release", key, budgets=names))

    async def open_reservations(self, run: str) -> list[OpenReservation]:
        await self._ready()
        async with self._db.connection() as conn:
            return await _open_of_run(conn, run)

    async def end_run(self, run: str, sent: Mapping[str, float | None]) -> RunEnd:
        figures = {k: None if v is None else check_amount("a charge", v) for k, v in sent.items()}
        await self._ready()

        async def tx(conn: _Conn) -> RunEnd:
            now = await self._now(conn)
            opened = await _open_of_run(conn, run)
            rows = {r.drawn_on for r in opened} | {r.key for r in opened if r.what == "row"}
            states = await _lock(conn, rows)
            # Under the locks: the run's reservations as every other group left them.
            opened = await _open_of_run(conn, run)
            missing = {r.drawn_on for r in opened} - states.keys()
            if missing:
                states.update(await _lock(conn, missing))
            pairs = [(r.key, r.budget) for r in opened]
            ledger = GroupLedger(states, await _held(conn, pairs), now)
            steps: list[tuple[OpenReservation, float | None, bool]] = []
            for reservation in opened:  # calls first: the rows' budgets count them
                if reservation.what != "call":
                    continue
                amount = call_end(reservation, figures)
                names = (reservation.budget,)
                if amount is None:
                    ledger.release(LedgerOp("release", reservation.key, budgets=names))
                else:
                    ledger.settle(LedgerOp("settle", reservation.key, amount, budgets=names))
                worst = reservation.key in figures and figures[reservation.key] is None
                steps.append((reservation, amount, worst))
            for reservation in opened:
                if reservation.what != "row":
                    continue
                own = ledger.state(reservation.key)
                used = 0.0 if own is None else own.used
                names = (reservation.budget,)
                ledger.settle(LedgerOp("settle", reservation.key, used, budgets=names))
                steps.append((reservation, used, False))
            await _write(conn, ledger, now)
            return ended(run, steps)

        return await self._db.transaction(tx)

    async def _group(self, ops: list[LedgerOp]) -> list[Refusal | Exception | None]:
        """One transaction for a group of calls: see the module docstring."""
        return await self._db.transaction(lambda conn: self._apply(conn, ops))

    async def _apply(self, conn: _Conn, ops: list[LedgerOp]) -> list[Refusal | Exception | None]:
        now = await self._now(conn)
        pairs = sorted({pair for op in ops for pair in op.pairs()})
        # Where the group's reservations are, unlocked: which rows a settlement locks.
        earlier = await _held(conn, pairs)
        targets = await _targets(conn, ops, now)
        creatable: dict[str, float] = {}
        for target in targets:
            if not isinstance(target, Exception):
                for drawn_on, limit in target.values():
                    if limit is not None:
                        creatable.setdefault(drawn_on, limit)
        await _create_rows(conn, creatable, now)
        rows = {
            drawn_on
            for target in targets
            if not isinstance(target, Exception)
            for drawn_on, _ in target.values()
        }
        states = await _lock(conn, rows | {held.drawn_on for held in earlier.values()})
        # Under the locks: the reservations as every other group left them.
        held = await _held(conn, pairs)
        missing = {h.drawn_on for h in held.values()} - states.keys()
        if missing:  # reserved meanwhile on a row this group did not expect: lock it too
            states.update(await _lock(conn, missing))
        ledger = GroupLedger(states, held, now)
        results: list[Refusal | Exception | None] = []
        for op, target in zip(ops, targets, strict=True):
            if isinstance(target, Exception):
                results.append(target)
                continue
            try:
                if op.kind == "reserve":
                    results.append(ledger.reserve(op, {b: t[0] for b, t in target.items()}))
                    continue
                if op.kind == "settle":
                    ledger.settle(op)
                else:
                    ledger.release(op)
                results.append(None)
            except UnknownBudget as err:
                results.append(err)
        await _write(conn, ledger, now)
        return results

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
        await self._ready()

        async def tx(conn: _Conn) -> BudgetState:
            now = await self._now(conn)
            name = named_name(budget)
            if name is not None:
                definition = await _definition(conn, name, lock=True)
                if definition is None:
                    raise unknown_budget(budget)
                await conn.execute(
                    "UPDATE playline_named_budgets SET credit_limit = %s, updated_at = %s"
                    " WHERE name = %s",
                    [adjusted_limit(budget, definition.limit, add=add, set_to=set_to), now, name],
                )
                drawn_on = period_id(name, definition.period, now)
                initial_limit: float | None = definition.limit
            else:
                drawn_on, initial_limit = budget, initial
            if initial_limit is not None:
                await _create(conn, drawn_on, initial_limit, now)
            current = (await _lock(conn, [drawn_on])).get(drawn_on)
            if current is None:
                raise unknown_budget(budget)
            limit = adjusted_limit(budget, current.limit, add=add, set_to=set_to)
            await conn.execute(
                "UPDATE playline_budgets SET credit_limit = %s, updated_at = %s WHERE id = %s",
                [limit, now, drawn_on],
            )
            return BudgetState(drawn_on, limit, current.spent, current.reserved)

        return await self._db.transaction(tx)

    async def define(self, name: str, *, period: Period, limit: float) -> NamedBudget:
        check_name(name)
        checked = NamedBudget(name, check_period(period), check_amount("the limit", limit))
        await self._ready()

        async def tx(conn: _Conn) -> NamedBudget:
            now = await self._now(conn)
            before = await _definition(conn, name, lock=True)
            await conn.execute(
                "INSERT INTO playline_named_budgets"
                " (name, period, credit_limit, created_at, updated_at)"
                " VALUES (%(name)s, %(period)s, %(limit)s, %(now)s, %(now)s)"
                " ON CONFLICT (name) DO UPDATE SET period = EXCLUDED.period,"
                " credit_limit = EXCLUDED.credit_limit, updated_at = EXCLUDED.updated_at",
                {"name": name, "period": checked.period, "limit": checked.limit, "now": now},
            )
            await conn.execute(
                "INSERT INTO playline_budgets (id, credit_limit, created_at, updated_at)"
                " VALUES (%(id)s, %(limit)s, %(now)s, %(now)s)"
                " ON CONFLICT (id) DO UPDATE SET credit_limit = EXCLUDED.credit_limit,"
                " updated_at = EXCLUDED.updated_at",
                {"id": period_id(name, checked.period, now), "limit": checked.limit, "now": now},
            )
            if before is not None and before.period != checked.period:
                carry = await _carry(conn, name, checked.period, now)
                await conn.execute(
                    "UPDATE playline_budgets SET spent = spent + %s, carried = carried + %s"
                    " WHERE id = %s",
                    [carry, carry, period_id(name, checked.period, now)],
                )
            return checked

        return await self._db.transaction(tx)

    # --------------------------------------------------------------------- reads

    async def state(self, budget: str) -> BudgetState | None:
        check_budget_id(budget.partition("@")[0])
        await self._ready()
        async with self._db.connection() as conn:
            name = named_name(budget) if "@" not in budget else None
            if name is None:
                return (await _states(conn, [budget])).get(budget)
            definition = await _definition(conn, name)
            if definition is None:
                return None
            drawn_on = period_id(name, definition.period, await self._now(conn))
            found = (await _states(conn, [drawn_on])).get(drawn_on)
            return found or BudgetState(drawn_on, definition.limit, 0.0, 0.0)

    async def definitions(self) -> list[NamedBudget]:
        await self._ready()
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT name, period, credit_limit FROM playline_named_budgets ORDER BY name"
            )
            rows = await cur.fetchall()
        return [NamedBudget(name, check_period(period), limit) for name, period, limit in rows]

    async def close(self) -> None:
        """Wait for the calls in flight; the database is the stores' (closed with them)."""
        await self._ops.drain()


# ------------------------------------------------------------ in the transaction


async def _states(conn: _Conn, ids: Iterable[str], *, lock: bool = False) -> dict[str, BudgetState]:
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    cur = await conn.execute(
        "SELECT id, credit_limit, spent, reserved FROM playline_budgets"
        " WHERE id = ANY(%s::text[]) ORDER BY id" + (" FOR UPDATE" if lock else ""),
        [wanted],
    )
    return {row[0]: BudgetState(row[0], row[1], row[2], row[3]) for row in await cur.fetchall()}


async def _lock(conn: _Conn, ids: Iterable[str]) -> dict[str, BudgetState]:
    """Lock the budget rows ``ids`` (in id order) for this transaction; their states."""
    return await _states(conn, ids, lock=True)


async def _create(conn: _Conn, budget_id: str, limit: float, now: float) -> None:
    await conn.execute(
        "INSERT INTO playline_budgets (id, credit_limit, created_at, updated_at)"
        " VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO NOTHING",
        [budget_id, limit, now, now],
    )


async def _definition(conn: _Conn, name: str, *, lock: bool = False) -> NamedBudget | None:
    cur = await conn.execute(
        "SELECT period, credit_limit FROM playline_named_budgets WHERE name = %s"
        + (" FOR UPDATE" if lock else ""),
        [name],
    )
    row = await cur.fetchone()
    return None if row is None else NamedBudget(name, check_period(row[0]), row[1])


async def _targets(
    conn: _Conn, ops: list[LedgerOp], now: float
) -> list[dict[str, tuple[str, float | None]] | Exception]:
    """For each reservation of the group, each line's budget row and the limit it is
    created with if missing (a named budget: its current period, with the definition's
    limit); an undefined named budget is that call's ``UnknownBudget``. Settlements and
    releases get no targets."""
    names = {
        name for op in ops for line in op.lines if (name := named_name(line.budget)) is not None
    }
    definitions: dict[str, NamedBudget] = {}
    if names:
        cur = await conn.execute(
            "SELECT name, period, credit_limit FROM playline_named_budgets"
            " WHERE name = ANY(%s::text[])",
            [sorted(names)],
        )
        for name, period, limit in await cur.fetchall():
            definitions[name] = NamedBudget(name, check_period(period), limit)
    targets: list[dict[str, tuple[str, float | None]] | Exception] = []
    for op in ops:
        mine: dict[str, tuple[str, float | None]] = {}
        try:
            for line in op.lines:
                name = named_name(line.budget)
                if name is None:
                    mine[line.budget] = (line.budget, creation_limit(line))
                    continue
                definition = definitions.get(name)
                if definition is None:
                    raise unknown_budget(line.budget)
                mine[line.budget] = (period_id(name, definition.period, now), definition.limit)
        except UnknownBudget as err:
            targets.append(err)
            continue
        targets.append(mine)
    return targets


async def _held(conn: _Conn, pairs: list[Pair]) -> dict[Pair, Held]:
    """The stored reservations of ``pairs`` (open or settled)."""
    if not pairs:
        return {}
    cur = await conn.execute(
        "SELECT r.key, r.budget, r.drawn_on, r.credits, r.status, r.created_at, r.charged,"
        " r.settled_at, r.run FROM playline_budget_reservations AS r"
        " JOIN unnest(%s::text[], %s::text[]) AS p(key, budget)"
        " ON r.key = p.key AND r.budget = p.budget",
        [[key for key, _ in pairs], [budget for _, budget in pairs]],
    )
    return {
        (row[0], row[1]): Held(row[2], row[3], row[4], row[5], row[6], row[7], row[8])
        for row in await cur.fetchall()
    }


async def _open_of_run(conn: _Conn, run: str) -> list[OpenReservation]:
    cur = await conn.execute(
        "SELECT key, budget, drawn_on, credits FROM playline_budget_reservations"
        " WHERE run = %s AND status = 'open' ORDER BY key, budget",
        [run],
    )
    return [
        OpenReservation(key, budget, drawn_on, credits, run, reservation_kind(key))
        for key, budget, drawn_on, credits in await cur.fetchall()
    ]


async def _carry(conn: _Conn, name: str, period: Period, now: float) -> float:
    """As ``budgets_sqlite._carry``: what the named budget spent this ``period`` under
    periods of the other length (the month's days; today's share of the month)."""
    if period == "month":
        prefix = period_id(name, "month", now) + "-"
        cur = await conn.execute(
            "SELECT spent, carried, reserved FROM playline_budgets"
            " WHERE left(id, %s) = %s AND length(id) = %s FOR UPDATE",
            [len(prefix), prefix, len(prefix) + 2],
        )
        return carried((r[0], r[1], r[2]) for r in await cur.fetchall())
    cur = await conn.execute(
        "SELECT COALESCE(SUM(CASE WHEN status = 'open' THEN credits ELSE 0 END), 0),"
        " COALESCE(SUM(CASE WHEN status = 'settled' AND settled_at >= %s THEN charged"
        " ELSE 0 END), 0) FROM playline_budget_reservations WHERE drawn_on = %s",
        [period_start("day", now), period_id(name, "month", now)],
    )
    row = await cur.fetchone()
    assert row is not None
    return carried([(float(row[1]), 0.0, float(row[0]))])


async def _create_rows(conn: _Conn, limits: dict[str, float], now: float) -> None:
    """Create the budget rows that do not exist yet, in id order (as they are locked)."""
    if not limits:
        return
    ids = sorted(limits)
    await conn.execute(
        "INSERT INTO playline_budgets (id, credit_limit, created_at, updated_at)"
        " SELECT i, l, %(now)s, %(now)s"
        " FROM unnest(%(ids)s::text[], %(limits)s::float8[]) AS u(i, l) ORDER BY i"
        " ON CONFLICT (id) DO NOTHING",
        {"ids": ids, "limits": [limits[i] for i in ids], "now": now},
    )


async def _write(conn: _Conn, ledger: GroupLedger, now: float) -> None:
    """Store what the group changed: its reservations, then its budget rows' totals."""
    stale = ledger.stale_pairs()
    if stale:
        await conn.execute(
            "DELETE FROM playline_budget_reservations AS r"
            " USING unnest(%s::text[], %s::text[]) AS p(key, budget)"
            " WHERE r.key = p.key AND r.budget = p.budget",
            [[key for key, _ in stale], [budget for _, budget in stale]],
        )
    rows = ledger.new_rows()
    if rows:
        await conn.execute(
            "INSERT INTO playline_budget_reservations (key, budget, drawn_on, credits, status,"
            " created_at, charged, settled_at, run)"
            " SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::float8[],"
            " %s::text[], %s::float8[], %s::float8[], %s::float8[], %s::text[])",
            [
                [key for (key, _), _ in rows],
                [budget for (_, budget), _ in rows],
                [held.drawn_on for _, held in rows],
                [held.credits for _, held in rows],
                [held.status for _, held in rows],
                [held.created_at for _, held in rows],
                [held.charged for _, held in rows],
                [held.settled_at for _, held in rows],
                [held.run for _, held in rows],
            ],
        )
    states = ledger.changed_states()
    if states:
        await conn.execute(
            "UPDATE playline_budgets AS b SET reserved = u.reserved, spent = u.spent,"
            " updated_at = %s"
            " FROM unnest(%s::text[], %s::float8[], %s::float8[]) AS u(id, reserved, spent)"
            " WHERE b.id = u.id",
            [
                now,
                [state.budget for state in states],
                [state.reserved for state in states],
                [state.spent for state in states],
            ],
        )
