"""Unit tests of the pure pacing arithmetic, on a controllable clock."""

from __future__ import annotations

import math

import pytest

from playline.pacing.gcra import gcra_take
from playline.pacing.measure import Ewma, little_width
from playline.pacing.search import RateLimitOutcome, RateSearch, SearchConfig


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def search(ceiling: float = 40.0, min_rps: float = 0.5, **config: float) -> RateSearch:
    """A search without jitter, so pauses are exact."""
    return RateSearch(ceiling, min_rps, SearchConfig(**{"jitter_fraction": 0.0, **config}))


def run_for(s: RateSearch, clock: FakeClock, seconds: float, rps: float) -> int:
    """Send at ``rps`` for ``seconds`` (every call accepted); return how many grew the rate."""
    grew = 0
    for _ in range(round(seconds * rps)):
        clock.advance(1 / rps)
        s.on_dispatch(clock())
        grew += s.on_accepted(clock(), clock(), s.epoch)
    return grew


def run_refused(s: RateSearch, clock: FakeClock, seconds: float, rps: float, admits: float) -> None:
    """Send at ``rps`` for ``seconds`` while the provider admits ``admits`` per second: the
    rest are refused, their 429s coming back after the epoch's cut (absorbed), the
    admitted calls' answers not yet."""
    taken = 0.0
    for _ in range(round(seconds * rps)):
        clock.advance(1 / rps)
        s.on_dispatch(clock())
        taken += admits / rps
        if taken >= 1:
            taken -= 1  # admitted: its answer is still on its way
        else:
            s.on_rate_limited(clock(), clock(), s.epoch - 1, 1.0)  # an earlier epoch's


def limited(s: RateSearch, clock: FakeClock, retry_after: float | None = 1.0) -> RateLimitOutcome:
    clock.advance(0.001)
    s.on_dispatch(clock())
    return s.on_rate_limited(clock(), clock(), s.epoch, retry_after)


# ---------------------------------------------------------------------- the limit search


def test_a_429_cuts_to_a_fraction_of_the_admitted_rate_not_the_attempted_one() -> None:
    clock = FakeClock()
    s = search(100)
    run_refused(s, clock, 2.0, 100, 60)  # the provider took 60 rps of the 100 sent
    absorbed = s.rate_limited
    assert limited(s, clock) is RateLimitOutcome.CUT
    assert s.rate == pytest.approx(0.9 * 60, rel=0.03)
    assert s.upper == pytest.approx(100, rel=0.03)
    assert s.rate_limited == absorbed + 1
    # Retry-After: 1 is a whole-second bound: a few intervals of the new rate instead
    assert s.pause_remaining(clock()) == pytest.approx(3 / s.rate)
    assert (s.cuts, s.pauses, s.short_pauses) == (1, 1, 1)


def test_a_whole_second_retry_after_is_honoured_once_a_short_pause_proved_it_meant() -> None:
    clock = FakeClock()
    s = search(100)
    run_for(s, clock, 2.0, 60)
    limited(s, clock)
    assert not s.retry_after_trusted
    clock.advance(s.pause_remaining(clock()))
    limited(s, clock)  # the first call after the short pause is refused: a real window
    assert s.retry_after_trusted
    assert s.pause_remaining(clock()) == pytest.approx(1.0)
    # a Retry-After that is not whole seconds, or long, is honoured whole from the start
    other = search(100)
    run_for(other, clock, 2.0, 60)
    limited(other, clock, retry_after=0.4)
    assert other.pause_remaining(clock()) == pytest.approx(0.4)


def test_a_429_too_early_to_measure_halves_the_rate() -> None:
    clock = FakeClock()
    s = search(100)
    run_for(s, clock, 0.1, 100)
    limited(s, clock)
    assert s.rate == 50
    assert s.upper == 100


def test_one_cut_per_burst_of_429s() -> None:
    clock = FakeClock()
    s = search(40)
    epoch = s.epoch
    s.on_dispatch(clock())
    assert s.on_rate_limited(clock(), clock(), epoch, None) is RateLimitOutcome.CUT
    for _ in range(5):  # the rest of the burst, dispatched before the cut
        assert s.on_rate_limited(clock(), clock(), epoch, None) is RateLimitOutcome.ABSORBED
    assert (s.rate, s.cuts, s.rate_limited) == (20, 1, 6)


def test_absorbed_429_extends_a_running_pause_to_its_retry_after() -> None:
    clock = FakeClock()
    s = search(40)
    epoch = s.epoch
    s.on_rate_limited(clock(), clock(), epoch, 1.0)
    s.on_rate_limited(clock(), clock(), epoch, 3.0)
    assert s.pause_remaining(clock()) == pytest.approx(3.0)
    clock.advance(4)
    s.on_rate_limited(clock(), clock(), epoch, 9.0)  # stale, and no pause running
    assert s.pause_remaining(clock()) == 0


