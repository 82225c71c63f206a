"""``BudgetLedger``: the budget ledger, one implementation for SQLite and PostgreSQL.

See :mod:`playline.stores.budgets` for the contract. The reserve, settle and release
calls of a process are committed in groups (:mod:`~playline.db.coalesce`): one write
function per group (:meth:`Database.write <playline.db.engine.Database.write>`)
creates the budget rows its reservations need (``INSERT ... ON CONFLICT DO
NOTHING``), locks every budget row it touches (the dialect's ``FOR UPDATE``, in id
order, so two PostgreSQL workers never deadlock on each other's rows; on SQLite the
write already holds the file), reads its keys' reservations under those locks,
applies the calls in order with the one ledger rule,
:class:`~playline.stores.budgets_group.GroupLedger` (each call sees the previous
ones, exactly as separate transactions would), and writes the result back. So "does
it cover it?" and "reserve it" are one step for the whole fleet, and two attempts of
one call (same key) reserve once. ``end_run`` applies the same rule to a run's open
reservations; ``adjust`` and ``define`` are writes of their own.

``spent`` and ``reserved`` are columns of the budget row: a group costs a fixed
number of indexed statements whatever its size, never a sum over the ledger.

The tables are created (SQLite: the file ``budgets.db``; PostgreSQL: the ``budgets``
component) by the store's first use, by a worker or a client alike (a client
legitimately writes the ledger: ``playline budgets set``); a process that never
touches budgets creates nothing. Times come from the database's clock (SQLite: this
machine's) unless a ``clock`` is given (tests).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from playline.db.coalesce import Coalescer
from playline.db.conn import Conn, chunks
from playline.db.dialect import marks
from playline.db.migrations import Migration, Schema
from playline.db.ready import ReadyOnFirstUse
from playline.db.store import LedgerStore
from playline.errors import UnknownBudget
from playline.stores.budget_ids import BudgetId, NamedBudgetId, as_budget_id, budget_key
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
    period_id,
    period_start,
    reservation_kind,
    unique,
    unique_lines,
    unknown_budget,
)
from playline.stores.budgets_group import GroupLedger, Held, LedgerOp, Pair

__all__ = ["SCHEMA", "BudgetLedger"]

SCHEMA = Schema(
    "budgets",
    (
        Migration(
            1,
            "budgets (limit, spent, reserved), their reservations, named budgets",
            # budget: as the caller names it; drawn_on: the budget row it counts in
            # (a named budget's period), so it settles there after the period ends.
            sqlite=(
                "CREATE TABLE budgets (id TEXT PRIMARY KEY, credit_limit REAL NOT NULL,"
                " spent REAL NOT NULL DEFAULT 0, reserved REAL NOT NULL DEFAULT 0,"
                " created_at REAL NOT NULL, updated_at REAL NOT NULL)",
                "CREATE TABLE budget_reservations (key TEXT NOT NULL, budget TEXT NOT NULL,"
                " drawn_on TEXT NOT NULL, credits REAL NOT NULL, status TEXT NOT NULL,"
                " charged REAL, created_at REAL NOT NULL, settled_at REAL,"
                " PRIMARY KEY (key, budget)) WITHOUT ROWID",
                "CREATE TABLE named_budgets (name TEXT PRIMARY KEY, period TEXT NOT NULL,"
                " credit_limit REAL NOT NULL, created_at REAL NOT NULL,"
                " updated_at REAL NOT NULL)",
            ),
            postgres=(
                "CREATE TABLE playline_budgets (id text PRIMARY KEY,"
                " credit_limit float8 NOT NULL, spent float8 NOT NULL DEFAULT 0,"
                " reserved float8 NOT NULL DEFAULT 0, created_at float8 NOT NULL,"
                " updated_at float8 NOT NULL)",
                "CREATE TABLE playline_budget_reservations (key text NOT NULL,"
                " budget text NOT NULL, drawn_on text NOT NULL, credits float8 NOT NULL,"
                " status text NOT NULL, charged float8, created_at float8 NOT NULL,"
                " settled_at float8, PRIMARY KEY (key, budget))",
                "CREATE TABLE playline_named_budgets (name text PRIMARY KEY,"
                " period text NOT NULL, credit_limit float8 NOT NULL,"
                " created_at float8 NOT NULL, updated_at float8 NOT NULL)",
            ),
        ),
        Migration(
            2,
            "the play run of each reservation (NULL before: not ended by run); what a "
            "named budget's period took over from periods of another length",
            sqlite=(
                "ALTER TABLE budget_reservations ADD COLUMN run TEXT",
                "CREATE INDEX budget_reservations_open_by_run ON budget_reservations (run)"
                " WHERE status = 'open'",
                "ALTER TABLE budgets ADD COLUMN carried REAL NOT NULL DEFAULT 0",
            ),
            postgres=(
                "ALTER TABLE playline_budget_reservations ADD COLUMN run text",
                "CREATE INDEX playline_budget_reservations_open_by_run"
                " ON playline_budget_reservations (run) WHERE status = 'open'",
                "ALTER TABLE playline_budgets ADD COLUMN carried float8 NOT NULL DEFAULT 0",
            ),
        ),
        Migration(
            3,
            "one name per table on both databases (SQLite's tables take PostgreSQL's)",
            sqlite=(
                "ALTER TABLE budgets RENAME TO playline_budgets",
                "ALTER TABLE budget_reservations RENAME TO playline_budget_reservations",
                "ALTER TABLE named_budgets RENAME TO playline_named_budgets",
            ),
            postgres=(),
        ),
        Migration(
            4,
            "what one credit of a reservation counts in its budget (1 before: credits; a "
            "provider's credit price on a run's money cap)",
            sqlite=(
                "ALTER TABLE playline_budget_reservations ADD COLUMN scale REAL NOT NULL DEFAULT 1",
            ),
            postgres=(
                "ALTER TABLE playline_budget_reservations"
                " ADD COLUMN scale float8 NOT NULL DEFAULT 1",
            ),
        ),
    ),
)

_RESERVATION_COLUMNS = (
    "key, budget, drawn_on, credits, status, created_at, charged, settled_at, run, scale"
)


class BudgetLedger(LedgerStore):
    """The budget ledger on either database; safe across processes and workers.

    Build it with :meth:`~playline.db.store.LedgerStore.in_file` (SQLite,
    ``Settings.budgets_path``) or :meth:`~playline.db.store.LedgerStore.in_database`
    (PostgreSQL); ``clock``: for named budgets' periods and timestamps (default: the
    database's).
    """

    SCHEMA = SCHEMA

    def __init__(self, ready: ReadyOnFirstUse, *, clock: Callable[[], float] | None = None) -> None:
        super().__init__(ready, clock=clock)
        #: reserve, settle and release calls of this process, one write per group
        self._ops: Coalescer[LedgerOp, Refusal | None] = Coalescer(self._group)

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
        return await self._ops.submit(op)

    async def settle(self, key: str, credits: float, budgets: Sequence[BudgetId | str]) -> None:
        charged = check_amount("the credits charged", credits)
        names = tuple(unique(check_budget_id(b) for b in budgets))
        await self._ops.submit(LedgerOp("settle", key, charged, budgets=names))

    async def release(self, key: str, budgets: Sequence[BudgetId | str]) -> None:
        names = tuple(unique(check_budget_id(b) for b in budgets))
        await self._ops.submit(LedgerOp("release", key, budgets=names))

    async def open_reservations(self, run: str) -> list[OpenReservation]:
        return await (await self._ready()).read(lambda conn: _open_of_run(conn, run))

    async def end_run(self, run: str, sent: Mapping[str, float | None]) -> RunEnd:
        figures = {k: None if v is None else check_amount("a charge", v) for k, v in sent.items()}

        def tx(conn: Conn) -> RunEnd:
            now = self._now(conn)
            opened = _open_of_run(conn, run)
            rows = {r.drawn_on for r in opened} | {r.key for r in opened if r.what == "row"}
            states = _lock(conn, rows)
            # Under the locks: the run's reservations as every other group left them.
            opened = _open_of_run(conn, run)
            missing = {r.drawn_on for r in opened} - states.keys()
            if missing:
                states.update(_lock(conn, missing))
            ledger = GroupLedger(states, _held(conn, [(r.key, r.budget) for r in opened]), now)
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
            _write(conn, ledger, now)
            return ended(run, steps)

        return await (await self._ready()).write(tx)

    async def _group(self, ops: list[LedgerOp]) -> list[Refusal | Exception | None]:
        """One write for a group of calls: see the module docstring."""
        return await (await self._ready()).write(lambda conn: self._apply(conn, ops))

    def _apply(self, conn: Conn, ops: list[LedgerOp]) -> list[Refusal | Exception | None]:
        now = self._now(conn)
        pairs = sorted({pair for op in ops for pair in op.pairs()})
        # Where the group's reservations are, unlocked: which rows a settlement locks.
        earlier = _held(conn, pairs)
        targets = _targets(conn, ops, now)
        creatable: dict[str, float] = {}
        for target in targets:
            if not isinstance(target, Exception):
                for drawn_on, limit in target.values():
                    if limit is not None:
                        creatable.setdefault(drawn_on, limit)
        _create_rows(conn, creatable, now)
        rows = {
            drawn_on
            for target in targets
            if not isinstance(target, Exception)
            for drawn_on, _ in target.values()
        }
        states = _lock(conn, rows | {held.drawn_on for held in earlier.values()})
        # Under the locks: the reservations as every other group left them.
        held = _held(conn, pairs)
        missing = {h.drawn_on for h in held.values()} - states.keys()
        if missing:  # reserved meanwhile on a row this group did not expect: lock it too
            states.update(_lock(conn, missing))
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
        _write(conn, ledger, now)
        return results

    # -------------------------------------------------------------------- limits

    async def adjust(
        self,
        budget: BudgetId | str,
        *,
        add: float | None = None,
        set_to: float | None = None,
        create_with: float | None = None,
    ) -> BudgetState:
        ref = as_budget_id(budget)
        check_adjustment(add, set_to)
        initial = None if create_with is None else check_amount("create_with", create_with)

        def tx(conn: Conn) -> BudgetState:
            now = self._now(conn)
            if isinstance(ref, NamedBudgetId):
                definition = _definition(conn, ref.name, lock=True)
                if definition is None:
                    raise unknown_budget(ref)
                conn.execute(
                    "UPDATE playline_named_budgets SET credit_limit = ?, updated_at = ?"
                    " WHERE name = ?",
                    [adjusted_limit(ref, definition.limit, add=add, set_to=set_to), now, ref.name],
                )
                drawn_on = period_id(ref.name, definition.period, now)
                initial_limit: float | None = definition.limit
            else:
                drawn_on, initial_limit = budget_key(ref), initial
            if initial_limit is not None:
                _create_rows(conn, {drawn_on: initial_limit}, now)
            current = _lock(conn, [drawn_on]).get(drawn_on)
            if current is None:
                raise unknown_budget(ref)
            limit = adjusted_limit(ref, current.limit, add=add, set_to=set_to)
            conn.execute(
                "UPDATE playline_budgets SET credit_limit = ?, updated_at = ? WHERE id = ?",
                [limit, now, drawn_on],
            )
            return BudgetState(drawn_on, limit, current.spent, current.reserved)

        return await (await self._ready()).write(tx)

    async def define(self, name: str, *, period: Period, limit: float) -> NamedBudget:
        check_name(name)
        checked = NamedBudget(name, check_period(period), check_amount("the limit", limit))

        def tx(conn: Conn) -> NamedBudget:
            now = self._now(conn)
            before = _definition(conn, name, lock=True)
            conn.execute(
                "INSERT INTO playline_named_budgets"
                " (name, period, credit_limit, created_at, updated_at) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET period = excluded.period,"
                " credit_limit = excluded.credit_limit, updated_at = excluded.updated_at",
                [name, checked.period, checked.limit, now, now],
            )
            drawn_on = period_id(name, checked.period, now)
            conn.execute(
                "INSERT INTO playline_budgets (id, credit_limit, created_at, updated_at)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
                " credit_limit = excluded.credit_limit, updated_at = excluded.updated_at",
                [drawn_on, checked.limit, now, now],
            )
            if before is not None and before.period != checked.period:
                carry = _carry(conn, name, checked.period, now)
                conn.execute(
                    "UPDATE playline_budgets SET spent = spent + ?, carried = carried + ?"
                    " WHERE id = ?",
                    [carry, carry, drawn_on],
                )
            return checked

        return await (await self._ready()).write(tx)

    # --------------------------------------------------------------------- reads

    async def state(self, budget: BudgetId | str) -> BudgetState | None:
        ref = as_budget_id(budget)

        def read(conn: Conn) -> BudgetState | None:
            if not isinstance(ref, NamedBudgetId) or ref.period is not None:
                key = budget_key(ref)
                return _states(conn, [key]).get(key)
            definition = _definition(conn, ref.name)
            if definition is None:
                return None
            drawn_on = period_id(ref.name, definition.period, self._now(conn))
            found = _states(conn, [drawn_on]).get(drawn_on)
            return found or BudgetState(drawn_on, definition.limit, 0.0, 0.0)

        return await (await self._ready()).read(read)

    async def definitions(self) -> list[NamedBudget]:
        def read(conn: Conn) -> list[NamedBudget]:
            rows = conn.all(
                "SELECT name, period, credit_limit FROM playline_named_budgets ORDER BY name"
            )
            return [NamedBudget(name, check_period(period), limit) for name, period, limit in rows]

        return await (await self._ready()).read(read)

    async def close(self) -> None:
        """Wait for the calls in flight, then close the ledger's own file (SQLite)."""
        await self._ops.drain()
        await super().close()


