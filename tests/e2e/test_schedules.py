"""Scheduled plays end to end: ``playline schedule`` on the real Temporal dev server.

A real subprocess creates and controls each schedule, an in-process worker runs its
firings over the real provider server, whose ledger is the judge: the first firing
pays for each lead once, a later one finds everything in receipts and pays nothing,
and each firing recorded what was due (its child estimate) before it paid. Every
test deletes its schedules (they would outlive it) and ends the firings still running.
Nothing here asserts how long anything took; waits poll until a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from playline import describe_schedule, start_play
from playline.contract import PlayRunResult, PlayState, RunOptions
from playline.schedules import ScheduleView, delete_schedule
from playline.search_attributes import PLAY
from tests.e2e.test_cli import playline
from tests.plays import lead, write_csv
from tests.plays_schedules import NoEstimateInput, t_no_estimate

T = TypeVar("T")
PLAY_NAME = "t_tool_column"


async def eventually(
    get: Callable[[], Awaitable[T]], ok: Callable[[T], bool], what: str, timeout_s: float = 60
) -> T:
    """``get()`` once ``ok`` holds for it (polled); fails naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await get()
        if ok(value):
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {value!r}"
        await asyncio.sleep(0.3)


def new_name() -> str:
    return f"sched-{uuid.uuid4().hex[:8]}"


@contextlib.asynccontextmanager
async def cleaned_up(client: Client, name: str) -> AsyncIterator[None]:
    """Delete schedule ``name`` and end its running firings, however the test went."""
    try:
        yield
    finally:
        running: list[str] = []
        with contextlib.suppress(Exception):
            running = (await describe_schedule(client, name)).running
        with contextlib.suppress(Exception):
            await delete_schedule(client, name)
        for workflow_id in running:
            with contextlib.suppress(RPCError):
                await client.get_workflow_handle(workflow_id).terminate("test over")


async def finished_firings(client: Client, name: str, count: int) -> list[str]:
    """The workflow ids of the first ``count`` firings of ``name``, each completed."""
    view = await eventually(
        lambda: describe_schedule(client, name),
        lambda v: len(v.recent_actions) >= count,
        f"{count} firings of {name}",
    )
    ids = [firing.workflow_id for firing in view.recent_actions[:count]]
    for workflow_id in ids:
        handle = client.get_workflow_handle(workflow_id, result_type=PlayRunResult)
        await asyncio.wait_for(handle.result(), 60)
    return ids


async def state_of(client: Client, workflow_id: str) -> PlayState:
    state: PlayState = await client.get_workflow_handle(workflow_id).query(
        "state", result_type=PlayState
    )
    return state


