"""Weighted fair shares at the governor: who of several waiting runs goes next.

Ordering, not timing: every caller is queued before the first token is free, and the
tests look at the order in which the governor admitted them.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from playline.pacing.fair import SHARE, Share
from playline.pacing.gate import WORK_STARTED
from playline.pacing.governor import Governor
from playline.pacing.policy import PacingPolicy


def _governor(max_concurrency: int = 256) -> Governor:
    return Governor({"acme": PacingPolicy(rps=2000, burst=1, max_concurrency=max_concurrency)})


async def _warm(gov: Governor) -> None:
    async with gov.permit(["acme"]) as permit:  # the first answer goes alone
        permit.record_success(0.001)


async def _admitted(gov: Governor, calls: list[Share], hold_s: float = 0.0) -> list[str]:
    """Queue every call before any is admitted (the test holds the key's turn for a rate
    token meanwhile); the fairness keys in the order they were admitted."""
    order: list[str] = []
    turn = gov._states["acme"].turn  # private: held so that no caller slips through first

    async def call(share: Share, n: int) -> None:
        SHARE.set(share)
        WORK_STARTED.set(float(n))
        async with gov.permit(["acme"]) as permit:
            order.append(share.key)
            await asyncio.sleep(hold_s)
            permit.record_success(0.001)

    await turn.acquire()
    tasks = [asyncio.create_task(call(share, n)) for n, share in enumerate(calls)]
    await asyncio.sleep(0.01)
    turn.release()
    await asyncio.gather(*tasks)
    return order


async def test_a_weight_two_key_gets_twice_the_calls_of_a_weight_one_key() -> None:
    gov = _governor()
    await _warm(gov)
    calls = [Share("a", 2.0)] * 90 + [Share("b", 1.0)] * 90
    order = await _admitted(gov, calls)
    first = Counter(order[:90])  # while both keys wait
    assert abs(first["a"] - 60) <= 2 and abs(first["b"] - 30) <= 2, first
    assert Counter(order) == {"a": 90, "b": 90}  # work-conserving: everyone, once
    shares = gov.shares("acme")
    assert {"a", "b"} <= set(shares) and shares["a"]["weight"] == 2.0
    assert shares["a"]["served"] == shares["b"]["served"] == 90


async def test_three_runs_of_one_key_share_with_one_run_of_another_evenly() -> None:
    gov = _governor()
    await _warm(gov)
    team_a = [Share("team-a")] * 40 * 3  # three runs, one fairness key
    order = await _admitted(gov, team_a + [Share("team-b")] * 40)
    first = Counter(order[:80])
    assert abs(first["team-a"] - 40) <= 2, first


async def test_a_lower_priority_class_is_served_strictly_first() -> None:
    gov = _governor()
    await _warm(gov)
    order = await _admitted(gov, [Share("backfill", 5.0, 3)] * 50 + [Share("urgent", 1.0, 1)] * 10)
    assert order[:10] == ["urgent"] * 10


async def test_within_a_key_the_oldest_work_goes_first() -> None:
    gov = _governor()
    await _warm(gov)
    seen: list[float] = []

    async def call(started: float) -> None:
        SHARE.set(Share("run"))
        WORK_STARTED.set(started)
        async with gov.permit(["acme"]):
            seen.append(started)

    holder = gov.permit(["acme"])
    await holder.__aenter__()  # holds the turn's token briefly: the others queue
    tasks = [asyncio.create_task(call(t)) for t in (30.0, 10.0, 20.0)]
    await asyncio.sleep(0.01)
    await holder.__aexit__(None, None, None)
    await asyncio.gather(*tasks)
    assert sorted(seen) == [10.0, 20.0, 30.0] and len(seen) == 3


async def test_a_concurrency_capped_provider_shares_its_slots_by_weight() -> None:
    gov = _governor(max_concurrency=2)
    await _warm(gov)
    calls = [Share("a", 3.0)] * 60 + [Share("b", 1.0)] * 60
    order = await _admitted(gov, calls, hold_s=0.002)
    first = Counter(order[:60])
    assert abs(first["a"] - 45) <= 3, first


async def test_a_weight_changed_while_calls_wait_applies_to_them() -> None:
    gov = _governor()
    await _warm(gov)
    gov.set_share_weight("b", 3.0)  # playline limits share b --weight 3
    order = await _admitted(gov, [Share("a")] * 80 + [Share("b")] * 80)
    first = Counter(order[:80])
    assert abs(first["b"] - 60) <= 2, first
    gov.set_share_weight("b", None)
    assert "b" in gov.shares("acme")
