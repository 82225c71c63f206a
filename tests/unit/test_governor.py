"""The governor under real asyncio and real (short) time."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from playline.calls.catalog import Catalog
from playline.pacing.fleet_store import FleetPacingUnavailable
from playline.pacing.gate import ResizableGate
from playline.pacing.governor import Governor
from playline.pacing.headers import QuotaReport, RateLimitReport
from playline.pacing.pacer import KeyBlocked
from playline.pacing.policy import Limits, PacingPolicy
from playline.pacing.search import SearchConfig

FAST = PacingPolicy(rps=1000, burst=100, max_concurrency=64)


async def hold(gov: Governor, keys: list[str], seconds: float, started: asyncio.Event) -> None:
    async with gov.permit(keys):
        started.set()
        await asyncio.sleep(seconds)


async def test_never_more_than_max_concurrency_in_flight() -> None:
    gov = Governor({"acme": FAST.model_copy(update={"max_concurrency": 3})})
    in_flight = peak = 0

    async def call() -> None:
        nonlocal in_flight, peak
        async with gov.permit(["acme"]) as permit:
            in_flight += 1
            peak = max(peak, in_flight)
            assert gov.snapshot()["acme"]["in_flight"] <= 3
            await asyncio.sleep(0.02)
            in_flight -= 1
            permit.record_success(0.02)

    await asyncio.gather(*(call() for _ in range(30)))
    assert peak == 3
    snap = gov.snapshot()["acme"]
    assert (snap["in_flight"], snap["waiting"], snap["successes"]) == (0, 0, 30)


async def test_rate_is_respected_over_a_window() -> None:
    rps, burst = 50.0, 5
    gov = Governor({"acme": PacingPolicy(rps=rps, burst=burst, max_concurrency=64)})
    granted: list[float] = []
    stop = time.monotonic() + 1.2

    async def worker() -> None:
        while time.monotonic() < stop:
            async with gov.permit(["acme"]):
                granted.append(time.monotonic())

    await asyncio.gather(*(worker() for _ in range(20)))
    # Sliding windows: never more than burst + rps x window (+1 for the window edge).
    for start in granted:
        for window in (0.2, 0.5, 1.0):
            n = sum(1 for t in granted if start <= t < start + window)
            assert n <= burst + rps * window + 1, (window, n)
    # ... and the limiter is not needlessly slow either.
    span = granted[-1] - granted[0]
    assert len(granted) >= burst + rps * span * 0.8


async def test_multi_key_waits_for_every_key() -> None:
    gov = Governor(
        {
            "acme": FAST.model_copy(update={"max_concurrency": 1}),
            "acme:key=ab12cd": FAST,
        }
    )
    started = asyncio.Event()
    holder = asyncio.create_task(hold(gov, ["acme"], 0.3, started))
    await started.wait()
    t0 = time.monotonic()
    async with gov.permit(["acme:key=ab12cd", "acme"]) as permit:
        waited = time.monotonic() - t0
        assert permit.keys == ("acme", "acme:key=ab12cd")
        snap = gov.snapshot()
        assert snap["acme"]["in_flight"] == 1
        assert snap["acme:key=ab12cd"]["in_flight"] == 1
    assert waited >= 0.25
    await holder
    assert all(s["in_flight"] == 0 for s in gov.snapshot().values())


async def test_multi_key_takes_rate_tokens_together() -> None:
    """A call over two keys waits for the slower one without holding the other's token."""
    gov = Governor(
        {
            "slow": PacingPolicy(rps=5, burst=1, max_concurrency=8),
            "fast": PacingPolicy(rps=5, burst=1, max_concurrency=8),
        }
    )
    async with gov.permit(["slow"]):
        pass  # slow's only token is used for the next 0.2 s
    t0 = time.monotonic()
    async with gov.permit(["fast", "slow"]):
        assert time.monotonic() - t0 >= 0.15
    # fast's token was taken at the same instant, so a fast-only call waits ~0.2 s too.
    t1 = time.monotonic()
    async with gov.permit(["fast"]):
        assert time.monotonic() - t1 >= 0.15


async def test_overlapping_multi_key_permits_do_not_deadlock() -> None:
    gov = Governor({k: FAST.model_copy(update={"max_concurrency": 1}) for k in ("a", "b", "c")})

    async def call(keys: list[str]) -> None:
        async with gov.permit(keys):
            await asyncio.sleep(0.005)

    orders = [["a", "b"], ["b", "a"], ["c", "a", "b"], ["b", "c"], ["a"]] * 6
    await asyncio.wait_for(asyncio.gather(*(call(k) for k in orders)), timeout=2.5)


