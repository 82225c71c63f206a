"""The receipt store's contract on a real SQLite file: claims, leases, fencing, batches."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from playline.stores.receipts import ClaimRequest, ClaimStatus
from playline.stores.receipts_sqlite import SqliteReceiptStore


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def store(tmp_path: Path, clock: Clock) -> SqliteReceiptStore:
    return SqliteReceiptStore(tmp_path / "receipts.db", clock=clock)


async def test_claim_complete_then_hit(store: SqliteReceiptStore) -> None:
    req = ClaimRequest(key="k1", tool_id="t")
    [first] = await store.claim([req], owner="a", lease_id="L1", ttl_s=10)
    assert first.status is ClaimStatus.CLAIMED
    assert await store.complete("k1", lease_id="L1", result={"v": 1}, credits=2.0)
    [again] = await store.claim([req], owner="b", lease_id="L2", ttl_s=10)
    assert again.status is ClaimStatus.HIT
    assert again.result == {"v": 1}
    receipt = (await store.get(["k1"]))["k1"]
    assert receipt.status == "completed" and receipt.credits == 2.0 and receipt.lease_id is None


async def test_live_lease_is_held_and_expired_lease_is_reclaimed(
    store: SqliteReceiptStore, clock: Clock
) -> None:
    req = ClaimRequest(key="k", tool_id="t")
    await store.claim([req], owner="a", lease_id="L1", ttl_s=5)
    [held] = await store.claim([req], owner="b", lease_id="L2", ttl_s=5)
    assert held.status is ClaimStatus.HELD and held.owner == "a"
    clock.now += 6  # owner a stopped renewing (crashed)
    [taken] = await store.claim([req], owner="b", lease_id="L2", ttl_s=5)
    assert taken.status is ClaimStatus.CLAIMED
    # The old owner's late completion is fenced off; the new owner's lands.
    assert not await store.complete("k", lease_id="L1", result={"late": True}, credits=1)
    assert await store.complete("k", lease_id="L2", result={"v": 2}, credits=1)
    assert (await store.get(["k"]))["k"].result == {"v": 2}


async def test_renew_extends_only_the_holders_lease(
    store: SqliteReceiptStore, clock: Clock
) -> None:
    reqs = [ClaimRequest(key=k, tool_id="t") for k in ("a", "b")]
    await store.claim(reqs, owner="o", lease_id="L1", ttl_s=5)
    clock.now += 4
    assert await store.renew(["a", "b"], lease_id="L1", ttl_s=5) == [True, True]
    clock.now += 4  # 8s after the claim, 4s after the renewal: still held
    [held] = await store.claim([reqs[0]], owner="x", lease_id="L9", ttl_s=5)
    assert held.status is ClaimStatus.HELD
    assert await store.renew(["a"], lease_id="WRONG", ttl_s=5) == [False]


async def test_stale_and_force_bypass_the_cache(store: SqliteReceiptStore, clock: Clock) -> None:
    await store.claim([ClaimRequest(key="k", tool_id="t")], owner="a", lease_id="L1", ttl_s=5)
    await store.complete("k", lease_id="L1", result=1, credits=1)
    clock.now += 100
    [fresh] = await store.claim(
        [ClaimRequest(key="k", tool_id="t", stale_after_s=1000)], owner="b", lease_id="L2", ttl_s=5
    )
    assert fresh.status is ClaimStatus.HIT
    [stale] = await store.claim(
        [ClaimRequest(key="k", tool_id="t", stale_after_s=10)], owner="b", lease_id="L2", ttl_s=5
    )
    assert stale.status is ClaimStatus.CLAIMED
    await store.complete("k", lease_id="L2", result=2, credits=1)
    [forced] = await store.claim(
        [ClaimRequest(key="k", tool_id="t", force=True)], owner="c", lease_id="L3", ttl_s=5
    )
    assert forced.status is ClaimStatus.CLAIMED


async def test_failed_receipt_keeps_its_error_and_is_retried(store: SqliteReceiptStore) -> None:
    req = ClaimRequest(key="k", tool_id="t")
    await store.claim([req], owner="a", lease_id="L1", ttl_s=5)
    assert await store.fail("k", lease_id="L1", error="ProviderRejected: 404")
    receipt = (await store.get(["k"]))["k"]
    assert receipt.status == "failed" and receipt.error == "ProviderRejected: 404"
    [retry] = await store.claim([req], owner="b", lease_id="L2", ttl_s=5)
    assert retry.status is ClaimStatus.CLAIMED
    assert (await store.get(["k"]))["k"].attempts == 2


async def test_concurrent_claims_from_two_stores_have_one_winner(tmp_path: Path) -> None:
    """Two processes' worth of connections on one file: exactly one claims each key."""
    path = tmp_path / "shared.db"
    one, two = SqliteReceiptStore(path), SqliteReceiptStore(path)
    reqs = [ClaimRequest(key=f"k{i}", tool_id="t") for i in range(200)]
    a, b = await asyncio.gather(
        one.claim(reqs, owner="a", lease_id="LA", ttl_s=30),
        two.claim(reqs, owner="b", lease_id="LB", ttl_s=30),
    )
    for x, y in zip(a, b, strict=True):
        assert {x.status, y.status} == {ClaimStatus.CLAIMED, ClaimStatus.HELD}
