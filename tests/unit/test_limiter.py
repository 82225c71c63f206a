"""``AdjustableLimiter`` pins the aiolimiter internals it relies on.

playline resizes a live aiolimiter bucket in place (``playline.pacing.limiter``);
these tests state exactly what it needs from aiolimiter 1.x, so an upgrade that
changes the internals fails here, naming the attribute, not in a benchmark.
"""

from __future__ import annotations

import asyncio

import pytest
from aiolimiter import AsyncLimiter

from playline.pacing.limiter import AdjustableLimiter


def test_aiolimiter_still_has_the_internals_the_limiter_uses() -> None:
    bucket = AsyncLimiter(5, 1.0)
    for name in ("_level", "_rate_per_sec", "_waiters"):
        assert hasattr(bucket, name), f"aiolimiter no longer has {name}"
    for name in ("_leak", "_wake_next", "has_capacity"):
        assert callable(getattr(bucket, name, None)), f"aiolimiter no longer has {name}()"


def test_mapping_burst_back_to_back_then_rps() -> None:
    limiter = AdjustableLimiter(rps=10, burst=4)
    assert (limiter.max_rate, limiter.time_period) == (4.0, 0.4)


async def test_burst_is_available_at_once_then_capacity_runs_out() -> None:
    limiter = AdjustableLimiter(rps=10, burst=3)
    assert [limiter.try_take() for _ in range(4)] == [True, True, True, False]
    assert limiter.capacity_delay() == pytest.approx(0.1, abs=0.02)


async def test_reconfigure_keeps_the_level_so_a_cut_hands_out_no_fresh_burst() -> None:
    limiter = AdjustableLimiter(rps=100, burst=10)
    for _ in range(10):
        assert limiter.try_take()
    limiter.reconfigure(rps=5, burst=10)  # a cut: the bucket stays full
    assert not limiter.try_take()
    # At 5 rps one unit drains in 0.2 s, not the 0.01 s of the old rate.
    assert limiter.capacity_delay() == pytest.approx(0.2, abs=0.03)


async def test_refund_gives_back_capacity_and_never_goes_negative() -> None:
    limiter = AdjustableLimiter(rps=1, burst=1)
    assert limiter.try_take()
    assert not limiter.try_take()
    limiter.refund()
    assert limiter.try_take()
    limiter.refund(5.0)
    assert limiter._level == 0.0  # clamped, not negative


async def test_reconfigure_wakes_a_waiter_when_the_rate_rises() -> None:
    limiter = AdjustableLimiter(rps=0.2, burst=1)
    assert limiter.try_take()
    waiter = asyncio.ensure_future(limiter.acquire())
    await asyncio.sleep(0.05)
    assert not waiter.done()  # 5 s to wait at 0.2 rps
    limiter.reconfigure(rps=100, burst=1)
    await asyncio.wait_for(waiter, 3.0)  # not the 5 s the old rate needed
