"""Unit tests of the pure pacing arithmetic, on a controllable clock."""

from __future__ import annotations

import math

import pytest

from playline.pacing.aimd import (
    AimdConfig,
    AimdController,
    Ewma,
    RateLimitOutcome,
    little_width,
)
from playline.pacing.gcra import gcra_take


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def controller(ceiling: float = 40.0, min_rps: float = 0.5, **config: float) -> AimdController:
    """A controller without jitter, so pauses are exact."""
    return AimdController(ceiling, min_rps, AimdConfig(**{"jitter_fraction": 0.0, **config}))


def succeed_window(c: AimdController, clock: FakeClock) -> bool:
    """Feed one full window of successes at the current epoch; return whether the rate grew."""
    clock.advance(c.config.window_s)
    grew = False
    for _ in range(math.ceil(c.rate * c.config.window_s)):
        grew = c.on_success(clock(), c.epoch) or grew
    return grew


# ---------------------------------------------------------------------- AIMD


def test_first_429_halves_the_rate_and_pauses() -> None:
    clock = FakeClock()
    c = controller(40)
    assert c.rate == 40
    outcome = c.on_rate_limited(clock(), c.epoch, retry_after_s=None)
    assert outcome is RateLimitOutcome.CUT
    assert c.rate == 20
    assert c.pause_remaining(clock()) == pytest.approx(1.0)  # default pause
    assert (c.cuts, c.pauses, c.rate_limited) == (1, 1, 1)


def test_one_cut_per_burst_of_429s() -> None:
    clock = FakeClock()
    c = controller(40)
    dispatched_at = c.epoch
    # Ten calls were on the wire when the provider started refusing.
    outcomes = [c.on_rate_limited(clock(), dispatched_at, None) for _ in range(10)]
    assert outcomes.count(RateLimitOutcome.CUT) == 1
    assert c.rate == 20
    assert (c.cuts, c.pauses, c.rate_limited) == (1, 1, 10)
    # A late 429 from the same burst, after the pause ended: still no new cut.
    clock.advance(5)
    assert c.on_rate_limited(clock(), dispatched_at, None) is RateLimitOutcome.ABSORBED
    assert c.rate == 20
    assert c.pause_remaining(clock()) == 0
    # A 429 of a call dispatched after the cut is a new burst.
    assert c.on_rate_limited(clock(), c.epoch, None) is RateLimitOutcome.CUT
    assert c.rate == 10
    assert c.cuts == 2


def test_absorbed_429_extends_a_running_pause_to_its_retry_after() -> None:
    clock = FakeClock()
    c = controller(40)
    epoch = c.epoch
    c.on_rate_limited(clock(), epoch, retry_after_s=1.0)
    clock.advance(0.5)
    c.on_rate_limited(clock(), epoch, retry_after_s=3.0)
    assert c.pause_remaining(clock()) == pytest.approx(3.0)
    assert (c.cuts, c.pauses) == (1, 1)


def test_retry_after_pause_is_honoured_and_capped() -> None:
    clock = FakeClock()
    c = controller(40, max_pause_s=30.0)
    c.on_rate_limited(clock(), c.epoch, retry_after_s=7.5)
    assert c.pause_remaining(clock()) == pytest.approx(7.5)
    clock.advance(7.5)
    assert c.pause_remaining(clock()) == 0
    c.on_rate_limited(clock(), c.epoch, retry_after_s=3600)
    assert c.pause_remaining(clock()) == pytest.approx(30.0)
    # Nonsense Retry-After values fall back to the default pause.
    clock.advance(31)
    c.on_rate_limited(clock(), c.epoch, retry_after_s=-4)
    assert c.pause_remaining(clock()) == pytest.approx(1.0)


def test_pause_jitter_is_bounded() -> None:
    clock = FakeClock()
    c = AimdController(40, 0.5, AimdConfig(jitter_fraction=0.1), rng=lambda: 0.999)
    c.on_rate_limited(clock(), c.epoch, retry_after_s=10)
    assert 10.0 < c.pause_remaining(clock()) < 11.0


def test_floor_is_respected() -> None:
    clock = FakeClock()
    c = controller(40, min_rps=3)
    for _ in range(10):
        c.on_rate_limited(clock(), c.epoch, None)
    assert c.rate == 3
    assert c.cuts == 10


def test_floor_above_ceiling_never_raises_the_rate() -> None:
    c = controller(0.2, min_rps=0.5)
    assert c.rate == 0.2
    c.on_rate_limited(0.0, c.epoch, None)
    assert c.rate == 0.2


