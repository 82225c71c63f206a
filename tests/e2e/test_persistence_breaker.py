"""The persistence circuit breaker, end to end, with a real SQLite failure.

A trigger makes every receipt completion fail (as a full disk would). The first
provider answer cannot be recorded: the attempt keeps it in memory and retries the
write (``Attempt.settle_patience_s``), dispatching nothing else meanwhile. Once the
store heals, the answer is written, the attempt gives up the chunk (the rows it held
back stay pending) and Temporal's retry finishes the play. The paid call is never
sent again: the provider receives exactly one request per row.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time

import pytest

from playline.contract import PlayRunResult, RunOptions
from playline.stores.receipts_ledger import ReceiptLedger
from tests.conftest import new_id
from tests.plays import lead, write_csv

BREAK = (
    "CREATE TRIGGER injected_failure BEFORE UPDATE OF status ON playline_receipts "
    "WHEN NEW.status = 'completed' BEGIN SELECT RAISE(ABORT, 'disk I/O error (injected)'); END"
)

#: how many failed writes of the paid answer to wait for before healing the store
RETRIES_SEEN = 3


def _retries(caplog: pytest.LogCaptureFixture) -> int:
    return sum(
        1
        for r in caplog.records
        if r.name == "playline.calls" and "failed, retrying" in r.getMessage()
    )


async def test_failed_receipt_write_stops_dispatch_and_recovers_without_double_pay(
    client, provider, worker, task_queue, home, tmp_path, caplog
) -> None:
    caplog.set_level(logging.WARNING, logger="playline.calls")
    caplog.set_level(logging.WARNING, logger="temporalio.activity")  # failed attempts
    rows = [lead(i, domain=f"breaker{i}.example") for i in range(8)]
    csv_path = write_csv(tmp_path / "leads.csv", rows)
    options = RunOptions(chunk_size=8, row_concurrency=1, heartbeat_timeout_s=2)
    store = await ReceiptLedger.in_file(home / "receipts.db").ensure_open()
    await store.close()  # the worker's store, schema made
    db = sqlite3.connect(home / "receipts.db")
    db.execute(BREAK)
    db.commit()
    try:
        async with worker():
            handle = await client.start_workflow(
                "t_tool_column",
                args=[{"csv_path": str(csv_path), "column_tool": "company"}, options],
                id=new_id("breaker"),
                task_queue=task_queue,
                result_type=PlayRunResult,
            )
            deadline = time.monotonic() + 60
            while _retries(caplog) < RETRIES_SEEN:
                assert time.monotonic() < deadline, "the paid answer's write was not retried"
                await asyncio.sleep(0.05)
            # While the store fails, the one paid answer is held and retried, nothing else
            # goes out, and the attempt is still alive (kept by its heartbeats).
            assert provider.ledger()["received"] == 1, "calls went out while writes failed"
            (status,) = db.execute("SELECT status FROM playline_receipts").fetchone()
            assert status == "running"  # neither dropped nor failed: still being written
            assert not list((home / "journal").glob("*.jsonl"))  # within the patience
            dataset_run = client.get_workflow_handle(f"{handle.id}/dataset/t_rows")
            description = await dataset_run.describe()
            (pending,) = description.raw_description.pending_activities
            assert pending.attempt == 1 and not pending.last_failure.message
            db.execute("DROP TRIGGER injected_failure")
            db.commit()
            result = await asyncio.wait_for(handle.result(), 60)
        assert db.execute(
            "SELECT count(*) FROM playline_receipts WHERE status = 'completed'"
        ).fetchone() == (8,)
    finally:
        db.close()
    # The attempt that held the answer wrote it, then gave the chunk up: the next row
    # was refused at dispatch and the six after it never started.
    failures = [
        str(r.exc_info[1])
        for r in caplog.records
        if r.name == "temporalio.activity" and r.exc_info and r.exc_info[1] is not None
    ]
    assert len(failures) == 1, failures
    assert "injected" in failures[0]
    assert "1 provider call(s) and 6 row(s) not yet started were held back" in failures[0]
    ledger = provider.ledger()
    assert result.stats.rows_ok == 8
    # The failed attempt's paid call is reported once (its stats rode its last heartbeat
    # to the retry), so the run's accounting matches the provider's bill.
    assert result.stats.calls_made == 8 and result.stats.credits == 8 * 0.5
    assert ledger["charged"] == 8  # one paid call per distinct domain, none twice
    assert ledger["double_charged"] == 0
    # The held answer was recorded, not lost: nothing was re-sent, not even by its key.
    assert ledger["received"] == 8 and ledger["duplicates"] == 0
    assert not list((home / "journal").glob("*.jsonl"))
