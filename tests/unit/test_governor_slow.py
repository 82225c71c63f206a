"""The governor against slow and concurrency-capped providers (issue 17).

Fake clocks and fake outcomes: no timing is asserted, only what the governor decides.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager

import pytest

from playline.pacing.gate import WORK_STARTED, ResizableGate
from playline.pacing.governor import Governor, Permit
from playline.pacing.measure import DispatchLog
from playline.pacing.policy import Limits, PacingPolicy
from playline.pacing.search import RateSearch, SearchConfig
from playline.pacing.sending import note_sending
from tests.gcra_sim import VirtualLoop


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def open_permits(
    gov: Governor, n: int
) -> tuple[list[AbstractAsyncContextManager[Permit]], list[Permit]]:
    """``n`` calls in flight at once (widths 1..n); the key's first answer is already in."""
    entered = [gov.permit(["acme"]) for _ in range(n)]
    return entered, [await cm.__aenter__() for cm in entered]


async def close(entered: list[AbstractAsyncContextManager[Permit]]) -> None:
    for cm in entered:
        await cm.__aexit__(None, None, None)


async def warm(gov: Governor, latency_s: float, widths: int = 0, times: int = 4) -> None:
    """Successes at every width up to ``widths`` (the first answer included)."""
    async with gov.permit(["acme"]) as permit:
        permit.record_success(latency_s)
    for _ in range(times if widths else 0):
        entered, permits = await open_permits(gov, widths)
        for permit in permits:
            permit.record_success(latency_s)
        await close(entered)


async def test_a_429_past_the_cap_narrows_the_gate_and_leaves_the_rate_alone() -> None:
    gov = Governor({"acme": PacingPolicy(rps=50, burst=5, max_concurrency=24)}, clock=Clock())
    await warm(gov, 1.5)
    entered, permits = await open_permits(gov, 9)
    permits[8].record_rate_limited(None)  # the 9th in flight: no slot at the provider
    await close(entered)
    snap = gov.snapshot()["acme"]
    assert (snap["concurrency"], snap["concurrency_cap"]) == (8, 8)
    assert snap["rate_rps"] == 50  # a concurrency cap is not a rate: no cut
    assert (snap["cuts"], snap["rate_limited"]) == (0, 1)
    assert snap["paused_until"] is None  # no Retry-After: the narrower gate is enough


async def test_a_first_429_with_retry_after_at_a_new_width_cuts_the_rate_not_the_gate() -> None:
    # A slow rate-limited provider: its first 429 comes before anything proved the width.
    clock = Clock()
    gov = Governor({"acme": PacingPolicy(rps=20, burst=2, max_concurrency=64)}, clock=clock)
    await warm(gov, 1.5)
    clock.now += 1.0
    entered, permits = await open_permits(gov, 5)
    permits[4].record_rate_limited(1.0)
    await close(entered)
    snap = gov.snapshot()["acme"]
    assert (snap["concurrency"], snap["cuts"]) == (64, 1)


async def test_a_429_at_a_width_that_works_is_a_rate_limit() -> None:
    clock = Clock()
    gov = Governor({"acme": PacingPolicy(rps=50, burst=5, max_concurrency=24)}, clock=clock)
    await warm(gov, 0.05, widths=4)
    clock.now += 3
    entered, permits = await open_permits(gov, 3)
    permits[2].record_rate_limited(1.0)
    await close(entered)
    snap = gov.snapshot()["acme"]
    assert snap["cuts"] == 1 and snap["rate_rps"] < 50
    assert (snap["concurrency"], snap["concurrency_cap"]) == (24, None)


async def test_quick_503s_narrow_neither_the_gate_nor_the_width() -> None:
    gov = Governor({"acme": PacingPolicy(rps=50, burst=5, max_concurrency=8)}, clock=Clock())
    await warm(gov, 4.0)
    before = gov.suggested_parallelism("acme")
    for _ in range(20):
        async with gov.permit(["acme"]) as permit:
            permit.record_failure(0.002)  # a 503 answered at once
    snap = gov.snapshot()["acme"]
    assert gov.suggested_parallelism("acme") == before == 16
    assert (snap["concurrency"], snap["latency_ewma_s"], snap["failures"]) == (8, 4.0, 20)
    async with gov.permit(["acme"]) as permit:
        permit.record_failure(9.0)  # a timeout held its slot for 9 s: it does count
    assert gov.snapshot()["acme"]["latency_ewma_s"] > 4.0


