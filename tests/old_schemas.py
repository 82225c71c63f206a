"""The job and budget ledgers' and the receipt store's schemas as the code before
``playline.db`` created them.

Copied from ``jobs_sqlite.py``/``jobs_postgres.py``, ``budgets_sqlite.py``/
``budgets_postgres.py`` and ``receipts_sqlite.py``/``postgres_db.py`` as they were when
those modules were replaced, so the tests can build a store exactly as a deployed
playline left it and open it with today's code
(:mod:`tests.integration.test_ledgers_in_place`,
:mod:`tests.integration.test_receipts_in_place`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

JOBS_SQLITE_V1 = (
    """CREATE TABLE jobs (
        key TEXT PRIMARY KEY,
        tool_id TEXT NOT NULL,
        provider TEXT NOT NULL,
        request TEXT NOT NULL,
        members TEXT NOT NULL,
        state TEXT NOT NULL,
        job_id TEXT,
        token TEXT NOT NULL,
        opened_at REAL NOT NULL,
        submitted_at REAL,
        polled_at REAL,
        finished_at REAL,
        status TEXT,
        error TEXT,
        waiters TEXT NOT NULL DEFAULT '[]'
    )""",
    "CREATE INDEX jobs_provider_job_id ON jobs (provider, job_id)",
    "CREATE INDEX jobs_token ON jobs (token)",
    "CREATE INDEX jobs_provider_state ON jobs (provider, state)",
    """CREATE TABLE job_members (
        seq INTEGER PRIMARY KEY,
        member TEXT NOT NULL,
        job TEXT NOT NULL,
        opened_at REAL NOT NULL,
        UNIQUE (member, job)
    )""",
    "CREATE INDEX job_members_latest ON job_members (member, opened_at)",
    """CREATE TABLE job_waiters (
        workflow_id TEXT NOT NULL,
        job TEXT NOT NULL,
        PRIMARY KEY (workflow_id, job)
    ) WITHOUT ROWID""",
    """CREATE TABLE job_deliveries (
        job TEXT NOT NULL,
        digest TEXT NOT NULL,
        received_at REAL NOT NULL,
        PRIMARY KEY (job, digest)
    ) WITHOUT ROWID""",
)

JOBS_POSTGRES_V1 = (
    "CREATE TABLE playline_jobs (key text PRIMARY KEY, tool_id text NOT NULL,"
    " provider text NOT NULL, request text NOT NULL, members text NOT NULL,"
    " state text NOT NULL, job_id text, token text NOT NULL,"
    " opened_at float8 NOT NULL, submitted_at float8, polled_at float8,"
    " finished_at float8, status text, error text,"
    " waiters text NOT NULL DEFAULT '[]')",
    "CREATE INDEX playline_jobs_provider_job_id ON playline_jobs (provider, job_id)",
    "CREATE INDEX playline_jobs_token ON playline_jobs (token)",
    "CREATE INDEX playline_jobs_provider_state ON playline_jobs (provider, state)",
    "CREATE TABLE playline_job_members (member text NOT NULL, job text NOT NULL,"
    " opened_at float8 NOT NULL, seq bigint GENERATED ALWAYS AS IDENTITY,"
    " PRIMARY KEY (member, job))",
    "CREATE INDEX playline_job_members_latest ON playline_job_members"
    " (member, opened_at DESC, seq DESC)",
    "CREATE TABLE playline_job_waiters (workflow_id text NOT NULL, job text NOT NULL,"
    " PRIMARY KEY (workflow_id, job))",
    "CREATE TABLE playline_job_deliveries (job text NOT NULL, digest text NOT NULL,"
    " received_at float8 NOT NULL, PRIMARY KEY (job, digest))",
)

BUDGETS_SQLITE_V1 = (
    """CREATE TABLE budgets (
        id TEXT PRIMARY KEY,
        credit_limit REAL NOT NULL,
        spent REAL NOT NULL DEFAULT 0,
        reserved REAL NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    )""",
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
)
BUDGETS_SQLITE_V2 = (
    "ALTER TABLE budget_reservations ADD COLUMN run TEXT",
    "CREATE INDEX budget_reservations_open_by_run ON budget_reservations (run)"
    " WHERE status = 'open'",
    "ALTER TABLE budgets ADD COLUMN carried REAL NOT NULL DEFAULT 0",
)

BUDGETS_POSTGRES_V1 = (
    "CREATE TABLE playline_budgets (id text PRIMARY KEY,"
    " credit_limit float8 NOT NULL, spent float8 NOT NULL DEFAULT 0,"
    " reserved float8 NOT NULL DEFAULT 0, created_at float8 NOT NULL,"
    " updated_at float8 NOT NULL)",
    "CREATE TABLE playline_budget_reservations (key text NOT NULL,"
    " budget text NOT NULL, drawn_on text NOT NULL, credits float8 NOT NULL,"
    " status text NOT NULL, charged float8, created_at float8 NOT NULL,"
    " settled_at float8, PRIMARY KEY (key, budget))",
    "CREATE TABLE playline_named_budgets (name text PRIMARY KEY, period text NOT NULL,"
    " credit_limit float8 NOT NULL, created_at float8 NOT NULL,"
    " updated_at float8 NOT NULL)",
)
BUDGETS_POSTGRES_V2 = (
    "ALTER TABLE playline_budget_reservations ADD COLUMN run text",
    "CREATE INDEX playline_budget_reservations_open_by_run"
    " ON playline_budget_reservations (run) WHERE status = 'open'",
    "ALTER TABLE playline_budgets ADD COLUMN carried float8 NOT NULL DEFAULT 0",
)


def old_sqlite(
    path: Path, ddl: Sequence[str], version: int, rows: Sequence[tuple[str, Sequence[Any]]]
) -> None:
    """A SQLite file as the old code left it: its DDL, ``user_version``, and ``rows``
    (statements with ``?`` parameters) inserted."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        for statement in ddl:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {version:d}")
        for sql, params in rows:
            conn.execute(sql, params)
    conn.close()