async def test_a_cli_schedule_fires_estimates_first_and_pays_only_what_is_due(
    client, provider, worker, temporal_address, task_queue, home, tmp_path
) -> None:
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(4)])
    name = new_name()
    common = ("--address", temporal_address, "--task-queue", task_queue)
    async with worker(), cleaned_up(client, name):
        made = await playline(
            "schedule", "create", name, "--play", PLAY_NAME, "--csv", str(csv_path),
            "--every", "2s", "--json", *common, home=home,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        created = ScheduleView.model_validate_json(made.stdout)
        assert (created.play, created.spec, created.overlap) == (PLAY_NAME, "every 2s", "skip")
        assert created.pause_on_failure and created.catchup_window_s == 600
        assert created.input is not None and created.input["csv_path"].startswith("store:")
        assert "uploaded 4 rows" in made.stderr

        first, second = await finished_firings(client, name, 2)
        paused = await playline("schedule", "pause", name, *common, home=home)
        assert paused.returncode == 0, paused.stderr

        # The firing is a play from its first moment, started by the schedule.
        desc = await client.get_workflow_handle(first).describe()
        assert desc.typed_search_attributes.get(PLAY) == PLAY_NAME
        assert desc.search_attributes.get("TemporalScheduledById") == [name]
        summary = await desc.static_summary()
        assert summary is not None and summary.startswith(f"schedule {name}: {PLAY_NAME}")
        assert first.startswith(f"{name}-")

        # The first firing found 4 calls due and recorded it before it paid for them.
        due = (await state_of(client, first)).due
        assert due is not None and due["estimate_id"] == f"{first}-estimate"
        assert due["calls"] == 4 and due["worst_case"] > 0
        events = (await client.get_workflow_handle(first).fetch_history()).events
        estimated = next(
            i
            for i, e in enumerate(events)
            if e.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED
            and e.child_workflow_execution_completed_event_attributes.workflow_execution.workflow_id
            == due["estimate_id"]
        )
        started_children = [
            (i, e.start_child_workflow_execution_initiated_event_attributes.workflow_id)
            for i, e in enumerate(events)
            if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
        ]
        paying = [i for i, child in started_children if child != due["estimate_id"]]
        assert paying and estimated < min(paying)

        # The second found every call in receipts: nothing due, nothing paid.
        state = await state_of(client, second)
        assert state.due is not None and state.due["calls"] == 0
        assert state.due["worst_case"] == 0
        assert any(line.startswith("nothing is due") for line in state.log), state.log
        second_result = await client.get_workflow_handle(second, result_type=PlayRunResult).result()
        assert second_result.stats.calls_made == 0
    ledger = provider.ledger()
    assert ledger["charged"] == 4  # every later firing paid nothing
    assert ledger["received"] == 4


async def test_overlapping_firings_are_skipped(
    client, provider, worker, temporal_address, task_queue, home, tmp_path
) -> None:
    provider.configure(latency_ms=[2500, 2600])  # a run outlasts the 1 s interval
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(3)])
    name = new_name()
    common = ("--address", temporal_address, "--task-queue", task_queue)
    async with worker(), cleaned_up(client, name):
        made = await playline(
            "schedule", "create", name, "--play", PLAY_NAME,
            "--input", json.dumps({"csv_path": str(csv_path)}),
            "--every", "1s", *common, home=home,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        assert f"created schedule {name}: play {PLAY_NAME}, every 1s" in made.stdout

        running_at_once: list[int] = []

        async def described() -> ScheduleView:
            view = await describe_schedule(client, name)
            running_at_once.append(len(view.running))
            return view

        view = await eventually(
            described,
            lambda v: v.num_actions_skipped_overlap >= 1 and len(v.recent_actions) >= 2,
            "a skipped firing and two that ran",
            timeout_s=90,
        )
        await playline("schedule", "pause", name, *common, home=home)
        ids = await finished_firings(client, name, 2)
    assert max(running_at_once) <= 1
    # The firings that ran did not overlap: each started after the one before closed.
    spans = []
    for workflow_id in ids:
        desc = await client.get_workflow_handle(workflow_id).describe()
        assert desc.status == WorkflowExecutionStatus.COMPLETED
        spans.append((desc.start_time, desc.close_time))
    spans.sort()
    for (_, closed), (started, _) in itertools.pairwise(spans):
        assert closed is not None and started >= closed
    assert view.num_actions >= 2
    assert provider.ledger()["charged"] == 3  # the rows were paid for once


async def test_cli_list_describe_pause_unpause_trigger_delete(
    client, provider, worker, temporal_address, task_queue, home, tmp_path
) -> None:
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(2)])
    name = new_name()
    common = ("--address", temporal_address, "--task-queue", task_queue)

    async def cli(*args: str) -> Any:
        return await playline("schedule", *args, *common, home=home)

    async with worker(), cleaned_up(client, name):
        made = await cli(
            "create", name, "--play", PLAY_NAME, "--input", json.dumps({"csv_path": str(csv_path)}),
            "--cron", "0 6 * * 1", "--paused", "--note", "first week off", "--max-credits", "10",
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        assert "paused" in made.stdout

        again = await cli("create", name, "--play", PLAY_NAME, "--every", "1h")
        assert again.returncode == 1
        assert again.stderr.strip().splitlines() == [
            f"error: a schedule named {name!r} exists already; see it with "
            f"`playline schedule describe {name}` or delete it first"
        ]

        described = await cli("describe", name)
        assert described.returncode == 0, described.stderr
        assert f"schedule {name}: play {PLAY_NAME}, cron 0 6 * * 1" in described.stdout
        assert "state: paused (note: first week off)" in described.stdout
        assert "overlap skip, pause on failure, catch-up 10m" in described.stdout

        listed = await eventually(
            lambda: cli("list", "--json"),
            lambda r: name in [s["name"] for s in json.loads(r.stdout or "[]")],
            "the schedule in the list",
        )
        (shown,) = [s for s in json.loads(listed.stdout) if s["name"] == name]
        assert shown["play"] == PLAY_NAME and shown["paused"] is True
        table = await cli("list")
        assert name in table.stdout and "cron 0 6 * * 1" in table.stdout

        unpaused = await cli("unpause", name)
        assert unpaused.returncode == 0, unpaused.stderr
        view = await describe_schedule(client, name)
        assert not view.paused and view.next_action_times

        triggered = await cli("trigger", name)
        assert triggered.returncode == 0, triggered.stderr
        (firing,) = await finished_firings(client, name, 1)
        result = await client.get_workflow_handle(firing, result_type=PlayRunResult).result()
        assert result.stats.rows_ok == 2

        described = await cli("describe", name, "--json")
        view = ScheduleView.model_validate_json(described.stdout)
        assert view.num_actions == 1 and view.recent_actions[0].workflow_id == firing
        text = (await cli("describe", name)).stdout
        assert firing in text and f"/workflows/{quote(firing, safe='')}/" in text  # its UI link

        assert (await cli("pause", name, "--note", "holiday")).returncode == 0
        view = await describe_schedule(client, name)
        assert view.paused and view.note == "holiday"

        deleted = await cli("delete", name)
        assert deleted.returncode == 0, deleted.stderr
        gone = await cli("describe", name)
        assert gone.returncode == 1
        assert gone.stderr.strip().splitlines() == [
            f"error: no schedule named {name!r}; `playline schedule list` shows them"
        ]
        for command in ("pause", "unpause", "trigger", "delete"):
            missing = await cli(command, name)
            assert missing.returncode == 1 and "no schedule named" in missing.stderr
    assert provider.ledger()["charged"] == 2


async def test_a_bad_cron_is_the_servers_error_in_one_line(
    client, temporal_address, task_queue, home
) -> None:
    name = new_name()
    async with cleaned_up(client, name):
        made = await playline(
            "schedule", "create", name, "--play", PLAY_NAME, "--cron", "every tuesday",
            "--address", temporal_address, "--task-queue", task_queue, home=home,
        )  # fmt: skip
    assert made.returncode == 1
    lines = made.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "error: invalid cron expression 'every tuesday': "
    ), made.stderr


