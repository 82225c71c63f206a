"""The persistence circuit breaker, end to end, with a real SQLite failure.

A trigger makes every receipt completion fail (as a full disk would). The first
provider answer cannot be recorded, so the chunk stops dispatching: no further
call is paid for that could not be recorded. Once the store heals, Temporal's
retry finishes the play, and the call whose answer was lost is re-sent with the
same Idempotency-Key, so the provider does not charge it again.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time

from playline.contract import PlayRunResult, RunOptions
from playline.stores.receipts_sqlite import SqliteReceiptStore
from tests.conftest import new_id
from tests.plays import lead, write_csv

BREAK = (
    "CREATE TRIGGER injected_failure BEFORE UPDATE OF status ON receipts "
    "WHEN NEW.status = 'completed' BEGIN SELECT RAISE(ABORT, 'disk I/O error (injected)'); END"
)


async def test_failed_receipt_write_stops_dispatch_and_recovers_without_double_pay(
    client, provider, worker, task_queue, home, tmp_path
) -> None:
    rows = [lead(i, domain=f"breaker{i}.example") for i in range(8)]
    csv_path = write_csv(tmp_path / "leads.csv", rows)
    options = RunOptions(chunk_size=8, row_concurrency=1, heartbeat_timeout_s=2)
    await SqliteReceiptStore(home / "receipts.db").close()  # the worker's store, schema made
    db = sqlite3.connect(home / "receipts.db")
    db.execute(BREAK)
    db.commit()
    async with worker():
        handle = await client.start_workflow(
            "t_tool_column",
            args=[{"csv_path": str(csv_path), "column_tool": "company"}, options],
            id=new_id("breaker"),
            task_queue=task_queue,
            result_type=PlayRunResult,
        )
        deadline = time.monotonic() + 20
        while provider.ledger()["received"] == 0:
            assert time.monotonic() < deadline, "no provider call was made"
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.5)  # the broken chunk (and its first retry) had time to dispatch
        assert provider.ledger()["received"] <= 2, "calls kept going out while writes failed"
        dataset_run = client.get_workflow_handle(f"{handle.id}/dataset/t_rows")
        description = await dataset_run.describe()
        assert description.raw_description.pending_activities
        failure = description.raw_description.pending_activities[0].last_failure
        assert "injected" in failure.message
        # One row ran and could not be recorded; the other seven were held back unstarted.
        assert "0 provider call(s) and 7 row(s) not yet started were held back" in (
            failure.message
        ), failure.message
        db.execute("DROP TRIGGER injected_failure")
        db.commit()
        db.close()
        result = await asyncio.wait_for(handle.result(), 60)
    ledger = provider.ledger()
    assert result.stats.rows_ok == 8
    assert ledger["charged"] == 8  # one paid call per distinct domain, none twice
    assert ledger["double_charged"] == 0
    assert ledger["duplicates"] >= 1  # the lost answer came back by its Idempotency-Key