async def test_cancelled_waiter_releases_and_consumes_nothing() -> None:
    gov = Governor({"acme": PacingPolicy(rps=1000, burst=100, max_concurrency=1)})
    started = asyncio.Event()
    holder = asyncio.create_task(hold(gov, ["acme"], 0.2, started))
    await started.wait()
    waiter = asyncio.create_task(hold(gov, ["acme"], 0.0, asyncio.Event()))
    await asyncio.sleep(0.05)
    assert gov.snapshot()["acme"]["waiting"] == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert gov.snapshot()["acme"]["waiting"] == 0
    await holder
    # The slot is free again: admitted at once.
    await asyncio.wait_for(hold(gov, ["acme"], 0.0, asyncio.Event()), timeout=0.1)
    assert gov.snapshot()["acme"]["in_flight"] == 0


async def test_cancelled_rate_waiter_leaves_the_token_for_the_next_caller() -> None:
    gov = Governor({"acme": PacingPolicy(rps=4, burst=1, max_concurrency=8)})
    async with gov.permit(["acme"]):
        pass  # the next token is due in 0.25 s
    waiter = asyncio.create_task(hold(gov, ["acme"], 0.0, asyncio.Event()))
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    t0 = time.monotonic()
    async with gov.permit(["acme"]):
        waited = time.monotonic() - t0
    # ~0.2 s: the token the cancelled waiter queued for, not the one after it (~0.45 s)
    assert 0.1 < waited < 0.38


async def test_cancellation_inside_the_permit_releases_the_slot() -> None:
    gov = Governor({"acme": FAST.model_copy(update={"max_concurrency": 1})})
    started = asyncio.Event()
    task = asyncio.create_task(hold(gov, ["acme"], 10.0, started))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(hold(gov, ["acme"], 0.0, asyncio.Event()), timeout=0.1)


async def test_exception_inside_the_permit_releases_the_slot() -> None:
    gov = Governor({"acme": FAST.model_copy(update={"max_concurrency": 1})})
    with pytest.raises(RuntimeError):
        async with gov.permit(["acme"]):
            raise RuntimeError("provider exploded")
    await asyncio.wait_for(hold(gov, ["acme"], 0.0, asyncio.Event()), timeout=0.1)


async def test_set_limit_concurrency_applies_to_waiting_calls() -> None:
    gov = Governor({"acme": FAST.model_copy(update={"max_concurrency": 1})})
    async with gov.permit(["acme"]) as first:
        first.record_success(0.001)  # the key's first answer is in
    in_flight = peak = 0
    release = asyncio.Event()

    async def call() -> None:
        nonlocal in_flight, peak
        async with gov.permit(["acme"]):
            in_flight += 1
            peak = max(peak, in_flight)
            await release.wait()
            in_flight -= 1

    tasks = [asyncio.create_task(call()) for _ in range(6)]
    await asyncio.sleep(0.05)
    assert in_flight == 1
    gov.set_limit("acme", Limits(max_concurrency=4))
    await asyncio.sleep(0.05)
    assert in_flight == 4
    assert gov.snapshot()["acme"]["max_concurrency"] == 4
    release.set()
    await asyncio.gather(*tasks)
    assert peak == 4


async def test_set_limit_rate_applies_to_waiting_calls() -> None:
    gov = Governor({"acme": PacingPolicy(rps=1, burst=1, max_concurrency=8)})
    async with gov.permit(["acme"]):
        pass  # the next token is a full second away at 1 rps
    waiter = asyncio.create_task(hold(gov, ["acme"], 0.0, asyncio.Event()))
    await asyncio.sleep(0.05)
    t0 = time.monotonic()
    gov.set_limit("acme", Limits(rps=100, burst=2))
    await asyncio.wait_for(waiter, timeout=0.3)
    assert time.monotonic() - t0 < 0.3
    snap = gov.snapshot()["acme"]
    assert (snap["rps"], snap["rate_rps"], snap["burst"]) == (100, 100, 2)


async def test_set_limit_rejects_invalid_values() -> None:
    gov = Governor({})
    with pytest.raises(ValueError):
        gov.set_limit("acme", Limits(rps=0))
    with pytest.raises(ValueError):
        gov.set_limit("acme", Limits(max_concurrency=0))


