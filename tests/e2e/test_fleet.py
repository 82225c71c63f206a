"""A fleet without shared files: two workers, one killed and restarted, a laptop and a third desk.

Two ``playline worker`` processes with homes of their own share only the Temporal
server and PostgreSQL (one schema for this test). A "laptop" directory holds the CSV
and starts the play with the ``playline`` command, which streams the file into the
store; one worker is SIGKILLed mid-run and started again; the play completes with
every row exactly once and nothing charged twice (from the provider's ledger), and a
``playline runs export`` from a third directory writes the result.
"""

from __future__ import annotations

import asyncio
import csv
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from playline import demo
from playline.calls.provenance import run_spend
from playline.config import Settings
from playline.contract import PlayRunResult
from playline.services import Services
from tests.conftest import REPO, core_charged, start_worker_process
from tests.e2e.test_crash_recovery import wait_for
from tests.pg import pg_schema

pytestmark = pytest.mark.postgres

ROWS = 3000


@pytest.fixture
async def pg_store() -> AsyncIterator[str]:
    async with pg_schema() as url:
        yield url


def fleet_catalog(path: Path) -> Path:
    """The demo catalog with limits that keep a 3,000-row play short (a few seconds)."""
    text = demo.CATALOG.read_text().replace(
        "pacing = { rps = 100, burst = 10, max_concurrency = 32 }",
        "pacing = { rps = 1000, burst = 50, max_concurrency = 64 }",
    )
    assert text.count("rps = 1000") == 5  # every provider, the waterfall's too
    path.write_text(text)
    return path


def leads(path: Path) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["lead_id", "first_name", "last_name", "company_domain"])
        for n in range(ROWS):
            writer.writerow([f"F{n:05d}", f"First{n}", f"Last{n}", f"fleet{n % 50}.example"])
    return path


async def playline(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "playline",
        *args,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    return subprocess.CompletedProcess(args, proc.returncode or 0, out.decode(), err.decode())


async def test_a_fleet_without_shared_files_survives_a_sigkill_and_exports_elsewhere(
    client, provider, temporal_address, task_queue, tmp_path, pg_store
) -> None:
    provider.configure(latency_ms=[5, 15])
    catalog = fleet_catalog(tmp_path / "catalog.toml")
    env = {"PLAYLINE_STORE_URL": pg_store, "PLAYLINE_CATALOG": str(catalog)}
    homes = [tmp_path / "machine-a", tmp_path / "machine-b"]
    logs = [tmp_path / "worker-a.log", tmp_path / "worker-b.log"]
    workers = [
        start_worker_process(temporal_address, task_queue, home, log, env)
        for home, log in zip(homes, logs, strict=True)
    ]
    laptop = tmp_path / "laptop"
    laptop.mkdir()
    leads(laptop / "leads.csv")
    run_id = f"fleet-{task_queue}"
    common = ("--address", temporal_address, "--task-queue", task_queue)
    laptop_env = {"PLAYLINE_STORE_URL": pg_store, "PLAYLINE_HOME": str(laptop / ".playline")}
    try:
        started = asyncio.ensure_future(
            playline(
                "run",
                "enrich_leads",
                "--csv",
                "leads.csv",
                "--id",
                run_id,
                *common,
                cwd=laptop,
                env=laptop_env,
            )
        )
        await wait_for(lambda: core_charged(provider.ledger()) >= 1500, 180, "half the calls")
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait(timeout=10)
        charged_at_kill = core_charged(provider.ledger())
        workers[0] = start_worker_process(temporal_address, task_queue, homes[0], logs[0], env)
        finished = await started
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.terminate()
        for worker in workers:
            try:
                worker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                worker.kill()
    assert finished.returncode == 0, (finished.stderr[-3000:], logs[1].read_text()[-2000:])
    assert f"uploaded {ROWS} rows of leads.csv" in finished.stderr
    assert f"rows: {ROWS} ok, 0 failed" in finished.stdout
    result = await client.get_workflow_handle(run_id, result_type=PlayRunResult).result()
    ledger = provider.ledger()
    assert charged_at_kill < core_charged(ledger), "the kill came after the play was done"
    assert ledger["double_charged"] == 0 and ledger["double_charged_items"] == 0
    # One email and one person lookup per lead, one company lookup per domain: once each.
    assert core_charged(ledger) == 2 * ROWS + 50
    # The chunks' counts never exceed the bill (a killed attempt's calls since its last
    # heartbeat are in no chunk's stats, and rows it wrote are not run again, so they
    # may fall short); the cells in the store say exactly what was billed.
    assert result.stats.calls_made <= ledger["charged"]
    services = await Services.open(Settings.from_env(home=tmp_path / "reader", store_url=pg_store))
    try:
        spend = await run_spend(services.sheet, result.datasets[0].run_ref)
    finally:
        await services.close()
    assert spend.credits == pytest.approx(float(ledger["credits"]), abs=1e-9)

    desk = tmp_path / "third-desk"
    desk.mkdir()
    desk_env = {"PLAYLINE_STORE_URL": pg_store, "PLAYLINE_HOME": str(desk / ".playline")}
    exported = await playline(
        "runs", "export", run_id, "--out", "result.csv", *common, cwd=desk, env=desk_env
    )
    assert exported.returncode == 0, exported.stderr
    with (desk / "result.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(r["lead_id"] for r in rows) == [f"F{n:05d}" for n in range(ROWS)]
    assert all(r["work_email"] and r["company_name"] and r["title"] for r in rows)
    for place in (*homes, laptop, desk):  # nobody kept a store file of their own
        assert not list(place.rglob("*.db")), place
    print(
        f"fleet: {ROWS} rows, {ledger['charged']} calls charged ({charged_at_kill} at the "
        f"kill), {ledger['double_charged']} twice, {ledger['duplicates']} idempotent replays"
    )