def test_additive_increase_per_window_up_to_ceiling() -> None:
    clock = FakeClock()
    c = controller(100)
    for _ in range(3):
        c.on_rate_limited(clock(), c.epoch, None)
    assert c.rate == 12.5
    assert c.step_rps == 5.0  # 5 % of the ceiling (> the 1 rps floor)
    assert succeed_window(c, clock)
    assert c.rate == 17.5
    for _ in range(100):
        succeed_window(c, clock)
    assert c.rate == 100
    assert c.on_success(clock(), c.epoch) is False  # at the ceiling: no more growth


def test_increase_step_has_a_floor_of_one_rps() -> None:
    clock = FakeClock()
    c = controller(8)
    c.on_rate_limited(clock(), c.epoch, None)
    assert c.rate == 4
    assert succeed_window(c, clock)
    assert c.rate == 5


def test_no_increase_on_many_successes_within_one_second() -> None:
    clock = FakeClock()
    c = controller(100)
    c.on_rate_limited(clock(), c.epoch, None)
    for _ in range(500):
        assert c.on_success(clock(), c.epoch) is False
    clock.advance(1.0)
    assert c.on_success(clock(), c.epoch) is True  # now the window has both time and count


def test_no_increase_on_too_few_successes() -> None:
    clock = FakeClock()
    c = controller(100)
    c.on_rate_limited(clock(), c.epoch, None)
    clock.advance(10.0)
    # rate 50 x window 1 s: 50 successes make a window.
    assert [c.on_success(clock(), c.epoch) for _ in range(50)] == [False] * 49 + [True]


def test_successes_from_before_the_cut_do_not_count() -> None:
    clock = FakeClock()
    c = controller(100)
    old = c.epoch
    c.on_rate_limited(clock(), old, None)
    clock.advance(10)
    for _ in range(1000):
        assert c.on_success(clock(), old) is False
    assert c.rate == 50


def test_set_ceiling_replaces_the_learnt_rate_and_starts_a_new_epoch() -> None:
    clock = FakeClock()
    c = controller(40)
    old = c.epoch
    c.on_rate_limited(clock(), old, None)
    c.set_ceiling(5, clock())
    assert (c.ceiling_rps, c.rate) == (5, 5)
    assert c.epoch == old + 2  # one for the cut, one for the new limit
    assert c.on_rate_limited(clock(), old, None) is RateLimitOutcome.ABSORBED


def test_adopt_clamps_and_bumps_the_epoch_only_when_lowering() -> None:
    c = controller(40, min_rps=2)
    e = c.epoch
    assert c.adopt(10, 0.0)
    assert (c.rate, c.epoch) == (10, e + 1)
    assert c.adopt(1000, 0.0)
    assert (c.rate, c.epoch) == (40, e + 1)
    assert c.adopt(0.1, 0.0)
    assert c.rate == 2
    assert c.adopt(2, 0.0) is False


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


# ---------------------------------------------------- probing near the learnt limit


def test_a_cut_records_the_achieved_rate_as_the_limit_estimate() -> None:
    clock = FakeClock()
    c = controller(1000)
    for _ in range(200):  # the provider let 200 calls through in the last second
        c.on_success(clock(), c.epoch)
    assert c.on_rate_limited(clock(), c.epoch, retry_after_s=None) is RateLimitOutcome.CUT
    assert c.limit_estimate == pytest.approx(200)
    assert c.rate == 500  # the multiplicative cut itself is unchanged


def test_growth_is_full_below_the_knee_gentle_near_the_estimate_full_beyond() -> None:
    clock = FakeClock()
    c = controller(1000)  # full step: 5 % of the ceiling = 50 rps
    c.limit_estimate = 200.0
    c.rate = 100.0
    assert succeed_window(c, clock) and c.rate == pytest.approx(150)  # full step
    assert succeed_window(c, clock) and c.rate == pytest.approx(180)  # stops at the knee
    assert succeed_window(c, clock) and c.rate == pytest.approx(182)  # 1 % of the estimate
    c.rate = 225.0  # past estimate / 0.9: the limit has moved, probe fast again
    assert succeed_window(c, clock) and c.rate == pytest.approx(275)


def test_an_idle_rate_earns_no_increase() -> None:
    """A key held back by its dispatch, not its limiter, learns nothing about the limit."""
    clock = FakeClock()
    c = controller(100)
    c.rate = 20.0
    needed = math.ceil(c.rate * c.config.window_s)
    clock.advance(c.config.window_s)
    for _ in range(needed // 2):
        c.on_success(clock(), c.epoch)
    clock.advance(2 * c.config.window_s)  # half the window's successes are now old
    grew = any(c.on_success(clock(), c.epoch) for _ in range(needed - needed // 2))
    assert not grew and c.rate == 20.0
    assert succeed_window(c, clock)  # a busy window does earn it


def test_set_ceiling_forgets_the_limit_estimate() -> None:
    c = controller(1000)
    c.limit_estimate = 200.0
    c.set_ceiling(300, FakeClock()())
    assert c.limit_estimate is None