async def test_429_cuts_once_pauses_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    gov = Governor({"acme": PacingPolicy(rps=40, burst=10, max_concurrency=16)})
    caplog.set_level(logging.INFO, logger="playline.governor")
    permits = []
    entered = [gov.permit(["acme"]) for _ in range(5)]
    for cm in entered:
        permits.append(await cm.__aenter__())
    for permit in permits:  # a burst: every in-flight call comes back 429
        permit.record_rate_limited(0.3)
    for cm in entered:
        await cm.__aexit__(None, None, None)
    snap = gov.snapshot()["acme"]
    assert snap["rate_rps"] == 20  # too early to measure what was admitted: halved
    assert (snap["rate_limited"], snap["cuts"], snap["pauses"]) == (5, 1, 1)
    assert 0.2 < snap["paused_until"] <= 0.34
    cuts = [r for r in caplog.records if "rate-limited" in r.getMessage()]
    assert len(cuts) == 1
    assert cuts[0].levelno == logging.WARNING
    # The key stays closed until the Retry-After has passed.
    t0 = time.monotonic()
    async with gov.permit(["acme"]):
        assert time.monotonic() - t0 >= 0.2
    assert gov.snapshot()["acme"]["paused_until"] is None


async def test_waiters_queued_during_a_pause_resume_at_the_cut_rate() -> None:
    gov = Governor({"acme": PacingPolicy(rps=40, burst=1, max_concurrency=16)})
    async with gov.permit(["acme"]) as permit:
        permit.record_rate_limited(0.2)
    granted: list[float] = []

    async def call() -> None:
        async with gov.permit(["acme"]):
            granted.append(time.monotonic())

    t0 = time.monotonic()
    await asyncio.gather(*(call() for _ in range(6)))
    assert min(granted) - t0 >= 0.18
    gaps = [b - a for a, b in zip(sorted(granted), sorted(granted)[1:], strict=False)]
    assert min(gaps) >= 1 / 20 * 0.8  # spaced at the halved rate, 20 rps


async def test_sustained_success_recovers_the_rate() -> None:
    t = [0.0]
    gov = Governor(
        {"acme": PacingPolicy(rps=10, burst=10, min_rps=1)},
        clock=lambda: t[0],
        search=SearchConfig(window_s=0.5, min_window_calls=2, jitter_fraction=0.0),
    )
    async with gov.permit(["acme"]) as permit:
        permit.record_rate_limited(0.0)
    assert gov.snapshot()["acme"]["rate_rps"] == 5
    for _ in range(40):
        t[0] += 0.1
        async with gov.permit(["acme"]) as permit:
            permit.record_success(0.01)
    snap = gov.snapshot()["acme"]
    assert snap["rate_rps"] > 5  # the search climbs back towards the 429's bound
    assert snap["increases"] >= 1


async def test_only_the_first_outcome_of_a_permit_counts() -> None:
    gov = Governor({"acme": FAST})
    async with gov.permit(["acme"]) as permit:
        permit.record_failure()
        permit.record_rate_limited(1.0)
        permit.record_success(0.1)
    snap = gov.snapshot()["acme"]
    assert (snap["failures"], snap["rate_limited"], snap["successes"]) == (1, 0, 0)
    assert snap["rate_rps"] == 1000


async def test_suggested_parallelism_follows_littles_law() -> None:
    gov = Governor({"acme": PacingPolicy(rps=20, burst=2, max_concurrency=8)}, global_ceiling=6)
    assert gov.suggested_parallelism("acme") == 6  # prior: ceil(20 x 2 x 0.25), capped
    async with gov.permit(["acme"]) as permit:
        permit.record_success(0.1)
    assert gov.suggested_parallelism("acme") == 4  # ceil(20 x 2 headroom x 0.1)
    gov.set_limit("acme", Limits(rps=0.5))
    assert gov.suggested_parallelism("acme") == 1  # floored at 1
    gov.set_limit("acme", Limits(rps=1000))
    assert gov.suggested_parallelism("acme") == 6  # capped by the global ceiling
    gov.set_limit("acme", Limits(max_concurrency=2))
    assert gov.suggested_parallelism("acme") == 4  # capped at 2 x max_concurrency
    assert gov.snapshot()["acme"]["suggested_parallelism"] == 4