# ------------------------------------------------------------ in the transaction


def _states(conn: Conn, ids: Iterable[str], *, lock: bool = False) -> dict[str, BudgetState]:
    """The budget rows ``ids`` (those that exist); ``lock``: locked, in id order."""
    found: dict[str, BudgetState] = {}
    lock_sql = conn.dialect.for_update if lock else ""
    for batch in chunks(sorted(set(ids)), conn.dialect.max_params):
        for budget, limit, spent, reserved in conn.all(
            "SELECT id, credit_limit, spent, reserved FROM playline_budgets"
            f" WHERE id IN ({marks(len(batch))}) ORDER BY id{lock_sql}",
            batch,
        ):
            found[budget] = BudgetState(budget, limit, spent, reserved)
    return found


def _lock(conn: Conn, ids: Iterable[str]) -> dict[str, BudgetState]:
    """Lock the budget rows ``ids`` (in id order) for this transaction; their states."""
    return _states(conn, ids, lock=True)


def _definition(conn: Conn, name: str, *, lock: bool = False) -> NamedBudget | None:
    row = conn.one(
        "SELECT period, credit_limit FROM playline_named_budgets WHERE name = ?"
        + (conn.dialect.for_update if lock else ""),
        [name],
    )
    return None if row is None else NamedBudget(name, check_period(row[0]), row[1])


