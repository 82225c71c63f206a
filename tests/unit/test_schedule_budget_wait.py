"""A scheduled firing's budget wait is bounded by the next firing, and ``describe`` says so."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from playline.cli.schedule import _print_view
from playline.config import Settings
from playline.contract import BudgetHold, RunOptions
from playline.schedules import ScheduleView, _shortest_gap, scheduled_options
from playline.workflows.status import budget_wait_message


def test_a_firing_waits_for_budget_at_most_until_just_before_the_next_one() -> None:
    weekly = scheduled_options("weekly", RunOptions(max_credits=5), timedelta(days=7))
    assert weekly.budget_wait_s == (timedelta(days=7) - timedelta(minutes=5)).total_seconds()
    fast = scheduled_options("fast", RunOptions(max_credits=5), timedelta(seconds=10))
    assert fast.budget_wait_s == 9.0  # a tenth of a short gap
    assert scheduled_options("none", None).budget_wait_s is None
    # A cron's firings: the shortest gap bounds every wait (Friday to Monday is longer).
    monday = datetime(2026, 12, 7, 6, tzinfo=UTC)
    times = [monday + timedelta(days=d) for d in (0, 1, 2, 3, 4, 7)]
    assert _shortest_gap(times) == timedelta(days=1)
    assert _shortest_gap(times[:1]) is None


def test_the_wait_message_says_until_when(capsys) -> None:  # type: ignore[no-untyped-def]
    hold = BudgetHold(budget="run", limit=2, used=2, rows=4, spent=2)
    until = datetime(2026, 12, 6, 12, 0, 15, tzinfo=UTC)
    said = budget_wait_message(hold, "sched-a-2026-12-06T12:00:00Z", until)
    assert "waiting for budget until 2026-12-06 12:00:15 UTC (the next firing)" in said
    assert "waiting for budget until" not in budget_wait_message(hold, "p")
    view = ScheduleView(
        name="sched-a",
        play="t_tool_column",
        spec="every 15s",
        overlap="skip",
        pause_on_failure=True,
        paused=False,
        running=["sched-a-2026-12-06T12:00:00Z"],
        budget_waits={"sched-a-2026-12-06T12:00:00Z": "waiting for budget until X: " + said},
    )
    _print_view(view, Settings.from_env())
    out = capsys.readouterr().out
    assert "sched-a-2026-12-06T12:00:00Z: waiting for budget until X" in out