async def test_littles_law_keeps_a_slow_provider_as_full_as_a_quick_one() -> None:
    quick = Governor({"acme": PacingPolicy(rps=8, burst=1, max_concurrency=64)}, clock=Clock())
    slow = Governor({"acme": PacingPolicy(rps=8, burst=1, max_concurrency=64)}, clock=Clock())
    await warm(quick, 0.2)
    await warm(slow, 4.0)
    # calls in flight = rate x time in flight (x 2 of headroom)
    assert quick.suggested_parallelism("acme") == 4  # ceil(8 x 0.2 x 2)
    assert slow.suggested_parallelism("acme") == 64  # ceil(8 x 4 x 2)
    # A concurrency-capped provider: twice its cap, whatever the latency.
    capped = Governor({"acme": PacingPolicy(rps=50, max_concurrency=40)}, clock=Clock())
    await warm(capped, 4.0)
    entered, permits = await open_permits(capped, 17)
    permits[16].record_rate_limited(None)
    await close(entered)
    assert capped.suggested_parallelism("acme") == 32


async def test_a_learnt_cap_is_probed_again_after_a_clean_period() -> None:
    clock = Clock()
    gov = Governor({"acme": PacingPolicy(rps=50, burst=5, max_concurrency=24)}, clock=clock)
    await warm(gov, 1.0)
    entered, permits = await open_permits(gov, 7)
    permits[6].record_rate_limited(None)
    await close(entered)
    assert gov.snapshot()["acme"]["concurrency"] == 6
    clock.now += 2.0
    await warm(gov, 1.0)
    assert gov.snapshot()["acme"]["concurrency"] == 6  # not clean for long enough yet
    clock.now += 10.0
    await warm(gov, 1.0)
    snap = gov.snapshot()["acme"]
    assert (snap["concurrency"], snap["concurrency_probing"]) == (7, True)
    # The provider takes 7 now (its bad minute is over): the gate grows on.
    entered, permits = await open_permits(gov, 7)
    permits[6].record_success(1.0)
    await close(entered)
    assert gov.snapshot()["acme"]["concurrency"] == 8


async def test_set_limit_forgets_a_learnt_cap() -> None:
    gov = Governor({"acme": PacingPolicy(rps=50, max_concurrency=24)}, clock=Clock())
    await warm(gov, 1.0)
    entered, permits = await open_permits(gov, 5)
    permits[4].record_rate_limited(None)
    await close(entered)
    gov.set_limit("acme", Limits(max_concurrency=12))
    snap = gov.snapshot()["acme"]
    assert (snap["concurrency"], snap["concurrency_cap"]) == (12, None)


def test_a_slow_providers_cut_counts_the_calls_still_in_flight_as_admitted() -> None:
    # 10 calls a second (the rate in force) for 2 s, none answered yet (they take 4 s).
    s = RateSearch(10, 0.5, SearchConfig(jitter_fraction=0.0))
    t = 1000.0
    for _ in range(20):
        t += 0.1
        s.on_dispatch(t)
    t += 0.001
    s.on_dispatch(t)
    s.on_rate_limited(t, t, s.epoch, None)
    assert s.rate == pytest.approx(0.9 * 10, rel=0.06)  # not the floor


def test_a_cut_after_sending_slower_than_allowed_is_at_most_a_halving() -> None:
    # The governor held the calls back itself (a key's first call goes alone): the
    # provider took all that was sent, which says little about what it would take.
    s = RateSearch(20, 0.5, SearchConfig(jitter_fraction=0.0))
    t = 1000.0
    for gap in (0.0, 1.0, 0.02, 0.02):
        t += gap
        s.on_dispatch(t)
    s.on_rate_limited(t, t, s.epoch, 1.0)
    assert s.rate == 10


def test_the_wait_for_a_keys_first_answer_is_no_measure_of_its_rate() -> None:
    s = RateSearch(20, 0.5, SearchConfig(jitter_fraction=0.0))
    s.on_dispatch(1000.0)  # the first call, alone for a second
    s.measure_from(1001.0)  # its answer
    for t in (1001.0, 1001.05, 1001.1):
        s.on_dispatch(t)
    s.on_rate_limited(1001.1, 1001.1, s.epoch, 1.0)
    assert (s.rate, s.upper) == (10, 20)  # too early to measure: halved, not 20 -> 2


def test_the_dispatch_log_admits_what_was_not_refused() -> None:
    log = DispatchLog()
    for t in (1.0, 1.1, 1.2, 1.3):
        log.sent(t)
    log.refused(1.2, 1.25)
    log.accepted(1.0, 1.5)
    assert log.count(1.0, 1.3) == (4, 1)
    assert log.admitted(1.0, 1.3) == 3


