"""A dataset run's outstanding work end to end: parked rows survive a pause and
continue-as-new, and progress never counts a row twice.

The provider server gives acme a small quota per 20-second window (a daily quota in
miniature, see tests/e2e/test_parking.py): the rows it cannot take before the reset
are parked and the run waits for the reset on a durable timer. The work left (rows
never started, ranges to redo, ranges parked) is one state the run carries; it
completes only when that is empty.

* F1: a play paused while its run waits for the reset stays paused after the reset
  with the parked rows still to do (it used to end "completed" with them never run,
  or continue as new without them); resumed, it finishes every row;
* F23: a redone range counts only its parked rows, so the progress the run and the
  play report never exceeds the total (it used to count a redone range again).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.service import RPCError

from playline import search_attributes as sa
from playline.contract import ControlState, DatasetRunState, PlayRunResult, PlayState, RunOptions
from tests.conftest import new_id
from tests.plays import export_rows, lead, read_csv_rows, write_csv

T = TypeVar("T")

WINDOW_S = 20


def quota_and_leads(provider: Any, tmp_path: Path, *, quota: int, rows: int) -> Path:
    """acme allows ``quota`` calls per window; a CSV of ``rows`` leads to spend it on."""
    provider.configure(
        limiters={"acme": [{"kind": "quota", "limit": quota, "window_s": WINDOW_S}]},
        retry_after="ceil",
    )
    return write_csv(tmp_path / "leads.csv", [lead(n) for n in range(rows)])


async def near_a_window_start() -> None:
    """The provider's quota windows are aligned to the clock: start near one's beginning,
    so the reset is well beyond the 3 s heartbeat budget when the quota runs out."""
    phase = time.time() % WINDOW_S
    if phase > 2:
        await asyncio.sleep(WINDOW_S - phase + 0.05)


async def eventually(
    probe: Callable[[], Awaitable[T]], ok: Callable[[T], bool], what: str, timeout_s: float = 90
) -> T:
    """Poll ``probe`` until ``ok`` holds; a workflow not started yet (or between two runs
    of a continue-as-new) counts as not yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = await probe()
        except (RPCError, WorkflowQueryFailedError):
            pass
        else:
            if ok(value):
                return value
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.2)


class Progress:
    """Every progress the run and its play show while the play runs (polled), and the
    progress reports the run sent the play (read from the play's history)."""

    def __init__(self, client: Client, play: WorkflowHandle[Any, Any], run_id: str) -> None:
        self.client, self.play = client, play
        self.run = client.get_workflow_handle(run_id)
        self.seen: list[tuple[str, int, int]] = []  # (who, done, total)
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Progress:
        self._task = asyncio.ensure_future(self._poll())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _poll(self) -> None:
        while True:
            for who, probe in (("run", self.run_state), ("play", self.play_state)):
                try:
                    state = await probe()
                except (RPCError, WorkflowQueryFailedError):
                    continue
                self.seen.append((who, state.rows_done, state.rows_total))
            await asyncio.sleep(0.25)

    async def run_state(self) -> DatasetRunState:
        return await self.run.query("state", result_type=DatasetRunState)

    async def play_state(self) -> PlayState:
        return await self.play.query("state", result_type=PlayState)

    async def reports(self) -> list[DatasetRunState]:
        """The ``playline.progress`` signals in the play's history, decoded."""
        found = []
        async for event in self.play.fetch_history_events():
            if event.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                continue
            signal = event.workflow_execution_signaled_event_attributes
            if signal.signal_name == "playline.progress":
                [state] = await self.client.data_converter.decode(
                    signal.input.payloads, [DatasetRunState]
                )
                found.append(state)
        return found

    async def assert_never_beyond(self, total: int) -> None:
        """Nothing shown or reported counted more rows than there are; at the end, all."""
        assert self.seen, "the progress was never seen"
        # (A play shows a total of 0 until its run is prepared.)
        beyond = [s for s in self.seen if s[1] > s[2] or s[2] not in (0, total)]
        assert not beyond, beyond[:5]
        reports = await self.reports()
        assert reports, "the run sent the play no progress report"
        assert all(r.rows_done <= r.rows_total == total for r in reports), [
            (r.status, r.rows_done) for r in reports
        ]
        final = await self.run_state()
        assert final.status == "completed"
        assert final.rows_done == final.rows_total == total
        play = await self.play_state()
        assert play.rows_done == play.rows_total == total
        attrs = (await self.play.describe()).typed_search_attributes
        assert attrs.get(sa.ROWS_DONE) == attrs.get(sa.ROWS_TOTAL) == total


def assert_every_row_enriched(path: Path, rows: int) -> None:
    """Every row has its company, and every even lead (``run_if``) its email."""
    exported = read_csv_rows(path)
    assert [r["lead_id"] for r in exported] == [f"T{n:04d}" for n in range(rows)]
    for n, row in enumerate(exported):
        assert row["company"], row
        assert bool(row["email"]) == (n % 2 == 0), row
        assert not row.get("_error"), row


async def start_two_providers(
    client: Client, task_queue: str, csv_path: Path, options: RunOptions
) -> WorkflowHandle[Any, PlayRunResult]:
    """``t_two_providers``: every row's company (firmo), the even rows' email (acme)."""
    return await client.start_workflow(
        "t_two_providers",
        args=[{"csv_path": str(csv_path)}, options],
        id=new_id("outstanding"),
        task_queue=task_queue,
        result_type=PlayRunResult,
    )


