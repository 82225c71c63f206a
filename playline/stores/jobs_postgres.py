"""``PostgresJobStore``: the job ledger of a fleet, in the stores' PostgreSQL database.

See :mod:`playline.stores.jobs` for the contract. Each change is one transaction
(:meth:`PostgresDatabase.transaction
<playline.stores.postgres_db.PostgresDatabase.transaction>`): an open inserts the
job with ``ON CONFLICT (key) DO NOTHING`` and indexes its members only when that
insert took, so of two workers opening one job at once exactly one records it and
both get the same job back; a state change locks the job's row (``SELECT ... FOR
UPDATE``), applies the rule of :mod:`~playline.stores.jobs` and writes it back, so
two workers polling one job never move a finished job back to a live state.

JSON columns are text holding :func:`~playline.stores.receipts.stored_json` (as the
receipt results are): a provider's status body is kept byte for byte whatever it
holds (``jsonb`` refuses ``\\u0000``).

The tables are the ``jobs`` component of ``playline_schema``, migrated by the store's
first use, by a worker or a client alike; a client that never touches jobs changes
nothing. Times come from the database server's clock unless a ``clock`` is given
(tests).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from playline.stores.jobs import (
    JOB_COLUMNS,
    LIVE_STATES,
    Job,
    JobCounts,
    JobState,
    check_state,
    job_from_row,
    job_values,
    opened,
    status_applied,
    submitted_applied,
    unknown_job,
)
from playline.stores.migrations import Migration, migrate_postgres
from playline.stores.postgres_db import PostgresDatabase
from playline.stores.receipts import stored_json

__all__ = ["MIGRATIONS", "PostgresJobStore"]

MIGRATIONS = (
    Migration(
        1,
        "jobs, their members, their waiters and their webhook deliveries",
        (
            # request, members, status, waiters: stored_json text
            "CREATE TABLE playline_jobs (key text PRIMARY KEY, tool_id text NOT NULL,"
            " provider text NOT NULL, request text NOT NULL, members text NOT NULL,"
            " state text NOT NULL, job_id text, token text NOT NULL,"
            " opened_at float8 NOT NULL, submitted_at float8, polled_at float8,"
            " finished_at float8, status text, error text,"
            " waiters text NOT NULL DEFAULT '[]')",
            "CREATE INDEX playline_jobs_provider_job_id ON playline_jobs (provider, job_id)",
            "CREATE INDEX playline_jobs_token ON playline_jobs (token)",
            "CREATE INDEX playline_jobs_provider_state ON playline_jobs (provider, state)",
            # seq: the order members were recorded in (of two jobs opened at the same
            # time, the later one is a member's latest)
            "CREATE TABLE playline_job_members (member text NOT NULL, job text NOT NULL,"
            " opened_at float8 NOT NULL, seq bigint GENERATED ALWAYS AS IDENTITY,"
            " PRIMARY KEY (member, job))",
            "CREATE INDEX playline_job_members_latest ON playline_job_members"
            " (member, opened_at DESC, seq DESC)",
            "CREATE TABLE playline_job_waiters (workflow_id text NOT NULL, job text NOT NULL,"
            " PRIMARY KEY (workflow_id, job))",
            "CREATE TABLE playline_job_deliveries (job text NOT NULL, digest text NOT NULL,"
            " received_at float8 NOT NULL, PRIMARY KEY (job, digest))",
        ),
    ),
)

_Conn = psycopg.AsyncConnection[Any]

_SELECT = f"SELECT {', '.join(JOB_COLUMNS)} FROM playline_jobs"
_LIVE = f"state IN ({', '.join(repr(s) for s in LIVE_STATES)})"


class PostgresJobStore:
    """The job ledger in PostgreSQL, shared by every worker and client of a fleet.

    Args:
        db: the stores' database (opened); the caller closes it.
        clock: seconds since the epoch, for the jobs' timestamps; default: the
            database server's clock.
    """

    def __init__(self, db: PostgresDatabase, *, clock: Callable[[], float] | None = None) -> None:
        self._db = db
        self._clock = clock
        self._migrated = False
        self._migrating = asyncio.Lock()

    async def _ready(self) -> None:
        """Apply :data:`MIGRATIONS` once per store, on first use."""
        if self._migrated:
            return
        async with self._migrating:
            if not self._migrated:
                async with self._db.connection() as conn:
                    await migrate_postgres(
                        conn, MIGRATIONS, component="jobs", where=self._db.where, create=True
                    )
                self._migrated = True

    async def _now(self, conn: _Conn) -> float:
        if self._clock is not None:
            return self._clock()
        cur = await conn.execute("SELECT extract(epoch FROM statement_timestamp())::float8")
        row = await cur.fetchone()
        assert row is not None
        return float(row[0])

    # -------------------------------------------------------------------- writes

    async def open(self, job: Job) -> Job:
        await self._ready()

        async def tx(conn: _Conn) -> Job:
            new = opened(job, job.opened_at or await self._now(conn))
            cur = await conn.execute(
                f"INSERT INTO playline_jobs ({', '.join(JOB_COLUMNS)})"
                f" VALUES ({', '.join(['%s'] * len(JOB_COLUMNS))}) ON CONFLICT (key) DO NOTHING",
                job_values(new),
            )
            if cur.rowcount:
                await conn.execute(
                    "INSERT INTO playline_job_members (member, job, opened_at)"
                    " SELECT m, %(key)s, %(at)s FROM unnest(%(members)s::text[])"
                    " WITH ORDINALITY AS u(m, n) ORDER BY n ON CONFLICT DO NOTHING",
                    {"key": new.key, "at": new.opened_at, "members": new.members},
                )
                if new.waiters:
                    await conn.execute(
                        "INSERT INTO playline_job_waiters (workflow_id, job)"
                        " SELECT w, %s FROM unnest(%s::text[]) AS u(w) ON CONFLICT DO NOTHING",
                        [new.key, new.waiters],
                    )
            stored = await _job(conn, new.key)
            assert stored is not None
            return stored

        return await self._db.transaction(tx)

    async def mark_submitting(self, key: str) -> bool:
        await self._ready()

        async def tx(conn: _Conn) -> bool:
            # One row updated under its row lock: of two callers, the second waits for
            # the first's commit, then finds the job no longer ``opened`` (0 rows).
            cur = await conn.execute(
                "UPDATE playline_jobs SET state = 'sending' WHERE key = %s AND state = 'opened'",
                [key],
            )
            if cur.rowcount:
                return True
            if await _job(conn, key) is None:
                raise unknown_job(key)
            return False

        return await self._db.transaction(tx)

    async def submitted(self, key: str, job_id: str) -> Job:
        await self._ready()

        async def tx(conn: _Conn) -> Job:
            job = await _job(conn, key, lock=True)
            if job is None:
                raise unknown_job(key)
            changed = submitted_applied(job, job_id, await self._now(conn))
            if changed is None:
                return job
            await _update(conn, changed)
            return changed

        return await self._db.transaction(tx)

    async def record_status(
        self, key: str, *, state: JobState, status: Any, error: str | None = None
    ) -> Job:
        check_state(state)
        await self._ready()

        async def tx(conn: _Conn) -> Job:
            job = await _job(conn, key, lock=True)
            if job is None:
                raise unknown_job(key)
            changed = status_applied(job, state, status, error, await self._now(conn))
            if changed is None:
                return job
            await _update(conn, changed)
            return await _job(conn, key) or changed  # as stored (the status through JSON)

        return await self._db.transaction(tx)

    async def add_waiter(self, keys: Sequence[str], workflow_id: str) -> None:
        wanted = sorted(set(keys))
        if not wanted:
            return
        await self._ready()

        async def tx(conn: _Conn) -> None:
            await _add_waiters(conn, wanted, [workflow_id])

        await self._db.transaction(tx)

    async def record_delivery(self, key: str, digest: str) -> bool:
        await self._ready()
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "INSERT INTO playline_job_deliveries (job, digest, received_at)"
                " VALUES (%s, %s, %s) ON CONFLICT (job, digest) DO NOTHING",
                [key, digest, await self._now(conn)],
            )
            return bool(cur.rowcount)

    # --------------------------------------------------------------------- reads

    async def get(self, key: str) -> Job | None:
        await self._ready()
        async with self._db.connection() as conn:
            return await _job(conn, key)

    async def jobs_of(self, members: Sequence[str]) -> dict[str, Job]:
        wanted = sorted(set(members))
        if not wanted:
            return {}
        await self._ready()
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT DISTINCT ON (m.member) m.member,"
                f" {', '.join(f'j.{c}' for c in JOB_COLUMNS)}"
                " FROM playline_job_members AS m JOIN playline_jobs AS j ON j.key = m.job"
                " WHERE m.member = ANY(%s::text[])"
                " ORDER BY m.member, m.opened_at DESC, m.seq DESC",
                [wanted],
            )
            rows = await cur.fetchall()
        return {row[0]: job_from_row(row[1:]) for row in rows}

    async def by_job_id(self, provider: str, job_id: str) -> Job | None:
        await self._ready()
        async with self._db.connection() as conn:
            cur = await conn.execute(
                f"{_SELECT} WHERE provider = %s AND job_id = %s ORDER BY opened_at DESC LIMIT 1",
                [provider, job_id],
            )
            row = await cur.fetchone()
        return None if row is None else job_from_row(row)

    async def by_token(self, token: str) -> Job | None:
        if not token:
            return None
        await self._ready()
        async with self._db.connection() as conn:
            cur = await conn.execute(
                f"{_SELECT} WHERE token = %s ORDER BY opened_at DESC LIMIT 1", [token]
            )
            row = await cur.fetchone()
        return None if row is None else job_from_row(row)

    async def live(self, provider: str, *, max_age_s: float | None = None) -> int:
        await self._ready()
        async with self._db.connection() as conn:
            since = float("-inf") if max_age_s is None else await self._now(conn) - max_age_s
            cur = await conn.execute(
                f"SELECT count(*) FROM playline_jobs WHERE provider = %s AND {_LIVE}"
                " AND opened_at >= %s",
                [provider, since],
            )
            row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    async def counts(self, waiter: str | None = None) -> list[JobCounts]:
        await self._ready()
        sums = (
            f"SELECT provider, count(*) FILTER (WHERE {_LIVE}),"
            " count(*) FILTER (WHERE state = 'done'),"
            " count(*) FILTER (WHERE state IN ('failed', 'ambiguous')),"
            f" min(opened_at) FILTER (WHERE {_LIVE}) FROM playline_jobs"
        )
        async with self._db.connection() as conn:
            if waiter is None:
                cur = await conn.execute(f"{sums} GROUP BY provider ORDER BY provider")
            else:
                cur = await conn.execute(
                    f"{sums} JOIN playline_job_waiters AS w"
                    " ON w.job = playline_jobs.key AND w.workflow_id = %s"
                    " GROUP BY provider ORDER BY provider",
                    [waiter],
                )
            rows = await cur.fetchall()
        return [
            JobCounts(provider, int(pending), int(done), int(failed), oldest)
            for provider, pending, done, failed, oldest in rows
        ]

    async def unread(self, waiters: Sequence[str]) -> list[str]:
        if not waiters:
            return []
        await self._ready()
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT DISTINCT provider, coalesce(job_id, key), state FROM playline_jobs"
                " JOIN playline_job_waiters AS w ON w.job = playline_jobs.key"
                " WHERE w.workflow_id = ANY(%s::text[]) AND state IN ('sending', 'running')"
                " ORDER BY 1, 2",
                [list(waiters)],
            )
            rows = await cur.fetchall()
        return [f"{provider} job {job}: {state}" for provider, job, state in rows]

    async def submitted_twice(self, waiters: Sequence[str]) -> list[str]:
        if not waiters:
            return []
        await self._ready()
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT m.member FROM playline_job_members AS m"
                " JOIN playline_jobs AS j ON j.key = m.job"
                " WHERE j.state NOT IN ('opened', 'failed') AND m.member IN ("
                " SELECT m2.member FROM playline_job_members AS m2"
                " JOIN playline_job_waiters AS w ON w.job = m2.job"
                " WHERE w.workflow_id = ANY(%s::text[]))"
                " GROUP BY m.member HAVING count(DISTINCT m.job) > 1 ORDER BY m.member",
                [list(waiters)],
            )
            rows = await cur.fetchall()
        return [row[0] for row in rows]

    async def close(self) -> None:
        """Nothing of its own to close: the database is the stores' (closed with them)."""


