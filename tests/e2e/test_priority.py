"""Temporal's priority of a play's work is its run's fairness key, weight and class, on
the real dev server (started with fairness on): the play workflow, its dataset run
child and each chunk activity carry the same ``Priority``, from the CLI's flags or, by
default, keyed by the play's own workflow id."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from temporalio.api.common.v1 import Priority as PriorityProto
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, ScheduleActionStartWorkflow

import playline
from playline.cli.devserver import DevServer
from playline.contract import DatasetRunInput, RunOptions
from playline.provider_server.process import ProviderServerProcess, free_port
from playline.schedules import create_schedule, delete_schedule
from playline.workflows.priority import play_fairness_key, temporal_priority
from tests.conftest import WorkerFactory
from tests.e2e.test_cli import playline as run_cli
from tests.plays import ToolColumnInput, lead, t_tool_column, write_csv


def _triple(priority: PriorityProto) -> tuple[str, float, int]:
    return (priority.fairness_key, priority.fairness_weight, priority.priority_key)


async def _child_start(client: Client, child_id: str) -> Any:
    """The dataset run child's started event (its input carries the play's options)."""
    history = await client.get_workflow_handle(child_id).fetch_history()
    return history.events[0].workflow_execution_started_event_attributes


async def _chunk_priorities(client: Client, child_id: str) -> list[tuple[str, float, int]]:
    """Every chunk activity's priority as scheduled in the dataset run's history."""
    history = await client.get_workflow_handle(child_id).fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    chunks = [a for a in scheduled if a.activity_type.name.endswith("run_chunk")]
    assert chunks, [a.activity_type.name for a in scheduled]
    return [_triple(a.priority) for a in chunks]


async def _priorities(client: Client, play_id: str, dataset: str) -> dict[str, Any]:
    """The play's, its dataset run's and its chunks' priorities, and the run's options."""
    child_id = f"{play_id}/dataset/{dataset}"
    play = await client.get_workflow_handle(play_id).describe()
    child = await client.get_workflow_handle(child_id).describe()
    started = await _child_start(client, child_id)
    [run_input] = await client.data_converter.decode(started.input.payloads, [DatasetRunInput])
    return {
        "play": _triple(play.raw_description.workflow_execution_info.priority),
        "child": _triple(child.raw_description.workflow_execution_info.priority),
        "chunks": set(await _chunk_priorities(client, child_id)),
        "options": run_input.options,
    }


async def test_the_cli_flags_reach_the_play_its_dataset_run_and_its_chunks(
    client: Client,
    provider: ProviderServerProcess,
    worker: WorkerFactory,
    temporal_address: str,
    task_queue: str,
    home: Path,
    tmp_path: Path,
) -> None:
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(6)])
    play_id = f"prio-cli-{uuid.uuid4().hex[:8]}"
    common = ("--address", temporal_address, "--task-queue", task_queue)
    async with worker():
        ran = await run_cli(
            "run",
            "t_tool_column",
            "--csv",
            str(csv_path),
            "--input",
            '{"dataset": "t_prio"}',
            "--id",
            play_id,
            "--fairness-key",
            "team-a",
            "--weight",
            "2",
            "--priority",
            "1",
            "--chunk-size",
            "2",
            *common,
            home=home,
        )
        assert ran.returncode == 0, ran.stderr
    found = await _priorities(client, play_id, "t_prio")
    expected = ("team-a", 2.0, 1)
    assert found["play"] == expected
    assert found["child"] == expected
    assert found["chunks"] == {expected}  # three chunks of two rows, all alike
    options = found["options"]
    assert (options.fairness_key, options.fairness_weight, options.priority) == ("team-a", 2, 1)


async def test_by_default_a_run_is_keyed_by_its_own_workflow_id(
    client: Client,
    provider: ProviderServerProcess,
    worker: WorkerFactory,
    task_queue: str,
    tmp_path: Path,
) -> None:
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(3)])
    play_id = f"prio-default-{uuid.uuid4().hex[:8]}"
    async with worker():
        handle = await playline.start_play(
            client,
            t_tool_column,
            ToolColumnInput(csv_path=str(csv_path), dataset="t_prio_default"),
            id=play_id,
            task_queue=task_queue,
        )
        await handle.result()
    found = await _priorities(client, play_id, "t_prio_default")
    expected = (play_id, 1.0, 3)
    assert found["play"] == expected and found["child"] == expected
    assert found["chunks"] == {expected}
    # The play filled its key in before its dataset run copied the options.
    assert found["options"].fairness_key == play_id


async def test_a_workflow_id_that_is_no_valid_key_still_runs_under_a_key_of_its_own(
    client: Client,
    provider: ProviderServerProcess,
    worker: WorkerFactory,
    task_queue: str,
    tmp_path: Path,
) -> None:
    """The key the play derives must survive its children decoding the options again."""
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(2)])
    play_id = f"prio odd #{uuid.uuid4().hex[:8]}"
    async with worker():
        handle = await playline.start_play(
            client,
            t_tool_column,
            ToolColumnInput(csv_path=str(csv_path), dataset="t_prio_odd"),
            id=play_id,
            task_queue=task_queue,
        )
        result = await handle.result()
    assert result.stats.rows_ok == 2
    key = play_fairness_key(play_id)
    assert key != play_id
    found = await _priorities(client, play_id, "t_prio_odd")
    assert found["play"] == found["child"] == (key, 1.0, 3)
    assert found["chunks"] == {(key, 1.0, 3)}


async def test_a_schedules_firings_start_with_its_priority(client: Client, task_queue: str) -> None:
    name = f"prio-{uuid.uuid4().hex[:8]}"
    await create_schedule(
        client,
        name,
        "t_tool_column",
        {"csv_path": "store:none"},
        every="7d",
        options=RunOptions(fairness_key="team-b", fairness_weight=3, priority=2),
        paused=True,
        task_queue=task_queue,
    )
    unkeyed = f"{name}-default"
    await create_schedule(
        client, unkeyed, "t_tool_column", {"csv_path": "store:none"}, every="7d", paused=True
    )
    try:
        keyed = (await client.get_schedule_handle(name).describe()).schedule.action
        default = (await client.get_schedule_handle(unkeyed).describe()).schedule.action
    finally:
        await delete_schedule(client, name)
        await delete_schedule(client, unkeyed)
    assert isinstance(keyed, ScheduleActionStartWorkflow)
    assert isinstance(default, ScheduleActionStartWorkflow)
    assert keyed.priority is not None and default.priority is not None
    assert (
        keyed.priority.fairness_key,
        keyed.priority.fairness_weight,
        keyed.priority.priority_key,
    ) == ("team-b", 3.0, 2)
    assert (default.priority.fairness_key, default.priority.priority_key) == (unkeyed, 3)


async def test_playline_devs_server_starts_with_fairness_on(tmp_path: Path) -> None:
    """``playline dev``/``demo``'s embedded server takes the dynamic config and starts."""
    server = DevServer(home=tmp_path / "temporal", port=free_port(), ui_port=free_port())
    await server.start()
    try:
        argv = Path(f"/proc/{server.pid}/cmdline").read_bytes().decode().split("\0")
        assert "matching.enableFairness=true" in argv
        assert "matching.useNewMatcher=true" in argv
        dev_client = await Client.connect(server.address)
        handle = await dev_client.start_workflow(
            "t_tool_column",
            id=f"prio-dev-{uuid.uuid4().hex[:8]}",
            task_queue="nobody-polls",
            priority=temporal_priority(RunOptions(fairness_key="team-c", priority=4), "x"),
        )
        described = await handle.describe()
        info = described.raw_description.workflow_execution_info
        assert _triple(info.priority) == ("team-c", 1.0, 4)
        await handle.terminate()
    finally:
        server.stop()