async def test_calls_waiting_for_tokens_when_the_gate_narrows_queue_again() -> None:
    gov = Governor({"acme": PacingPolicy(rps=20, burst=1, max_concurrency=8)})
    await warm(gov, 0.01)
    in_flight = peak = 0

    async def call() -> None:
        nonlocal in_flight, peak
        async with gov.permit(["acme"]) as permit:
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(0.15)  # longer than the tokens' spacing
            in_flight -= 1
            permit.record_success(0.15)

    tasks = [asyncio.create_task(call()) for _ in range(4)]
    await asyncio.sleep(0)  # all four hold a slot of 8 and wait for their rate tokens
    gov.set_limit("acme", Limits(max_concurrency=1))  # as a learnt cap would narrow it
    await asyncio.gather(*tasks)
    assert peak == 1


async def test_a_full_gate_admits_the_oldest_work_first() -> None:
    gate = ResizableGate(1)
    await gate.acquire()
    order: list[str] = []

    async def waiter(name: str, priority: float) -> None:
        await gate.acquire(priority)
        order.append(name)
        gate.release()

    tasks = [
        asyncio.create_task(waiter(name, priority))
        for name, priority in (("newer chunk", 5.0), ("older chunk", 1.0), ("older, later", 1.0))
    ]
    await asyncio.sleep(0)
    gate.release()
    await asyncio.gather(*tasks)
    assert order == ["older chunk", "older, later", "newer chunk"]


async def test_the_governor_admits_the_rows_of_older_chunks_first() -> None:
    gov = Governor({"acme": PacingPolicy(rps=1000, burst=100, max_concurrency=1)})
    await warm(gov, 0.01)
    order: list[float] = []
    holder = gov.permit(["acme"])
    await holder.__aenter__()

    async def row(chunk_started: float) -> None:
        WORK_STARTED.set(chunk_started)
        async with gov.permit(["acme"]) as permit:
            order.append(chunk_started)
            permit.record_success(0.01)

    tasks = [asyncio.create_task(row(t)) for t in (30.0, 10.0, 20.0, 10.0)]
    await asyncio.sleep(0.01)
    await holder.__aexit__(None, None, None)
    await asyncio.gather(*tasks)
    assert order == [10.0, 10.0, 20.0, 30.0]


def run_clean(s: RateSearch, t: float, seconds: float) -> float:
    """Send at the rate in force for ``seconds``, every call accepted at once."""
    for _ in range(round(seconds * s.rate)):
        t += 1 / s.rate
        s.on_dispatch(t, backlogged=True)
        s.on_accepted(t, t, s.epoch)
    return t


def refused(s: RateSearch, t: float) -> float:
    t += 0.001
    s.on_dispatch(t, backlogged=True)
    s.on_rate_limited(t, t, s.epoch, 0.0)
    return t


def test_a_reprobe_that_finds_the_same_limit_doubles_the_hold() -> None:
    cfg = SearchConfig(jitter_fraction=0.0, hold_s=5.0, max_hold_s=20.0)
    s = RateSearch(100, 0.5, cfg)
    s.rate, s.upper = 59.0, 60.0
    t = run_clean(s, 1000.0, 1.5)  # settled: 59 proven, 60 drew a 429
    holds = [s.hold_in_force_s]
    for _ in range(3):
        while s.upper is not None and s.upper <= 60.0:
            t = run_clean(s, t, 0.5)  # held, then the bound is re-probed
        t = refused(s, t)  # the re-probe's 429: the limit is still 60
        holds.append(s.hold_in_force_s)
        s.rate, s.upper, s.lower = 59.0, 60.0, 59.0
    assert holds == [5.0, 10.0, 20.0, 20.0]  # doubling, up to max_hold_s
    # A re-probe that runs clean past the old bound: the limit went up, the hold resets.
    while s.upper is not None and s.upper <= 60.0:
        t = run_clean(s, t, 0.5)
    s.upper = 80.0
    run_clean(s, t, 3.0)
    assert s.lower is not None and s.lower > 60 and s.hold_in_force_s == 5.0


def test_after_a_proof_that_lied_rates_near_the_bound_take_longer_to_prove() -> None:
    cfg = SearchConfig(jitter_fraction=0.0, confirm_window_s=5.0)
    s = RateSearch(100, 0.5, cfg)
    s.rate, s.upper = 20.0, 22.0
    t = run_clean(s, 1000.0, 1.1)
    assert s.lower == 20.0  # an ordinary one-second proof, and the search moves on
    s.rate = 20.0
    t = refused(s, t)  # a 429 at 20, proven clean: a burst had hidden the limit
    assert s.noise == 1
    s.rate, s.lower, s.upper = 19.0, 19.0, 20.0  # cut, then searched below the 429
    t = run_clean(s, t + 1.0, 2.0)
    assert s.rate == 19.0 and s.lower == 19.0  # two clean seconds do not prove 19 of 20
    run_clean(s, t, 4.0)
    assert s.rate > 19.0
    far = RateSearch(100, 0.5, cfg)
    far._proofs_lied = True
    far.rate, far.upper = 16.0, 20.0
    run_clean(far, 1000.0, 1.1)
    assert far.rate > 16.0  # further below the bound: the ordinary one-second proof


