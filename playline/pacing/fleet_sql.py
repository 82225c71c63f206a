"""The fleet pacing tables and statements, for one table prefix.

:class:`~playline.pacing.fleet_store.FleetPacer` keeps six tables whose names start
with a prefix (``playline_`` unless a deployment or a test run chose another), so
several fleets can share one database. Their DDL is a versioned
:class:`~playline.db.migrations.Schema` whose component names the prefix (``fleet``
for the default one, ``fleet:<prefix>`` for any other): each prefix's tables carry a
version of their own in ``playline_schema``.

Version 1 adopts the tables the fleet store created before it moved onto
:mod:`playline.db` (which ran ``CREATE TABLE IF NOT EXISTS`` at every start, with an
``ALTER TABLE`` for limits tables made by playline 0.2): ``CREATE TABLE IF NOT
EXISTS`` in the final shape, and the columns that shim added added again if missing,
so a running fleet's database migrates in place and keeps its state.

Statements are written with ``?`` placeholders (see :mod:`playline.db.dialect`);
times are seconds since the Unix epoch on the database server's clock (``{now}``
below), so worker clocks never need to agree. The SQL is PostgreSQL's: fleet pacing
exists only there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from playline.db.migrations import Migration, Schema

__all__ = ["DEFAULT_TABLE_PREFIX", "FleetStatements", "check_prefix", "fleet_schema"]

DEFAULT_TABLE_PREFIX = "playline_"
_PREFIX_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,40}$")
#: Seconds since the Unix epoch on the server clock, as float8 (read anew each time
#: it is evaluated, unlike ``now()``, which holds for the whole transaction).
_NOW = "extract(epoch FROM clock_timestamp())::float8"
#: The columns of a shared rate: rps, burst, epoch and how long the fleet stays paused.
_RATE = "g.rps, g.burst, g.epoch, GREATEST(g.paused_until - {now}, 0)"


def check_prefix(prefix: str) -> str:
    """``prefix`` if it may start table names (it is written into the SQL as is)."""
    if not _PREFIX_RE.match(prefix):
        raise ValueError(
            f"table_prefix {prefix!r} must be letters, digits and underscores, "
            "starting with a letter or underscore"
        )
    return prefix


def _names(prefix: str) -> dict[str, str]:
    """Each table's name, quoted as the old code quoted it (``sql.Identifier``): a
    prefix with capitals names the same tables it always did."""
    tables = {
        "pacing": "pacing",
        "limits": "limits",
        "windows": "windows",
        "shares": "shares",
        "weights": "share_weights",
        "learned": "learned",
    }
    names = {name: f'"{check_prefix(prefix)}{table}"' for name, table in tables.items()}
    return {**names, "now": _NOW}


def fleet_schema(prefix: str = DEFAULT_TABLE_PREFIX) -> Schema:
    """The tables of the fleet using ``prefix``, as versioned migrations."""
    n = _names(prefix)
    component = "fleet" if prefix == DEFAULT_TABLE_PREFIX else f"fleet:{prefix}"
    return Schema(
        component,
        (
            Migration(
                1,
                "pacing, limits, quota windows, shares and share weights (adopting the "
                "tables fleet pacing created before versioned schemas)",
                postgres=(
                    f"CREATE TABLE IF NOT EXISTS {n['pacing']} ("
                    " key text PRIMARY KEY,"
                    " tat float8 NOT NULL DEFAULT 0,"
                    " rps float8 NOT NULL CHECK (rps > 0),"
                    " burst integer NOT NULL CHECK (burst >= 1),"
                    " epoch bigint NOT NULL DEFAULT 0,"
                    " paused_until float8 NOT NULL DEFAULT 0,"
                    " last_now float8 NOT NULL DEFAULT 0)",
                    f"CREATE TABLE IF NOT EXISTS {n['limits']} ("
                    " key text PRIMARY KEY,"
                    " rps float8 CHECK (rps > 0),"
                    " burst integer CHECK (burst >= 1),"
                    " max_concurrency integer CHECK (max_concurrency >= 1),"
                    " updated_at timestamptz NOT NULL DEFAULT now(),"
                    " per_minute integer CHECK (per_minute >= 1),"
                    " per_hour integer CHECK (per_hour >= 1),"
                    " per_day integer CHECK (per_day >= 1),"
                    " min_rps float8 CHECK (min_rps > 0))",
                    # Limits tables made by playline 0.2 lack the quota columns and hold
                    # NOT NULLs (what the old code's shim fixed at every start).
                    f"ALTER TABLE {n['limits']}"
                    " ADD COLUMN IF NOT EXISTS per_minute integer CHECK (per_minute >= 1),"
                    " ADD COLUMN IF NOT EXISTS per_hour integer CHECK (per_hour >= 1),"
                    " ADD COLUMN IF NOT EXISTS per_day integer CHECK (per_day >= 1),"
                    " ADD COLUMN IF NOT EXISTS min_rps float8 CHECK (min_rps > 0),"
                    " ALTER COLUMN rps DROP NOT NULL,"
                    " ALTER COLUMN burst DROP NOT NULL,"
                    " ALTER COLUMN max_concurrency DROP NOT NULL",
                    f"CREATE TABLE IF NOT EXISTS {n['windows']} ("
                    " key text NOT NULL,"
                    " window_s float8 NOT NULL,"
                    " bucket bigint NOT NULL,"
                    " count integer NOT NULL,"
                    " PRIMARY KEY (key, window_s, bucket))",
                    f"CREATE TABLE IF NOT EXISTS {n['shares']} ("
                    " key text NOT NULL,"
                    " worker text NOT NULL,"
                    " fairness_key text NOT NULL,"
                    " weight float8 NOT NULL CHECK (weight > 0),"
                    " priority integer NOT NULL,"
                    " waiting integer NOT NULL,"
                    " seen_at float8 NOT NULL,"
                    " PRIMARY KEY (key, worker, fairness_key))",
                    f"CREATE TABLE IF NOT EXISTS {n['weights']} ("
                    " fairness_key text PRIMARY KEY,"
                    " weight float8 NOT NULL CHECK (weight > 0),"
                    " updated_at timestamptz NOT NULL DEFAULT now())",
                ),
            ),
            Migration(
                2,
                "learned limits: a key's limit learnt below its catalog's, how and when, "
                "so the fleet's next run starts there",
                postgres=(
                    f"CREATE TABLE IF NOT EXISTS {n['learned']} ("
                    " key text PRIMARY KEY,"
                    " rps float8 NOT NULL CHECK (rps > 0),"
                    " ceiling_rps float8 CHECK (ceiling_rps > 0),"
                    " source text NOT NULL,"
                    " learned_at timestamptz NOT NULL DEFAULT now())",
                ),
            ),
        ),
    )


@dataclass(frozen=True, slots=True)
class FleetStatements:
    """Every statement of the fleet store, written once per table prefix.

    Each names its parameters in a comment beside it, in order (``?`` placeholders
    are positional).
    """

    ensure: str
    take: str
    cut: str
    increase: str
    read_state: str
    set_limits: str
    window_lock: str
    window_used: str
    window_count: str
    publish_share: str
    clear_shares: str
    read_shares: str
    set_weight: str
    clear_weight: str
    read_weights: str
    record_learned: str
    read_learned: str

    @classmethod
    def build(cls, prefix: str) -> FleetStatements:
        names = _names(prefix)

        def q(text: str) -> str:
            return text.format(**names)

        rate = _RATE
        return cls(
            # key, rps, burst, key: a new key starts at its configured limits (the
            # limits table wins over the worker's catalog) with an empty bucket.
            ensure=q(
                "INSERT INTO {pacing} (key, rps, burst)"
                " SELECT ?, COALESCE(l.rps, ?), COALESCE(l.burst, ?)"
                " FROM (SELECT 1) AS one LEFT JOIN {limits} AS l ON l.key = ?"
                " ON CONFLICT (key) DO NOTHING"
            ),
            # n, margin, key: the GCRA step, atomically: the clock is read once, after
            # the row lock is held, and returned with the new tat so the caller
            # computes each ticket's delay from the very reading the step used.
            take=q(
                "UPDATE {pacing} AS g SET (tat, last_now) = ("
                "  SELECT GREATEST(g.tat, c.now, g.paused_until) + ? / (g.rps * ?),"
                "  c.now"
                "  FROM (SELECT {now} AS now) AS c)"
                " WHERE g.key = ?"
                " RETURNING g.tat, g.rps, g.burst, g.paused_until, g.last_now"
            ),
            # rps, min_rps, rps, min_rps, pause, key
            cut=q(
                "UPDATE {pacing} AS g SET"
                " rps = LEAST(g.rps, GREATEST(?, ?)),"
                " epoch = g.epoch + CASE WHEN GREATEST(?, ?) < g.rps"
                "   THEN 1 ELSE 0 END,"
                " paused_until = GREATEST(g.paused_until, {now} + ?)"
                " WHERE g.key = ?"
                " RETURNING " + rate
            ),
            # ceiling, rps, key, epoch
            increase=q(
                "UPDATE {pacing} AS g SET rps = LEAST(?, GREATEST(g.rps, ?))"
                " WHERE g.key = ? AND g.epoch = ?"
                " RETURNING " + rate
            ),
            read_state=q(
                "SELECT COALESCE(l.key, g.key), l.key IS NOT NULL, l.rps, l.burst,"
                " l.max_concurrency, l.per_minute, l.per_hour, l.per_day, l.min_rps, "
                + rate
                + " FROM {limits} AS l FULL JOIN {pacing} AS g ON g.key = l.key"
                " ORDER BY 1"
            ),
            # key, rps, burst, max_concurrency, per_minute, per_hour, per_day, min_rps,
            # rps, burst: one statement, so the limits and the reset shared rate change
            # together.
            set_limits=q(
                "WITH lim AS ("
                " INSERT INTO {limits} AS t (key, rps, burst, max_concurrency, per_minute,"
                "  per_hour, per_day, min_rps, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, now())"
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
                "  WHERE lim.rps IS NOT NULL AND ?::float8 IS NOT NULL"
                " ON CONFLICT (key) DO UPDATE SET rps = EXCLUDED.rps,"
                "  burst = COALESCE(?::integer, g.burst), epoch = g.epoch + 1)"
                " SELECT * FROM lim"
            ),
            # lock name: one key's windows are counted by one transaction at a time
            window_lock="SELECT pg_advisory_xact_lock(hashtext(?))",
            # w, nb, key, w, nb
            window_used=q(
                "SELECT COALESCE(SUM(w.count), 0), MIN(w.bucket), c.now FROM"
                " (SELECT {now} AS now, floor({now} / (? / ?))::bigint AS cur) AS c"
                " LEFT JOIN {windows} AS w ON w.key = ? AND w.window_s = ?"
                "  AND w.bucket >= c.cur - ?"
                " GROUP BY c.cur, c.now"
            ),
            # w, nb, key, w, nb, key, w
            window_count=q(
                "WITH c AS (SELECT floor({now} / (? / ?))::bigint AS cur),"
                " gone AS (DELETE FROM {windows} WHERE key = ? AND window_s = ?"
                "  AND bucket < (SELECT cur FROM c) - 2 * ?)"
                " INSERT INTO {windows} (key, window_s, bucket, count)"
                " SELECT ?, ?, cur, 1 FROM c"
                " ON CONFLICT (key, window_s, bucket)"
                " DO UPDATE SET count = {windows}.count + 1"
            ),
            # key, worker, fairness_key, weight, priority, waiting
            publish_share=q(
                "INSERT INTO {shares} AS s (key, worker, fairness_key, weight, priority,"
                " waiting, seen_at) VALUES (?, ?, ?, ?, ?, ?, {now})"
                " ON CONFLICT (key, worker, fairness_key) DO UPDATE SET"
                " weight = EXCLUDED.weight, priority = EXCLUDED.priority,"
                " waiting = EXCLUDED.waiting, seen_at = EXCLUDED.seen_at"
            ),
            # worker, kept (an array of key chr(31) fairness_key)
            clear_shares=q(
                "DELETE FROM {shares} WHERE (worker = ? AND seen_at < {now} - 0.001"
                " AND NOT (key || chr(31) || fairness_key = ANY(?)))"
                " OR seen_at < {now} - 600"
            ),
            # max_age
            read_shares=q(
                "SELECT key, worker, fairness_key, weight, priority, waiting FROM {shares}"
                " WHERE seen_at >= {now} - ?"
            ),
            # fairness_key, weight
            set_weight=q(
                "INSERT INTO {weights} (fairness_key, weight, updated_at)"
                " VALUES (?, ?, now())"
                " ON CONFLICT (fairness_key) DO UPDATE SET weight = EXCLUDED.weight,"
                " updated_at = now()"
            ),
            # fairness_key
            clear_weight=q("DELETE FROM {weights} WHERE fairness_key = ?"),
            read_weights=q("SELECT fairness_key, weight FROM {weights}"),
            # key, rps, ceiling_rps, source
            record_learned=q(
                "INSERT INTO {learned} AS t (key, rps, ceiling_rps, source, learned_at)"
                " VALUES (?, ?, ?, ?, now())"
                " ON CONFLICT (key) DO UPDATE SET rps = EXCLUDED.rps,"
                " ceiling_rps = EXCLUDED.ceiling_rps, source = EXCLUDED.source,"
                " learned_at = now()"
            ),
            # each key's learned limit and its age in seconds (the server's clock)
            read_learned=q(
                "SELECT key, rps, ceiling_rps, source,"
                " extract(epoch FROM clock_timestamp() - learned_at)::float8,"
                " extract(epoch FROM learned_at)::float8"
                " FROM {learned}"
            ),
        )
