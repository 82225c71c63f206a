"""The governor against strict small-burst GCRA limits it does not know, simulated.

Every test runs the real :class:`~playline.pacing.governor.Governor` on a virtual clock
against a strict GCRA (:mod:`tests.gcra_sim`): deterministic, CPU-light, a minute of
calls in well under a second. The benchmark (``bench/governor.py --cells smallburst``)
measures the same against the real provider server.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from playline.pacing.fleet_store import LearnedLimit
from playline.pacing.governor import (
    MAX_TRIM,
    TRIM_SAMPLES,
    Governor,
    _note_departure,
    _spacing_rate,
)
from playline.pacing.policy import PacingPolicy
from tests.gcra_sim import SimProvider, simulate


@pytest.mark.parametrize(
    ("rate", "burst", "catalog"),
    [(60.0, 5, 100.0), (40.0, 3, 100.0), (25.0, 2, 100.0), (30.0, 4, 120.0)],
)
def test_an_unknown_small_burst_limit_is_found_and_filled(
    rate: float, burst: int, catalog: float
) -> None:
    run = simulate(rate=rate, burst=burst, catalog_rps=catalog, seconds=60, seed=3)
    assert run.utilization >= 0.93  # over the whole run, convergence included
    assert run.share_429 <= 0.01
    snap = run.snapshot
    assert snap["limit_source"] == "429 measurement"
    assert snap["learned_rps"] == pytest.approx(rate, rel=0.1)
    # Whole-second Retry-After were taken as bounds: short pauses, not a second each.
    assert run.governor._state("acme").search.short_pauses >= 1


def test_a_known_small_burst_limit_runs_clean_near_its_rate() -> None:
    run = simulate(rate=50.0, burst=3, catalog_rps=50.0, seconds=60, seed=1)
    assert run.utilization >= 0.95
    assert run.refused == 0
    assert run.snapshot["limit_source"] == "catalog"


def test_a_whole_second_retry_after_that_means_it_is_honoured() -> None:
    """A provider whose refusals last (a window that resets on the second) refuses the
    calls sent after a short pause: from then on its Retry-After is honoured whole."""

    class SecondWindow(SimProvider):
        def admit(self, now: float) -> float | None:
            second = int(now)
            used = sum(1 for t, s in self.calls if int(t) == second and s != 429)
            if used >= self.rate:
                self.calls.append((now, 429))
                return 1.0
            self.calls.append((now, 200))
            return None

    run = simulate(rate=20.0, burst=1, catalog_rps=60.0, seconds=20, provider=SecondWindow(20.0, 1))
    search = run.governor._state("acme").search
    assert search.retry_after_trusted
    assert run.share_429 <= 0.05


def test_a_sliding_window_is_not_taken_for_a_small_burst_gcra() -> None:
    """120 calls in any 2 s (a window: its refusals ask for 1-2 s and mean it): the
    search must not halve itself to the floor on short pauses (it did, measuring
    nothing across them)."""

    class SlidingLog(SimProvider):
        def admit(self, now: float) -> float | None:
            recent = [t for t, s in self.calls if s != 429 and t > now - 2.0]
            if len(recent) >= 120:
                self.calls.append((now, 429))
                return float(max(1, math.ceil(recent[0] + 2.0 - now)))
            self.calls.append((now, 200))
            return None

    run = simulate(rate=60.0, burst=5, catalog_rps=180.0, seconds=60, provider=SlidingLog(60.0, 5))
    assert run.utilization >= 0.8
    assert run.snapshot["search_rps"] >= 50.0
    assert run.share_429 <= 0.03


def test_a_second_run_starts_at_the_limit_the_first_learnt() -> None:
    first = simulate(rate=25.0, burst=2, catalog_rps=100.0, seconds=30, seed=2)
    snap = first.snapshot
    learned = snap["learned_rps"]
    assert learned is not None and learned < 100.0
    remembered = LearnedLimit("acme", learned, 100.0, snap["limit_source"], 60.0, 0.0)
    policy = PacingPolicy(rps=100.0, burst=2, min_rps=1, max_concurrency=64)

    def seeded(clock: object) -> Governor:
        gov = Governor({"acme": policy}, clock=clock)  # type: ignore[arg-type]
        assert gov.seed_learned("acme", remembered)
        return gov

    # (its first 1.5 s: later, the search probes a step above it, as after any settling)
    second = simulate(rate=25.0, burst=2, catalog_rps=100.0, seconds=1.5, seed=2, governor=seeded)
    # The first calls are spaced at the learnt rate, not the catalog's 100/s (10 ms), and
    # at most one is refused (the limit learnt may be a few % above the true one: the
    # search proves a rate paced with its margin, and a burst of 2 hides a little).
    gaps = second.first_gaps(20)[2:]  # after the first answer and the provider's burst
    assert min(gaps) >= 0.9 / learned
    assert second.refused <= 1
    assert second.snapshot["limit_source"] == "fleet store (429 measurement)"
    # without the memory, the same provider's first calls came at the catalog's rate
    assert min(first.first_gaps(20)[2:]) < 0.5 / learned


def test_a_learnt_limit_older_than_a_week_is_not_a_starting_point() -> None:
    gov = Governor({"acme": PacingPolicy(rps=100.0)})
    old = LearnedLimit("acme", 20.0, 100.0, "429 measurement", 8 * 86400.0, 0.0)
    assert not gov.seed_learned("acme", old)
    assert gov.snapshot()["acme"]["search_rps"] == 100.0
    fresh = LearnedLimit("acme", 20.0, 100.0, "429 measurement", 3600.0, 0.0)
    assert gov.seed_learned("acme", fresh)
    assert gov.snapshot()["acme"]["search_rps"] == 20.0
    assert gov.snapshot()["acme"]["limit_source"] == "fleet store (429 measurement)"


@pytest.mark.parametrize("catalog", [20.0, 40.0])
def test_a_burst_1_limit_is_filled_when_sends_are_stamped(catalog: float) -> None:
    """Burst 1 (a strict GCRA refuses any call sooner than an interval after the last):
    a call that leaves late pushes the next one when the call path stamps its sends,
    so late calls cost neither refusals nor margin."""
    noisy = {"late_share": 0.01, "stall_share": 0.01, "wire_late_share": 0.002}
    for seed in (1, 2):
        run = simulate(rate=20.0, burst=1, catalog_rps=catalog, seconds=60, seed=seed, **noisy)
        blind = simulate(
            rate=20.0, burst=1, catalog_rps=catalog, seconds=60, seed=seed, stamp=False, **noisy
        )
        assert run.utilization >= 0.93
        assert run.share_429 <= 0.01
        assert run.utilization > blind.utilization  # spaced from admission: late pairs


def test_noise_429s_on_a_loaded_machine_do_not_ratchet_the_margin() -> None:
    """Stalls now and then (a loaded machine) refuse a call now and then: the margin
    moves only for a steady share of them, so the run ends near its rate."""
    run = simulate(
        rate=55.0, burst=4, catalog_rps=110.0, seconds=60, seed=1, late_share=0.02, stall_share=0.03
    )
    assert run.snapshot["noise"] >= 1
    assert run.snapshot["pacing_margin"] >= 0.95
    assert run.utilization >= 0.95
    assert run.share_429 <= 0.01


def test_a_burst_1_key_admits_its_next_call_ahead_of_the_path_to_the_wire() -> None:
    """Every call spends 3 ms from its permit to the wire (a receipt, the request built):
    spaced from the last call's departure, the next call is admitted that much early,
    so the path is not added to every interval (it was: 0.90 of the rate here)."""
    run = simulate(rate=20.0, burst=1, catalog_rps=20.0, seconds=60, seed=1, path_s=0.003)
    assert run.utilization >= 0.95
    assert run.share_429 <= 0.01


def _no_burst_key() -> Any:
    governor = Governor({"acme": PacingPolicy(rps=20, burst=1)}, clock=lambda: 0.0)
    return governor._state("acme")


def test_a_no_burst_key_whose_calls_leave_late_is_spaced_faster_by_their_median_gap() -> None:
    """Calls that leave 4 % behind their spacing are never made up: after a full sample
    of such gaps the key is spaced half way (geometrically) faster, and not before."""
    state = _no_burst_key()
    paced = state.pace_rate(0.0)
    assert not any(_note_departure(state, 1.04) for _ in range(TRIM_SAMPLES - 1))
    assert state.trim == 1.0 and _spacing_rate(state, 0.0) == paced
    assert _note_departure(state, 1.04)
    assert state.trim == pytest.approx(math.sqrt(1.04))
    assert _spacing_rate(state, 0.0) == pytest.approx(paced * math.sqrt(1.04))
    # The next sample, now on time: the trim stands (it is what made them on time).
    assert not any(_note_departure(state, 1.0) for _ in range(TRIM_SAMPLES))
    assert state.trim == pytest.approx(math.sqrt(1.04))


def test_a_stall_now_and_then_does_not_make_a_no_burst_key_faster() -> None:
    """A median, not a mean: one long gap in a sample (the event loop stalled) moves
    nothing, where the sample's mean (1.028) would have sped the key up by 1.4 %."""
    state = _no_burst_key()
    gaps = [1.0] * (TRIM_SAMPLES - 1) + [1.45]
    assert not any(_note_departure(state, g) for g in gaps)
    assert state.trim == 1.0


def test_the_trim_stays_between_one_and_its_cap() -> None:
    """Calls that leave early bring a trimmed key back, never faster than its pace rate's
    interval; calls ever later never make it more than ``MAX_TRIM`` faster."""
    state = _no_burst_key()
    for _ in range(20):
        for _ in range(TRIM_SAMPLES):
            _note_departure(state, 1.3)
    assert state.trim == MAX_TRIM
    for _ in range(20):
        for _ in range(TRIM_SAMPLES):
            _note_departure(state, 0.9)
    assert state.trim == 1.0
