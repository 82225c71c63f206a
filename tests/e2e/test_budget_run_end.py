"""A run's reservations are settled or released when it ends, however it ends (issue
28, G4): real Temporal, a real worker, the provider server's jobs and ledger."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from playline.config import Settings
from playline.contract import PlayRunResult, RunOptions
from playline.services import Services
from playline.stores.budgets import BudgetState
from tests.conftest import new_id
from tests.e2e.test_async_jobs import catalog, jobs_provider, leads  # noqa: F401 - fixture
from tests.plays import run


async def _named(home: Path, name: str, *, define: float | None = None) -> BudgetState:
    services = await Services.open(Settings.from_env(home=home))
    try:
        if define is not None:
            await services.budgets.define(name, period="month", limit=define)
        state = await services.budgets.state(f"named:{name}")
        assert state is not None
        return state
    finally:
        await services.close()


async def _held(home: Path, name: str, *, within_s: float) -> BudgetState:
    """The budget's state once some of it is reserved (rows in flight or parked)."""
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        state = await _named(home, name)
        if state.reserved > 0 or asyncio.get_running_loop().time() > deadline:
            return state
        await asyncio.sleep(0.1)


def billed(provider: Any) -> float:
    return float(provider.ledger()["credits_by_provider"].get("fullenrich", 0.0))


async def test_a_cancelled_run_leaves_nothing_reserved_on_its_named_budget(
    client,
    jobs_provider,  # noqa: F811 - the fixture imported above
    worker,
    task_queue,
    home,
    tmp_path,
) -> None:
    await _named(home, "g4-team", define=20)
    async with worker(catalog_path=str(catalog(tmp_path))):
        handle = await client.start_workflow(
            "t_async",
            args=[{"csv_path": str(leads(tmp_path, 60))}, RunOptions(budget="g4-team")],
            id=new_id("g4"),
            task_queue=task_queue,
            result_type=PlayRunResult,
        )
        # Cancel while rows wait on their jobs, holding reservations on the month.
        held = await _held(home, "g4-team", within_s=180)
        assert held.reserved > 0
        await handle.cancel()
        with pytest.raises(Exception):  # noqa: B017 - cancelled
            await handle.result()
    state = await _named(home, "g4-team")
    assert state.reserved == pytest.approx(0, abs=1e-9)
    # Never under the bill: calls whose job was not read count at their worst case.
    assert billed(jobs_provider) <= state.spent + 1e-9 <= 20 + 1e-9


async def test_a_completed_run_leaves_nothing_reserved_and_the_next_run_goes(
    client,
    jobs_provider,  # noqa: F811 - the fixture imported above
    worker,
    task_queue,
    home,
    tmp_path,
) -> None:
    await _named(home, "g4-done", define=50)
    options = RunOptions(budget="g4-done", on_budget="stop")
    async with worker(catalog_path=str(catalog(tmp_path))):
        first = await run(
            client,
            "t_async",
            {"csv_path": str(leads(tmp_path, 10))},
            task_queue=task_queue,
            options=options,
            timeout_s=180,
        )
        state = await _named(home, "g4-done")
        assert state.reserved == pytest.approx(0, abs=1e-9)
        assert state.spent == pytest.approx(billed(jobs_provider))
        second = await run(
            client,
            "t_async",
            {"csv_path": str(leads(tmp_path, 12))},
            task_queue=task_queue,
            options=options,
            timeout_s=180,
        )
    assert not first.budget_exhausted and not second.budget_exhausted
    state = await _named(home, "g4-done")
    assert state.reserved == pytest.approx(0, abs=1e-9)
    assert state.spent == pytest.approx(billed(jobs_provider))