def _targets(
    conn: Conn, ops: list[LedgerOp], now: float
) -> list[dict[str, tuple[str, float | None]] | Exception]:
    """For each reservation of the group, each line's budget row and the limit it is
    created with if missing (a named budget: its current period, with the definition's
    limit); an undefined named budget is that call's ``UnknownBudget``. Settlements and
    releases get no targets."""
    names = sorted(
        {
            ref.name
            for op in ops
            for line in op.lines
            if isinstance(ref := line.budget, NamedBudgetId) and ref.period is None
        }
    )
    definitions: dict[str, NamedBudget] = {}
    for batch in chunks(names, conn.dialect.max_params):
        for name, period, limit in conn.all(
            "SELECT name, period, credit_limit FROM playline_named_budgets"
            f" WHERE name IN ({marks(len(batch))})",
            batch,
        ):
            definitions[name] = NamedBudget(name, check_period(period), limit)
    targets: list[dict[str, tuple[str, float | None]] | Exception] = []
    for op in ops:
        mine: dict[str, tuple[str, float | None]] = {}
        try:
            for line in op.lines:
                ref = line.budget
                if not isinstance(ref, NamedBudgetId) or ref.period is not None:
                    mine[line.key] = (line.key, creation_limit(line))
                    continue
                definition = definitions.get(ref.name)
                if definition is None:
                    raise unknown_budget(ref)
                mine[line.key] = (period_id(ref.name, definition.period, now), definition.limit)
        except UnknownBudget as err:
            targets.append(err)
            continue
        targets.append(mine)
    return targets


