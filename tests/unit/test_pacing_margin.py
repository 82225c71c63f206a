"""The pacing margin follows the share of noise 429s, not each one (pure arithmetic)."""

from __future__ import annotations

import pytest

from playline.pacing.margin import MarginConfig, PacingMargin


def sent(margin: PacingMargin, start: float, calls: int, rate: float) -> float:
    t = start
    for _ in range(calls):
        t += 1 / rate
        margin.on_sent(t)
    return t


def test_an_isolated_refusal_moves_nothing() -> None:
    margin = PacingMargin(0.98)
    t = sent(margin, 0.0, 1000, 50.0)
    assert not margin.on_noise(t)
    t = sent(margin, t, 1000, 50.0)  # the next one 20 s later, among 1000 calls
    assert not margin.on_noise(t)
    assert margin.value == 0.98


def test_a_steady_share_widens_it_by_how_far_over_it_is() -> None:
    few, many = PacingMargin(0.98), PacingMargin(0.98)
    t = 0.0
    for _ in range(3):  # 3 refusals among 600 calls: 0.5 %, just over 0.4 %
        t = sent(few, t, 200, 20.0)
        few.on_noise(t)
    assert 0.97 < few.value < 0.98
    t = 0.0
    for _ in range(3):  # 3 among 60 calls: 5 %, far over: at most three steps
        t = sent(many, t, 20, 20.0)
        many.on_noise(t)
    assert many.value == pytest.approx(0.98 * 0.97)


def test_clean_periods_give_it_back_up_to_the_ceiling() -> None:
    margin = PacingMargin(0.93, MarginConfig(relax_s=15.0))
    margin.hold(0.0)
    assert not margin.relax(10.0)
    assert margin.relax(15.0) and margin.value == pytest.approx(0.94)
    assert margin.relax(30.0) and margin.value == pytest.approx(0.95)
    assert not margin.relax(45.0, ceiling=0.95)  # a key whose limit was learnt stops there
    assert margin.relax(45.0) and margin.value == pytest.approx(0.96)


def test_it_stays_within_its_floor() -> None:
    margin = PacingMargin(0.91)
    t = 0.0
    for _ in range(30):
        t = sent(margin, t, 10, 20.0)
        margin.on_noise(t)
    assert margin.value == 0.90