async def test_a_pause_during_the_quota_wait_keeps_the_parked_rows_and_resume_finishes_them(
    client, provider, worker, task_queue, home, tmp_path
) -> None:
    """Quota spent, the run waits for the reset; the play is paused meanwhile. After the
    reset the run is paused (not completed) with the parked rows to do, dispatching
    nothing; resumed, it runs them: every row once, nothing paid twice."""
    quota, rows = 6, 20
    csv_path = quota_and_leads(provider, tmp_path, quota=quota, rows=rows)
    await near_a_window_start()
    async with worker():
        play = await start_two_providers(
            client, task_queue, csv_path, RunOptions(heartbeat_timeout_s=3, chunk_size=5)
        )
        async with Progress(client, play, f"{play.id}/dataset/t_two") as progress:
            await eventually(
                progress.run_state, lambda s: s.status == "waiting", "the run waited for acme"
            )
            paused = await play.execute_update("pause", result_type=ControlState)
            assert paused.paused
            # The reset passes while the play is paused.
            after = await eventually(
                progress.run_state, lambda s: s.status != "waiting", "the reset passed"
            )
            assert after.status == "paused", after.status  # not "completed"
            assert after.rows_done < rows and after.chunks_in_flight == 0
            assert (await progress.run.describe()).status == WorkflowExecutionStatus.RUNNING
            held = provider.ledger()["charged_by_provider"]["acme"]
            assert held < rows // 2  # the parked rows were not run
            state = await progress.play_state()
            assert state.status == "paused" and state.rows_done < rows
            again = await progress.run_state()
            assert again.status == "paused" and again.rows_done == after.rows_done
            assert provider.ledger()["charged_by_provider"]["acme"] == held

            resumed = await play.execute_update("resume", result_type=ControlState)
            assert not resumed.paused
            result = await asyncio.wait_for(play.result(), 120)
            await progress.assert_never_beyond(rows)

    assert result.stats.rows_ok == rows and result.stats.rows_failed == 0
    ledger = provider.ledger()
    assert ledger["charged_by_provider"]["acme"] == rows // 2
    assert ledger["charged_by_provider"]["firmo"] == 3  # three domains, receipts shared
    assert ledger["double_charged"] == 0
    await export_rows(home, result.datasets[0].run_ref, tmp_path / "out.csv")
    assert_every_row_enriched(tmp_path / "out.csv", rows)


async def test_parked_rows_are_carried_across_continue_as_new_after_a_paused_reset(
    client, provider, worker, task_queue, home, tmp_path
) -> None:
    """One chunk per run: the first chunk parks a row, the run waits, the play is
    paused, the reset passes. The run hands over to its next run only with the parked
    row done (or carried): resumed, the play finishes every row."""
    quota, rows = 3, 10
    csv_path = quota_and_leads(provider, tmp_path, quota=quota, rows=rows)
    # Rows 0-7 need four acme calls (0, 2, 4, 6): one more than the quota; rows 8-9
    # need one, which with the parked row fits the next window.
    options = RunOptions(heartbeat_timeout_s=3, chunk_size=8, chunks_per_workflow_run=1)
    await near_a_window_start()
    async with worker():
        play = await start_two_providers(client, task_queue, csv_path, options)
        async with Progress(client, play, f"{play.id}/dataset/t_two") as progress:
            waiting = await eventually(
                progress.run_state, lambda s: s.status == "waiting", "the run waited for acme"
            )
            assert waiting.rows_done < 8
            first_run = (await progress.run.describe()).run_id
            await play.execute_update("pause", result_type=ControlState)
            after = await eventually(
                progress.run_state, lambda s: s.status != "waiting", "the reset passed"
            )
            assert after.status == "paused", after.status
            await play.execute_update("resume", result_type=ControlState)
            result = await asyncio.wait_for(play.result(), 120)
            await progress.assert_never_beyond(rows)

    assert result.stats.rows_ok == rows and result.stats.rows_failed == 0
    ledger = provider.ledger()
    assert ledger["charged_by_provider"]["acme"] == rows // 2 and ledger["double_charged"] == 0
    await export_rows(home, result.datasets[0].run_ref, tmp_path / "out.csv")
    assert_every_row_enriched(tmp_path / "out.csv", rows)
    # The run did continue as new (so the parked row crossed or preceded a hand-over).
    first = client.get_workflow_handle(f"{play.id}/dataset/t_two", run_id=first_run)
    kinds = [e.event_type async for e in first.fetch_history_events()]
    assert kinds[-1] == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW


async def test_progress_never_exceeds_the_total_when_parked_ranges_are_redone(
    client, provider, worker, task_queue, tmp_path
) -> None:
    """Ranges with parked rows run again after the reset; their finished rows are not
    counted again: what the run and the play show, and what the run reports, stays
    within the total and ends at it."""
    quota, rows = 6, 20
    csv_path = quota_and_leads(provider, tmp_path, quota=quota, rows=rows)
    await near_a_window_start()
    async with worker():
        play = await start_two_providers(
            client, task_queue, csv_path, RunOptions(heartbeat_timeout_s=3, chunk_size=5)
        )
        async with Progress(client, play, f"{play.id}/dataset/t_two") as progress:
            waiting = await eventually(
                progress.run_state, lambda s: s.status == "waiting", "the run waited for acme"
            )
            result = await asyncio.wait_for(play.result(), 120)
            await progress.assert_never_beyond(rows)
    assert waiting.rows_done < rows
    assert result.stats.rows_ok == rows
    # Ranges were redone: a chunk activity ran again after the reset.
    history = await progress.run.fetch_history()
    resumed = [
        e.activity_task_scheduled_event_attributes.activity_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and "-resumed-" in e.activity_task_scheduled_event_attributes.activity_id
    ]
    assert resumed