def _held(conn: Conn, pairs: Sequence[Pair]) -> dict[Pair, Held]:
    """The stored reservations of ``pairs`` (open or settled)."""
    wanted = set(pairs)
    found: dict[Pair, Held] = {}
    for batch in chunks(sorted({key for key, _ in wanted}), conn.dialect.max_params):
        for row in conn.all(
            f"SELECT {_RESERVATION_COLUMNS} FROM playline_budget_reservations"
            f" WHERE key IN ({marks(len(batch))})",
            batch,
        ):
            key, budget, drawn_on, credits, status, created, charged, settled, run, scale = row
            if (key, budget) in wanted:
                found[key, budget] = Held(
                    drawn_on, credits, status, created, charged, settled, run, scale
                )
    return found


def _open_of_run(conn: Conn, run: str) -> list[OpenReservation]:
    rows = conn.all(
        "SELECT key, budget, drawn_on, credits FROM playline_budget_reservations"
        " WHERE run = ? AND status = 'open' ORDER BY key, budget",
        [run],
    )
    return [
        OpenReservation(key, budget, drawn_on, credits, run, reservation_kind(key))
        for key, budget, drawn_on, credits in rows
    ]


def _carry(conn: Conn, name: str, period: Period, now: float) -> float:
    """What a named budget spent this ``period`` under periods of the other length
    (its length just changed to ``period``): per month, the month's days; per day,
    today's share of the month (what its reservations settled today, and those open)."""
    if period == "month":
        prefix = period_id(name, "month", now) + "-"
        rows = conn.all(
            "SELECT spent, carried, reserved FROM playline_budgets"
            f" WHERE substr(id, 1, ?) = ? AND length(id) = ?{conn.dialect.for_update}",
            [len(prefix), prefix, len(prefix) + 2],
        )
        return carried((r[0], r[1], r[2]) for r in rows)
    row = conn.one(
        "SELECT COALESCE(SUM(CASE WHEN status = 'open' THEN credits * scale ELSE 0 END), 0),"
        " COALESCE(SUM(CASE WHEN status = 'settled' AND settled_at >= ? THEN charged * scale"
        " ELSE 0 END), 0) FROM playline_budget_reservations WHERE drawn_on = ?",
        [period_start("day", now), period_id(name, "month", now)],
    )
    assert row is not None
    return carried([(float(row[1]), 0.0, float(row[0]))])


