"""Crash safety end to end: a worker killed with SIGKILL mid-run, and lease takeover.

Real Temporal dev server, real worker processes, real SQLite files, real HTTP.
"""

from __future__ import annotations

import asyncio
import csv
import signal
import time
from pathlib import Path

from playline.config import Settings
from playline.contract import PlayRunResult, RunOptions
from playline.datasets import export_run
from playline.services import Services
from tests.conftest import LEADS_CSV, core_charged, new_id, start_worker_process


def first_rows(n: int, path: Path) -> Path:
    with LEADS_CSV.open() as src:
        rows = list(csv.reader(src))
    with path.open("w", newline="") as out:
        csv.writer(out).writerows(rows[: n + 1])
    return path


async def wait_for(predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def test_sigkill_mid_run_loses_no_row_and_pays_nothing_twice(
    client, provider, temporal_address, task_queue, tmp_path
) -> None:
    """Kill the only worker while chunks are in flight; a new worker finishes the play."""
    provider.configure(latency_ms=[80, 120])
    csv_path = first_rows(60, tmp_path / "leads60.csv")
    home = tmp_path / "home"
    log = tmp_path / "worker.log"
    options = RunOptions(chunk_size=5, heartbeat_timeout_s=3, max_chunks_in_flight=4)

    first = start_worker_process(temporal_address, task_queue, home, log)
    handle = await client.start_workflow(
        "enrich_leads",
        args=[{"csv_path": str(csv_path)}, options],
        id=new_id("crash"),
        task_queue=task_queue,
        result_type=PlayRunResult,
    )
    try:
        # Kill it once it has paid for some calls but is far from done (60 rows ≈ 130 calls).
        await wait_for(lambda: core_charged(provider.ledger()) >= 25, 60, "the first paid calls")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        charged_at_kill = core_charged(provider.ledger())
        assert charged_at_kill < 120, "the play finished before the kill; slow the provider"

        second = start_worker_process(temporal_address, task_queue, home, log)
        try:
            result = await asyncio.wait_for(handle.result(), 120)
        finally:
            second.terminate()
            second.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()

    ledger = provider.ledger()
    assert result.stats.rows_ok == 60 and result.stats.rows_failed == 0
    # Every distinct input was paid for once: 60 emails, 60 person lookups and one
    # company lookup per distinct domain — nothing charged twice.
    domains = {row["company_domain"] for row in csv.DictReader(csv_path.open())}
    assert ledger["double_charged"] == 0
    assert core_charged(ledger) == 60 + 60 + len(domains)

    services = await Services.open(Settings.from_env(home=home))
    try:
        out = tmp_path / "out.csv"
        count = await export_run(services.sheet, result.datasets[0].run_ref, str(out))
    finally:
        await services.close()
    rows = list(csv.DictReader(out.open()))
    assert count == 60
    assert sorted(r["lead_id"] for r in rows) == sorted(
        r["lead_id"] for r in csv.DictReader(csv_path.open())
    )
    assert all(r["work_email"] and r["company_name"] and r["title"] for r in rows)
