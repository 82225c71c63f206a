"""Fleet-wide pacing in PostgreSQL: N workers, one provider budget.

Each worker's :class:`~playline.pacing.governor.Governor` paces its own
process; with several workers that alone would multiply a provider's limit by
N. A :class:`FleetPacer` makes the budget shared. It keeps two tables (names
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
least once a second, so limits change without a restart::

    key text PRIMARY KEY, rps float8, burst int, max_concurrency int, updated_at timestamptz

One ticket (or a block of ``n`` tickets) is one atomic ``UPDATE ... RETURNING``
statement; the row lock serialises concurrent workers, so the fleet as a whole
gets at most ``burst + rps x w`` tickets due in any window of ``w`` seconds
(see :func:`~playline.pacing.gcra.gcra_take`, whose arithmetic the
statement mirrors). How a governor uses all this is
:class:`~playline.pacing.fleet_sync.FleetSync`.

psycopg is imported only when a pacer is created, so playline works without
the ``postgres`` extra as long as fleet pacing is not asked for.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from playline.errors import PlaylineError
from playline.pacing.gcra import gcra_take

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

__all__ = [
    "FleetKeyState",
    "FleetLimits",
    "FleetPacer",
    "FleetPacingUnavailable",
    "FleetRate",
]

DEFAULT_TABLE_PREFIX = "playline_"
_PREFIX_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,40}$")
#: Seconds since the Unix epoch on the server clock, as float8.
_NOW = "extract(epoch FROM clock_timestamp())::float8"


class FleetPacingUnavailable(PlaylineError):
    """The fleet pacing store (PostgreSQL) could not be reached or used.

    No provider call is dispatched without a fleet ticket, so the call fails
    instead of risking the shared budget; Temporal retries the activity.
    """

    retryable = True


@dataclass(frozen=True, slots=True)
class FleetLimits:
    """A key's configured limits as ``playline limits set`` stored them."""

    key: str
    rps: float
    burst: int
    max_concurrency: int


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
class FleetKeyState:
    """What the fleet store knows about one key; either half may be missing."""

    key: str
    limits: FleetLimits | None
    rate: FleetRate | None