def old_postgres(
    url: str,
    component: str,
    ddl: Sequence[str],
    version: int,
    rows: Sequence[tuple[str, Sequence[Any]]],
) -> None:
    """A PostgreSQL schema as the old code left ``component``: its DDL, its row in
    ``playline_schema``, and ``rows`` (statements with ``?`` parameters) inserted."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        conn.execute(
            "CREATE TABLE IF NOT EXISTS playline_schema ("
            " component text PRIMARY KEY, version integer NOT NULL,"
            " updated_at timestamptz NOT NULL DEFAULT now())"
        )
        for statement in ddl:
            conn.execute(statement)  # type: ignore[call-overload]
        conn.execute(
            "INSERT INTO playline_schema (component, version) VALUES (%s, %s)",
            [component, version],
        )
        for sql, params in rows:
            conn.execute(sql.replace("?", "%s"), params)  # type: ignore[call-overload]


# --------------------------------------------------------------------------- sheet
# The sheet store's schemas as ``sheet_sqlite.py`` and ``sheet_postgres.py`` (with the
# sheet's tables of ``postgres_db.MIGRATIONS``, component ``stores``) created them when
# they were replaced by ``sheet_ledger.py`` (:mod:`tests.integration.test_sheet_in_place`).

#: SQLite, ``sheet.db``: the ``PRAGMA user_version`` each step left, and its DDL.
SHEET_SQLITE = {
    1: (
        "CREATE TABLE IF NOT EXISTS sources (dataset_id TEXT PRIMARY KEY, "
        "columns TEXT NOT NULL, count INTEGER NOT NULL, created_at REAL)",
        "CREATE TABLE IF NOT EXISTS source_rows (dataset_id TEXT NOT NULL, "
        "pos INTEGER NOT NULL, data TEXT NOT NULL, PRIMARY KEY (dataset_id, pos))",
        "CREATE TABLE IF NOT EXISTS sheet_rows (dataset TEXT NOT NULL, "
        "row_key TEXT NOT NULL, data TEXT NOT NULL, first_run TEXT, updated_at REAL, "
        "PRIMARY KEY (dataset, row_key))",
        "CREATE TABLE IF NOT EXISTS runs (run_ref TEXT PRIMARY KEY, dataset TEXT NOT NULL, "
        "source_id TEXT NOT NULL, mode TEXT NOT NULL, total INTEGER NOT NULL, "
        "admitted INTEGER NOT NULL, duplicates INTEGER NOT NULL, "
        "seen_before INTEGER NOT NULL, columns TEXT NOT NULL, created_at REAL)",
        "CREATE TABLE IF NOT EXISTS run_rows (run_ref TEXT NOT NULL, seq INTEGER NOT NULL, "
        "row_key TEXT NOT NULL, status TEXT NOT NULL, error TEXT, "
        "PRIMARY KEY (run_ref, seq))",
    ),
    2: ("ALTER TABLE runs ADD COLUMN duplicate_keys TEXT",),
    3: ("ALTER TABLE run_rows ADD COLUMN provenance TEXT",),
    4: (
        "ALTER TABLE sheet_rows ADD COLUMN cell_meta TEXT",
        "ALTER TABLE run_rows ADD COLUMN changes TEXT",
        "ALTER TABLE run_rows ADD COLUMN compared TEXT",
    ),
}

#: PostgreSQL: the sheet's tables of the ``stores`` component's version 1 (the same
#: statements created the receipts' table; only the sheet's are copied here).
SHEET_POSTGRES_STORES_V1 = (
    "CREATE TABLE playline_sources (dataset_id text PRIMARY KEY, columns jsonb NOT NULL,"
    " count integer NOT NULL, created_at float8)",
    "CREATE TABLE playline_source_rows (dataset_id text NOT NULL, pos integer NOT NULL,"
    " data jsonb NOT NULL, PRIMARY KEY (dataset_id, pos))",
    "CREATE TABLE playline_sheet_rows (dataset text NOT NULL, row_key text NOT NULL,"
    " data jsonb NOT NULL, first_run text, updated_at float8,"
    " PRIMARY KEY (dataset, row_key))",
    "CREATE TABLE playline_runs (run_ref text PRIMARY KEY, dataset text NOT NULL,"
    " source_id text NOT NULL, mode text NOT NULL, total integer NOT NULL,"
    " admitted integer NOT NULL, duplicates integer NOT NULL,"
    " seen_before integer NOT NULL, columns jsonb NOT NULL, created_at float8)",
    "CREATE TABLE playline_run_rows (run_ref text NOT NULL, seq integer NOT NULL,"
    " row_key text NOT NULL, status text NOT NULL, error text,"
    " PRIMARY KEY (run_ref, seq))",
)

#: PostgreSQL, component ``sheet`` (the sheet's later columns): the version each step
#: left, and its DDL.
SHEET_POSTGRES = {
    1: ("ALTER TABLE playline_runs ADD COLUMN duplicate_keys jsonb",),
    2: ("ALTER TABLE playline_run_rows ADD COLUMN IF NOT EXISTS provenance text",),
    3: (
        "ALTER TABLE playline_sheet_rows ADD COLUMN IF NOT EXISTS cell_meta jsonb",
        "ALTER TABLE playline_run_rows ADD COLUMN IF NOT EXISTS changes jsonb",
        "ALTER TABLE playline_run_rows ADD COLUMN IF NOT EXISTS compared jsonb",
    ),
}


def sheet_ddl(steps: dict[int, tuple[str, ...]], version: int) -> tuple[str, ...]:
    """The statements of ``steps`` up to ``version``, in order."""
    return tuple(s for v in sorted(steps) if v <= version for s in steps[v])


def old_sqlite_sheet(
    path: Path, version: int, rows: Sequence[tuple[str, Sequence[Any]]] = ()
) -> None:
    """A ``sheet.db`` as the old code of schema ``version`` (1-4) left it."""
    old_sqlite(path, sheet_ddl(SHEET_SQLITE, version), version, rows)


def old_postgres_sheet(
    url: str, version: int, rows: Sequence[tuple[str, Sequence[Any]]] = ()
) -> None:
    """A PostgreSQL schema as the old code left the sheet: its tables (made by the
    ``stores`` component, whose row is the receipts' business and not written here)
    and the ``sheet`` component at ``version`` (0-3; 0: no row, as before a worker
    of the old code prepared a run)."""
    import psycopg

    ddl = (*SHEET_POSTGRES_STORES_V1, *sheet_ddl(SHEET_POSTGRES, version))
    old_postgres(url, "sheet", ddl, version, rows)
    if version == 0:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DELETE FROM playline_schema WHERE component = 'sheet'")


# -- the receipt store, as receipts_sqlite.py / postgres_db.py created it before it moved
# -- onto playline.db (tests.integration.test_receipts_in_place)

#: ``receipts.db``, one tuple of statements per ``user_version`` 1-7 (version 1 also
#: added the batch columns to a table from before versioned migrations that lacked them).
RECEIPTS_SQLITE_VERSIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE IF NOT EXISTS receipts (
                key TEXT PRIMARY KEY,
                tool_id TEXT NOT NULL,
                status TEXT NOT NULL,
                result TEXT,
                error TEXT,
                owner TEXT,
                lease_id TEXT,
                lease_expires_at REAL,
                created_at REAL NOT NULL,
                completed_at REAL,
                attempts INTEGER NOT NULL DEFAULT 0,
                credits REAL NOT NULL DEFAULT 0,
                batch_key TEXT,
                request TEXT
            )""",
    ),
    ("CREATE INDEX IF NOT EXISTS receipts_batch ON receipts (batch_key)",),
    (
        "ALTER TABLE receipts ADD COLUMN sent_at REAL",
        "ALTER TABLE receipts ADD COLUMN generation INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE receipts ADD COLUMN forced_by TEXT",
    ),
    ("ALTER TABLE receipts ADD COLUMN credits_source TEXT",),
    ("ALTER TABLE receipts ADD COLUMN paid_by TEXT",),
    (
        "CREATE INDEX IF NOT EXISTS receipts_tool_completed ON receipts "
        "(tool_id, completed_at) WHERE status = 'completed'",
    ),
    (
        "ALTER TABLE receipts ADD COLUMN paid_credits REAL",
        "ALTER TABLE receipts ADD COLUMN resends INTEGER NOT NULL DEFAULT 0",
    ),
)

