"""Bulk endpoints: batched calls, durable membership, a crashed batch resumed unpaid.

Real SQLite receipts, real HTTP to the provider server's bulk endpoint, and (for the
end-to-end case) a real Temporal worker.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from playline.activities.batching import aggregate_key, batch_idempotency_key
from playline.activities.catalog import DEFAULT_CATALOG_PATH, Catalog
from playline.activities.governor import Governor
from playline.activities.provider_http import ProviderClient
from playline.activities.receipts import ClaimRequest, SqliteReceiptStore, receipt_key
from playline.activities.tools import ToolRunner
from playline.workflows.models import PlayRunResult, RunOptions
from tests.conftest import new_id
from tests.plays import lead, write_csv

BULK = 'batch = { path = "/firmo/v1/company/lookup/bulk", max_items = 5, linger_ms = 50 }\n'


def batch_catalog(tmp_path: Path) -> Path:
    text = DEFAULT_CATALOG_PATH.read_text().replace(
        'getters = { name = "name", industry = "industry", employees = "employees" }\n',
        'getters = { name = "name", industry = "industry", employees = "employees" }\n' + BULK,
    )
    assert BULK in text
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    return path


async def test_batched_column_uses_the_bulk_endpoint_and_pays_each_item_once(
    client, provider, worker, task_queue, tmp_path
) -> None:
    catalog = batch_catalog(tmp_path)
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


async def test_a_batch_sent_by_a_crashed_attempt_is_resent_not_repaid(provider, tmp_path) -> None:
    catalog = Catalog.from_toml(batch_catalog(tmp_path))
    store = SqliteReceiptStore(tmp_path / "receipts.db")
    tool = catalog.tool("company_lookup")
    assert tool.batch is not None
    async with httpx.AsyncClient() as http:
        client = ProviderClient(catalog, http)
        scope = client.auth_scope(tool)
        inputs = [{"domain": f"crash{i}.example"} for i in range(3)]
        keys = [receipt_key(tool.id, tool.version, i, scope) for i in inputs]
        by_key = dict(zip(keys, inputs, strict=True))
        members = sorted(keys)
        agg = aggregate_key(tool.id, members)
        request = {"items": [by_key[k] for k in members]}

        # The crashed attempt: claimed, recorded the batch, sent it, died unrecorded.
        await store.claim(
            [ClaimRequest(k, tool.id) for k in keys], owner="dead", lease_id="L0", ttl_s=0.5
        )
        assert await store.open_batch(
            agg,
            tool_id=tool.id,
            member_keys=members,
            request=request,
            owner="dead",
            lease_id="L0",
            ttl_s=0.5,
        )
        await client.send(
            tool, request, idempotency_key=batch_idempotency_key(agg), path=tool.batch.path
        )
        assert provider.ledger()["charged"] == 1
        await asyncio.sleep(0.6)  # its leases expire

        runner = ToolRunner(
            catalog=catalog,
            receipts=store,
            governor=Governor.from_catalog(catalog),
            provider=client,
            owner="retry",
            lease_id="L1",
            lease_ttl_s=5,
        )
        first = await asyncio.wait_for(runner.call(tool.id, inputs[1]), 10)
        others = [await runner.call(tool.id, i) for i in (inputs[0], inputs[2])]

    ledger = provider.ledger()
    assert first.get("domain") == "crash1.example"
    assert [o.get("domain") for o in others] == ["crash0.example", "crash2.example"]
    assert ledger["charged"] == 1  # the resend was answered by its Idempotency-Key
    assert ledger["duplicates"] == 1
    assert ledger["double_charged_items"] == 0
    assert runner.stats.cached == 2  # the other members were completed with the batch
    receipts = await store.get([agg, *keys])
    assert {r.status for r in receipts.values()} == {"completed"}
