"""Reading what providers say about their limits, and spending it as a budget."""

from __future__ import annotations

import email.utils

import pytest

from playline.pacing.budget import HeaderBudget, WindowCap
from playline.pacing.headers import QuotaReport, RateLimitReport, parse_rate_limit

NOW = 1_800_000_000.0


def test_x_ratelimit_with_delta_or_epoch_reset() -> None:
    delta = parse_rate_limit(
        {"X-RateLimit-Limit": "100", "X-RateLimit-Remaining": "7", "X-RateLimit-Reset": "30"},
        now_wall=NOW,
    )
    assert delta.quotas == (QuotaReport("", 100, 7, 30.0),)
    epoch = parse_rate_limit(
        {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(NOW + 90))}, now_wall=NOW
    )
    assert epoch.quotas[0].reset_s == pytest.approx(90)
    assert epoch.quotas[0].limit is None


def test_ietf_drafts_old_dictionary_and_list_forms() -> None:
    old = parse_rate_limit(
        {
            "RateLimit-Limit": "60",
            "RateLimit-Remaining": "12",
            "RateLimit-Reset": "5",
            "RateLimit-Policy": "60;w=60",
        },
        now_wall=NOW,
    )
    assert old.quotas == (QuotaReport("", 60, 12, 5.0, 60.0),)
    dictionary = parse_rate_limit({"RateLimit": "limit=100, remaining=50, reset=30"}, now_wall=NOW)
    assert dictionary.quotas == (QuotaReport("", 100, 50, 30.0),)
    listed = parse_rate_limit(
        {
            "RateLimit": '"minute";r=50;t=30, "day";r=900;t=40000',
            "RateLimit-Policy": '"minute";q=100;w=60, "day";q=1000;w=86400',
        },
        now_wall=NOW,
    )
    assert listed.quotas == (
        QuotaReport("minute", 100, 50, 30.0, 60.0),
        QuotaReport("day", 1000, 900, 40000.0, 86400.0),
    )


def test_retry_after_as_seconds_or_http_date_and_garbage_ignored() -> None:
    assert parse_rate_limit({"Retry-After": "2.5"}, now_wall=NOW).retry_after_s == 2.5
    date = email.utils.formatdate(NOW + 120, usegmt=True)
    assert parse_rate_limit({"Retry-After": date}, now_wall=NOW).retry_after_s == 120
    junk = parse_rate_limit(
        {"Retry-After": "soon", "X-RateLimit-Remaining": "-3", "X-RateLimit-Reset": "x"},
        now_wall=NOW,
    )
    assert junk.empty


def test_window_cap_is_a_sliding_log() -> None:
    cap = WindowCap(3, 10.0)
    for t in (0.0, 1.0, 2.0):
        assert cap.available_at(t) == t
        cap.take(t)
    assert cap.available_at(5.0) == 10.0  # the oldest leaves the window at 10
    assert cap.available_at(10.0) == 10.0
    assert cap.even_rps == 0.3
    assert WindowCap(100, 3600.0).even_rps is None  # an hour is not spread evenly


def test_header_budget_spends_evenly_and_blocks_when_spent() -> None:
    budget = HeaderBudget()
    # 10 left for 5 s; two calls sent since were probably not counted yet.
    budget.observe(RateLimitReport((QuotaReport("", 100, 10, 5.0),)), 0.1, unseen=2)
    assert budget.rate(0.1) == pytest.approx(8 / 5.0)  # reset 5 s after the answer came
    for _ in range(8):
        budget.on_dispatch(1.0)
    assert budget.blocked_until(1.0) == pytest.approx(5.1)
    assert budget.rate(1.0) is None
    # After the reset the window's limit over its length is the guide.
    assert budget.rate(6.0) == pytest.approx(100 / 5.0)
    assert budget.blocked_until(6.0) is None


def test_a_window_of_known_length_is_spent_at_least_at_its_sustained_rate() -> None:
    """A sliding window's reset is rounded up to whole seconds: remaining / reset undershoots."""
    budget = HeaderBudget(reserve=4)
    budget.observe(RateLimitReport((QuotaReport("s", 40, 6, 1.0, 2.0),)), 0.0)
    assert budget.rate(0.0) == pytest.approx(20.0)  # 40 per 2 s, not 6 per 1 s
    budget.on_dispatch(0.01)
    budget.on_dispatch(0.01)
    budget.on_dispatch(0.01)  # 3 left, under the reserve: slower in proportion
    assert budget.rate(0.01) == pytest.approx(20.0 * 3 / 4)
    for _ in range(3):
        budget.on_dispatch(0.02)
    assert budget.blocked_until(0.02) == pytest.approx(1.0)  # but never past what is left


def test_a_newer_report_replaces_the_older() -> None:
    budget = HeaderBudget()
    budget.observe(RateLimitReport((QuotaReport("", 10, 9, 1.0),)), 0.1)
    budget.observe(RateLimitReport((QuotaReport("", 10, 4, 1.0),)), 0.2)
    assert budget.rate(0.2) == pytest.approx(4 / 1.0)


def test_a_long_quota_is_not_spread_but_still_blocks() -> None:
    budget = HeaderBudget()
    budget.observe(RateLimitReport((QuotaReport("day", 600, 0, 40000.0, 86400.0),)), 0.0)
    assert budget.rate(0.0) is None
    assert budget.blocked_until(0.0) == 40000.0


def test_a_refused_call_gives_its_window_slot_back() -> None:
    cap = WindowCap(2, 60.0)
    cap.take(1.0)
    cap.take(2.0)
    assert cap.available_at(3.0) == 61.0
    cap.refund(2.0)  # the provider answered 429: it did not count the call
    assert cap.available_at(3.0) == 3.0
    cap.refund(99.0)  # unknown: nothing happens
    assert cap.used(3.0) == 1