#: PostgreSQL's ``stores`` component (the receipts and the sheet in one schema), one
#: tuple of statements per version 1-6.
STORES_POSTGRES_VERSIONS: tuple[tuple[str, ...], ...] = (
    (
        "CREATE TABLE playline_receipts ("
        " key text PRIMARY KEY,"
        " tool_id text NOT NULL,"
        " status text NOT NULL,"
        " result text,"
        " error text,"
        " owner text,"
        " lease_id text,"
        " lease_expires_at float8,"
        " created_at float8 NOT NULL,"
        " completed_at float8,"
        " attempts integer NOT NULL DEFAULT 0,"
        " credits float8 NOT NULL DEFAULT 0,"
        " batch_key text,"
        " request text)",
        "CREATE INDEX playline_receipts_batch ON playline_receipts (batch_key)"
        " WHERE batch_key IS NOT NULL",
        *SHEET_POSTGRES_STORES_V1,
    ),
    (
        "ALTER TABLE playline_receipts ADD COLUMN sent_at float8",
        "ALTER TABLE playline_receipts ADD COLUMN generation integer NOT NULL DEFAULT 0",
        "ALTER TABLE playline_receipts ADD COLUMN forced_by text",
    ),
    ("ALTER TABLE playline_receipts ADD COLUMN IF NOT EXISTS credits_source text",),
    ("ALTER TABLE playline_receipts ADD COLUMN IF NOT EXISTS paid_by text",),
    (
        "CREATE INDEX IF NOT EXISTS playline_receipts_tool_completed ON playline_receipts"
        " (tool_id, completed_at) WHERE status = 'completed'",
    ),
    (
        "ALTER TABLE playline_receipts ADD COLUMN IF NOT EXISTS paid_credits float8",
        "ALTER TABLE playline_receipts ADD COLUMN IF NOT EXISTS resends integer NOT NULL DEFAULT 0",
    ),
)


def up_to(versions: Sequence[Sequence[str]], version: int) -> tuple[str, ...]:
    """The statements of ``versions`` 1..``version``, in order."""
    return tuple(statement for step in versions[:version] for statement in step)
