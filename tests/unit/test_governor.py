"""The governor under real asyncio and real (short) time."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from playline.calls.catalog import Catalog
from playline.pacing.aimd import AimdConfig
from playline.pacing.fleet_store import FleetPacingUnavailable
from playline.pacing.gate import ResizableGate
from playline.pacing.governor import Governor
from playline.pacing.policy import PacingPolicy

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
    gov.set_limit("acme", max_concurrency=4)
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
    gov.set_limit("acme", rps=100, burst=2)
    await asyncio.wait_for(waiter, timeout=0.3)
    assert time.monotonic() - t0 < 0.3
    snap = gov.snapshot()["acme"]
    assert (snap["rps"], snap["rate_rps"], snap["burst"]) == (100, 100, 2)


async def test_set_limit_rejects_invalid_values() -> None:
    gov = Governor({})
    with pytest.raises(ValueError):
        gov.set_limit("acme", rps=0)
    with pytest.raises(ValueError):
        gov.set_limit("acme", max_concurrency=0)


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
    assert snap["rate_rps"] == 20
    assert (snap["rate_limited"], snap["cuts"], snap["pauses"]) == (5, 1, 1)
    assert 0.2 < snap["paused_until"] <= 0.33
    cuts = [r for r in caplog.records if "rate cut" in r.getMessage()]
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


async def test_sustained_success_recovers_the_rate(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="playline.governor")
    t = [0.0]
    gov = Governor(
        {"acme": PacingPolicy(rps=10, burst=10, min_rps=1)},
        clock=lambda: t[0],
        aimd=AimdConfig(window_s=0.05, jitter_fraction=0.0),
    )
    async with gov.permit(["acme"]) as permit:
        permit.record_rate_limited(0.0)
    assert gov.snapshot()["acme"]["rate_rps"] == 5
    for _ in range(8):
        t[0] += 0.06  # one window per success (rate 5..10 x 0.05 s needs one success)
        async with gov.permit(["acme"]) as permit:
            permit.record_success(0.01)
    snap = gov.snapshot()["acme"]
    assert snap["rate_rps"] == 10  # +1 rps per window, capped at the ceiling
    assert snap["increases"] == 5
    assert sum("recovered" in r.getMessage() for r in caplog.records) == 1


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
    assert gov.suggested_parallelism("acme") == 5  # prior: ceil(20 x 0.25)
    async with gov.permit(["acme"]) as permit:
        permit.record_success(0.1)
    assert gov.suggested_parallelism("acme") == 2  # ceil(20 x 0.1)
    gov.set_limit("acme", rps=0.5)
    assert gov.suggested_parallelism("acme") == 1  # floored at 1
    gov.set_limit("acme", rps=1000)
    assert gov.suggested_parallelism("acme") == 6  # capped by the global ceiling
    gov.set_limit("acme", max_concurrency=3)
    assert gov.suggested_parallelism("acme") == 3  # capped by max_concurrency
    assert gov.snapshot()["acme"]["suggested_parallelism"] == 3


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
    assert gov.suggested_parallelism("acme") == 2
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
