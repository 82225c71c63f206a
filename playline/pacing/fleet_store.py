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

psycopg is imported only when a pacer is created, so playline works without
the ``postgres`` extra as long as fleet pacing is not asked for.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from playline.errors import PlaylineError
from playline.pacing.gcra import gcra_take
from playline.pacing.policy import LIMIT_FIELDS, Limits

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

__all__ = [
    "FleetKeyState",
    "FleetPacer",
    "FleetPacingUnavailable",
    "FleetRate",
    "FleetShare",
]

DEFAULT_TABLE_PREFIX = "playline_"
_PREFIX_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,40}$")
#: Seconds since the Unix epoch on the server clock, as float8.
_NOW = "extract(epoch FROM clock_timestamp())::float8"


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
class FleetKeyState:
    """What the fleet store knows about one key; either half may be missing."""

    key: str
    #: what ``playline limits set`` stored for it (None: nothing; the catalog applies)
    limits: Limits | None
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
        params = {"key": key, "n": n, "margin": margin}
        row = await self._fetchone("tickets", self._q.take, params)
        if row is None:  # the row vanished (tables reset): recreate it once
            self._known.discard(key)
            await self._ensure_key(key, rps, burst)
            row = await self._fetchone("tickets", self._q.take, params)
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
        params: dict[str, Any] = {"key": key, **limits.model_dump()}
        row = await self._fetchone("control", self._q.set_limits, params)
        if row is None:  # pragma: no cover - an upsert always returns its row
            raise FleetPacingUnavailable(f"setting the limits of {key!r} returned nothing")
        self._known.add(key)
        _, l_rps, *rest = row
        stored = dict(zip(LIMIT_FIELDS[1:], rest, strict=True))
        return Limits(rps=None if l_rps is None else float(l_rps), **stored)

    # ------------------------------------------------------------------ shares

    async def publish_shares(self, worker: str, shares: list[FleetShare]) -> None:
        """Say which fairness keys wait on ``worker`` now (its other rows go)."""
        kept = [f"{s.key}\x1f{s.fairness_key}" for s in shares]
        for share in shares:
            await self._execute(
                "control",
                self._q.publish_share,
                {
                    "key": share.key,
                    "worker": worker,
                    "fairness_key": share.fairness_key,
                    "weight": share.weight,
                    "priority": share.priority,
                    "waiting": share.waiting,
                },
                fetch_all=False,
            )
        await self._execute(
            "control", self._q.clear_shares, {"worker": worker, "kept": kept}, fetch_all=False
        )

    async def read_shares(self, max_age_s: float) -> list[FleetShare]:
        """Every worker's waiting fairness keys reported in the last ``max_age_s``."""
        rows = await self._fetchall("control", self._q.read_shares, {"max_age": max_age_s})
        return [
            FleetShare(str(r[0]), str(r[2]), float(r[3]), int(r[4]), int(r[5]), str(r[1]))
            for r in rows
        ]

    async def set_share_weight(self, fairness_key: str, weight: float | None) -> None:
        """Weigh ``fairness_key`` by ``weight`` fleet-wide (``None``: as its runs say)."""
        if weight is None:
            await self._execute(
                "control", self._q.clear_weight, {"fairness_key": fairness_key}, fetch_all=False
            )
            return
        if not (math.isfinite(weight) and 0 < weight <= 1000):
            raise ValueError(f"a weight must be a number in (0, 1000], got {weight!r}")
        await self._execute(
            "control",
            self._q.set_weight,
            {"fairness_key": fairness_key, "weight": weight},
            fetch_all=False,
        )

    async def read_share_weights(self) -> dict[str, float]:
        """The weights set with ``playline limits share``, by fairness key."""
        rows = await self._fetchall("control", self._q.read_weights, {})
        return {str(r[0]): float(r[1]) for r in rows}

    async def take_window_slot(self, key: str, windows: Mapping[float, int]) -> float:
        """Count one call in every fleet-wide window of ``key``, if all have room.

        Returns ``0.0`` when the call is admitted (and counted), else the seconds
        until the fullest window's oldest bucket ages out (nothing counted).
        """
        if not windows:
            return 0.0
        conn = await self._conn("tickets")
        try:
            async with conn.transaction():
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtext(%s))",
                    [f"playline:{self.table_prefix}:{key}"],
                )
                waits: list[float] = []
                for window_s, limit in sorted(windows.items()):
                    cur = await conn.execute(
                        self._q.window_used,
                        {"key": key, "w": window_s, "nb": WINDOW_BUCKETS},
                    )
                    used, oldest, now = await cur.fetchone() or (0, None, 0.0)
                    if int(used) >= limit:
                        bucket_s = window_s / WINDOW_BUCKETS
                        waits.append(max(bucket_s, (oldest + WINDOW_BUCKETS + 1) * bucket_s - now))
                if waits:
                    return max(waits)
                for window_s in windows:
                    await conn.execute(
                        self._q.window_count,
                        {"key": key, "w": window_s, "nb": WINDOW_BUCKETS},
                    )
        except Exception as err:
            if isinstance(err, FleetPacingUnavailable):
                raise
            raise _unavailable(err) from err
        return 0.0

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
    window_used: sql.Composed
    window_count: sql.Composed
    publish_share: sql.Composed
    clear_shares: sql.Composed
    read_shares: sql.Composed
    set_weight: sql.Composed
    clear_weight: sql.Composed
    read_weights: sql.Composed

    @classmethod
    def build(cls, prefix: str) -> _Queries:
        from psycopg import sql

        names = {
            "pacing": sql.Identifier(prefix + "pacing"),
            "limits": sql.Identifier(prefix + "limits"),
            "windows": sql.Identifier(prefix + "windows"),
            "shares": sql.Identifier(prefix + "shares"),
            "weights": sql.Identifier(prefix + "share_weights"),
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
                    " rps float8 CHECK (rps > 0),"
                    " burst integer CHECK (burst >= 1),"
                    " max_concurrency integer CHECK (max_concurrency >= 1),"
                    " updated_at timestamptz NOT NULL DEFAULT now())"
                ),
                # Tables made by playline 0.2 lack the quota columns and hold NOT NULLs.
                q(
                    "ALTER TABLE {limits}"
                    " ADD COLUMN IF NOT EXISTS per_minute integer CHECK (per_minute >= 1),"
                    " ADD COLUMN IF NOT EXISTS per_hour integer CHECK (per_hour >= 1),"
                    " ADD COLUMN IF NOT EXISTS per_day integer CHECK (per_day >= 1),"
                    " ADD COLUMN IF NOT EXISTS min_rps float8 CHECK (min_rps > 0),"
                    " ALTER COLUMN rps DROP NOT NULL,"
                    " ALTER COLUMN burst DROP NOT NULL,"
                    " ALTER COLUMN max_concurrency DROP NOT NULL"
                ),
                q(
                    "CREATE TABLE IF NOT EXISTS {windows} ("
                    " key text NOT NULL,"
                    " window_s float8 NOT NULL,"
                    " bucket bigint NOT NULL,"
                    " count integer NOT NULL,"
                    " PRIMARY KEY (key, window_s, bucket))"
                ),
                q(
                    "CREATE TABLE IF NOT EXISTS {shares} ("
                    " key text NOT NULL,"
                    " worker text NOT NULL,"
                    " fairness_key text NOT NULL,"
                    " weight float8 NOT NULL CHECK (weight > 0),"
                    " priority integer NOT NULL,"
                    " waiting integer NOT NULL,"
                    " seen_at float8 NOT NULL,"
                    " PRIMARY KEY (key, worker, fairness_key))"
                ),
                q(
                    "CREATE TABLE IF NOT EXISTS {weights} ("
                    " fairness_key text PRIMARY KEY,"
                    " weight float8 NOT NULL CHECK (weight > 0),"
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
                "  SELECT GREATEST(g.tat, c.now, g.paused_until) + %(n)s / (g.rps * %(margin)s),"
                "  c.now"
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
                "SELECT COALESCE(l.key, g.key), l.key IS NOT NULL, l.rps, l.burst,"
                " l.max_concurrency, l.per_minute, l.per_hour, l.per_day, l.min_rps, "
                + rate_cols
                + " FROM {limits} AS l FULL JOIN {pacing} AS g ON g.key = l.key"
                " ORDER BY 1"
            ),
            # One statement, so the limits and the reset shared rate change together.
            set_limits=q(
                "WITH lim AS ("
                " INSERT INTO {limits} AS t (key, rps, burst, max_concurrency, per_minute,"
                "  per_hour, per_day, min_rps, updated_at)"
                " VALUES (%(key)s, %(rps)s, %(burst)s, %(max_concurrency)s, %(per_minute)s,"
                "  %(per_hour)s, %(per_day)s, %(min_rps)s, now())"
                " ON CONFLICT (key) DO UPDATE SET"
                "  rps = COALESCE(EXCLUDED.rps, t.rps),"
                "  burst = COALESCE(EXCLUDED.burst, t.burst),"
                "  max_concurrency = COALESCE(EXCLUDED.max_concurrency, t.max_concurrency),"
                "  per_minute = COALESCE(EXCLUDED.per_minute, t.per_minute),"
                "  per_hour = COALESCE(EXCLUDED.per_hour, t.per_hour),"
                "  per_day = COALESCE(EXCLUDED.per_day, t.per_day),"
                "  min_rps = COALESCE(EXCLUDED.min_rps, t.min_rps),"
                "  updated_at = now()"
                " RETURNING t.key, t.rps, t.burst, t.max_concurrency, t.per_minute,"
                "  t.per_hour, t.per_day, t.min_rps),"
                " reset AS ("
                " INSERT INTO {pacing} AS g (key, rps, burst)"
                " SELECT key, rps, COALESCE(burst, 1) FROM lim"
                "  WHERE lim.rps IS NOT NULL AND %(rps)s::float8 IS NOT NULL"
                " ON CONFLICT (key) DO UPDATE SET rps = EXCLUDED.rps,"
                "  burst = COALESCE(%(burst)s::integer, g.burst), epoch = g.epoch + 1)"
                " SELECT * FROM lim"
            ),
            window_used=q(
                "SELECT COALESCE(SUM(w.count), 0), MIN(w.bucket), c.now FROM"
                " (SELECT {now} AS now, floor({now} / (%(w)s / %(nb)s))::bigint AS cur) AS c"
                " LEFT JOIN {windows} AS w ON w.key = %(key)s AND w.window_s = %(w)s"
                "  AND w.bucket >= c.cur - %(nb)s"
                " GROUP BY c.cur, c.now"
            ),
            window_count=q(
                "WITH c AS (SELECT floor({now} / (%(w)s / %(nb)s))::bigint AS cur),"
                " gone AS (DELETE FROM {windows} WHERE key = %(key)s AND window_s = %(w)s"
                "  AND bucket < (SELECT cur FROM c) - 2 * %(nb)s)"
                " INSERT INTO {windows} (key, window_s, bucket, count)"
                " SELECT %(key)s, %(w)s, cur, 1 FROM c"
                " ON CONFLICT (key, window_s, bucket)"
                " DO UPDATE SET count = {windows}.count + 1"
            ),
            publish_share=q(
                "INSERT INTO {shares} AS s (key, worker, fairness_key, weight, priority,"
                " waiting, seen_at) VALUES (%(key)s, %(worker)s, %(fairness_key)s,"
                " %(weight)s, %(priority)s, %(waiting)s, {now})"
                " ON CONFLICT (key, worker, fairness_key) DO UPDATE SET"
                " weight = EXCLUDED.weight, priority = EXCLUDED.priority,"
                " waiting = EXCLUDED.waiting, seen_at = EXCLUDED.seen_at"
            ),
            clear_shares=q(
                "DELETE FROM {shares} WHERE (worker = %(worker)s AND seen_at < {now} - 0.001"
                " AND NOT (key || chr(31) || fairness_key = ANY(%(kept)s)))"
                " OR seen_at < {now} - 600"
            ),
            read_shares=q(
                "SELECT key, worker, fairness_key, weight, priority, waiting FROM {shares}"
                " WHERE seen_at >= {now} - %(max_age)s"
            ),
            set_weight=q(
                "INSERT INTO {weights} (fairness_key, weight, updated_at)"
                " VALUES (%(fairness_key)s, %(weight)s, now())"
                " ON CONFLICT (fairness_key) DO UPDATE SET weight = EXCLUDED.weight,"
                " updated_at = now()"
            ),
            clear_weight=q("DELETE FROM {weights} WHERE fairness_key = %(fairness_key)s"),
            read_weights=q("SELECT fairness_key, weight FROM {weights}"),
        )


def _rate(key: str, row: tuple[Any, ...]) -> FleetRate:
    rps, burst, epoch, paused_for = row
    return FleetRate(key, float(rps), int(burst), int(epoch), float(paused_for))


def _unavailable(err: Exception) -> FleetPacingUnavailable:
    return FleetPacingUnavailable(
        f"fleet pacing store unavailable ({type(err).__name__}: {err}). "
        "Check that PostgreSQL is reachable with the configured DSN."
    )
