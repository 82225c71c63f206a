"""Bulk endpoints end to end: a batched column on a real Temporal worker pays each item once."""

from __future__ import annotations

import pytest

from playline.contract import PlayRunResult, RunOptions
from tests.conftest import bulk_catalog, new_id
from tests.plays import lead, write_csv


async def test_batched_column_uses_the_bulk_endpoint_and_pays_each_item_once(
    client, provider, worker, task_queue, tmp_path
) -> None:
    catalog = bulk_catalog(tmp_path)
    rows = [lead(i, domain=f"bulk{i}.example") for i in range(12)]
    csv_path = write_csv(tmp_path / "leads.csv", rows)
    options = RunOptions(chunk_size=12, row_concurrency=12)
    play_input = {"csv_path": str(csv_path), "column_tool": "company"}
    async with worker(catalog_path=str(catalog)):
        first = await client.execute_workflow(
            "t_tool_column",
            args=[play_input, options],
            id=new_id("bulk"),
            task_queue=task_queue,
            result_type=PlayRunResult,
        )
        after_first = provider.ledger()
        second = await client.execute_workflow(
            "t_tool_column",
            args=[play_input, options],
            id=new_id("bulk"),
            task_queue=task_queue,
            result_type=PlayRunResult,
        )
    assert first.stats.rows_ok == 12
    bulk_calls = after_first["charged_by_path"].get("/firmo/v1/company/lookup/bulk", 0)
    assert bulk_calls == 3  # 12 members in requests of at most 5
    assert "/firmo/v1/company/lookup" not in after_first["charged_by_path"]
    assert after_first["items_charged"] == 12
    assert after_first["double_charged_items"] == 0
    assert first.stats.calls_made == 3
    assert first.stats.credits == pytest.approx(12 * 0.5)
    # A rerun is answered from the member receipts.
    assert second.stats.calls_made == 0 and second.stats.rows_ok == 12
    assert provider.ledger()["charged"] == after_first["charged"]