def test_no_retry_after_pauses_briefly_and_jitter_is_bounded() -> None:
    clock = FakeClock()
    s = search(40)
    limited(s, clock, None)
    assert s.pause_remaining(clock()) == pytest.approx(0.25)
    jittered = RateSearch(40, 0.5, SearchConfig(jitter_fraction=0.1), rng=lambda: 0.999)
    jittered.on_rate_limited(clock(), clock(), 0, 3600.0)  # an hour: jitter is capped at 1 s
    assert 3600 < jittered.pause_remaining(clock()) < 3601


def test_clean_windows_search_between_the_bounds_then_hold() -> None:
    clock = FakeClock()
    s = search(100, hold_s=5.0)
    s.rate, s.upper, s.lower = 50.0, 60.0, None
    rates = []
    for _ in range(8):
        run_for(s, clock, 1.05, s.rate)
        rates.append(round(s.rate, 2))
    # half way up each clean window (50 -> 55 -> 57.5 -> 58.75), then it holds within 3 %
    assert rates[:3] == [55.0, 57.5, 58.75]
    assert s.lower == pytest.approx(58.75)
    assert rates[-1] == rates[-2] < 60
    run_for(s, clock, 6.0, s.rate)  # held long enough: the upper bound is re-probed
    assert s.upper == pytest.approx(63.0)
    assert s.rate > 58.75


def test_without_an_upper_bound_the_rate_grows_multiplicatively_to_the_ceiling() -> None:
    clock = FakeClock()
    s = search(100)
    s.rate = 10.0
    for expected in (15.0, 22.5, 33.75):
        run_for(s, clock, 1.2, s.rate)
        assert s.rate == pytest.approx(expected)


def test_an_idle_rate_earns_no_increase() -> None:
    """A key held back by its dispatch, not its limiter, learns nothing about the limit."""
    clock = FakeClock()
    s = search(100)
    s.rate = 40.0
    assert run_for(s, clock, 3.0, 10) == 0  # sending at a quarter of the rate
    assert s.rate == 40.0 and s.lower is None


def test_a_429_at_a_proven_rate_is_noise_once_then_the_limit_moved() -> None:
    clock = FakeClock()
    s = search(100)
    s.rate, s.upper = 60.0, 61.0
    run_for(s, clock, 1.05, 60)
    assert s.lower == 60
    assert limited(s, clock) is RateLimitOutcome.NOISE
    assert s.rate == 60 and s.lower == 60 and s.pause_remaining(clock()) > 0
    clock.advance(1.0)
    run_for(s, clock, 2.0, 40)  # the provider now only takes 40
    # A few refusals are jitter; a steady share of them means the limit moved down.
    outcomes = [limited(s, clock)]
    while outcomes[-1] is RateLimitOutcome.NOISE and len(outcomes) < 5:
        run_for(s, clock, 0.2, 40)  # refusals spread out (a clump's would count once)
        outcomes.append(limited(s, clock))
    assert outcomes[0] is RateLimitOutcome.NOISE and outcomes[-1] is RateLimitOutcome.CUT
    assert s.lower is None
    assert s.rate == pytest.approx(0.9 * 60)  # a step below the rate it had proven
    assert s.upper is not None and s.upper <= 60
    clock.advance(1.0)
    run_refused(s, clock, 2.0, s.rate, 40)
    limited(s, clock)  # now measured from what got through
    assert s.rate == pytest.approx(0.9 * 40, rel=0.05)


def test_two_429s_at_a_slow_proven_rate_are_jitter_three_are_a_limit() -> None:
    """At 20/s, early in a run, two refusals a second apart are more than 3 % of the
    calls sent; they are still a coincidence of jitter, a third is a steady share."""
    clock = FakeClock()
    s = search(20)
    run_for(s, clock, 1.5, 20)
    assert s.lower == 20
    outcomes = []
    for _ in range(3):
        outcomes.append(limited(s, clock))
        run_for(s, clock, 1.0, 20)
    assert outcomes == [RateLimitOutcome.NOISE, RateLimitOutcome.NOISE, RateLimitOutcome.CUT]
    assert s.rate == pytest.approx(0.9 * 20)


def test_a_429_among_few_refusals_while_sending_slower_than_the_rate_cuts_a_step() -> None:
    """A busy worker sends slower than its rate, and in clumps: a 429 then says the
    clump was too much, not that the limit is what little was sent."""
    clock = FakeClock()
    s = search(100)
    run_for(s, clock, 2.0, 60)  # 60 rps sent (the worker could do no more), all taken
    assert limited(s, clock) is RateLimitOutcome.CUT
    assert s.rate == pytest.approx(0.9 * 100)
    assert s.upper == pytest.approx(100)


def test_a_long_retry_after_learns_the_window_quota() -> None:
    clock = FakeClock()
    s = search(200)
    run_for(s, clock, 10.0, 100)  # 1000 calls accepted in 10 s, then the minute's quota is gone
    assert limited(s, clock, retry_after=40.0) is RateLimitOutcome.CUT
    assert s.rate == pytest.approx(1000 / 50, rel=0.01)  # its calls over its 50 s
    assert s.pause_remaining(clock()) == pytest.approx(40)


