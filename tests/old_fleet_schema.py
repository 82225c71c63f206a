"""The fleet pacing tables as the code before ``playline.db`` created them.

Copied from ``playline/pacing/fleet_store.py``'s ``_Queries.create`` as it was when
the store moved onto :mod:`playline.db` (it ran these at every start, under an
advisory lock, and recorded no version), plus the limits table of playline 0.2 that
its ``ALTER TABLE`` shim upgraded; so a test can build a database exactly as a
running fleet left it and open it with today's code
(:mod:`tests.integration.test_fleet_in_place`). Table names were quoted identifiers
(``psycopg.sql.Identifier``) of the prefix and the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

FLEET_TODAY = (
    "CREATE TABLE IF NOT EXISTS {pacing} ("
    " key text PRIMARY KEY,"
    " tat float8 NOT NULL DEFAULT 0,"
    " rps float8 NOT NULL CHECK (rps > 0),"
    " burst integer NOT NULL CHECK (burst >= 1),"
    " epoch bigint NOT NULL DEFAULT 0,"
    " paused_until float8 NOT NULL DEFAULT 0,"
    " last_now float8 NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS {limits} ("
    " key text PRIMARY KEY,"
    " rps float8 CHECK (rps > 0),"
    " burst integer CHECK (burst >= 1),"
    " max_concurrency integer CHECK (max_concurrency >= 1),"
    " updated_at timestamptz NOT NULL DEFAULT now())",
    # Tables made by playline 0.2 lack the quota columns and hold NOT NULLs.
    "ALTER TABLE {limits}"
    " ADD COLUMN IF NOT EXISTS per_minute integer CHECK (per_minute >= 1),"
    " ADD COLUMN IF NOT EXISTS per_hour integer CHECK (per_hour >= 1),"
    " ADD COLUMN IF NOT EXISTS per_day integer CHECK (per_day >= 1),"
    " ADD COLUMN IF NOT EXISTS min_rps float8 CHECK (min_rps > 0),"
    " ALTER COLUMN rps DROP NOT NULL,"
    " ALTER COLUMN burst DROP NOT NULL,"
    " ALTER COLUMN max_concurrency DROP NOT NULL",
    "CREATE TABLE IF NOT EXISTS {windows} ("
    " key text NOT NULL,"
    " window_s float8 NOT NULL,"
    " bucket bigint NOT NULL,"
    " count integer NOT NULL,"
    " PRIMARY KEY (key, window_s, bucket))",
    "CREATE TABLE IF NOT EXISTS {shares} ("
    " key text NOT NULL,"
    " worker text NOT NULL,"
    " fairness_key text NOT NULL,"
    " weight float8 NOT NULL CHECK (weight > 0),"
    " priority integer NOT NULL,"
    " waiting integer NOT NULL,"
    " seen_at float8 NOT NULL,"
    " PRIMARY KEY (key, worker, fairness_key))",
    "CREATE TABLE IF NOT EXISTS {weights} ("
    " fairness_key text PRIMARY KEY,"
    " weight float8 NOT NULL CHECK (weight > 0),"
    " updated_at timestamptz NOT NULL DEFAULT now())",
)

#: A limits table in the shape playline 0.2 made it, the one the shim upgraded: every
#: limit required, no quota columns.
LIMITS_0_2 = (
    "CREATE TABLE {limits} ("
    " key text PRIMARY KEY,"
    " rps float8 NOT NULL CHECK (rps > 0),"
    " burst integer NOT NULL CHECK (burst >= 1),"
    " max_concurrency integer NOT NULL CHECK (max_concurrency >= 1),"
    " updated_at timestamptz NOT NULL DEFAULT now())"
)

_TABLES = {
    "pacing": "pacing",
    "limits": "limits",
    "windows": "windows",
    "shares": "shares",
    "weights": "share_weights",
}


def fleet_tables(prefix: str) -> dict[str, str]:
    """The old code's table names for ``prefix``, quoted as it quoted them."""
    return {name: f'"{prefix}{table}"' for name, table in _TABLES.items()}


def old_fleet(
    url: str,
    prefix: str,
    rows: Sequence[tuple[str, Sequence[Any]]],
    ddl: Sequence[str] = FLEET_TODAY,
) -> None:
    """Tables as the old code left them for ``prefix`` (``ddl``; no ``playline_schema``
    row), with ``rows`` inserted (statements naming tables ``{pacing}``, ``{limits}``...
    and taking ``?`` parameters)."""
    import psycopg

    names = fleet_tables(prefix)
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        for statement in ddl:
            conn.execute(statement.format(**names))  # type: ignore[call-overload]
        for sql, params in rows:
            conn.execute(sql.format(**names).replace("?", "%s"), params)  # type: ignore[call-overload]


async def forget_fleet_schema(conn: Any, prefix: str) -> None:
    """Drop the version today's code recorded for ``prefix``'s tables (a test that drops
    its tables afterwards; ``conn``: a psycopg ``AsyncConnection`` in autocommit), so
    nothing of the test is left in the shared database."""
    component = "fleet" if prefix == "playline_" else f"fleet:{prefix}"
    cur = await conn.execute("SELECT to_regclass('playline_schema') IS NOT NULL")
    if (await cur.fetchone())[0]:
        await conn.execute("DELETE FROM playline_schema WHERE component = %s", [component])
