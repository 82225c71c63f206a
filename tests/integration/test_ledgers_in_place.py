"""Ledgers created by the code before ``playline.db`` open in place with today's.

Each test builds a store with the old schema and rows (:mod:`tests.old_schemas`),
on SQLite and on PostgreSQL, then opens it through ``open_stores`` as a worker
would, and checks that every job / budget / reservation is there and still works.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from playline.config import Settings
from playline.stores.backends import open_stores
from playline.stores.jobs import JobCounts
from tests.integration.conftest import Clock
from tests.old_schemas import JOBS_POSTGRES_V1, JOBS_SQLITE_V1, old_postgres, old_sqlite
from tests.pg import pg_schema


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A fresh store location of each backend (PostgreSQL: marked ``postgres``)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store'}"
        return
    async with pg_schema() as url:
        yield url


def _tables(url: str, sqlite_name: str, postgres_name: str) -> str:
    return postgres_name if url.startswith("postgres") else sqlite_name


def _old_jobs(url: str) -> None:
    """Two jobs sharing a member, a waiter and a delivery, in the old tables."""
    jobs = _tables(url, "jobs", "playline_jobs")
    members = _tables(url, "job_members", "playline_job_members")
    waiters = _tables(url, "job_waiters", "playline_job_waiters")
    deliveries = _tables(url, "job_deliveries", "playline_job_deliveries")
    request = json.dumps({"method": "POST", "path": "/v1/jobs", "body": {}})
    rows = [
        (
            f"INSERT INTO {jobs} (key, tool_id, provider, request, members, state, job_id,"
            " token, opened_at, submitted_at, status, waiters)"
            " VALUES (?, 'acme.find', 'acme', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                "acme.find#job:1",
                request,
                '["r:1","r:2"]',
                "running",
                "J-1",
                "tok-1",
                10.0,
                11.0,
                None,
                '["wf-1"]',
            ],
        ),
        (
            f"INSERT INTO {jobs} (key, tool_id, provider, request, members, state, job_id,"
            " token, opened_at, submitted_at, finished_at, status, waiters)"
            " VALUES (?, 'acme.find', 'acme', ?, ?, 'done', ?, ?, ?, ?, ?, ?, '[]')",
            ["acme.find#job:0", request, '["r:1"]', "J-0", "tok-0", 5.0, 6.0, 7.0, '{"ok":1}'],
        ),
        (
            f"INSERT INTO {members} (member, job, opened_at) VALUES (?, ?, ?)",
            ["r:1", "acme.find#job:0", 5.0],
        ),
        (
            f"INSERT INTO {members} (member, job, opened_at) VALUES (?, ?, ?)",
            ["r:1", "acme.find#job:1", 10.0],
        ),
        (
            f"INSERT INTO {members} (member, job, opened_at) VALUES (?, ?, ?)",
            ["r:2", "acme.find#job:1", 10.0],
        ),
        (f"INSERT INTO {waiters} (workflow_id, job) VALUES (?, ?)", ["wf-1", "acme.find#job:1"]),
        (
            f"INSERT INTO {deliveries} (job, digest, received_at) VALUES (?, ?, ?)",
            ["acme.find#job:0", "d-0", 7.0],
        ),
    ]
    if url.startswith("postgres"):
        old_postgres(url, "jobs", JOBS_POSTGRES_V1, 1, rows)
    else:
        old_sqlite(Settings(store_url=url).jobs_path, JOBS_SQLITE_V1, 1, rows)


async def test_an_old_job_ledger_opens_in_place_and_keeps_every_job(
    backend: str, clock: Clock
) -> None:
    _old_jobs(backend)
    settings = Settings(store_url=backend)
    async with await open_stores(settings, create=True, clock=clock) as stores:
        jobs = stores.jobs
        running = await jobs.get("acme.find#job:1")
        done = await jobs.get("acme.find#job:0")
        assert running is not None and done is not None
        assert (running.state, running.job_id, running.members) == (
            "running",
            "J-1",
            ["r:1", "r:2"],
        )
        assert (done.state, done.status, done.finished_at) == ("done", {"ok": 1}, 7.0)
        # Each member's latest job, the indexes by job id and token, the waiters.
        found = await jobs.jobs_of(["r:1", "r:2"])
        assert {m: j.key for m, j in found.items()} == {
            "r:1": "acme.find#job:1",
            "r:2": "acme.find#job:1",
        }
        assert (await jobs.by_job_id("acme", "J-0")) == done
        assert (await jobs.by_token("tok-1")) == running
        assert await jobs.counts("wf-1") == [JobCounts("acme", 1, 0, 0, 10.0)]
        assert await jobs.record_delivery("acme.find#job:0", "d-0") is False
        # Still usable: the running job finishes, a done job stays done.
        finished = await jobs.record_status("acme.find#job:1", state="done", status={"n": 2})
        assert (finished.state, finished.finished_at) == ("done", clock.now)
        again = await jobs.record_status("acme.find#job:0", state="running", status={})
        assert again == done
        await jobs.add_waiter(["acme.find#job:0"], "wf-2")
        assert [c.provider for c in await jobs.counts("wf-2")] == ["acme"]
    async with await open_stores(settings, create=False) as client:  # a second open
        assert (await client.jobs.get("acme.find#job:1")) == finished
