"""Leases between tool runners: waiting on a live owner, taking over an expired one,
and noticing a lost lease. Real SQLite receipts, real HTTP to the provider server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from playline import demo
from playline.calls.catalog import Catalog
from playline.calls.runner import ToolRunner
from playline.errors import LeaseLost
from playline.stores.receipts import ClaimRequest, receipt_key
from playline.stores.receipts_ledger import ReceiptLedger
from tests.conftest import live_runner, provider_client

INPUT = {"domain": "lease-test.example"}


@pytest.fixture
async def parts(tmp_path: Path, provider):  # type: ignore[no-untyped-def]
    catalog = Catalog.from_toml(demo.CATALOG)
    async with httpx.AsyncClient() as http:
        yield catalog, ReceiptLedger.in_file(tmp_path / "r.db"), provider_client(catalog, http)


def runner(parts, owner: str, lease_id: str, ttl: float) -> ToolRunner:  # type: ignore[no-untyped-def]
    catalog, store, client = parts
    return live_runner(catalog, store, client, owner=owner, lease_id=lease_id, lease_ttl_s=ttl)


def key_of(parts) -> str:  # type: ignore[no-untyped-def]
    catalog, _, client = parts
    tool = catalog.tool("company_lookup")
    return receipt_key(tool.id, tool.version, tool.validate_input(INPUT), client.auth_scope(tool))


async def test_expired_lease_of_a_dead_owner_is_reclaimed(parts, provider) -> None:  # type: ignore[no-untyped-def]
    _, store, _ = parts
    # A crashed attempt claimed the receipt and never renewed it.
    await store.claim(
        [ClaimRequest(key_of(parts), "company_lookup")], owner="dead", lease_id="L0", ttl_s=0.6
    )
    live = runner(parts, "live", "L1", ttl=5)
    result = await asyncio.wait_for(live.call("company_lookup", INPUT), 10)
    assert result.get("name")
    assert provider.ledger()["charged"] == 1
    assert (await store.get([key_of(parts)]))[key_of(parts)].status == "completed"


async def test_live_owner_is_waited_for_not_duplicated(parts, provider) -> None:  # type: ignore[no-untyped-def]
    provider.configure(latency_ms=[400, 450])
    one = runner(parts, "one", "L1", ttl=5)
    two = runner(parts, "two", "L2", ttl=5)
    first = asyncio.ensure_future(one.call("company_lookup", INPUT))
    await asyncio.sleep(0.1)  # one holds the lease and is waiting on the provider
    second = await asyncio.wait_for(two.call("company_lookup", INPUT), 10)
    assert (await first).data == second.data
    assert two.stats.waited == 1 and two.stats.made == 0
    assert provider.ledger()["charged"] == 1


async def test_renewal_detects_a_takeover_stops_new_dispatch_and_lets_the_call_in_flight_finish(
    parts, provider
) -> None:  # type: ignore[no-untyped-def]
    provider.configure(latency_ms=[1500, 1600])
    _, store, _ = parts
    slow = runner(parts, "slow", "L1", ttl=0.5)
    call = asyncio.ensure_future(slow.call("company_lookup", INPUT))
    await asyncio.sleep(0.7)  # lease expired while the provider was slow...
    [taken] = await store.claim(
        [ClaimRequest(key_of(parts), "company_lookup")], owner="thief", lease_id="L9", ttl_s=30
    )
    assert taken.status.value == "claimed"  # ...and another attempt took it over
    with slow.attempt.leases.holding(["another-pending-call"]):  # a queued call of the chunk
        await slow.renew_leases()
    assert isinstance(slow.lease_lost, LeaseLost)
    # The call in flight is not cancelled: its (paid) answer still serves its row...
    assert (await call).get("name")
    # ...but it does not overwrite the receipt the new owner holds (fenced completion).
    receipt = (await store.get([key_of(parts)]))[key_of(parts)]
    assert (receipt.status, receipt.lease_id) == ("running", "L9")
    with pytest.raises(LeaseLost):
        await slow.call("company_lookup", {"domain": "other.example"})  # nothing new dispatched
    assert provider.ledger()["received"] == 1
