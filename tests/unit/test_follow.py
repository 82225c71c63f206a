"""What ``playline run`` shows while it follows a run: rows and credits made exact by
the dataset run's own state, the ETA, and the waits it announces."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from playline.cli.follow import eta_text, snapshot, wait_lines
from playline.contract import ChunkStats, DatasetRunState, PlayState, ProviderWait

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def child(rows_done: int, credits: float, **fields: object) -> DatasetRunState:
    return DatasetRunState(
        dataset="leads",
        rows_total=100,
        rows_done=rows_done,
        chunks_in_flight=1,
        stats=ChunkStats(credits=credits),
        **fields,  # type: ignore[arg-type]
    )


def test_the_dataset_runs_own_state_replaces_the_plays_older_copy_of_it() -> None:
    state = PlayState(
        play="p",
        phase="running leads",
        status="running",
        rows_total=150,
        rows_done=60,
        credits=12.0,
        current=child(10, 2.0),
    )
    shot = snapshot(state, child(25, 7.5), [])
    # 50 rows and 10 credits from datasets before this one, then this one's latest.
    assert (shot.done, shot.total, shot.credits, shot.waiting) == (75, 150, 17.5, False)
    assert snapshot(state, None, []).done == 60
    assert snapshot(state, None, ["waiting: budget"]).waiting


def test_eta_from_the_rate_and_waiting_instead_of_a_guess() -> None:
    assert eta_text(40, 100, 2.0, waiting=False) == "ETA 30s"
    assert eta_text(0, 100, 1 / 90, waiting=False) == "ETA 2h30m"
    assert eta_text(10, 100, 1.0, waiting=False) == "ETA 1m30s"
    assert eta_text(10, 100, None, waiting=False) == "ETA -"
    assert eta_text(10, 100, 5.0, waiting=True) == "ETA - (waiting)"


def test_each_wait_is_one_line_saying_what_for_and_until_when() -> None:
    budget = "budget: 20 of 20 credits spent; `playline runs budget r1 --add N` to go on"
    quota = ProviderWait(provider="acme", until=NOW + timedelta(minutes=5), reason="acme quota")
    past = ProviderWait(provider="firmo", until=NOW - timedelta(seconds=1), reason="firmo quota")
    state = PlayState(play="p", status="waiting", budget_wait=budget)
    assert wait_lines(state, child(3, 20.0, budget_wait=budget), NOW, "r1") == [
        f"waiting: {budget}"
    ]
    running = PlayState(play="p", status="running")
    assert wait_lines(running, child(3, 1.0, waits=[quota, past]), NOW, "r1") == [
        "waiting for acme quota until 12:05:00 UTC"
    ]
    paused = PlayState(play="p", status="paused", paused=True)
    assert wait_lines(paused, None, NOW, "r1") == ["paused: `playline runs resume r1` to go on"]
    assert wait_lines(running, child(3, 1.0), NOW, "r1") == []
    ended = PlayState(play="p", status="completed", budget_wait=budget)
    assert wait_lines(ended, None, NOW, "r1") == []
