"""Controls of a running play (updates with validators, graceful cancellation) and what
it shows of itself (static and current details, search attributes), on a real server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import CancelledError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from playline import search_attributes as sa
from playline.cli.devserver import temporal_binary
from playline.contract import ControlState, DatasetRunState, PlayRunResult, PlayState, RunOptions
from playline.workflows.context import RUN_REFS_MEMO
from tests.conftest import new_id
from tests.plays import BOOM, lead, write_csv

T = TypeVar("T")

#: Small chunks, two in flight: a slow provider keeps the run going for several seconds.
SLOW = RunOptions(chunk_size=4, max_chunks_in_flight=2, row_concurrency=4)


async def eventually(
    probe: Callable[[], Awaitable[T]], ok: Callable[[T], bool], timeout_s: float = 60
) -> T:
    """Poll ``probe`` until ``ok`` holds (visibility and queries catch up asynchronously;
    a workflow not started yet counts as not yet)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = await probe()
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
        else:
            if ok(value):
                return value
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.2)


async def start(
    client: Client, task_queue: str, csv_path: str, **input: Any
) -> WorkflowHandle[Any, PlayRunResult]:
    return await client.start_workflow(
        "t_tool_column",
        args=[{"csv_path": csv_path, **input}, SLOW],
        id=new_id("ctl"),
        task_queue=task_queue,
        result_type=PlayRunResult,
    )


async def play_state(handle: WorkflowHandle[Any, Any]) -> PlayState:
    return await handle.query("state", result_type=PlayState)


async def child_state(client: Client, handle: WorkflowHandle[Any, Any]) -> DatasetRunState:
    child = client.get_workflow_handle(f"{handle.id}/dataset/t_rows")
    return await child.query("state", result_type=DatasetRunState)


async def current_details(handle: WorkflowHandle[Any, Any]) -> str:
    """What the UI shows as "Current Details" (the SDK's built-in metadata query)."""
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return metadata.current_details


async def attributes(handle: WorkflowHandle[Any, Any]) -> dict[str, Any]:
    desc = await handle.describe()
    return {key.name: desc.typed_search_attributes.get(key) for key in sa.ALL_KEYS}


def events(history: Any, kind: int) -> list[Any]:
    return [e for e in history.events if e.event_type == kind]


async def test_pause_holds_dispatch_resume_finishes_and_bad_requests_never_enter_history(
    client, provider, worker, task_queue, tmp_path
) -> None:
    provider.configure(latency_ms=[250, 300])
    rows = 48
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(rows)])
    async with worker():
        handle = await start(client, task_queue, str(csv_path))
        await eventually(lambda: child_state(client, handle), lambda s: s.rows_done >= 4)

        paused = await handle.execute_update("pause", result_type=ControlState)
        assert paused.paused and paused.status == "paused" and paused.dataset == "t_rows"
        # In-flight chunks finish and are recorded; then nothing new starts.
        held = await eventually(
            lambda: child_state(client, handle), lambda s: s.chunks_in_flight == 0
        )
        assert held.status == "paused" and held.rows_done < rows
        charged = provider.ledger()["charged"]
        assert charged == held.rows_done  # every recorded row was paid once, none beyond
        await asyncio.sleep(2)  # a paused run starts no chunk, however long it waits
        assert provider.ledger()["charged"] == charged
        assert (await child_state(client, handle)).rows_done == held.rows_done
        state = await play_state(handle)
        assert state.status == "paused" and state.paused
        assert "**paused**" in await current_details(handle)
        assert (await attributes(handle))["PlaylineStatus"] == "paused"

        # Requests that make no sense are rejected by the validators, before history.
        with pytest.raises(WorkflowUpdateFailedError) as again:
            await handle.execute_update("pause", result_type=ControlState)
        assert "already paused" in str(again.value.cause)
        for bad in (0, 65):
            with pytest.raises(WorkflowUpdateFailedError) as window:
                await handle.execute_update("set_window", bad, result_type=ControlState)
            assert "the window must be 1 to 64 chunks in flight" in str(window.value.cause)

        narrowed = await handle.execute_update("set_window", 1, result_type=ControlState)
        assert narrowed.window == 1 and narrowed.paused
        resumed = await handle.execute_update("resume", result_type=ControlState)
        assert not resumed.paused and resumed.status == "running"
        with pytest.raises(WorkflowUpdateFailedError) as not_paused:
            await handle.execute_update("resume", result_type=ControlState)
        assert "is not paused" in str(not_paused.value.cause)
        result = await handle.result()

    assert result.stats.rows_ok == rows
    ledger = provider.ledger()
    assert ledger["charged"] == rows and ledger["double_charged"] == 0
    play_history = await handle.fetch_history()
    # Only the three accepted updates are in history; the four rejected ones are not.
    accepted = events(play_history, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED)
    assert [
        e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
        for e in accepted
    ] == ["pause", "set_window", "resume"]
    child_history = await client.get_workflow_handle(f"{handle.id}/dataset/t_rows").fetch_history()
    started = events(child_history, EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED)
    # Pausing waited in the workflow: no chunk attempt was spent on it.
    assert started and all(e.activity_task_started_event_attributes.attempt == 1 for e in started)
    # After the window of 1 reached the run, at most one chunk was in flight at a time.
    outstanding, most, narrowed_at = 0, 0, None
    for event in child_history.events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            control = event.workflow_execution_signaled_event_attributes
            if control.signal_name == "playline.control" and narrowed_at is None:
                narrowed_at = event.event_id
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            outstanding += 1
            if narrowed_at is not None:
                most = max(most, outstanding)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            outstanding -= 1
    assert narrowed_at is not None and most == 1

    final = await attributes(handle)
    assert final == {
        "PlaylinePlay": "t_tool_column",
        "PlaylineStatus": "completed",
        "PlaylineRowsTotal": rows,
        "PlaylineRowsDone": rows,
        "PlaylineRowsFailed": 0,
        "PlaylineCredits": pytest.approx(result.stats.credits),
        "PlaylineKind": "run",
    }
    listed = await eventually(
        lambda: _ids(client, 'PlaylinePlay = "t_tool_column" AND PlaylineStatus = "completed"'),
        lambda ids: handle.id in ids,
    )
    assert f"{handle.id}/dataset/t_rows" not in listed  # dataset runs carry no PlaylinePlay


