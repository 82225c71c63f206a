"""``SqliteJobStore``: the job ledger in its own SQLite file, ``jobs.db``.

See :mod:`playline.stores.jobs` for the contract. Every change is one function run
by :meth:`SqliteDatabase.write <playline.stores.sqlite_db.SqliteDatabase.write>`:
inside ``BEGIN IMMEDIATE``, which takes the file's write lock, so "is the job there?"
and "record it" (an open), or "read the job" and "write its next state" (a status),
are one step for every process sharing the file, and a call that fails half-way
leaves nothing (its savepoint is undone).

The file is created (and migrated) by the store's first use, like the budget ledger
(:mod:`~playline.stores.budgets_sqlite`): a process that never touches jobs creates
nothing.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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
from playline.stores.migrations import Migration
from playline.stores.receipts import stored_json
from playline.stores.sqlite_db import SqliteDatabase

__all__ = ["MIGRATIONS", "SqliteJobStore"]

MIGRATIONS = (
    Migration(
        1,
        "jobs, their members, their waiters and their webhook deliveries",
        (
            # request, members, status, waiters: stored_json text
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
            # seq: the order members were recorded in (of two jobs opened at the same
            # time, the later one is a member's latest)
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
        ),
    ),
)

_SELECT = f"SELECT {', '.join(JOB_COLUMNS)} FROM jobs"
_JOINED = f"SELECT m.member, {', '.join(f'j.{c}' for c in JOB_COLUMNS)} FROM job_members AS m"
_LIVE = f"state IN ({', '.join(repr(s) for s in LIVE_STATES)})"
#: members per ``IN (...)`` (well under SQLite's limit on parameters)
_BATCH = 500


class SqliteJobStore:
    """The job ledger in one SQLite file (WAL mode), safe across processes.

    Args:
        path: the file (``Settings.jobs_path``); created by the first use.
        clock: seconds since the epoch, for the jobs' timestamps (tests move it by hand).
    """

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._clock = clock
        self._db: SqliteDatabase | None = None
        self._opening = asyncio.Lock()

    async def _database(self) -> SqliteDatabase:
        """The file, opened (created and migrated if need be) on first use."""
        if self._db is None:
            async with self._opening:
                if self._db is None:
                    self._db = await asyncio.to_thread(
                        SqliteDatabase, self.path, MIGRATIONS, create=True
                    )
        return self._db

    # -------------------------------------------------------------------- writes

    async def open(self, job: Job) -> Job:
        new = opened(job, self._clock())

        def tx(conn: sqlite3.Connection) -> Job:
            inserted = conn.execute(
                f"INSERT INTO jobs ({', '.join(JOB_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(JOB_COLUMNS))}) ON CONFLICT (key) DO NOTHING",
                job_values(new),
            ).rowcount
            if inserted:
                conn.executemany(
                    "INSERT INTO job_members (member, job, opened_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (member, job) DO NOTHING",
                    [(member, new.key, new.opened_at) for member in new.members],
                )
                conn.executemany(
                    "INSERT INTO job_waiters (workflow_id, job) VALUES (?, ?) "
                    "ON CONFLICT DO NOTHING",
                    [(waiter, new.key) for waiter in new.waiters],
                )
            stored = _job(conn, new.key)
            assert stored is not None
            return stored

        return await (await self._database()).write(tx)

    async def mark_submitting(self, key: str) -> bool:
        def tx(conn: sqlite3.Connection) -> bool:
            if _job(conn, key) is None:
                raise unknown_job(key)
            return bool(
                conn.execute(
                    "UPDATE jobs SET state = 'sending' WHERE key = ? AND state = 'opened'", (key,)
                ).rowcount
            )

        return await (await self._database()).write(tx)

    async def submitted(self, key: str, job_id: str) -> Job:
        now = self._clock()

        def tx(conn: sqlite3.Connection) -> Job:
            job = _job(conn, key)
            if job is None:
                raise unknown_job(key)
            changed = submitted_applied(job, job_id, now)
            if changed is None:
                return job
            _update(conn, changed)
            return changed

        return await (await self._database()).write(tx)

    async def record_status(
        self, key: str, *, state: JobState, status: Any, error: str | None = None
    ) -> Job:
        check_state(state)
        now = self._clock()

        def tx(conn: sqlite3.Connection) -> Job:
            job = _job(conn, key)
            if job is None:
                raise unknown_job(key)
            changed = status_applied(job, state, status, error, now)
            if changed is None:
                return job
            _update(conn, changed)
            return _job(conn, key) or changed  # as stored (the status through JSON)

        return await (await self._database()).write(tx)

    async def add_waiter(self, keys: Sequence[str], workflow_id: str) -> None:
        wanted = list(dict.fromkeys(keys))

        def tx(conn: sqlite3.Connection) -> None:
            for key in wanted:
                row = conn.execute("SELECT waiters FROM jobs WHERE key = ?", (key,)).fetchone()
                if row is None:
                    continue
                waiters = _loads_list(row[0])
                if workflow_id in waiters:
                    continue
                conn.execute(
                    "UPDATE jobs SET waiters = ? WHERE key = ?",
                    (stored_json([*waiters, workflow_id]), key),
                )
                conn.execute(
                    "INSERT INTO job_waiters (workflow_id, job) VALUES (?, ?) "
                    "ON CONFLICT DO NOTHING",
                    (workflow_id, key),
                )

        if wanted:
            await (await self._database()).write(tx)

    async def record_delivery(self, key: str, digest: str) -> bool:
        now = self._clock()

        def tx(conn: sqlite3.Connection) -> bool:
            return bool(
                conn.execute(
                    "INSERT INTO job_deliveries (job, digest, received_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (job, digest) DO NOTHING",
                    (key, digest, now),
                ).rowcount
            )

        return await (await self._database()).write(tx)

    # --------------------------------------------------------------------- reads

    async def get(self, key: str) -> Job | None:
        return await (await self._database()).read(lambda conn: _job(conn, key))

    async def jobs_of(self, members: Sequence[str]) -> dict[str, Job]:
        wanted = list(dict.fromkeys(members))

        def read(conn: sqlite3.Connection) -> dict[str, Job]:
            found: dict[str, Job] = {}
            for start in range(0, len(wanted), _BATCH):
                batch = wanted[start : start + _BATCH]
                marks = ",".join("?" * len(batch))
                # Each member's jobs, latest first: the first row of a member is its job.
                for member, *row in conn.execute(
                    f"{_JOINED} JOIN jobs AS j ON j.key = m.job WHERE m.member IN ({marks}) "
                    "ORDER BY m.member, m.opened_at DESC, m.seq DESC",
                    batch,
                ):
                    if member not in found:
                        found[member] = job_from_row(row)
            return found

        if not wanted:
            return {}
        return await (await self._database()).read(read)

    async def by_job_id(self, provider: str, job_id: str) -> Job | None:
        def read(conn: sqlite3.Connection) -> Job | None:
            row = conn.execute(
                f"{_SELECT} WHERE provider = ? AND job_id = ? ORDER BY opened_at DESC LIMIT 1",
                (provider, job_id),
            ).fetchone()
            return None if row is None else job_from_row(row)

        return await (await self._database()).read(read)

    async def by_token(self, token: str) -> Job | None:
        if not token:
            return None

        def read(conn: sqlite3.Connection) -> Job | None:
            row = conn.execute(
                f"{_SELECT} WHERE token = ? ORDER BY opened_at DESC LIMIT 1", (token,)
            ).fetchone()
            return None if row is None else job_from_row(row)

        return await (await self._database()).read(read)

    async def live(self, provider: str, *, max_age_s: float | None = None) -> int:
        since = float("-inf") if max_age_s is None else self._clock() - max_age_s

        def read(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                f"SELECT count(*) FROM jobs WHERE provider = ? AND {_LIVE} AND opened_at >= ?",
                (provider, since),
            ).fetchone()
            return int(row[0])

        return await (await self._database()).read(read)

    async def counts(self, waiter: str | None = None) -> list[JobCounts]:
        def read(conn: sqlite3.Connection) -> list[JobCounts]:
            sums = (
                f"SELECT provider, sum({_LIVE}), sum(state = 'done'), "
                "sum(state IN ('failed', 'ambiguous')), "
                f"min(CASE WHEN {_LIVE} THEN opened_at END) FROM jobs"
            )
            if waiter is None:
                rows = conn.execute(f"{sums} GROUP BY provider ORDER BY provider")
            else:
                rows = conn.execute(
                    f"{sums} JOIN job_waiters AS w ON w.job = jobs.key AND w.workflow_id = ? "
                    "GROUP BY provider ORDER BY provider",
                    (waiter,),
                )
            return [
                JobCounts(provider, int(pending), int(done), int(failed), oldest)
                for provider, pending, done, failed, oldest in rows
            ]

        return await (await self._database()).read(read)

    async def unread(self, waiters: Sequence[str]) -> list[str]:
        def read(conn: sqlite3.Connection) -> list[str]:
            marks = ",".join("?" * len(waiters))
            rows = conn.execute(
                "SELECT DISTINCT provider, coalesce(job_id, key), state FROM jobs"
                " JOIN job_waiters AS w ON w.job = jobs.key"
                f" WHERE w.workflow_id IN ({marks}) AND state IN ('sending', 'running')"
                " ORDER BY 1, 2",
                list(waiters),
            )
            return [f"{provider} job {job}: {state}" for provider, job, state in rows]

        return await (await self._database()).read(read) if waiters else []

    async def submitted_twice(self, waiters: Sequence[str]) -> list[str]:
        def read(conn: sqlite3.Connection) -> list[str]:
            marks = ",".join("?" * len(waiters))
            rows = conn.execute(
                "SELECT m.member FROM job_members AS m JOIN jobs AS j ON j.key = m.job"
                f" WHERE j.state NOT IN ('opened', 'failed') AND m.member IN ("
                " SELECT m2.member FROM job_members AS m2 JOIN job_waiters AS w"
                f" ON w.job = m2.job WHERE w.workflow_id IN ({marks}))"
                " GROUP BY m.member HAVING count(DISTINCT m.job) > 1 ORDER BY m.member",
                list(waiters),
            )
            return [row[0] for row in rows]

        return await (await self._database()).read(read) if waiters else []

    async def close(self) -> None:
        async with self._opening:
            if self._db is not None:
                await self._db.close()
                self._db = None


# ------------------------------------------------------------ in the transaction


def _job(conn: sqlite3.Connection, key: str) -> Job | None:
    row = conn.execute(f"{_SELECT} WHERE key = ?", (key,)).fetchone()
    return None if row is None else job_from_row(row)


def _update(conn: sqlite3.Connection, job: Job) -> None:
    """Write every column of ``job`` but its key back to its row."""
    values = job_values(job)
    conn.execute(
        f"UPDATE jobs SET {', '.join(f'{c} = ?' for c in JOB_COLUMNS[1:])} WHERE key = ?",
        (*values[1:], values[0]),
    )


def _loads_list(text: str) -> list[str]:
    loaded = json.loads(text)
    return [str(item) for item in loaded] if isinstance(loaded, list) else []
