"""Budgets end to end: a cap no worker count or SIGKILL takes past the provider's ledger.

Real Temporal, real workers (processes sharing only Temporal and PostgreSQL, one of them
SIGKILLed mid-run, or one in process on SQLite), real HTTP to the provider server,
whose ledger is the judge of what was charged. A run with ``max_credits`` reserves each
paid call's worst case in the store before sending it, so the ledger never passes the
cap; when it is reached the run waits (``runs budget --add`` lets it go on) or stops
(the rows left are recorded as skipped, cell by cell).
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import pytest

from playline.calls.provenance import run_spend
from playline.config import Settings
from playline.contract import PlayRunResult, PlayState, RunOptions
from playline.datasets import export_run
from playline.services import Services
from playline.stores.budget_ids import RunBudgetId
from tests.conftest import LEADS_CSV, new_id, start_worker_process
from tests.e2e.test_crash_recovery import wait_for
from tests.e2e.test_fleet import playline
from tests.pg import pg_schema
from tests.plays import run

#: the demo's leads (one row repeats a key: 240 rows, 239 admitted)
DEMO_ROWS = 240


@pytest.fixture
async def pg_store() -> AsyncIterator[str]:
    async with pg_schema() as url:
        yield url


def credits(ledger: dict[str, Any]) -> float:
    return float(ledger["credits"])


async def waiting_state(handle: Any, timeout_s: float = 120.0) -> PlayState:
    """The play's state once it waits for budget."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    state: PlayState | None = None
    while asyncio.get_running_loop().time() < deadline:
        state = await handle.query("state", result_type=PlayState)
        if state.budget_wait and state.status == "waiting":
            return state
        if state.status in ("completed", "failed", "cancelled"):
            break
        await asyncio.sleep(0.2)
    child = None
    if state is not None and state.current_child_id:
        child = await handle._client.get_workflow_handle(state.current_child_id).query("state")
    raise AssertionError(f"the play never waited for budget: {state}; its dataset run: {child}")


async def store_view(settings: Settings, run_ref: str, budget: str) -> tuple[Any, Any]:
    """The run's spend summed from its cells, and its budget as the store holds it."""
    services = await Services.open(settings)
    try:
        return await run_spend(services.sheet, run_ref), await services.budgets.state(budget)
    finally:
        await services.close()


@pytest.mark.postgres
async def test_a_cap_holds_across_two_workers_and_a_sigkill_waits_then_goes_on_when_raised(
    client, provider, temporal_address, task_queue, tmp_path, pg_store
) -> None:
    provider.configure(latency_ms=[40, 80])
    env = {"PLAYLINE_STORE_URL": pg_store}
    homes = [tmp_path / "machine-a", tmp_path / "machine-b"]
    logs = [tmp_path / "worker-a.log", tmp_path / "worker-b.log"]
    workers = [
        start_worker_process(temporal_address, task_queue, home, log, env)
        for home, log in zip(homes, logs, strict=True)
    ]
    play_id = new_id("budget")
    try:
        handle = await client.start_workflow(
            "enrich_leads",
            args=[{"csv_path": str(LEADS_CSV)}, RunOptions(max_credits=100)],
            id=play_id,
            task_queue=task_queue,
            result_type=PlayRunResult,
        )
        await wait_for(lambda: credits(provider.ledger()) >= 25, 120, "a quarter of the cap")
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait(timeout=10)
        workers[0] = start_worker_process(temporal_address, task_queue, homes[0], logs[0], env)

        state = await waiting_state(handle)
        assert state.budget_wait is not None
        said = re.fullmatch(
            rf"budget: ([\d.]+) of 100 credits spent(, [\d.]+ reserved by calls and rows in "
            rf"flight)?; `playline runs budget {play_id} --add N` to go on",
            state.budget_wait,
        )
        assert said, state.budget_wait
        ledger = provider.ledger()
        assert credits(ledger) <= 100 + 1e-9
        assert state.rows_done < DEMO_ROWS - 1
        # Waiting is durable and idle: nothing more is sent while it waits.
        await asyncio.sleep(2)
        assert provider.ledger()["received"] == ledger["received"]
        # `runs get` says the same, with the command to go on.
        common = ("--address", temporal_address)
        got = await playline("runs", "get", play_id, *common, cwd=tmp_path, env=env)
        assert f"playline runs budget {play_id} --add N" in got.stdout, got.stdout

        raised = await playline(
            "runs", "budget", play_id, "--add", "100000", *common, cwd=tmp_path, env=env
        )
        assert raised.returncode == 0, raised.stderr
        assert "budget 100100 credits" in raised.stdout
        result = await asyncio.wait_for(handle.result(), 240)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.terminate()
        for worker in workers:
            try:
                worker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                worker.kill()
    ledger = provider.ledger()
    dataset = result.datasets[0]
    # Every admitted row exactly once, nothing charged twice, nothing skipped.
    assert result.stats.rows_ok + result.stats.rows_failed == dataset.admitted
    assert result.stats.rows_skipped_budget == 0 and not result.budget_exhausted
    assert ledger["double_charged"] == 0 and ledger["double_charged_items"] == 0
    # What the cells say they cost is what the provider billed; the budget covers the
    # bill (what it settled and still reserves is never less). After a SIGKILL it may
    # hold more: a call in flight at the kill that another row sent again stays reserved
    # in the killed row's budget too (counted high, never low).
    spend, budget = await store_view(
        Settings.from_env(home=tmp_path / "reader", store_url=pg_store),
        dataset.run_ref,
        RunBudgetId(await _run_id(handle)).key,
    )
    assert spend.credits == pytest.approx(credits(ledger), abs=1e-9)
    assert budget is not None and budget.limit == pytest.approx(100100)
    assert credits(ledger) <= budget.spent + budget.reserved + 1e-9