async def test_a_provider_without_burst_is_paced_further_below_its_rate() -> None:
    strict = Governor({"acme": PacingPolicy(rps=20, burst=1)}, clock=Clock())
    roomy = Governor({"acme": PacingPolicy(rps=20, burst=4)}, clock=Clock())
    assert strict.snapshot()["acme"]["pacing_margin"] == 0.96
    assert roomy.snapshot()["acme"]["pacing_margin"] == 0.98


async def test_noise_429s_widen_the_margin_only_as_a_steady_share() -> None:
    clock = Clock()
    gov = Governor(
        {"acme": PacingPolicy(rps=20, burst=4, max_concurrency=8)},
        clock=clock,
        search=SearchConfig(jitter_fraction=0.0),
    )
    await warm(gov, 0.05)

    async def clean(calls: int) -> None:
        for _ in range(calls):
            clock.now += 0.05
            async with gov.permit(["acme"]) as permit:
                permit.record_success(0.05)

    async def refused() -> None:
        clock.now += 0.05
        async with gov.permit(["acme"]) as permit:
            permit.record_rate_limited(1.0)  # noise: calls left evenly, arrived bunched

    await clean(60)  # clean seconds at the catalog's rate: proven
    await refused()
    snap = gov.snapshot()["acme"]
    assert (snap["noise"], snap["rate_rps"]) == (1, 20)
    assert snap["pacing_margin"] == pytest.approx(0.98)  # one refusal moves nothing
    for _ in range(2):  # three within half a minute of ~200 calls: a steady share
        await clean(60)
        await refused()
    snap = gov.snapshot()["acme"]
    assert (snap["noise"], snap["rate_rps"]) == (3, 20)
    widened = snap["pacing_margin"]
    assert widened < 0.975
    clock.now += 16.0  # a clean quarter of a minute gives a step back
    await clean(1)
    assert gov.snapshot()["acme"]["pacing_margin"] == pytest.approx(widened + 0.01)


@pytest.mark.parametrize("stamped", [True, False])
def test_a_late_send_pushes_the_next_call_of_a_key_without_burst(stamped: bool) -> None:
    """A call that left late (stamped by the transport) spaces the next from then; a
    call path that does not stamp is spaced from its admission. On a virtual clock."""
    loop = VirtualLoop()
    gov = Governor({"acme": PacingPolicy(rps=20, burst=1, max_concurrency=8)}, clock=loop.time)

    async def two_calls() -> float:
        async with gov.permit(["acme"]) as permit:  # the first answer
            permit.record_success(0.01)
        async with gov.permit(["acme"]) as permit:
            admitted = loop.time()
            await asyncio.sleep(0.03)  # admitted on time, left 30 ms later
            if stamped:
                note_sending()
            permit.record_success(0.01)
        async with gov.permit(["acme"]) as permit:
            permit.record_success(0.01)
            return loop.time() - admitted

    try:
        gap = loop.run_until_complete(two_calls())
    finally:
        loop.close()
    interval = 1 / (20 * 0.96)  # the key's rate at its no-burst margin
    expected = 0.03 + interval if stamped else interval
    assert gap == pytest.approx(expected, abs=0.002)


def test_a_429_that_answers_a_raise_is_not_noise() -> None:
    s = RateSearch(100, 0.5, SearchConfig(jitter_fraction=0.0))
    s.rate, s.upper = 15.0, 15.2  # settled: 15 is proven below a 429 at 15.2
    t = run_clean(s, 1000.0, 1.5)
    assert s.lower == 15.0
    s.upper = 30.0  # as a re-probe raises it: the next clean window goes half way up
    while s.rate == 15.0:
        t = run_clean(s, t, 0.2)
    assert s.rate == 22.5
    refused(s, t + 0.01)  # the raise drew a 429 at once: mostly 15/s were sent in the span
    assert (s.noise, s.rate, s.lower) == (0, 15.0, 15.0)
    assert s.upper == pytest.approx(18.75)  # half way: the next try is in between


async def test_a_key_without_burst_spaces_the_next_call_from_its_first_answer() -> None:
    # The first call may reach the provider late (it opens the connection): a provider
    # without burst would refuse the next call on its token's time, so it waits an
    # interval from the first answer instead.
    gov = Governor({"acme": PacingPolicy(rps=10, burst=1, max_concurrency=8)})
    loop = asyncio.get_running_loop()
    async with gov.permit(["acme"]) as first:
        await asyncio.sleep(0.08)
        first.record_success(0.08)
        answered = loop.time()
    async with gov.permit(["acme"]):
        left = loop.time()
    assert left - answered >= 0.9 / (10 * 0.96)