def test_floor_and_ceiling_bound_every_move() -> None:
    clock = FakeClock()
    s = search(40, min_rps=15)
    for _ in range(5):
        limited(s, clock, 0.0)
    assert s.rate == 15
    low = search(2, min_rps=5)  # a floor above the ceiling never raises the rate
    limited(low, clock, 0.0)
    assert low.rate == 2


def test_set_ceiling_replaces_the_learnt_rate_and_starts_a_new_epoch() -> None:
    clock = FakeClock()
    s = search(40)
    limited(s, clock)
    e = s.epoch
    s.set_ceiling(10, clock())
    assert (s.rate, s.ceiling_rps, s.epoch, s.upper, s.lower) == (10, 10, e + 1, None, None)


def test_adopt_clamps_and_bumps_the_epoch_only_when_lowering() -> None:
    s = search(40, min_rps=2)
    e = s.epoch
    assert s.adopt(20, 0.0)
    assert (s.rate, s.epoch) == (20, e + 1)
    assert s.adopt(80, 0.0)
    assert (s.rate, s.epoch) == (40, e + 1)
    assert s.adopt(0.1, 0.0)
    assert s.rate == 2
    assert s.adopt(2, 0.0) is False


# ---------------------------------------------------------------------- Little's law


def test_little_width() -> None:
    assert little_width(10, 0.25, cap=16) == 3  # ceil(2.5)
    assert little_width(50, 0.2, cap=16) == 10
    assert little_width(0.5, 0.1, cap=16) == 1  # floored at 1
    assert little_width(100, 5.0, cap=16) == 16  # capped
    assert little_width(100, 5.0, cap=0) == 1  # a nonsense cap still floors at 1
    assert little_width(10, float("nan"), cap=8) == 1
    assert little_width(10, 0.1, cap=8) == 1  # exactly 1.0, not ceil(1.0000000001)


# ---------------------------------------------------------------------- GCRA


def test_gcra_admits_burst_immediately_then_spaces_at_one_over_rps() -> None:
    clock = FakeClock()
    tat = -math.inf
    delays = []
    for _ in range(10):
        result = gcra_take(tat, clock(), rps=10, burst=4)
        tat = result.tat
        delays.extend(result.delays)
    assert delays[:4] == [0.0, 0.0, 0.0, 0.0]
    assert delays[4:] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])


def test_gcra_block_equals_single_tickets() -> None:
    clock = FakeClock()
    block = gcra_take(-math.inf, clock(), rps=10, burst=4, n=10)
    tat = -math.inf
    singles = []
    for _ in range(10):
        r = gcra_take(tat, clock(), rps=10, burst=4)
        tat = r.tat
        singles.extend(r.delays)
    assert block.delays == pytest.approx(tuple(singles))
    assert block.tat == pytest.approx(tat)


def test_gcra_window_bound_and_refill() -> None:
    """Over any window w, at most burst + rps*w tickets come due; idling refills the burst."""
    clock = FakeClock()
    rps, burst = 20.0, 5
    tat = -math.inf
    due: list[float] = []
    for _ in range(200):
        r = gcra_take(tat, clock(), rps, burst)
        tat = r.tat
        due.append(clock() + r.delays[0])
        clock.advance(0.001)
    for start in due:
        for w in (0.25, 1.0, 3.0):
            in_window = sum(1 for t in due if start <= t < start + w)
            assert in_window <= burst + rps * w + 1e-9
    # After idling long enough, a full burst is available again.
    clock.now = max(due) + burst / rps + 1
    r = gcra_take(tat, clock(), rps, burst, n=burst)
    assert r.delays == (0.0,) * burst


def test_gcra_pause_delays_everything_then_allows_one_burst() -> None:
    r = gcra_take(-math.inf, 100.0, rps=10, burst=3, n=5, paused_until=102.0)
    assert r.delays == pytest.approx((2.0, 2.0, 2.0, 2.1, 2.2))


def test_gcra_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        gcra_take(0, 0, rps=0, burst=1)
    with pytest.raises(ValueError):
        gcra_take(0, 0, rps=1, burst=0)


# ---------------------------------------------------------------------- EWMA


def test_ewma_prior_then_observations() -> None:
    e = Ewma(alpha=0.5, prior=0.25)
    assert (e.value, e.observed) == (0.25, None)
    e.observe(1.0)
    assert e.value == 1.0
    e.observe(0.0)
    assert e.value == 0.5
    e.observe(float("nan"))
    assert e.samples == 2


def test_a_clump_of_refusals_at_a_proven_rate_is_one_event_not_a_lower_limit() -> None:
    """A stalled sender lets several calls go at once and the provider refuses most of
    them: one clump, whatever its size, is noise; it takes spread refusals to cut."""
    clock = FakeClock()
    s = search(100)
    s.rate, s.upper = 20.0, 20.5
    run_for(s, clock, 1.2, 20)
    assert s.lower == 20
    outcomes = [limited(s, clock) for _ in range(4)]  # 1 ms apart: one clump
    assert set(outcomes) == {RateLimitOutcome.NOISE}
    assert (s.rate, s.lower) == (20.0, 20.0)
    assert s.log.refusal_events(clock() - 1, clock(), 0.1) == 1
