"""Heartbeats and lease renewals on tasks of their own, over a real SQLite store (F13).

Before, one loop heartbeated, renewed and flushed the sheet in turn: a slow flush held
renewals back, and a renewal that failed never stopped dispatch, so a second attempt
could claim the calls and send them beside the first. Now renewals keep their pace
whatever else the attempt is doing, and an attempt whose renewals fail sends nothing
under a lease that may lapse before the call could time out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from playline.calls.attempt import Attempt
from playline.calls.upkeep import AttemptUpkeep
from playline.errors import LeaseLost
from playline.stores.receipts import ClaimRequest, ClaimStatus
from playline.stores.receipts_ledger import ReceiptLedger
from tests.integration.test_call_edges import until

TTL_S = 0.9  # renewals every 0.3 s
KEY = "k-upkeep"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ReceiptLedger]:
    receipts = ReceiptLedger.in_file(tmp_path / "receipts.db")
    try:
        yield receipts
    finally:
        await receipts.close()


async def claimed(store: ReceiptLedger) -> Attempt:
    attempt = Attempt(receipts=store, owner="w1", lease_id="L1", lease_ttl_s=TTL_S)
    [outcome] = await store.claim([ClaimRequest(KEY, "t")], owner="w1", lease_id="L1", ttl_s=TTL_S)
    assert outcome.status is ClaimStatus.CLAIMED
    return attempt


async def test_renewals_and_beats_keep_going_while_a_flush_is_stuck(
    store: ReceiptLedger,
) -> None:
    attempt = await claimed(store)
    beats: list[int] = []
    flush_released = asyncio.Event()

    async def stuck_flush() -> None:  # a sheet write that takes far longer than the TTL
        await flush_released.wait()

    with attempt.leases.holding([KEY], valid_until=time.monotonic() + TTL_S):
        async with AttemptUpkeep(attempt, beat=lambda *_: beats.append(1)):
            flushing = asyncio.create_task(stuck_flush())
            started = time.monotonic()
            # Three TTLs pass while the flush is stuck: the lease is still ours and valid.
            await until(lambda: time.monotonic() - started > 3 * TTL_S, "three TTLs passed")
            assert attempt.leases.time_left(KEY, time.monotonic()) > 0
            attempt.check_before_dispatch([KEY], timeout_s=0.1)  # still allowed to send
            assert len(beats) >= 2
            flush_released.set()
            await flushing
    # Another owner cannot take the receipt over: the store's lease was kept renewed.
    [other] = await store.claim([ClaimRequest(KEY, "t")], owner="w2", lease_id="L2", ttl_s=TTL_S)
    assert other.status is ClaimStatus.HELD


async def test_failing_renewals_stop_dispatch_before_the_lease_can_lapse(
    store: ReceiptLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempt = await claimed(store)

    async def broken_renew(*args: object, **kwargs: object) -> list[bool]:
        raise OSError("database is locked")

    with attempt.leases.holding([KEY], valid_until=time.monotonic() + TTL_S):
        async with AttemptUpkeep(attempt, beat=lambda *_: None):
            monkeypatch.setattr(store, "renew", broken_renew)
            # The renewals fail (logged, retried); the lease runs down, and the attempt
            # refuses to send a call that could outlive it.
            await until(
                lambda: attempt.leases.time_left(KEY, time.monotonic()) < TTL_S / 3,
                "the lease ran down",
            )
            with pytest.raises(LeaseLost, match="renewals are failing"):
                attempt.check_before_dispatch([KEY], timeout_s=TTL_S)
