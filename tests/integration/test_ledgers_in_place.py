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
from playline.stores.budget_ids import SpendBudgetId
from playline.stores.budgets import BudgetLine, BudgetState, NamedBudget, RunEnd
from playline.stores.jobs import JobCounts
from tests.integration.conftest import Clock
from tests.old_schemas import (
    BUDGETS_POSTGRES_V1,
    BUDGETS_POSTGRES_V2,
    BUDGETS_SQLITE_V1,
    BUDGETS_SQLITE_V2,
    JOBS_POSTGRES_V1,
    JOBS_SQLITE_V1,
    old_postgres,
    old_sqlite,
)
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


def _old_budgets(url: str) -> None:
    """A run's budget with an open and a settled reservation, and a named budget's
    day, in the old tables (schema version 2: reservations know their run)."""
    budgets = _tables(url, "budgets", "playline_budgets")
    reservations = _tables(url, "budget_reservations", "playline_budget_reservations")
    named = _tables(url, "named_budgets", "playline_named_budgets")
    rows = [
        (
            f"INSERT INTO {budgets} (id, credit_limit, spent, reserved, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, 0, 0)",
            ["run:r1", 10.0, 2.0, 3.0],
        ),
        (
            f"INSERT INTO {budgets} (id, credit_limit, spent, reserved, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, 0, 0)",
            ["named:team@1970-01-01", 50.0, 5.0, 0.0],
        ),
        (
            f"INSERT INTO {named} (name, period, credit_limit, created_at, updated_at)"
            " VALUES ('team', 'day', 50, 0, 0)",
            [],
        ),
        (
            f"INSERT INTO {reservations} (key, budget, drawn_on, credits, status, created_at,"
            " run) VALUES ('K#0', 'run:r1', 'run:r1', 3, 'open', 0, 'r1')",
            [],
        ),
        (
            f"INSERT INTO {reservations} (key, budget, drawn_on, credits, status, charged,"
            " created_at, settled_at, run)"
            " VALUES ('J#0', 'run:r1', 'run:r1', 4, 'settled', 2, 0, 1, 'r1')",
            [],
        ),
    ]
    if url.startswith("postgres"):
        old_postgres(url, "budgets", (*BUDGETS_POSTGRES_V1, *BUDGETS_POSTGRES_V2), 2, rows)
    else:
        path = Settings(store_url=url).budgets_path
        old_sqlite(path, (*BUDGETS_SQLITE_V1, *BUDGETS_SQLITE_V2), 2, rows)


async def test_an_old_budget_ledger_opens_in_place_and_keeps_every_reservation(
    backend: str, clock: Clock
) -> None:
    _old_budgets(backend)
    settings = Settings(store_url=backend)
    async with await open_stores(settings, create=True, clock=clock) as stores:
        budgets = stores.budgets
        assert await budgets.state("run:r1") == BudgetState("run:r1", 10, 2, 3)
        assert await budgets.definitions() == [NamedBudget("team", "day", 50)]
        assert await budgets.state("named:team") == BudgetState("named:team@1970-01-01", 50, 5, 0)
        assert [(r.key, r.credits) for r in await budgets.open_reservations("r1")] == [("K#0", 3)]
        # Drawn once per key: the settled J#0 and open K#0 are not drawn again.
        assert await budgets.reserve("J#0", 4, [BudgetLine("run:r1")], run="r1") is None
        assert await budgets.reserve("K#0", 3, [BudgetLine("run:r1")], run="r1") is None
        assert await budgets.state("run:r1") == BudgetState("run:r1", 10, 2, 3)
        # Still usable: a new reservation up to the limit, then the run ends.
        assert await budgets.reserve("L#0", 5, [BudgetLine("run:r1")], run="r1") is None
        refusal = await budgets.reserve("M#0", 0.5, [BudgetLine("run:r1")], run="r1")
        assert refusal is not None and refusal.state == BudgetState("run:r1", 10, 2, 8)
        end = await budgets.end_run("r1", {"K#0": 1.0})
        assert end == RunEnd("r1", settled=1, settled_credits=1.0, released=1, released_credits=5)
        assert await budgets.state("run:r1") == BudgetState("run:r1", 10, 3, 0)
    async with await open_stores(settings, create=False, clock=clock) as client:
        assert await client.budgets.state("run:r1") == BudgetState("run:r1", 10, 3, 0)


async def test_an_old_budget_ledgers_reservations_count_one_per_credit_beside_a_money_cap(
    backend: str, clock: Clock
) -> None:
    """Migrated in place, a reservation written before money caps existed has scale 1
    (it settles in credits as before), and a money cap works beside it."""
    _old_budgets(backend)
    settings = Settings(store_url=backend)
    spend = SpendBudgetId("r1")
    async with await open_stores(settings, create=True, clock=clock) as stores:
        budgets = stores.budgets
        money = [BudgetLine("run:r1"), BudgetLine(spend, limit=0.05, scale=0.012)]
        assert await budgets.reserve("L#0", 4, money, run="r1") is None
        assert await budgets.reserve("M#0", 1, money, run="r1") is not None  # 0.06 > 0.05
        end = await budgets.end_run("r1", {"K#0": 2.0, "L#0": 3.0})
        assert end == RunEnd("r1", settled=2, settled_credits=5.0)
        assert await budgets.state("run:r1") == BudgetState("run:r1", 10, 7, 0)
        state = await budgets.state(spend)
        assert state is not None and state.reserved == 0
        assert state.spent == pytest.approx(3 * 0.012)