async def test_unknown_key_gets_the_default_policy() -> None:
    gov = Governor({})
    async with gov.permit("never-declared") as permit:  # a bare string is one key
        assert permit.keys == ("never-declared",)
    snap = gov.snapshot()["never-declared"]
    default = PacingPolicy()
    assert (snap["rps"], snap["burst"], snap["max_concurrency"]) == (
        default.rps,
        default.burst,
        default.max_concurrency,
    )
    with pytest.raises(ValueError):
        gov.permit([])


async def test_a_governor_from_the_catalog_has_one_key_per_provider() -> None:
    catalog = Catalog.model_validate(
        {
            "providers": {
                "acme": {"base_url": "http://x", "pacing": {"rps": 7, "max_concurrency": 3}},
                "firmo": {"base_url": "http://y"},
            },
            "tools": {},
        }
    )
    gov = Governor(catalog.pacing_policies(), global_ceiling=32)
    assert gov.suggested_parallelism("acme") == 4  # ceil(7 x 2 x 0.25)
    snap = gov.snapshot()
    assert snap["acme"]["rps"] == 7
    assert snap["acme"]["max_concurrency"] == 3
    assert snap["firmo"]["rps"] == PacingPolicy().rps
    await gov.aclose()


async def test_resizable_gate_shrinks_without_revoking() -> None:
    gate = ResizableGate(3)
    for _ in range(3):
        await gate.acquire()
    gate.resize(1)
    waiter = asyncio.create_task(gate.acquire())
    gate.release()
    gate.release()
    await asyncio.sleep(0.01)
    assert not waiter.done()  # 1 held, limit 1
    gate.release()
    await asyncio.wait_for(waiter, timeout=0.1)
    assert gate.held == 1
    with pytest.raises(ValueError):
        gate.resize(0)


class BrokenFleet:
    """A fleet store that is down: every ticket fails."""

    async def read_state(self) -> dict[str, object]:
        return {}

    async def take_many(self, key: str, n: int, **_: object) -> tuple[float, ...]:
        raise FleetPacingUnavailable("fleet pacing store unavailable (test)")


async def test_fleet_outage_fails_the_call_and_releases_everything() -> None:
    gov = Governor(
        {"acme": PacingPolicy(rps=2, burst=1, max_concurrency=1)},
        fleet=BrokenFleet(),  # type: ignore[arg-type]
    )
    with pytest.raises(FleetPacingUnavailable):
        async with gov.permit(["acme"]):
            pytest.fail("dispatched without a fleet ticket")
    snap = gov.snapshot()["acme"]
    assert (snap["in_flight"], snap["waiting"]) == (0, 0)
    # Slot and rate token were both given back: a local-only governor state would
    # admit the next call at once (the broken fleet fails it again, promptly).
    t0 = time.monotonic()
    with pytest.raises(FleetPacingUnavailable):
        async with gov.permit(["acme"]):
            pass
    assert time.monotonic() - t0 < 0.1
    await gov.aclose()


# ------------------------------------------------------------ governor v2: every limit together


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_quota_window_blocks_until_its_oldest_call_ages_out() -> None:
    clock = Clock()
    gov = Governor(
        {"acme": PacingPolicy(rps=1000, burst=100, per_hour=3, max_concurrency=8)},
        clock=clock,
        wall_clock=lambda: 5000.0,
    )
    for _ in range(3):
        async with gov.permit(["acme"]) as permit:
            permit.record_success(0.01)
        clock.now += 10
    assert gov.blocked_until("acme") == pytest.approx(5000.0 + 3600 - 30)
    with pytest.raises(KeyBlocked) as blocked:
        async with gov.permit(["acme"], park_after_s=60):
            pytest.fail("a full window admitted a call")
    assert blocked.value.until_wall == pytest.approx(5000.0 + 3570)
    snap = gov.snapshot()["acme"]
    assert (snap["in_flight"], snap["waiting"], snap["windows"]) == (0, 0, {3600.0: 3})
    clock.now += 3571
    assert gov.blocked_until("acme") is None


async def test_per_minute_is_spent_evenly() -> None:
    gov = Governor({"acme": PacingPolicy(rps=1000, burst=1, per_minute=600)})
    assert gov.rate_in_force("acme") == pytest.approx(10.0)  # 600 / 60 s


