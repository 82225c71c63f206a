"""The runner's rules with an in-memory receipt store and a recording dispatcher.

No database and no HTTP: what the runner decides (share, hit, wait, dispatch) is
checked against the ``Dispatcher`` protocol alone, which is the point of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from playline.calls.attempt import Attempt, LeaseKeeper, until_released
from playline.calls.catalog import Catalog, ToolSpec
from playline.calls.dispatch import ClaimedCall, Settled
from playline.calls.outcome import Answered
from playline.calls.runner import ToolRunner
from playline.calls.settle import SingleReceipt, settle
from playline.errors import LeaseLost, PersistenceCircuitOpen
from playline.stores.receipts import (
    BatchClaim,
    ClaimOutcome,
    ClaimRequest,
    ClaimStatus,
    Receipt,
    StoredState,
    decide_claim,
)

CATALOG = Catalog.model_validate(
    {
        "providers": {"acme": {"base_url": "http://unused"}},
        "tools": {"find": {"provider": "acme", "path": "/f", "input": {"q": "str"}}},
    }
)


class MemoryReceipts:
    """The parts of a ``ReceiptStore`` the runner uses, in a dict; counts claim batches."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        self.claim_batches: list[int] = []
        self.fail_writes = False

    async def claim(
        self, requests: Sequence[ClaimRequest], *, owner: str, lease_id: str, ttl_s: float
    ) -> list[ClaimOutcome]:
        self.claim_batches.append(len(requests))
        out = []
        for req in requests:
            r = self.rows.get(req.key)
            found = (
                None
                if r is None
                else StoredState(
                    r["status"], r["result"], r["owner"], r["lease"], 9e9, 0, None,
                    r.get("sent_at"), 0, None, None,
                )
            )  # fmt: skip
            outcome = decide_claim(req, found, now=0.0, lease_id=lease_id, ttl_s=ttl_s)
            if outcome.status is ClaimStatus.CLAIMED:
                self.rows[req.key] = {
                    "status": "running",
                    "result": None,
                    "owner": owner,
                    "lease": lease_id,
                }
            elif outcome.became_ambiguous:
                self.rows[req.key]["status"] = "ambiguous"
            out.append(outcome)
        return out

    async def complete(self, key: str, *, lease_id: str, result: Any, **cost: Any) -> bool:
        if self.fail_writes:
            raise OSError("disk full")
        row = self.rows[key]
        if row["lease"] != lease_id:
            return False
        row.update(status="completed", result=result, lease=None)
        return True

    async def fail(self, key: str, *, lease_id: str, error: str) -> bool:
        self.rows[key].update(status="failed", lease=None)
        return True

    async def mark_sent(self, keys: Sequence[str], *, lease_id: str, ttl_s: float) -> list[bool]:
        for key in keys:
            self.rows[key]["sent_at"] = 1.0
        return [self.rows[k]["lease"] == lease_id for k in keys]

    async def mark_ambiguous(self, key: str, *, lease_id: str, reason: str) -> bool:
        self.rows[key].update(status="ambiguous")
        return True

    async def renew(self, keys: Sequence[str], *, lease_id: str, ttl_s: float) -> list[bool]:
        return [self.rows[k]["lease"] == lease_id for k in keys]

    async def get(self, keys: Sequence[str]) -> dict[str, Receipt]:
        return {
            k: Receipt(
                k,
                "find",
                r["status"],
                r["result"],
                None,
                r["owner"],
                r["lease"],
                None,
                None,
                1,
                0.0,
            )
            for k, r in self.rows.items()
            if k in keys
        }

    async def release(self, keys: Sequence[str], *, lease_id: str) -> None: ...
    async def open_batch(self, agg_key: str, **kw: Any) -> bool:
        raise NotImplementedError

    async def claim_batch(self, agg_key: str, **kw: Any) -> BatchClaim:
        raise NotImplementedError

    async def complete_batch(self, agg_key: str, **kw: Any) -> bool:
        raise NotImplementedError

    async def fail_batch(self, agg_key: str, **kw: Any) -> None:
        raise NotImplementedError

    async def mark_batch_ambiguous(self, agg_key: str, **kw: Any) -> bool:
        raise NotImplementedError

    async def close(self) -> None: ...


