"""Fleet-wide pacing in PostgreSQL: N workers, one provider budget.

Each worker's :class:`~playline.pacing.governor.Governor` paces its own
process; with several workers that alone would multiply a provider's limit by
N. A :class:`FleetPacer` makes the budget shared. It keeps six tables (names
prefixed with ``table_prefix``):

``<prefix>pacing`` - one row per pacing key, the GCRA state and the shared
adapted rate::

    key text PRIMARY KEY, tat float8, rps float8, burst int,
    epoch bigint, paused_until float8, last_now float8

``tat`` (theoretical arrival time), ``paused_until`` and ``last_now`` are
seconds since the Unix epoch *on the database server's clock*, so worker clocks
never need to agree. ``rps`` is the rate in force for the whole fleet: GCRA
tickets are spaced by it, a worker's 429 cut lowers it, and ``epoch`` counts
those cuts so that a stale increase cannot undo one.

``<prefix>limits`` - the configured limits per key, written by ``playline
limits set`` (:meth:`FleetPacer.set_limits`) and read by every governor at
least once a second, so limits change without a restart. A ``NULL`` column
keeps the worker's catalog value::

    key text PRIMARY KEY, rps float8, burst int, max_concurrency int,
    per_minute int, per_hour int, per_day int, min_rps float8, updated_at timestamptz

``<prefix>shares`` - who waits for each key, per worker: the fairness keys with
calls waiting on that worker, their weight and class (written by every worker with
its refresh; rows older than a few seconds are ignored), from which each worker
computes the part of a key's rate its own waiting keys are owed
(:func:`~playline.pacing.fleet_sync.fleet_part`)::

    key text, worker text, fairness_key text, weight float8, priority int,
    waiting int, seen_at float8, PRIMARY KEY (key, worker, fairness_key)

``<prefix>share_weights`` - weights set while runs go (``playline limits share``),
which every governor applies within a refresh::

    fairness_key text PRIMARY KEY, weight float8, updated_at timestamptz

``<prefix>learned`` - a key's limit learnt below its catalog's (from 429s), how and
when, written by the worker that learnt it and read by every governor when it starts,
so the fleet's next run starts at it rather than at the catalog's rate (an entry older
than a week is ignored: plans change)::

    key text PRIMARY KEY, rps float8, ceiling_rps float8, source text, learned_at timestamptz

``<prefix>windows`` - fleet-wide quota windows (``per_minute`` / ``per_hour`` /
``per_day``): calls counted in buckets of 1/60 of the window; a call is admitted
only if the buckets covering the last window (plus the current one, so the
count errs high) leave room in every window of its key, all in one
transaction under an advisory lock per key::

    key text, window_s float8, bucket bigint, count int, PRIMARY KEY (key, window_s, bucket)

One ticket (or a block of ``n`` tickets) is one atomic ``UPDATE ... RETURNING``
statement; the row lock serialises concurrent workers, so the fleet as a whole
gets at most ``burst + rps x w`` tickets due in any window of ``w`` seconds
(see :func:`~playline.pacing.gcra.gcra_take`, whose arithmetic the
statement mirrors). How a governor uses all this is
:class:`~playline.pacing.fleet_sync.FleetSync`.

The tables live in :mod:`playline.db`'s PostgreSQL pool: their DDL is a versioned
schema (:func:`~playline.pacing.fleet_sql.fleet_schema`, applied by :meth:`FleetPacer.create`),
the statements (:class:`~playline.pacing.fleet_sql.FleetStatements`) run as functions
of a :class:`~playline.db.conn.Conn`. A statement that stands alone (a ticket, a cut,
a read) runs outside a transaction, where PostgreSQL makes it atomic by itself: one
round trip, as a ticket on the call path needs; a window slot or a worker's shares
take several statements and run as one transaction. psycopg is imported only when a
pacer is created, so playline works without the ``postgres`` extra as long as fleet
pacing is not asked for.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from playline.db.errors import StoreUnavailable
from playline.errors import PlaylineError
from playline.pacing.fleet_sql import (
    DEFAULT_TABLE_PREFIX,
    FleetStatements,
    check_prefix,
    fleet_schema,
)
from playline.pacing.gcra import gcra_take
from playline.pacing.policy import LIMIT_FIELDS, Limits

if TYPE_CHECKING:
    from playline.db.conn import Conn
    from playline.db.postgres import PostgresPool

__all__ = [
    "DEFAULT_TABLE_PREFIX",
    "FleetKeyState",
    "FleetPacer",
    "FleetPacingUnavailable",
    "FleetRate",
    "FleetShare",
    "LearnedLimit",
]

T = TypeVar("T")

#: The pool's bounds: a ticket is on the call path, so a database that does not
#: answer fails it within seconds (the governor then stops the chunk) rather than
#: holding calls for the libpq defaults.
CONNECT_TIMEOUT_S = 3
#: How long a call waits for a connection (a restarting server: one comes back).
CONNECTION_WAIT_S = 2.0
#: The server cancels a fleet statement running longer (a lock never released).
STATEMENT_TIMEOUT_S = 10.0
#: Connections per pacer: tickets of several keys and a refresh go side by side.
POOL_SIZE = 4


@dataclass(frozen=True, slots=True)
class FleetShare:
    """One fairness key waiting for one pacing key on one worker."""

    key: str
    fairness_key: str
    weight: float
    priority: int
    waiting: int
    worker: str = ""


class FleetPacingUnavailable(PlaylineError):
    """The fleet pacing store (PostgreSQL) could not be reached or used.

    No provider call is dispatched without a fleet ticket, so the call fails
    instead of risking the shared budget. It is about the worker's store, not the
    row: it stops the chunk (rows not started stay pending, nothing was sent) and
    Temporal retries the activity, so a store restart fails no row.
    """

    retryable = True
    chunk_fatal = True


#: A window is counted in this many buckets.
WINDOW_BUCKETS = 60


@dataclass(frozen=True, slots=True)
class FleetRate:
    """A key's shared adapted rate.

    ``epoch`` grows on every cut (and every ``limits set``); ``paused_for_s``
    is how long the fleet is still paused for the key (``0.0``: not paused).
    """

    key: str
    rps: float
    burst: int
    epoch: int
    paused_for_s: float


@dataclass(frozen=True, slots=True)
class LearnedLimit:
    """A key's limit learnt below its catalog's by a worker of the fleet.

    ``source`` says how (``429 measurement``); ``age_s`` how long ago, on the
    database server's clock, and ``learned_at`` when (Unix seconds).
    """

    key: str
    rps: float
    ceiling_rps: float | None
    source: str
    age_s: float
    learned_at: float


@dataclass(frozen=True, slots=True)
class FleetKeyState:
    """What the fleet store knows about one key; either half may be missing."""

    key: str
    #: what ``playline limits set`` stored for it (None: nothing; the catalog applies)
    limits: Limits | None
    rate: FleetRate | None


class FleetPacer:
    """GCRA tickets, shared adapted rate and live limits in PostgreSQL.

    Create with :meth:`create` (which migrates the tables), close with
    :meth:`aclose` or ``async with``. Safe for concurrent use by many tasks: calls
    run on a small pool of connections, so a refresh never queues behind a burst of
    tickets.

    Every database error is raised as :class:`FleetPacingUnavailable`; a call whose
    connection was cut (the server restarted) runs once more on a new one first.
    """

    def __init__(self, db: PostgresPool, table_prefix: str) -> None:
        self._db = db
        self.table_prefix = table_prefix
        self._q = FleetStatements.build(table_prefix)
        self._known: set[str] = set()
        self._closed = False

    @classmethod
    async def create(cls, dsn: str, *, table_prefix: str = DEFAULT_TABLE_PREFIX) -> FleetPacer:
        """Connect and bring the pacing tables to the current version.

        Args:
            dsn: a libpq connection string or URL.
            table_prefix: prefix of the table names (letters, digits and
                underscores), so several deployments or test runs can share a
                database.
        """
        check_prefix(table_prefix)
        from playline.db.postgres import PostgresPool

        try:
            db = await PostgresPool.open(
                dsn,
                min_size=1,
                max_size=POOL_SIZE,
                connect_timeout_s=CONNECT_TIMEOUT_S,
                wait_s=CONNECTION_WAIT_S,
                statement_timeout_s=STATEMENT_TIMEOUT_S,
                # Every fleet call may run twice: a ticket taken twice errs slow.
                retry_lost=True,
            )
        except StoreUnavailable as err:
            raise _unavailable(err) from err
        pacer = cls(db, table_prefix)
        try:
            try:
                await db.migrate(fleet_schema(table_prefix), create=True)
            except db.driver_error as err:
                raise _unavailable(err) from err
        except BaseException:
            await pacer.aclose()
            raise
        return pacer

    async def __aenter__(self) -> FleetPacer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the pacer's connections; it cannot be used afterwards (a call still
        made gets :class:`FleetPacingUnavailable`, as from a database gone)."""
        if not self._closed:
            self._closed = True
            await self._db.close()

    # ------------------------------------------------------------------ tickets

    async def take(
        self, key: str, n: int = 1, *, rps: float | None = None, burst: int | None = None
    ) -> float:
        """Reserve ``n`` tickets for ``key``; return the seconds to wait before dispatch.

        The returned delay is that of the *last* ticket of the block: after it,
        all ``n`` calls may go. ``rps`` and ``burst`` are used only if the
        key has no row yet (and no ``limits`` row); otherwise the fleet's rate
        in force applies.
        """
        return (await self.take_many(key, n, rps=rps, burst=burst))[-1]

    async def take_many(
        self,
        key: str,
        n: int = 1,
        *,
        rps: float | None = None,
        burst: int | None = None,
        margin: float = 1.0,
        local_burst: Callable[[int], int] | None = None,
    ) -> tuple[float, ...]:
        """Reserve a block of ``n`` tickets in one statement; the delay of each, in order.

        Ticket ``i`` may be used ``delays[i]`` seconds after the statement
        ran. Delays count from the database's clock reading inside the
        statement, so using them from when the answer arrives only errs on the
        slow side. ``margin`` spaces tickets at ``rps x margin`` and
        ``local_burst`` maps the row's burst to the tolerance used (the
        governor keeps part of a provider's burst for jitter, fleet-wide too).
        """
        if n < 1:
            raise ValueError("n must be >= 1")
        await self._ensure_key(key, rps, burst)
        params = (n, margin, key)
        row = await self._statement(lambda conn: conn.one(self._q.take, params))
        if row is None:  # the row vanished (tables reset): recreate it once
            self._known.discard(key)
            await self._ensure_key(key, rps, burst)
            row = await self._statement(lambda conn: conn.one(self._q.take, params))
            if row is None:
                raise FleetPacingUnavailable(f"fleet pacing row for key {key!r} disappeared")
        tat, row_rps, paused_until, now = (float(row[i]) for i in (0, 1, 3, 4))
        row_burst = int(row[2]) if local_burst is None else local_burst(int(row[2]))
        # The statement stored tat = start + n/(rps x margin) with start = max(old
        # tat, now, paused_until); re-running the same step from ``start`` yields
        # each ticket's delay from the statement's own clock reading.
        paced = row_rps * margin
        start = tat - n / paced
        return gcra_take(start, now, paced, row_burst, n, paused_until=paused_until).delays

    # ------------------------------------------------------------------ shared rate

    async def report_cut(
        self, key: str, rps: float, *, min_rps: float, pause_s: float = 0.0
    ) -> FleetRate:
        """Lower the shared rate to ``max(rps, min_rps)`` (never raise it) and pause the fleet.

        ``LEAST`` makes concurrent cuts from one burst idempotent: two workers
        halving the same rate write the same value, and the epoch only grows
        when the rate really went down. ``pause_s`` extends the shared pause
        (GCRA tickets come due no earlier than its end).
        """
        await self._ensure_key(key, rps, None)
        params = (rps, min_rps, rps, min_rps, pause_s, key)
        row = await self._statement(lambda conn: conn.one(self._q.cut, params))
        if row is None:
            raise FleetPacingUnavailable(f"fleet pacing row for key {key!r} disappeared")
        return _rate(key, row)

    async def report_increase(
        self, key: str, rps: float, *, ceiling_rps: float, epoch: int
    ) -> FleetRate | None:
        """Raise the shared rate to ``min(rps, ceiling_rps)`` if nobody cut since ``epoch``.

        Returns the row after the update, or ``None`` when the epoch moved on
        (a cut or a ``limits set`` happened that this worker has not seen; its
        next refresh will adopt it).
        """
        params = (ceiling_rps, rps, key, epoch)
        row = await self._statement(lambda conn: conn.one(self._q.increase, params))
        return None if row is None else _rate(key, row)

    # ------------------------------------------------------------------ limits

    async def read_state(self) -> dict[str, FleetKeyState]:
        """Every key's limits and shared rate, read in one statement."""
        rows = await self._statement(lambda conn: conn.all(self._q.read_state))
        out: dict[str, FleetKeyState] = {}
        for row in rows:
            key, has_limits = row[0], row[1]
            l_rps, l_burst, l_conc, l_min, l_hour, l_day, l_min_rps = row[2:9]
            g_rps, g_burst, g_epoch, g_paused = row[9:13]
            limits = None
            if has_limits:
                limits = Limits(
                    rps=None if l_rps is None else float(l_rps),
                    burst=l_burst,
                    max_concurrency=l_conc,
                    per_minute=l_min,
                    per_hour=l_hour,
                    per_day=l_day,
                    min_rps=None if l_min_rps is None else float(l_min_rps),
                )
            rate = (
                None
                if g_rps is None
                else FleetRate(key, float(g_rps), int(g_burst), int(g_epoch), float(g_paused))
            )
            out[key] = FleetKeyState(key, limits, rate)
        return out

    async def set_limits(self, key: str, limits: Limits) -> Limits:
        """Upsert the limits given for a key (others are kept); reset its shared rate;
        what is stored for the key now.

        Limits not given keep their stored value (or stay unset: the workers' catalog
        applies). A new ``rps`` becomes the shared rate with a new epoch, so every
        worker adopts it on its next refresh (within a second) and no in-flight
        increase can overwrite it.
        """
        if not limits.given():
            raise ValueError("give at least one limit to set")
        values = limits.model_dump()
        params = (
            key,
            *(values[name] for name in LIMIT_FIELDS),
            values["rps"],
            values["burst"],
        )
        row = await self._statement(lambda conn: conn.one(self._q.set_limits, params))
        if row is None:  # pragma: no cover - an upsert always returns its row
            raise FleetPacingUnavailable(f"setting the limits of {key!r} returned nothing")
        self._known.add(key)
        _, l_rps, *rest = row
        stored = dict(zip(LIMIT_FIELDS[1:], rest, strict=True))
        return Limits(rps=None if l_rps is None else float(l_rps), **stored)

    # ------------------------------------------------------------------ learned limits

    async def record_learned(
        self, key: str, rps: float, *, ceiling_rps: float | None, source: str
    ) -> None:
        """Remember ``rps`` as ``key``'s limit, learnt now by ``source``: the fleet's
        next run starts there (see :meth:`read_learned`)."""
        params = (key, rps, ceiling_rps, source)
        await self._statement(lambda conn: conn.execute(self._q.record_learned, params))

    async def read_learned(self) -> dict[str, LearnedLimit]:
        """Every key's learned limit, with its age."""
        rows = await self._statement(lambda conn: conn.all(self._q.read_learned))
        return {
            str(r[0]): LearnedLimit(
                str(r[0]),
                float(r[1]),
                None if r[2] is None else float(r[2]),
                str(r[3]),
                max(0.0, float(r[4])),
                float(r[5]),
            )
            for r in rows
        }

    # ------------------------------------------------------------------ shares

    async def publish_shares(self, worker: str, shares: list[FleetShare]) -> None:
        """Say which fairness keys wait on ``worker`` now (its other rows go), in one
        transaction: the others never read half of a worker's report."""
        kept = [f"{s.key}\x1f{s.fairness_key}" for s in shares]
        rows = [(s.key, worker, s.fairness_key, s.weight, s.priority, s.waiting) for s in shares]

        def tx(conn: Conn) -> None:
            conn.many(self._q.publish_share, rows)
            conn.execute(self._q.clear_shares, (worker, kept))

        await self._transaction(tx)

    async def read_shares(self, max_age_s: float) -> list[FleetShare]:
        """Every worker's waiting fairness keys reported in the last ``max_age_s``."""
        rows = await self._statement(lambda conn: conn.all(self._q.read_shares, (max_age_s,)))
        return [
            FleetShare(str(r[0]), str(r[2]), float(r[3]), int(r[4]), int(r[5]), str(r[1]))
            for r in rows
        ]

    async def set_share_weight(self, fairness_key: str, weight: float | None) -> None:
        """Weigh ``fairness_key`` by ``weight`` fleet-wide (``None``: as its runs say)."""
        if weight is None:
            await self._statement(lambda conn: conn.execute(self._q.clear_weight, (fairness_key,)))
            return
        if not (math.isfinite(weight) and 0 < weight <= 1000):
            raise ValueError(f"a weight must be a number in (0, 1000], got {weight!r}")
        await self._statement(lambda conn: conn.execute(self._q.set_weight, (fairness_key, weight)))

    async def read_share_weights(self) -> dict[str, float]:
        """The weights set with ``playline limits share``, by fairness key."""
        rows = await self._statement(lambda conn: conn.all(self._q.read_weights))
        return {str(r[0]): float(r[1]) for r in rows}

    async def take_window_slot(self, key: str, windows: Mapping[float, int]) -> float:
        """Count one call in every fleet-wide window of ``key``, if all have room.

        Returns ``0.0`` when the call is admitted (and counted), else the seconds
        until the fullest window's oldest bucket ages out (nothing counted). One
        transaction under an advisory lock per key: two workers never both take
        a window's last slot.
        """
        if not windows:
            return 0.0
        q, nb = self._q, WINDOW_BUCKETS
        lock = f"playline:{self.table_prefix}:{key}"

        def tx(conn: Conn) -> float:
            conn.execute(q.window_lock, (lock,))
            waits: list[float] = []
            for window_s, limit in sorted(windows.items()):
                row = conn.one(q.window_used, (window_s, nb, key, window_s, nb))
                used, oldest, now = row or (0, None, 0.0)
                if int(used) >= limit:
                    bucket_s = window_s / nb
                    waits.append(max(bucket_s, (oldest + nb + 1) * bucket_s - now))
            if waits:
                return max(waits)
            for window_s in windows:
                conn.execute(q.window_count, (window_s, nb, key, window_s, nb, key, window_s))
            return 0.0

        return await self._transaction(tx)

    # ------------------------------------------------------------------ plumbing

    async def _ensure_key(self, key: str, rps: float | None, burst: int | None) -> None:
        if key in self._known:
            return
        params = (key, rps if rps is not None else 10.0, burst or 1, key)
        await self._statement(lambda conn: conn.execute(self._q.ensure, params))
        self._known.add(key)

    async def _statement(self, fn: Callable[[Conn], T]) -> T:
        """Run ``fn``, one statement, outside a transaction: PostgreSQL makes a lone
        statement atomic by itself, in one round trip (a transaction adds two)."""
        return await self._guarded(self._db.read, fn)

    async def _transaction(self, fn: Callable[[Conn], T]) -> T:
        """Run ``fn``, several statements, in one transaction."""
        return await self._guarded(self._db.write, fn)

    async def _guarded(
        self, run: Callable[[Callable[[Conn], T]], Awaitable[T]], fn: Callable[[Conn], T]
    ) -> T:
        """``run(fn)`` on an open pacer; a database error is ``FleetPacingUnavailable``."""
        if self._closed:
            raise FleetPacingUnavailable("the fleet pacer is closed")
        try:
            return await run(fn)
        except self._db.driver_error as err:
            raise _unavailable(err) from err


def _rate(key: str, row: tuple[Any, ...]) -> FleetRate:
    rps, burst, epoch, paused_for = row
    return FleetRate(key, float(rps), int(burst), int(epoch), float(paused_for))


def _unavailable(err: Exception) -> FleetPacingUnavailable:
    return FleetPacingUnavailable(
        f"fleet pacing store unavailable ({type(err).__name__}: {err}). "
        "Check that PostgreSQL is reachable with the configured DSN."
    )