def _create_rows(conn: Conn, limits: Mapping[str, float], now: float) -> None:
    """Create the budget rows that do not exist yet, in id order (as they are locked)."""
    conn.many(
        "INSERT INTO playline_budgets (id, credit_limit, created_at, updated_at)"
        " VALUES (?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
        [(budget, limits[budget], now, now) for budget in sorted(limits)],
    )


def _write(conn: Conn, ledger: GroupLedger, now: float) -> None:
    """Store what the group changed: its reservations, then its budget rows' totals."""
    conn.many(
        "DELETE FROM playline_budget_reservations WHERE key = ? AND budget = ?",
        ledger.stale_pairs(),
    )
    conn.many(
        f"INSERT INTO playline_budget_reservations ({_RESERVATION_COLUMNS}) VALUES ({marks(10)})",
        [
            (
                key,
                budget,
                h.drawn_on,
                h.credits,
                h.status,
                h.created_at,
                h.charged,
                h.settled_at,
                h.run,
                h.scale,
            )
            for (key, budget), h in ledger.new_rows()
        ],
    )
    conn.many(
        "UPDATE playline_budgets SET reserved = ?, spent = ?, updated_at = ? WHERE id = ?",
        [(s.reserved, s.spent, now, s.budget) for s in ledger.changed_states()],
    )