class RecordingDispatcher:
    """Answers ``{"q": ...}`` after a short wait; remembers every settled call."""

    def __init__(self, attempt: Attempt) -> None:
        self.attempt = attempt
        self.settled: list[ClaimedCall] = []
        self.held_while_settling: list[list[str]] = []

    def auth_scope(self, tool: ToolSpec) -> str:
        return "test"

    async def settle(self, call: ClaimedCall) -> Settled:
        self.settled.append(call)
        self.held_while_settling.append(self.attempt.leases.keys())
        await asyncio.sleep(0.01)
        self.attempt.check_before_dispatch()
        outcome = Answered({"answer": call.payload["q"]}, 1.0)
        return await settle(self.attempt, SingleReceipt(self.attempt, call.key), outcome, call.tool)

    async def aclose(self) -> None: ...

    def abort(self) -> None: ...


def make(receipts: MemoryReceipts) -> tuple[ToolRunner, RecordingDispatcher]:
    attempt = Attempt(
        receipts=receipts,  # type: ignore[arg-type]
        owner="o",
        lease_id="L1",
        lease_ttl_s=5,
        settle_patience_s=0.3,
    )
    dispatcher = RecordingDispatcher(attempt)
    return ToolRunner(CATALOG, attempt, dispatcher), dispatcher


async def test_identical_calls_in_one_chunk_are_one_dispatch_and_claims_go_in_one_batch() -> None:
    receipts = MemoryReceipts()
    runner, dispatcher = make(receipts)
    results = await asyncio.gather(
        *(runner.call("find", {"q": q}) for q in ["a", "a", "b", "a", "b"])
    )
    assert [r.data["answer"] for r in results] == ["a", "a", "b", "a", "b"]
    assert sorted(c.payload["q"] for c in dispatcher.settled) == ["a", "b"]
    assert receipts.claim_batches == [2]  # the two distinct calls, claimed together
    assert (runner.stats.shared, runner.stats.cached) == (3, 0)
    # While a call settles its receipt is held (renewed by the heartbeat); afterwards not.
    assert all(held for held in dispatcher.held_while_settling)
    assert runner.attempt.leases.keys() == []


async def test_a_completed_receipt_is_a_hit_and_dispatches_nothing() -> None:
    receipts = MemoryReceipts()
    first, _ = make(receipts)
    await first.call("find", {"q": "a"})
    second, dispatcher = make(receipts)
    result = await second.call("find", {"q": "a"})
    assert result.cached and result.data == {"answer": "a"}
    assert dispatcher.settled == [] and second.stats.cached == 1


async def test_a_failed_write_trips_the_breaker_and_holds_back_later_calls() -> None:
    receipts = MemoryReceipts()
    runner, dispatcher = make(receipts)
    receipts.fail_writes = True
    with pytest.raises(PersistenceCircuitOpen, match="disk full"):
        await runner.call("find", {"q": "a"})
    with pytest.raises(PersistenceCircuitOpen):
        await runner.call("find", {"q": "b"})
    assert len(dispatcher.settled) == 1  # the second call never reached a dispatcher
    assert runner.attempt.latch.tripped
    assert runner.attempt.latch.prevented == 1  # held back at its claim, and counted
    assert "1 provider call(s) were held back" in str(runner.attempt.latch.error())


async def test_lease_keeper_blocks_nest_and_a_lost_lease_stops_dispatch() -> None:
    keeper = LeaseKeeper()
    with keeper.holding(["k"]):
        with keeper.holding(["k", "j"]):
            assert keeper.keys() == ["j", "k"]
        assert keeper.keys() == ["k"]
    assert keeper.keys() == []
    receipts = MemoryReceipts()
    runner, _ = make(receipts)
    receipts.rows["k"] = {"status": "running", "result": None, "owner": "thief", "lease": "L9"}
    with runner.attempt.leases.holding(["k"]):
        await runner.renew_leases()
    assert isinstance(runner.lease_lost, LeaseLost)
    with pytest.raises(LeaseLost):
        runner.attempt.check_before_dispatch()


async def test_until_released_returns_the_first_answer_or_gives_up() -> None:
    answers = iter([None, None, "done"])

    async def poll() -> str | None:
        return next(answers)

    assert await until_released(poll, max_wait_s=5, what="receipt k") == "done"

    async def never() -> str | None:
        return None

    with pytest.raises(LeaseLost, match="receipt k stayed held by another owner"):
        await until_released(never, max_wait_s=0.0, what="receipt k")