# ------------------------------------------------------------ in the transaction


async def _job(conn: _Conn, key: str, *, lock: bool = False) -> Job | None:
    cur = await conn.execute(f"{_SELECT} WHERE key = %s" + (" FOR UPDATE" if lock else ""), [key])
    row = await cur.fetchone()
    return None if row is None else job_from_row(row)


async def _update(conn: _Conn, job: Job) -> None:
    """Write every column of ``job`` but its key back to its row."""
    values = job_values(job)
    await conn.execute(
        f"UPDATE playline_jobs SET {', '.join(f'{c} = %s' for c in JOB_COLUMNS[1:])}"
        " WHERE key = %s",
        [*values[1:], values[0]],
    )


async def _add_waiters(conn: _Conn, keys: Sequence[str], waiters: Sequence[str]) -> None:
    """Add ``waiters`` to the jobs ``keys`` (locked in key order; missing keys skipped)."""
    if not keys or not waiters:
        return
    cur = await conn.execute(
        "SELECT key, waiters FROM playline_jobs WHERE key = ANY(%s::text[]) ORDER BY key"
        " FOR UPDATE",
        [sorted(set(keys))],
    )
    for key, text in await cur.fetchall():
        stored = json.loads(text)
        added = [w for w in dict.fromkeys(waiters) if w not in stored]
        if not added:
            continue
        await conn.execute(
            "UPDATE playline_jobs SET waiters = %s WHERE key = %s",
            [stored_json([*stored, *added]), key],
        )
        await conn.execute(
            "INSERT INTO playline_job_waiters (workflow_id, job)"
            " SELECT w, %s FROM unnest(%s::text[]) AS u(w) ON CONFLICT DO NOTHING",
            [key, added],
        )