async def _ids(client: Client, query: str) -> list[str]:
    return [w.id async for w in client.list_workflows(query)]


async def test_cancel_stops_dispatch_settles_in_flight_chunks_and_ends_cancelled(
    client, provider, worker, task_queue, tmp_path
) -> None:
    provider.configure(latency_ms=[250, 300])
    rows = 48
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(rows)])
    async with worker():
        handle = await start(client, task_queue, str(csv_path))
        await eventually(lambda: child_state(client, handle), lambda s: s.rows_done >= 4)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
        assert isinstance(failure.value.cause, CancelledError)
        state = await play_state(handle)
        details = await current_details(handle)
    child = client.get_workflow_handle(f"{handle.id}/dataset/t_rows")
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED
    assert (await child.describe()).status == WorkflowExecutionStatus.CANCELED
    history = await child.fetch_history()
    scheduled = events(history, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
    completed = events(history, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)
    # Every chunk that started settled (none was cancelled); no new one started.
    assert len(completed) == len(scheduled) and 0 < len(scheduled) < rows / 4
    done = 4 * len(completed)
    ledger = provider.ledger()
    assert ledger["charged"] == done and ledger["double_charged"] == 0
    assert state.status == "cancelled" and state.rows_done == done
    assert f"**cancelled** t_rows · {done} of {rows} rows done" in details
    assert (await attributes(handle))["PlaylineStatus"] == "cancelled"
    assert (await attributes(handle))["PlaylineRowsDone"] == done
    # What is done can still be exported: the memo names the dataset run.
    refs = await (await handle.describe()).memo_value(RUN_REFS_MEMO, type_hint=list[str])
    assert refs == state.run_refs and len(refs) == 1


async def test_a_failed_play_shows_its_root_cause_and_status(
    client, provider, worker, task_queue, tmp_path
) -> None:
    rows = [lead(0), lead(1, first_name=BOOM), lead(2)]
    csv_path = write_csv(tmp_path / "leads.csv", rows)
    async with worker():
        handle = await start(
            client, task_queue, str(csv_path), column_tool="fail_on_boom", on_row_error="fail"
        )
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        details = await current_details(handle)
    assert "**failed**" in details
    assert "boom: refusing lead T0001" in details
    assert (await attributes(handle))["PlaylineStatus"] == "failed"


async def test_static_summary_and_details_of_the_dataset_run(
    client, provider, worker, task_queue, tmp_path
) -> None:
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(6)])
    async with worker():
        handle = await start(client, task_queue, str(csv_path))
        await handle.result()
        details = await current_details(handle)
    child = await client.get_workflow_handle(f"{handle.id}/dataset/t_rows").describe()
    assert await child.static_summary() == "t_rows: 6 rows of leads.csv (upsert, live)"
    static = await child.static_details() or ""
    assert f"- input file: `{csv_path}`" in static and "- rows: 6 admitted of 6" in static
    assert "**completed** t_rows · 6 of 6 rows done" in details


async def test_a_namespace_without_the_search_attributes_still_runs_plays(
    provider, tmp_path
) -> None:
    """Upserting an unregistered attribute would fail every workflow task: the play
    asks first, runs without them and says how to register them."""
    from playline.config import Settings
    from playline.worker import build_worker, connect

    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), dev_server_log_level="error"
    )
    try:
        address = env.client.service_client.config.target_host
        client = await connect(address)
        worker_client = await connect(address, settings=Settings.from_env(home=tmp_path / "h"))
        csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(3)])
        async with build_worker(worker_client, task_queue="bare"):
            handle = await client.start_workflow(
                "t_tool_column",
                args=[{"csv_path": str(csv_path)}, None],
                id=new_id("bare"),
                task_queue="bare",
                result_type=PlayRunResult,
            )
            result = await asyncio.wait_for(handle.result(), 60)
            state = await play_state(handle)
        assert result.stats.rows_ok == 3
        assert state.search_attributes == []
        assert any("playline setup" in line for line in state.log)
    finally:
        await env.shutdown()


async def test_a_paused_play_calls_no_tool_until_resumed(
    client, provider, worker, task_queue
) -> None:
    """Paused before its first command (update-with-start), ``ctx.tool`` waits."""
    start = WithStartWorkflowOperation(
        "t_scalar",
        args=[{"domain": "co1.example"}, None],
        id=new_id("scalar-paused"),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        result_type=PlayRunResult,
    )
    async with worker():
        paused = await client.execute_update_with_start_workflow(
            "pause", start_workflow_operation=start, result_type=ControlState
        )
        assert paused.paused
        handle = await start.workflow_handle()
        state = await eventually(lambda: play_state(handle), lambda s: s.status == "paused")
        assert state.paused
        await asyncio.sleep(1)  # however long it stays paused, no tool is called
        history = await handle.fetch_history()
        assert not events(history, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
        assert provider.ledger()["charged"] == 0
        await handle.execute_update("resume", result_type=ControlState)
        result = await handle.result()
    assert result.output is not None and result.output["company_name"]
    assert provider.ledger()["charged"] == 1
