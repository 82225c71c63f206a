"""The concurrency search: a provider's cap on calls in flight, learnt from its 429s.

Pure logic on a fake clock; the governor's use of it is in ``test_governor.py``.
"""

from __future__ import annotations

import pytest

from playline.pacing.concurrency import ConcurrencyConfig, ConcurrencySearch, Refusal


def succeed(s: ConcurrencySearch, now: float, widths: range | list[int], times: int = 1) -> None:
    for _ in range(times):
        for width in widths:
            s.on_success(now, width)


def test_a_429_wider_than_any_success_is_a_cap_and_the_limit_goes_just_under_it() -> None:
    s = ConcurrencySearch(24)
    succeed(s, 0.0, range(1, 9), times=3)
    assert s.classify(9, retry_after=False) is Refusal.CONCURRENCY
    assert s.on_refused(0.0, 9)
    assert (s.limit, s.cap) == (8, 8)
    # The calls already on the wire at 10 and 11 are refused too: nothing new.
    assert not s.on_refused(0.0, 10)
    assert not s.on_refused(0.0, 11)
    assert (s.limit, s.cap) == (8, 8)


def test_a_429_at_a_width_that_works_is_about_the_rate() -> None:
    s = ConcurrencySearch(64)
    succeed(s, 0.0, range(1, 13), times=5)
    assert s.classify(7, retry_after=True) is Refusal.RATE
    assert s.classify(12, retry_after=False) is Refusal.RATE
    assert s.classify(1, retry_after=False) is Refusal.RATE  # alone: never a cap


def test_a_first_refusal_with_retry_after_is_either_then_concurrency_when_repeated() -> None:
    s = ConcurrencySearch(16)
    succeed(s, 0.0, range(1, 5), times=3)
    assert s.classify(5, retry_after=True) is Refusal.EITHER
    s.remember(0.0, 5)
    assert s.limit == 16  # a rate limit's refusals land anywhere: no narrowing yet
    assert s.classify(7, retry_after=True) is Refusal.EITHER
    assert s.classify(5, retry_after=True) is Refusal.EITHER  # twice: could be a rate still
    s.remember(0.0, 5)
    assert s.classify(5, retry_after=True) is Refusal.CONCURRENCY  # the same width again
    for _ in range(5):
        s.remember(0.0, 2)
    assert s.classify(2, retry_after=True) is Refusal.EITHER  # two in flight: never a cap


def test_a_width_is_proven_only_by_clearly_more_successes_than_refusals() -> None:
    s = ConcurrencySearch(16, ConcurrencyConfig(proof_successes=3, proof_ratio=4.0))
    succeed(s, 0.0, [5], times=2)
    assert not s.proven(5)  # two successes are not enough
    succeed(s, 0.0, [6], times=2)
    assert s.proven(5)  # four at 5 or wider
    for _ in range(2):
        s.on_refused(0.0, 6)
    assert not s.proven(6)  # a couple of lucky successes do not outweigh the refusals


def test_a_clean_cap_is_probed_one_wider_and_a_refused_probe_doubles_the_wait() -> None:
    cfg = ConcurrencyConfig(probe_after_s=5.0, probe_latencies=4.0, max_probe_after_s=20.0)
    s = ConcurrencySearch(32, cfg)
    s.on_refused(0.0, 9)
    assert not s.tick(4.9, latency_s=0.1)
    assert s.tick(5.0, latency_s=0.1)
    assert (s.limit, s.probing) == (9, True)
    s.on_refused(5.1, 9)  # the cap is still 8
    assert (s.limit, s.cap, s.probing) == (8, 8, False)
    assert s.probe_wait_s(0.1) == 10.0
    assert not s.tick(15.0, latency_s=0.1)
    assert s.tick(15.1, latency_s=0.1)
    s.on_refused(15.2, 9)
    assert s.probe_wait_s(0.1) == 20.0
    s.tick(35.2, latency_s=0.1)
    s.on_refused(35.3, 9)
    assert s.probe_wait_s(0.1) == 20.0  # capped
    assert s.probe_wait_s(4.0) == 20.0


def test_the_probe_waits_for_several_times_the_latency_of_a_slow_provider() -> None:
    s = ConcurrencySearch(32, ConcurrencyConfig(probe_after_s=5.0, probe_latencies=4.0))
    s.on_refused(0.0, 17)
    assert not s.tick(10.0, latency_s=4.0)  # 4 x 4 s
    assert s.tick(16.0, latency_s=4.0)
    s.on_refused(16.1, 17)
    assert s.probe_wait_s(4.0) == 32.0  # the doubling starts from the latency's wait


def test_a_successful_probe_raises_the_cap_and_grows_fast_to_the_new_one() -> None:
    s = ConcurrencySearch(40)
    s.on_refused(0.0, 5)  # a bad minute: the provider took 4
    assert s.limit == 4
    s.tick(10.0, latency_s=0.5)
    assert s.limit == 5
    widths = []
    now = 10.0
    while s.limit < 20:
        now += 0.5
        s.on_success(now, s.limit)  # the provider takes it: a call at the top succeeded
        widths.append(s.limit)
    assert widths == [6, 8, 12, 20]  # 1, 2, 4, 8 wider
    s.on_refused(now, 17)  # the provider's cap is 16 now
    assert (s.limit, s.cap, s.probing) == (16, 16, False)
    assert s.probe_wait_s(0.1) == s.config.probe_after_s  # a new cap: probed again soon


def test_growth_stops_at_the_ceiling_and_forgets_the_cap() -> None:
    s = ConcurrencySearch(6)
    s.on_refused(0.0, 4)
    s.tick(10.0, latency_s=0.1)
    for _ in range(4):
        s.on_success(11.0, s.limit)
    assert (s.limit, s.cap, s.probing) == (6, None, False)
    assert not s.tick(100.0, latency_s=0.1)  # nothing to probe: the ceiling is in force


def test_a_cap_that_drops_is_followed_at_once() -> None:
    s = ConcurrencySearch(32)
    s.on_refused(0.0, 13)
    assert s.limit == 12
    assert s.on_refused(1.0, 7)  # now it takes 6
    assert (s.limit, s.cap) == (6, 6)


def test_evidence_fades_so_a_width_refused_long_ago_can_be_proven_again() -> None:
    s = ConcurrencySearch(16, ConcurrencyConfig(memory_s=10.0))
    s.on_success(0.0, 1)
    for _ in range(8):
        s.on_refused(0.0, 5)
    succeed(s, 1.0, [5], times=3)
    assert not s.proven(5)
    succeed(s, 35.0, [5], times=4)  # three halvings later: 1 refusal against 4 successes
    assert s.proven(5)


def test_reset_forgets_everything() -> None:
    s = ConcurrencySearch(16)
    s.on_refused(0.0, 3)
    s.reset(10)
    assert (s.limit, s.cap, s.ceiling, s.probing) == (10, None, 10, False)
    with pytest.raises(ValueError):
        s.reset(0)
    with pytest.raises(ValueError):
        ConcurrencySearch(0)
    with pytest.raises(ValueError):
        ConcurrencyConfig(max_probe_after_s=1.0, probe_after_s=5.0)
