"""``JobLedger``: the job ledger, one implementation for SQLite and PostgreSQL.

See :mod:`playline.stores.jobs` for the contract. Every change is one function run
by :meth:`Database.write <playline.db.engine.Database.write>`, so it is atomic:

* an open inserts the job with ``ON CONFLICT (key) DO NOTHING`` and indexes its
  members only when that insert took: of two workers opening one job at once,
  exactly one records it and both get the same job back;
* a state change reads the job ``FOR UPDATE`` (on SQLite the write already holds the
  file), applies the rule of :mod:`~playline.stores.jobs` and writes it back, so two
  workers polling one job never move a finished job back to a live state.

JSON columns are text holding :func:`~playline.stores.receipts.stored_json`: a
provider's status body is kept byte for byte whatever it holds.

The tables are created (SQLite: the file ``jobs.db``; PostgreSQL: the ``jobs``
component) by the store's first use, by a worker or a client alike; a process that
never touches jobs creates nothing. Times come from the database's clock (SQLite:
this machine's) unless a ``clock`` is given (tests).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from playline.db.conn import Conn, chunks
from playline.db.dialect import marks
from playline.db.migrations import Migration, Schema
from playline.db.store import LedgerStore
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
from playline.stores.receipts import stored_json

__all__ = ["SCHEMA", "JobLedger"]

SCHEMA = Schema(
    "jobs",
    (
        Migration(
            1,
            "jobs, their members, their waiters and their webhook deliveries",
            # request, members, status, waiters: stored_json text
            sqlite=(
                "CREATE TABLE jobs (key TEXT PRIMARY KEY, tool_id TEXT NOT NULL,"
                " provider TEXT NOT NULL, request TEXT NOT NULL, members TEXT NOT NULL,"
                " state TEXT NOT NULL, job_id TEXT, token TEXT NOT NULL,"
                " opened_at REAL NOT NULL, submitted_at REAL, polled_at REAL,"
                " finished_at REAL, status TEXT, error TEXT,"
                " waiters TEXT NOT NULL DEFAULT '[]')",
                "CREATE INDEX jobs_provider_job_id ON jobs (provider, job_id)",
                "CREATE INDEX jobs_token ON jobs (token)",
                "CREATE INDEX jobs_provider_state ON jobs (provider, state)",
                # seq: the order members were recorded in (of two jobs opened at the
                # same time, the later one is a member's latest)
                "CREATE TABLE job_members (seq INTEGER PRIMARY KEY, member TEXT NOT NULL,"
                " job TEXT NOT NULL, opened_at REAL NOT NULL, UNIQUE (member, job))",
                "CREATE INDEX job_members_latest ON job_members (member, opened_at)",
                "CREATE TABLE job_waiters (workflow_id TEXT NOT NULL, job TEXT NOT NULL,"
                " PRIMARY KEY (workflow_id, job)) WITHOUT ROWID",
                "CREATE TABLE job_deliveries (job TEXT NOT NULL, digest TEXT NOT NULL,"
                " received_at REAL NOT NULL, PRIMARY KEY (job, digest)) WITHOUT ROWID",
            ),
            postgres=(
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
                "CREATE TABLE playline_job_waiters (workflow_id text NOT NULL,"
                " job text NOT NULL, PRIMARY KEY (workflow_id, job))",
                "CREATE TABLE playline_job_deliveries (job text NOT NULL, digest text NOT NULL,"
                " received_at float8 NOT NULL, PRIMARY KEY (job, digest))",
            ),
        ),
        Migration(
            2,
            "one name per table on both databases (SQLite's tables take PostgreSQL's)",
            sqlite=(
                "ALTER TABLE jobs RENAME TO playline_jobs",
                "ALTER TABLE job_members RENAME TO playline_job_members",
                "ALTER TABLE job_waiters RENAME TO playline_job_waiters",
                "ALTER TABLE job_deliveries RENAME TO playline_job_deliveries",
            ),
            postgres=(),
        ),
    ),
)

_SELECT = f"SELECT {', '.join(JOB_COLUMNS)} FROM playline_jobs"
_LIVE = f"state IN ({', '.join(repr(s) for s in LIVE_STATES)})"


class JobLedger(LedgerStore):
    """The job ledger on either database; safe across processes and workers.

    Build it with :meth:`~playline.db.store.LedgerStore.in_file` (SQLite,
    ``Settings.jobs_path``) or :meth:`~playline.db.store.LedgerStore.in_database`
    (PostgreSQL); ``clock``: for the jobs' timestamps (default: the database's).
    """

    SCHEMA = SCHEMA

    # -------------------------------------------------------------------- writes

    async def open(self, job: Job) -> Job:
        def tx(conn: Conn) -> Job:
            new = opened(job, job.opened_at or self._now(conn))
            inserted = conn.execute(
                f"INSERT INTO playline_jobs ({', '.join(JOB_COLUMNS)})"
                f" VALUES ({marks(len(JOB_COLUMNS))}) ON CONFLICT (key) DO NOTHING",
                job_values(new),
            )
            if inserted:
                conn.many(
                    "INSERT INTO playline_job_members (member, job, opened_at) VALUES (?, ?, ?)"
                    " ON CONFLICT (member, job) DO NOTHING",
                    [(member, new.key, new.opened_at) for member in new.members],
                )
                conn.many(
                    "INSERT INTO playline_job_waiters (workflow_id, job) VALUES (?, ?)"
                    " ON CONFLICT DO NOTHING",
                    [(waiter, new.key) for waiter in new.waiters],
                )
            stored = _job(conn, new.key)
            assert stored is not None
            return stored

        return await (await self._ready()).write(tx)

    async def mark_submitting(self, key: str) -> bool:
        def tx(conn: Conn) -> bool:
            # One row updated under its lock: of two callers, the second finds the job
            # no longer ``opened`` (0 rows).
            if conn.execute(
                "UPDATE playline_jobs SET state = 'sending' WHERE key = ? AND state = 'opened'",
                [key],
            ):
                return True
            if _job(conn, key) is None:
                raise unknown_job(key)
            return False

        return await (await self._ready()).write(tx)

    async def submitted(self, key: str, job_id: str) -> Job:
        def tx(conn: Conn) -> Job:
            job = _job(conn, key, lock=True)
            if job is None:
                raise unknown_job(key)
            changed = submitted_applied(job, job_id, self._now(conn))
            if changed is None:
                return job
            _update(conn, changed)
            return changed

        return await (await self._ready()).write(tx)

    async def record_status(
        self, key: str, *, state: JobState, status: Any, error: str | None = None
    ) -> Job:
        check_state(state)

        def tx(conn: Conn) -> Job:
            job = _job(conn, key, lock=True)
            if job is None:
                raise unknown_job(key)
            changed = status_applied(job, state, status, error, self._now(conn))
            if changed is None:
                return job
            _update(conn, changed)
            return _job(conn, key) or changed  # as stored (the status through JSON)

        return await (await self._ready()).write(tx)

    async def add_waiter(self, keys: Sequence[str], workflow_id: str) -> None:
        wanted = sorted(set(keys))

        def tx(conn: Conn) -> None:
            for batch in chunks(wanted, conn.dialect.max_params):
                # Locked in key order, so two writers never wait on each other in a ring.
                rows = conn.all(
                    f"SELECT key, waiters FROM playline_jobs WHERE key IN ({marks(len(batch))})"
                    f" ORDER BY key{conn.dialect.for_update}",
                    batch,
                )
                for key, text in rows:
                    waiters = _loads_list(text)
                    if workflow_id in waiters:
                        continue
                    conn.execute(
                        "UPDATE playline_jobs SET waiters = ? WHERE key = ?",
                        [stored_json([*waiters, workflow_id]), key],
                    )
                    conn.execute(
                        "INSERT INTO playline_job_waiters (workflow_id, job) VALUES (?, ?)"
                        " ON CONFLICT DO NOTHING",
                        [workflow_id, key],
                    )

        if wanted:
            await (await self._ready()).write(tx)

    async def record_delivery(self, key: str, digest: str) -> bool:
        def tx(conn: Conn) -> bool:
            return bool(
                conn.execute(
                    "INSERT INTO playline_job_deliveries (job, digest, received_at)"
                    " VALUES (?, ?, ?) ON CONFLICT (job, digest) DO NOTHING",
                    [key, digest, self._now(conn)],
                )
            )

        return await (await self._ready()).write(tx)

    # --------------------------------------------------------------------- reads

    async def get(self, key: str) -> Job | None:
        return await (await self._ready()).read(lambda conn: _job(conn, key))

    async def jobs_of(self, members: Sequence[str]) -> dict[str, Job]:
        wanted = sorted(set(members))

        def read(conn: Conn) -> dict[str, Job]:
            found: dict[str, Job] = {}
            for batch in chunks(wanted, conn.dialect.max_params):
                # Each member's jobs, latest first: the first row of a member is its job.
                for member, *row in conn.all(
                    f"SELECT m.member, {', '.join(f'j.{c}' for c in JOB_COLUMNS)}"
                    " FROM playline_job_members AS m JOIN playline_jobs AS j ON j.key = m.job"
                    f" WHERE m.member IN ({marks(len(batch))})"
                    " ORDER BY m.member, m.opened_at DESC, m.seq DESC",
                    batch,
                ):
                    if member not in found:
                        found[member] = job_from_row(row)
            return found

        if not wanted:
            return {}
        return await (await self._ready()).read(read)

    async def by_job_id(self, provider: str, job_id: str) -> Job | None:
        def read(conn: Conn) -> Job | None:
            row = conn.one(
                f"{_SELECT} WHERE provider = ? AND job_id = ? ORDER BY opened_at DESC LIMIT 1",
                [provider, job_id],
            )
            return None if row is None else job_from_row(row)

        return await (await self._ready()).read(read)

    async def by_token(self, token: str) -> Job | None:
        def read(conn: Conn) -> Job | None:
            row = conn.one(f"{_SELECT} WHERE token = ? ORDER BY opened_at DESC LIMIT 1", [token])
            return None if row is None else job_from_row(row)

        if not token:
            return None
        return await (await self._ready()).read(read)

    async def live(self, provider: str, *, max_age_s: float | None = None) -> int:
        def read(conn: Conn) -> int:
            since = float("-inf") if max_age_s is None else self._now(conn) - max_age_s
            return int(
                conn.scalar(
                    f"SELECT count(*) FROM playline_jobs WHERE provider = ? AND {_LIVE}"
                    " AND opened_at >= ?",
                    [provider, since],
                )
            )

        return await (await self._ready()).read(read)

    async def counts(self, waiter: str | None = None) -> list[JobCounts]:
        sums = (
            f"SELECT provider, sum(CASE WHEN {_LIVE} THEN 1 ELSE 0 END),"
            " sum(CASE WHEN state = 'done' THEN 1 ELSE 0 END),"
            " sum(CASE WHEN state IN ('failed', 'ambiguous') THEN 1 ELSE 0 END),"
            f" min(CASE WHEN {_LIVE} THEN opened_at END) FROM playline_jobs"
        )

        def read(conn: Conn) -> list[JobCounts]:
            if waiter is None:
                rows = conn.all(f"{sums} GROUP BY provider ORDER BY provider")
            else:
                rows = conn.all(
                    f"{sums} JOIN playline_job_waiters AS w"
                    " ON w.job = playline_jobs.key AND w.workflow_id = ?"
                    " GROUP BY provider ORDER BY provider",
                    [waiter],
                )
            return [
                JobCounts(provider, int(pending), int(done), int(failed), oldest)
                for provider, pending, done, failed, oldest in rows
            ]

        return await (await self._ready()).read(read)

    async def unread(self, waiters: Sequence[str]) -> list[str]:
        def read(conn: Conn) -> list[str]:
            rows = conn.all(
                "SELECT DISTINCT provider, coalesce(job_id, key), state FROM playline_jobs"
                " JOIN playline_job_waiters AS w ON w.job = playline_jobs.key"
                f" WHERE w.workflow_id IN ({marks(len(waiters))})"
                " AND state IN ('sending', 'running') ORDER BY 1, 2",
                list(waiters),
            )
            return [f"{provider} job {job}: {state}" for provider, job, state in rows]

        return await (await self._ready()).read(read) if waiters else []

    async def submitted_twice(self, waiters: Sequence[str]) -> list[str]:
        def read(conn: Conn) -> list[str]:
            rows = conn.all(
                "SELECT m.member FROM playline_job_members AS m"
                " JOIN playline_jobs AS j ON j.key = m.job"
                " WHERE j.state NOT IN ('opened', 'failed') AND m.member IN ("
                " SELECT m2.member FROM playline_job_members AS m2"
                " JOIN playline_job_waiters AS w ON w.job = m2.job"
                f" WHERE w.workflow_id IN ({marks(len(waiters))}))"
                " GROUP BY m.member HAVING count(DISTINCT m.job) > 1 ORDER BY m.member",
                list(waiters),
            )
            return [row[0] for row in rows]

        return await (await self._ready()).read(read) if waiters else []


# ------------------------------------------------------------ in the transaction


def _job(conn: Conn, key: str, *, lock: bool = False) -> Job | None:
    lock_sql = conn.dialect.for_update if lock else ""
    row = conn.one(f"{_SELECT} WHERE key = ?{lock_sql}", [key])
    return None if row is None else job_from_row(row)


def _update(conn: Conn, job: Job) -> None:
    """Write every column of ``job`` but its key back to its row."""
    values = job_values(job)
    conn.execute(
        f"UPDATE playline_jobs SET {', '.join(f'{c} = ?' for c in JOB_COLUMNS[1:])} WHERE key = ?",
        [*values[1:], values[0]],
    )


def _loads_list(text: str) -> list[str]:
    loaded = json.loads(text)
    return [str(item) for item in loaded] if isinstance(loaded, list) else []
