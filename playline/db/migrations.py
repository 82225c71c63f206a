"""Versioned schemas, applied by whoever opens a store to write it.

A store's schema is a :class:`Schema`: a component name and an ordered tuple of
:class:`Migration` s numbered 1, 2, 3... The database records the highest version
applied; :func:`migrate` applies the missing ones in order, each exactly once,
however many processes open the store at once:

* SQLite (one file per store): the version is the file's ``PRAGMA user_version``;
  the steps run inside ``BEGIN IMMEDIATE``, which takes the file's write lock, so a
  second process waits and then finds them applied.
* PostgreSQL (every store in one database): the version lives in ``playline_schema``
  (one row per component); the steps run in one transaction holding an advisory
  lock on the schema, so concurrent workers serialise and DDL is all-or-nothing.

A migration may spell a step per database (a store's first version predates this
package and was written twice); later steps are one text for both, with type names
taken from the dialect (``{text}``, ``{real}``...). A store whose version is newer
than this playline knows is refused (:class:`~playline.db.errors.StoreSchemaTooNew`);
a client (``create=False``) never migrates, it only checks the store is there and at
this playline's version (an older one waits for a worker to upgrade it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from playline.db.conn import Conn
from playline.db.errors import StoreNotFound, StoreSchemaTooNew

__all__ = ["Migration", "Schema", "check_numbered", "migrate", "schema_too_new"]


@dataclass(frozen=True)
class Migration:
    """One step of a schema: its version, what it does, and its statements.

    ``statements`` serve both databases unless ``sqlite`` or ``postgres`` spells the
    step for that one (an empty tuple: nothing to do there, the version still counts).
    ``sqlite_apply`` runs after the statements on SQLite only, for a step that must
    look at the file first (SQLite has no ``ADD COLUMN IF NOT EXISTS``: a file from
    before versioned migrations gains only the columns it lacks).
    """

    version: int
    description: str
    statements: tuple[str, ...] = ()
    sqlite: tuple[str, ...] | None = None
    postgres: tuple[str, ...] | None = None
    sqlite_apply: Callable[[Conn], None] | None = None

    def statements_for(self, conn: Conn) -> list[str]:
        own = self.sqlite if conn.dialect.name == "sqlite" else self.postgres
        texts = self.statements if own is None else own
        return [text.format_map(conn.dialect.types) for text in texts]


@dataclass(frozen=True)
class Schema:
    """A store's tables: ``component`` names its row in ``playline_schema``
    (PostgreSQL); a SQLite file holds one store, so there it is only a label."""

    component: str
    migrations: tuple[Migration, ...]
    #: a client (``create=False``) may read a store of an older version as it finds it
    #: (the store reads the older shapes itself); else it is told to let a worker
    #: upgrade the store first
    clients_read_older: bool = False

    @property
    def latest(self) -> int:
        return check_numbered([m.version for m in self.migrations])


def check_numbered(versions: Sequence[int]) -> int:
    """The latest version, if ``versions`` are 1..n in order; else ``ValueError``."""
    if list(versions) != list(range(1, len(versions) + 1)):
        raise ValueError(f"migrations must be numbered 1..n in order, got {list(versions)}")
    return len(versions)


def schema_too_new(where: str, found: int, known: int) -> StoreSchemaTooNew:
    return StoreSchemaTooNew(
        f"the store {where} has schema version {found}, newer than this playline knows "
        f"({known}); upgrade playline on this machine"
    )


def migrate(conn: Conn, schema: Schema, *, where: str, create: bool) -> int:
    """Bring ``schema`` to its latest version (``create``) or check it; the version.

    ``conn`` must not be in a transaction: the migration is one transaction.
    """
    latest = schema.latest
    versions = _SqliteVersions() if conn.dialect.name == "sqlite" else _PostgresVersions()
    if not create:
        version = versions.read(conn, schema.component)
        if version == 0 and not versions.has_tables(conn):
            raise StoreNotFound(
                f"{where} holds no playline {schema.component} store yet; start a worker on "
                "it first, or set PLAYLINE_STORE_URL to the workers' store"
            )
        if version > latest:
            raise schema_too_new(where, version, latest)
        if version < latest and not schema.clients_read_older:
            # Its tables are not what this playline reads yet; a worker upgrades them.
            raise StoreNotFound(
                f"{where} holds a playline {schema.component} store of schema version "
                f"{version}, older than this playline's ({latest}); start a worker on it "
                "first (it upgrades the store), then read it"
            )
        return version
    versions.begin(conn)
    try:
        version = versions.read(conn, schema.component)
        if version > latest:
            raise schema_too_new(where, version, latest)
        for migration in schema.migrations[version:]:
            for statement in migration.statements_for(conn):
                conn.execute(statement)
            if migration.sqlite_apply is not None and conn.dialect.name == "sqlite":
                migration.sqlite_apply(conn)
        if version < latest:
            versions.write(conn, schema.component, latest)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return latest


class _SqliteVersions:
    """A file's version is its ``user_version``; ``BEGIN IMMEDIATE`` locks the file."""

    def begin(self, conn: Conn) -> None:
        conn.execute("BEGIN IMMEDIATE")

    def read(self, conn: Conn, component: str) -> int:
        return int(conn.scalar("PRAGMA user_version"))

    def has_tables(self, conn: Conn) -> bool:
        return bool(conn.scalar("SELECT count(*) FROM sqlite_master WHERE type = 'table'"))

    def write(self, conn: Conn, component: str, version: int) -> None:
        conn.execute(f"PRAGMA user_version = {int(version):d}")


class _PostgresVersions:
    """One row per component in ``playline_schema``, under an advisory lock."""

    def begin(self, conn: Conn) -> None:
        conn.execute("BEGIN")
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext('playline:migrate:' || current_schema()))"
        )
        conn.execute(
            "CREATE TABLE IF NOT EXISTS playline_schema ("
            " component text PRIMARY KEY, version integer NOT NULL,"
            " updated_at timestamptz NOT NULL DEFAULT now())"
        )

    def read(self, conn: Conn, component: str) -> int:
        if not conn.scalar("SELECT to_regclass('playline_schema') IS NOT NULL"):
            return 0
        found = conn.scalar("SELECT version FROM playline_schema WHERE component = ?", [component])
        return 0 if found is None else int(found)

    def has_tables(self, conn: Conn) -> bool:
        return False  # a component is there once its version is recorded

    def write(self, conn: Conn, component: str, version: int) -> None:
        conn.execute(
            "INSERT INTO playline_schema (component, version) VALUES (?, ?) "
            "ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version, "
            "updated_at = now()",
            [component, version],
        )