async def _run_id(handle: Any) -> str:
    described = await handle.describe()
    return str(described.run_id)


async def test_stop_skips_the_rows_a_cap_cannot_cover_and_the_export_says_so(
    client, provider, worker, task_queue, home, tmp_path
) -> None:
    async with worker():
        result = await run(
            client,
            "enrich_leads",
            {"csv_path": str(LEADS_CSV)},
            task_queue=task_queue,
            options=RunOptions(max_credits=60, on_budget="stop"),
            timeout_s=120,
        )
    ledger = provider.ledger()
    assert credits(ledger) <= 60 + 1e-9
    stats, dataset = result.stats, result.datasets[0]
    assert result.budget_exhausted and stats.rows_skipped_budget > 0
    assert stats.rows_ok + stats.rows_failed + stats.rows_skipped_budget == dataset.admitted
    assert stats.rows_failed == 0
    out = tmp_path / "rows.jsonl"
    services = await Services.open(Settings.from_env(home=home))
    try:
        await export_run(services.sheet, dataset.run_ref, str(out), "jsonl", provenance=True)
        spend = await run_spend(services.sheet, dataset.run_ref)
    finally:
        await services.close()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    skipped = [r for r in rows if str(r.get("_error", "")).startswith("skipped_budget")]
    assert len(skipped) == stats.rows_skipped_budget
    # Cell by cell: a skipped row's cells that were not computed say skipped_budget.
    for row in skipped:
        misses = [cell.get("miss") for cell in row["_provenance"].values()]
        assert "skipped_budget" in misses, row["_provenance"]
    assert spend.credits == pytest.approx(credits(ledger), abs=1e-9)


async def test_a_provider_cap_stops_that_provider_only(
    client, provider, worker, task_queue, tmp_path
) -> None:
    async with worker():
        result = await run(
            client,
            "enrich_leads",
            {"csv_path": str(LEADS_CSV)},
            task_queue=task_queue,
            options=RunOptions(max_credits_by_provider={"mailfox": 10}, on_budget="stop"),
            timeout_s=120,
        )
    billed = provider.ledger()["credits_by_provider"]
    assert 0 < billed.get("mailfox", 0.0) <= 10 + 1e-9
    assert result.stats.rows_skipped_budget > 0
    # The other providers were asked for every row the cap did not stop.
    assert billed.get("acme", 0.0) > 10


async def test_the_budget_update_refuses_what_makes_no_sense_in_one_line(
    client, provider, worker, task_queue, temporal_address, tmp_path
) -> None:
    provider.configure(latency_ms=[200, 300])
    play_id = new_id("nobudget")
    async with worker():
        handle = await client.start_workflow(
            "enrich_leads",
            args=[{"csv_path": str(LEADS_CSV)}, RunOptions()],
            id=play_id,
            task_queue=task_queue,
            result_type=PlayRunResult,
        )
        common = ("--address", temporal_address)
        refused = await playline(
            "runs", "budget", play_id, "--add", "10", *common, cwd=tmp_path, env={}
        )
        assert refused.returncode != 0
        lines = [line for line in refused.stderr.splitlines() if line.strip()]
        assert lines[-1].endswith("runs without a budget (start it with --max-credits N)"), lines
        await handle.cancel()
        with pytest.raises(Exception):  # noqa: B017 - cancelled
            await handle.result()


async def test_runs_naming_a_team_budget_share_it_and_the_second_finds_it_spent(
    client, provider, worker, task_queue, home, tmp_path
) -> None:
    services = await Services.open(Settings.from_env(home=home))
    try:
        await services.budgets.define("growth-team", period="day", limit=40)
    finally:
        await services.close()
    options = RunOptions(budget="growth-team", on_budget="stop")
    async with worker():
        first = await run(
            client,
            "enrich_leads",
            {"csv_path": str(LEADS_CSV)},
            task_queue=task_queue,
            options=options,
            timeout_s=120,
        )
        billed_first = credits(provider.ledger())
        second = await run(
            client,
            "enrich_leads",
            {"csv_path": str(LEADS_CSV)},
            task_queue=task_queue,
            options=options,
            timeout_s=120,
        )
    billed = credits(provider.ledger())
    # Two runs, one day's budget between them: the provider billed at most 40 in all.
    assert 0 < billed_first <= billed <= 40 + 1e-9
    assert first.budget_exhausted and second.budget_exhausted
    services = await Services.open(Settings.from_env(home=home))
    try:
        state = await services.budgets.state("named:growth-team")
    finally:
        await services.close()
    assert state is not None and state.limit == 40
    assert state.spent <= billed + 1e-9 <= state.used + 1e-9
