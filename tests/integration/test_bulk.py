"""Bulk endpoints below Temporal: a batch sent by a crashed attempt is resent, not repaid.

Real SQLite receipts and real HTTP to the provider server's bulk endpoint.
"""

from __future__ import annotations

import asyncio

import httpx

from playline.calls.bulk import aggregate_key, batch_idempotency_key
from playline.calls.catalog import Catalog
from playline.stores.receipts import ClaimRequest, receipt_key
from playline.stores.receipts_ledger import ReceiptLedger
from tests.conftest import bulk_catalog, live_runner, provider_client


async def test_a_batch_sent_by_a_crashed_attempt_is_resent_not_repaid(provider, tmp_path) -> None:
    catalog = Catalog.from_toml(bulk_catalog(tmp_path))
    store = ReceiptLedger.in_file(tmp_path / "receipts.db")
    tool = catalog.tool("company_lookup")
    assert tool.batch is not None
    async with httpx.AsyncClient() as http:
        client = provider_client(catalog, http)
        scope = client.auth_scope(tool)
        inputs = [{"domain": f"crash{i}.example"} for i in range(3)]
        keys = [receipt_key(tool.id, tool.version, i, scope) for i in inputs]
        by_key = dict(zip(keys, inputs, strict=True))
        members = sorted(keys)
        agg = aggregate_key(tool.id, [(k, 0) for k in members])
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

        runner = live_runner(catalog, store, client, owner="retry", lease_id="L1", lease_ttl_s=5)
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
