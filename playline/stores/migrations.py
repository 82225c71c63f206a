"""Versioned schema migrations, applied when a worker opens its stores.

A store's schema is an ordered tuple of :class:`Migration` s numbered 1, 2, 3...;
the database records the highest version applied, and opening the store applies
the missing ones in order, each exactly once, however many workers start at once:

* SQLite (one file per store): the version is the file's ``PRAGMA user_version``;
  the migrations run inside ``BEGIN IMMEDIATE``, which takes the file's write lock,
  so a second process waits and then finds them applied.
* PostgreSQL (both stores in one database): the version lives in
  ``playline_schema`` (one row per component); the migrations run in one
  transaction holding a transaction-scoped advisory lock on the component and
  the schema, so concurrent workers serialise and DDL is all-or-nothing.

A store whose recorded version is newer than this playline knows is refused
(:class:`~playline.db.errors.StoreSchemaTooNew`) rather than used. A
client that opens a store to read it (``create=False``) never migrates; it only
checks that the store exists and is not too new.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from playline.db.errors import StoreNotFound
from playline.db.migrations import check_numbered, schema_too_new

if TYPE_CHECKING:
    import psycopg

__all__ = ["Migration", "migrate_postgres", "migrate_sqlite", "postgres_version"]


@dataclass(frozen=True)
class Migration:
    """One step of a schema: its version, what it does, and how.

    ``statements`` run in order; ``apply`` (SQLite only) runs after them, for steps
    that must look at the database first (adding a column only where it is missing).
    """

    version: int
    description: str
    statements: tuple[str, ...] = ()
    apply: Callable[[sqlite3.Connection], None] | None = None


def migrate_sqlite(
    conn: sqlite3.Connection, migrations: Sequence[Migration], *, where: str, create: bool
) -> int:
    """Bring the file to the latest version (``create``) or check it; the version."""
    latest = check_numbered([m.version for m in migrations])
    if not create:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        tables = conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()
        if version == 0 and not tables[0]:
            raise StoreNotFound(f"{where} is not a playline store (it has no tables)")
        if version > latest:
            raise schema_too_new(where, version, latest)
        return version
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > latest:
            raise schema_too_new(where, version, latest)
        for migration in migrations[version:]:
            for statement in migration.statements:
                conn.execute(statement)
            if migration.apply is not None:
                migration.apply(conn)
        if version < latest:
            conn.execute(f"PRAGMA user_version = {latest:d}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return latest


_VERSIONS_TABLE = (
    "CREATE TABLE IF NOT EXISTS playline_schema ("
    " component text PRIMARY KEY, version integer NOT NULL,"
    " updated_at timestamptz NOT NULL DEFAULT now())"
)


async def postgres_version(conn: psycopg.AsyncConnection[Any], component: str) -> int:
    """The version recorded for ``component`` in the current schema (0: none)."""
    cur = await conn.execute("SELECT to_regclass('playline_schema') IS NOT NULL")
    row = await cur.fetchone()
    if row is None or not row[0]:
        return 0
    cur = await conn.execute(
        "SELECT version FROM playline_schema WHERE component = %s", [component]
    )
    found = await cur.fetchone()
    return 0 if found is None else int(found[0])


async def migrate_postgres(
    conn: psycopg.AsyncConnection[Any],
    migrations: Sequence[Migration],
    *,
    component: str,
    where: str,
    create: bool,
) -> int:
    """Bring ``component`` to its latest version (``create``) or check it; the version.

    ``conn`` must not be inside a transaction; the migration is one transaction.
    """
    latest = check_numbered([m.version for m in migrations])
    if not create:
        version = await postgres_version(conn, component)
        if version == 0:
            raise StoreNotFound(
                f"{where} holds no playline store yet (no {component!r} schema); start a "
                "worker on it first, or set PLAYLINE_STORE_URL to the workers' store"
            )
        if version > latest:
            raise schema_too_new(where, version, latest)
        return version
    async with conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext('playline:migrate:' || current_schema()))"
        )
        await conn.execute(_VERSIONS_TABLE)
        version = await postgres_version(conn, component)
        if version > latest:
            raise schema_too_new(where, version, latest)
        for migration in migrations[version:]:
            if migration.apply is not None:
                raise ValueError("PostgreSQL migrations are statements only")
            for statement in migration.statements:
                await conn.execute(statement)
        if version < latest:
            await conn.execute(
                "INSERT INTO playline_schema (component, version) VALUES (%s, %s) "
                "ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version, "
                "updated_at = now()",
                [component, latest],
            )
    return latest