async def test_reported_quota_paces_evenly_then_blocks_and_parks() -> None:
    clock = Clock()
    gov = Governor({"acme": PacingPolicy(rps=1000, burst=5)}, clock=clock, wall_clock=lambda: 0.0)
    async with gov.permit(["acme"]) as permit:
        permit.observe(RateLimitReport((QuotaReport("", 100, 20, 10.0),)))
        permit.record_success(0.01)
    assert gov.rate_in_force("acme") == pytest.approx(2.0)  # 20 left over 10 s
    async with gov.permit(["acme"]) as permit:
        permit.observe(RateLimitReport((QuotaReport("", 100, 0, 8.0),)))
        permit.record_success(0.01)
    assert gov.blocked_until("acme") == pytest.approx(8.0)
    with pytest.raises(KeyBlocked):
        async with gov.permit(["acme"], park_after_s=1.0):
            pass
    clock.now += 8.5  # after the reset the window's limit over its length applies
    assert gov.blocked_until("acme") is None
    assert gov.rate_in_force("acme") == pytest.approx(100 / 10.0)


async def test_the_call_a_report_answers_is_counted_by_it_however_quick() -> None:
    """A round trip under half the quickest so far: the report still counted its own call
    (counting it again made the last call of a window park with one call left)."""
    clock = Clock()
    gov = Governor({"acme": PacingPolicy(rps=1000, burst=5)}, clock=clock, wall_clock=lambda: 0.0)
    for latency, remaining in ((0.010, 2), (0.002, 1)):  # a new connection, then a quick call
        async with gov.permit(["acme"]) as permit:
            clock.now += latency
            permit.observe(RateLimitReport((QuotaReport("", 3, remaining, 6.0),)))
            permit.record_success(latency)
    assert gov.blocked_until("acme") is None  # one call left, as the provider said
    async with gov.permit(["acme"], park_after_s=1.0) as permit:
        clock.now += 0.002
        permit.observe(RateLimitReport((QuotaReport("", 3, 0, 5.9),)))
        permit.record_success(0.002)
    assert gov.blocked_until("acme") == pytest.approx(5.9)  # wall time of the reset


async def test_a_long_retry_after_blocks_the_key_for_all_of_it() -> None:
    clock = Clock()
    gov = Governor(
        {"acme": PacingPolicy(rps=50)},
        clock=clock,
        wall_clock=lambda: 1000.0,
        search=SearchConfig(jitter_fraction=0.0),
    )
    async with gov.permit(["acme"]) as permit:
        permit.record_rate_limited(7200.0)  # a daily quota: "come back in two hours"
    assert gov.blocked_until("acme") == pytest.approx(1000.0 + 7200)


async def test_pick_prefers_a_key_that_can_admit_now() -> None:
    clock = Clock()
    policy = PacingPolicy(rps=100, burst=10, per_day=1)
    gov = Governor({"acme:key=A": policy, "acme:key=B": policy}, clock=clock)
    assert gov.pick(["acme:key=A", "acme:key=B"]) == "acme:key=A"  # ties: caller's order
    async with gov.permit(["acme:key=A"]):
        pass  # A's daily call is spent
    assert gov.pick(["acme:key=A", "acme:key=B"]) == "acme:key=B"


async def test_a_429_at_a_width_never_seen_to_succeed_narrows_the_gate() -> None:
    gov = Governor({"acme": PacingPolicy(rps=1000, burst=100, max_concurrency=16)})
    entered = [gov.permit(["acme"]) for _ in range(6)]
    permits = [await cm.__aenter__() for cm in entered]
    for permit in permits[:5]:
        permit.record_success(0.01)  # succeeded with up to 5 in flight
    permits[5].record_rate_limited(None)  # the 6th in flight was refused
    for cm in entered:
        await cm.__aexit__(None, None, None)
    assert gov.snapshot()["acme"]["concurrency"] == 5


async def test_a_keys_first_call_goes_alone_until_its_answer() -> None:
    gov = Governor({"acme": FAST})
    first = gov.permit(["acme"])
    permit = await first.__aenter__()
    second = asyncio.create_task(hold(gov, ["acme"], 0.0, asyncio.Event()))
    await asyncio.sleep(0.1)
    assert not second.done()  # waiting for what the provider says to the first call
    permit.observe(RateLimitReport((QuotaReport("", 100, 50, 10.0),)))
    await asyncio.wait_for(second, timeout=0.5)
    await first.__aexit__(None, None, None)