class FleetPacer:
    """GCRA tickets, shared adapted rate and live limits in PostgreSQL.

    Create with :meth:`create` (which creates the tables if needed), close
    with :meth:`aclose` or ``async with``. Safe for concurrent use by many
    tasks: tickets go over one connection, rate reports and limit reads over
    another, so a refresh never queues behind a burst of tickets.

    Every database error is raised as :class:`FleetPacingUnavailable`, after
    one reconnect attempt.
    """

    def __init__(self, dsn: str, table_prefix: str, queries: _Queries) -> None:
        self._dsn = dsn
        self.table_prefix = table_prefix
        self._q = queries
        self._tickets: psycopg.AsyncConnection[tuple[Any, ...]] | None = None
        self._control: psycopg.AsyncConnection[tuple[Any, ...]] | None = None
        self._known: set[str] = set()
        self._lock = asyncio.Lock()

    @classmethod
    async def create(cls, dsn: str, *, table_prefix: str = DEFAULT_TABLE_PREFIX) -> FleetPacer:
        """Connect and make sure the pacing tables exist.

        Args:
            dsn: a libpq connection string or URL.
            table_prefix: prefix of both table names (letters, digits and
                underscores), so several deployments or test runs can share a
                database.
        """
        if not _PREFIX_RE.match(table_prefix):
            raise ValueError(
                f"table_prefix {table_prefix!r} must be letters, digits and underscores, "
                "starting with a letter or underscore"
            )
        try:
            import psycopg  # noqa: F401  (fail early, with a clear message)
        except ImportError as err:
            raise FleetPacingUnavailable(
                "fleet pacing needs psycopg; install playline with the 'postgres' extra "
                "(pip install 'playline[postgres]')"
            ) from err
        pacer = cls(dsn, table_prefix, _Queries.build(table_prefix))
        try:
            await pacer._create_tables()
        except BaseException:
            await pacer.aclose()
            raise
        return pacer

    async def __aenter__(self) -> FleetPacer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close both connections; the pacer cannot be used afterwards."""
        for conn in (self._tickets, self._control):
            if conn is not None:
                await conn.close()
        self._tickets = self._control = None

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
        self, key: str, n: int = 1, *, rps: float | None = None, burst: int | None = None
    ) -> tuple[float, ...]:
        """Reserve a block of ``n`` tickets in one statement; the delay of each, in order.

        Ticket ``i`` may be used ``delays[i]`` seconds after the statement
        ran. Delays count from the database's clock reading inside the
        statement, so using them from when the answer arrives only errs on the
        slow side.
        """
        if n < 1:
            raise ValueError("n must be >= 1")
        await self._ensure_key(key, rps, burst)
        row = await self._fetchone("tickets", self._q.take, {"key": key, "n": n})
        if row is None:  # the row vanished (tables reset): recreate it once
            self._known.discard(key)
            await self._ensure_key(key, rps, burst)
            row = await self._fetchone("tickets", self._q.take, {"key": key, "n": n})
            if row is None:
                raise FleetPacingUnavailable(f"fleet pacing row for key {key!r} disappeared")
        tat, row_rps, paused_until, now = (float(row[i]) for i in (0, 1, 3, 4))
        row_burst = int(row[2])
        # The statement stored tat = start + n/rps with start = max(old tat, now,
        # paused_until); re-running the same step from ``start`` yields each
        # ticket's delay from the statement's own clock reading.
        start = tat - n / row_rps
        return gcra_take(start, now, row_rps, row_burst, n, paused_until=paused_until).delays

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
        row = await self._fetchone(
            "control", self._q.cut, {"key": key, "rps": rps, "min_rps": min_rps, "pause": pause_s}
        )
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
        row = await self._fetchone(
            "control",
            self._q.increase,
            {"key": key, "rps": rps, "ceiling": ceiling_rps, "epoch": epoch},
        )
        return None if row is None else _rate(key, row)

    # ------------------------------------------------------------------ limits

    async def read_state(self) -> dict[str, FleetKeyState]:
        """Every key's limits and shared rate, read in one statement."""
        rows = await self._fetchall("control", self._q.read_state, {})
        out: dict[str, FleetKeyState] = {}
        for key, l_rps, l_burst, l_conc, g_rps, g_burst, g_epoch, g_paused in rows:
            limits = None if l_rps is None else FleetLimits(key, float(l_rps), l_burst, l_conc)
            rate = (
                None
                if g_rps is None
                else FleetRate(key, float(g_rps), int(g_burst), int(g_epoch), float(g_paused))
            )
            out[key] = FleetKeyState(key, limits, rate)
        return out

    async def set_limits(
        self, key: str, *, rps: float, max_concurrency: int, burst: int | None = None
    ) -> FleetLimits:
        """Upsert a key's configured limits and reset its shared rate to them.

        ``burst`` defaults to the key's current burst (from ``limits``, else
        the shared rate row, else 1). The shared rate becomes ``rps`` with a
        new epoch, so every worker adopts it on its next refresh (within a
        second) and no in-flight increase can overwrite it.
        """
        if not (math.isfinite(rps) and rps > 0):
            raise ValueError(f"rps must be a number > 0, got {rps!r}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency!r}")
        if burst is not None and burst < 1:
            raise ValueError(f"burst must be >= 1, got {burst!r}")
        params = {"key": key, "rps": rps, "burst": burst, "mc": max_concurrency}
        row = await self._fetchone("control", self._q.set_limits, params)
        if row is None:  # pragma: no cover - an upsert always returns its row
            raise FleetPacingUnavailable(f"setting the limits of {key!r} returned nothing")
        self._known.add(key)
        return FleetLimits(str(row[0]), float(row[1]), int(row[2]), int(row[3]))

    # ------------------------------------------------------------------ plumbing

    async def _create_tables(self) -> None:
        conn = await self._conn("control")
        try:
            async with conn.transaction():
                # Two workers starting together would race on CREATE TABLE IF NOT EXISTS.
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtext(%s))", ["playline:" + self.table_prefix]
                )
                for stmt in self._q.create:
                    await conn.execute(stmt)
        except Exception as err:
            raise _unavailable(err) from err

    async def _ensure_key(self, key: str, rps: float | None, burst: int | None) -> None:
        if key in self._known:
            return
        await self._fetchall(
            "control",
            self._q.ensure,
            {"key": key, "rps": rps if rps is not None else 10.0, "burst": burst or 1},
        )
        self._known.add(key)

    async def _conn(self, which: str) -> psycopg.AsyncConnection[tuple[Any, ...]]:
        import psycopg

        async with self._lock:
            conn = self._tickets if which == "tickets" else self._control
            if conn is None or conn.closed or conn.broken:
                try:
                    conn = await psycopg.AsyncConnection.connect(self._dsn, autocommit=True)
                except psycopg.Error as err:
                    raise _unavailable(err) from err
                if which == "tickets":
                    self._tickets = conn
                else:
                    self._control = conn
            return conn

    async def _execute(
        self, which: str, query: sql.Composed, params: Mapping[str, Any], fetch_all: bool
    ) -> list[tuple[Any, ...]]:
        import psycopg

        for attempt in (1, 2):
            conn = await self._conn(which)
            try:
                cur = await conn.execute(query, params)
                if cur.description is None:
                    return []
                if fetch_all:
                    return await cur.fetchall()
                row = await cur.fetchone()
                return [] if row is None else [row]
            except psycopg.OperationalError as err:
                # A dropped connection is worth one reconnect; anything else is not.
                if attempt == 2 or not conn.broken:
                    raise _unavailable(err) from err
            except psycopg.Error as err:
                raise _unavailable(err) from err
        raise AssertionError("unreachable")  # pragma: no cover

    async def _fetchone(
        self, which: str, query: sql.Composed, params: Mapping[str, Any]
    ) -> tuple[Any, ...] | None:
        rows = await self._execute(which, query, params, fetch_all=False)
        return rows[0] if rows else None

    async def _fetchall(
        self, which: str, query: sql.Composed, params: Mapping[str, Any]
    ) -> list[tuple[Any, ...]]:
        return await self._execute(which, query, params, fetch_all=True)