async def test_the_python_api_schedules_a_play_class(
    client, provider, worker, task_queue, tmp_path: Path
) -> None:
    from playline import create_schedule, trigger_schedule
    from tests.plays import ToolColumnInput, t_tool_column

    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(2)])
    name = new_name()
    async with worker(), cleaned_up(client, name):
        handle = await create_schedule(
            client,
            name,
            t_tool_column,
            ToolColumnInput(csv_path=str(csv_path)),
            every="7d",
            paused=True,
            task_queue=task_queue,
        )
        assert handle.id == name
        view = await describe_schedule(client, name)
        assert (view.play, view.spec, view.paused) == (PLAY_NAME, "every 7d", True)
        assert view.input is not None and view.input["csv_path"] == str(csv_path)
        await trigger_schedule(client, name)  # fires even while paused
        (firing,) = await finished_firings(client, name, 1)
        state = await state_of(client, firing)
    assert state.due is not None and state.due["calls"] == 2
    assert provider.ledger()["charged"] == 2


async def test_a_failed_estimate_does_not_stop_the_firing(client, worker, task_queue) -> None:
    options = RunOptions(estimate_first=True, schedule="by-hand")
    async with worker():
        handle = await start_play(
            client, t_no_estimate, NoEstimateInput(), options=options, task_queue=task_queue
        )
        result = await asyncio.wait_for(handle.result(), 60)
        state = await state_of(client, handle.id)
    assert result.output is not None and result.output.ran
    assert state.due is None
    assert any(
        line.startswith("estimate first failed (this play cannot be estimated)")
        for line in state.log
    ), state.log


async def test_a_firing_that_reaches_its_budget_waits_until_the_next_firing_at_the_latest(
    client, provider, worker, task_queue, tmp_path
) -> None:
    # Each firing may spend 2 credits over 6 leads: it pays for 2, waits for budget
    # (``describe`` says until when), skips the rest when the bound passes and ends, so
    # the next firing is not skipped for ever; together they pay for every lead once.
    from playline import create_schedule

    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(6)])
    name = new_name()
    async with worker(), cleaned_up(client, name):
        await create_schedule(
            client,
            name,
            PLAY_NAME,
            {"csv_path": str(csv_path)},
            every="15s",
            options=RunOptions(max_credits=2),
            task_queue=task_queue,
        )
        waiting = await eventually(
            lambda: describe_schedule(client, name),
            lambda v: bool(v.budget_waits),
            "a firing waiting for budget",
            timeout_s=60,
        )
        firing, said = next(iter(waiting.budget_waits.items()))
        assert said.startswith("waiting for budget until "), said
        # The firing itself says it waits (its play state, not only its dataset run's).
        state = await state_of(client, firing)
        assert state.budget_wait and "waiting for budget until" in state.budget_wait, state
        view = await eventually(
            lambda: describe_schedule(client, name),
            lambda v: v.num_actions >= 3,
            "later firings",
            timeout_s=120,
        )
        await delete_schedule(client, name)
        firings = [f.workflow_id for f in view.recent_actions] + view.running
        results = []
        for workflow_id in dict.fromkeys(firings):
            handle = client.get_workflow_handle(workflow_id, result_type=PlayRunResult)
            results.append(await asyncio.wait_for(handle.result(), 60))
    assert view.num_actions >= 3
    first = results[0]
    assert first.budget_exhausted and first.stats.rows_skipped_budget > 0
    ledger = provider.ledger()
    assert sum(r.stats.credits for r in results) == pytest.approx(ledger["credits"])
    assert ledger["charged"] <= 6  # no lead paid for twice