@dataclass(frozen=True, slots=True)
class _Queries:
    """Every statement, composed once per table prefix."""

    create: tuple[sql.Composed, ...]
    ensure: sql.Composed
    take: sql.Composed
    cut: sql.Composed
    increase: sql.Composed
    read_state: sql.Composed
    set_limits: sql.Composed

    @classmethod
    def build(cls, prefix: str) -> _Queries:
        from psycopg import sql

        names = {
            "pacing": sql.Identifier(prefix + "pacing"),
            "limits": sql.Identifier(prefix + "limits"),
            "now": sql.SQL(_NOW),
        }

        def q(text: str) -> sql.Composed:
            return sql.SQL(text).format(**names)

        rate_cols = "g.rps, g.burst, g.epoch, GREATEST(g.paused_until - {now}, 0)"
        return cls(
            create=(
                q(
                    "CREATE TABLE IF NOT EXISTS {pacing} ("
                    " key text PRIMARY KEY,"
                    " tat float8 NOT NULL DEFAULT 0,"
                    " rps float8 NOT NULL CHECK (rps > 0),"
                    " burst integer NOT NULL CHECK (burst >= 1),"
                    " epoch bigint NOT NULL DEFAULT 0,"
                    " paused_until float8 NOT NULL DEFAULT 0,"
                    " last_now float8 NOT NULL DEFAULT 0)"
                ),
                q(
                    "CREATE TABLE IF NOT EXISTS {limits} ("
                    " key text PRIMARY KEY,"
                    " rps float8 NOT NULL CHECK (rps > 0),"
                    " burst integer NOT NULL CHECK (burst >= 1),"
                    " max_concurrency integer NOT NULL CHECK (max_concurrency >= 1),"
                    " updated_at timestamptz NOT NULL DEFAULT now())"
                ),
            ),
            # A new key starts at its configured limits (the limits table wins
            # over the worker's catalog) with an empty bucket.
            ensure=q(
                "INSERT INTO {pacing} (key, rps, burst)"
                " SELECT %(key)s, COALESCE(l.rps, %(rps)s), COALESCE(l.burst, %(burst)s)"
                " FROM (SELECT 1) AS one LEFT JOIN {limits} AS l ON l.key = %(key)s"
                " ON CONFLICT (key) DO NOTHING"
            ),
            # The GCRA step, atomically: the clock is read once, after the row
            # lock is held, and returned with the new tat so the caller computes
            # each ticket's delay from the very reading the step used.
            take=q(
                "UPDATE {pacing} AS g SET (tat, last_now) = ("
                "  SELECT GREATEST(g.tat, c.now, g.paused_until) + %(n)s / g.rps, c.now"
                "  FROM (SELECT {now} AS now) AS c)"
                " WHERE g.key = %(key)s"
                " RETURNING g.tat, g.rps, g.burst, g.paused_until, g.last_now"
            ),
            cut=q(
                "UPDATE {pacing} AS g SET"
                " rps = LEAST(g.rps, GREATEST(%(rps)s, %(min_rps)s)),"
                " epoch = g.epoch + CASE WHEN GREATEST(%(rps)s, %(min_rps)s) < g.rps"
                "   THEN 1 ELSE 0 END,"
                " paused_until = GREATEST(g.paused_until, {now} + %(pause)s)"
                " WHERE g.key = %(key)s"
                " RETURNING " + rate_cols
            ),
            increase=q(
                "UPDATE {pacing} AS g SET rps = LEAST(%(ceiling)s, GREATEST(g.rps, %(rps)s))"
                " WHERE g.key = %(key)s AND g.epoch = %(epoch)s"
                " RETURNING " + rate_cols
            ),
            read_state=q(
                "SELECT COALESCE(l.key, g.key), l.rps, l.burst, l.max_concurrency, "
                + rate_cols
                + " FROM {limits} AS l FULL JOIN {pacing} AS g ON g.key = l.key"
                " ORDER BY 1"
            ),
            # One statement, so the limits and the reset shared rate change together.
            set_limits=q(
                "WITH lim AS ("
                " INSERT INTO {limits} AS t (key, rps, burst, max_concurrency, updated_at)"
                " SELECT %(key)s, %(rps)s,"
                "  COALESCE(%(burst)s::integer, l.burst, g.burst, 1), %(mc)s, now()"
                " FROM (SELECT 1) AS one"
                " LEFT JOIN {limits} AS l ON l.key = %(key)s"
                " LEFT JOIN {pacing} AS g ON g.key = %(key)s"
                " ON CONFLICT (key) DO UPDATE SET rps = EXCLUDED.rps, burst = EXCLUDED.burst,"
                "  max_concurrency = EXCLUDED.max_concurrency, updated_at = now()"
                " RETURNING t.key, t.rps, t.burst, t.max_concurrency),"
                " reset AS ("
                " INSERT INTO {pacing} AS g (key, rps, burst) SELECT key, rps, burst FROM lim"
                " ON CONFLICT (key) DO UPDATE SET rps = EXCLUDED.rps, burst = EXCLUDED.burst,"
                "  epoch = g.epoch + 1)"
                " SELECT key, rps, burst, max_concurrency FROM lim"
            ),
        )


def _rate(key: str, row: tuple[Any, ...]) -> FleetRate:
    rps, burst, epoch, paused_for = row
    return FleetRate(key, float(rps), int(burst), int(epoch), float(paused_for))


def _unavailable(err: Exception) -> FleetPacingUnavailable:
    return FleetPacingUnavailable(
        f"fleet pacing store unavailable ({type(err).__name__}: {err}). "
        "Check that PostgreSQL is reachable with the configured DSN."
    )
