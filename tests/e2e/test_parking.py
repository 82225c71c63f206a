"""Durable parking end to end: a provider's quota runs out, the run waits on a timer.

The provider server gives acme a quota of 6 calls per 20-second window (a daily quota
in miniature) and does not announce it: the governor learns it from the first 429,
whose ``Retry-After`` names the reset. (A provider that reports its quota in headers is
spent evenly until the reset instead, see tests/e2e/test_governor_in_plays.py.) Half
the rows need acme, all of them need firmo. Chunks settle what they can, park the rows
acme cannot take before the reset (beyond the 3 s heartbeat budget), and the run waits
for the reset on a durable timer, then finishes them: every row once, nothing paid
twice, no chunk attempt spent on waiting.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowHandle

from playline.contract import DatasetRunState, PlayRunResult, PlayState, RunOptions
from tests.conftest import new_id
from tests.plays import lead, write_csv

QUOTA, WINDOW_S, ROWS = 6, 20, 20


async def current_details(handle: WorkflowHandle[Any, Any]) -> str:
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return metadata.current_details


async def test_a_spent_quota_parks_rows_on_a_durable_timer_and_the_run_finishes(
    client, provider, worker, task_queue, tmp_path
) -> None:
    provider.configure(
        limiters={"acme": [{"kind": "quota", "limit": QUOTA, "window_s": WINDOW_S}]},
        retry_after="ceil",
    )
    csv_path = write_csv(tmp_path / "leads.csv", [lead(n) for n in range(ROWS)])
    play_id = new_id("park")
    # The provider's windows are aligned to the clock: start near one's beginning, so
    # its reset is well beyond the 3 s heartbeat budget when the quota runs out.
    phase = time.time() % WINDOW_S
    if phase > 2:
        await asyncio.sleep(WINDOW_S - phase + 0.05)
    async with worker():
        handle = await client.start_workflow(
            "t_two_providers",
            args=[{"csv_path": str(csv_path)}, RunOptions(heartbeat_timeout_s=3, chunk_size=5)],
            id=play_id,
            task_queue=task_queue,
            result_type=PlayRunResult,
        )
        run = client.get_workflow_handle(f"{play_id}/dataset/t_two")
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "the run never waited for the quota"
            try:
                state = await run.query("state", result_type=DatasetRunState)
            except Exception:  # not started yet
                state = None
            if state is not None and state.status == "waiting":
                break
            await asyncio.sleep(0.2)
        # While acme is parked, every row that does not need it is done.
        assert state.rows_done >= ROWS - (ROWS // 2 - QUOTA)
        assert [w.provider for w in state.waits] == ["acme"]
        assert "waiting for acme quota until" in await current_details(run)
        play_state = await handle.query("state", result_type=PlayState)
        assert play_state.current is not None and play_state.current.status == "waiting"
        result = await asyncio.wait_for(handle.result(), 90)

    assert result.stats.rows_ok == ROWS and result.stats.rows_failed == 0
    ledger = provider.ledger()
    assert ledger["charged_by_provider"]["acme"] == ROWS // 2
    assert ledger["double_charged"] == 0
    # The 429 that taught the reset, and those of calls already in flight then (a busy
    # machine can have every remaining row's call out): each row refused once at most,
    # none after the reset. The provider records a call when it answers (a 429 at once,
    # a success after its latency), so within a window the order is not the arrivals':
    # the quota's calls and the refusals come first, in one window; the rest after it.
    calls = [c for c in provider.calls() if c["provider"] == "acme"]
    refused = [c["status"] for c in calls].count(429)
    rest = ROWS // 2 - QUOTA
    assert 1 <= refused <= rest and ledger["rate_limited"] == refused
    first, after = calls[: QUOTA + refused], calls[QUOTA + refused :]
    assert sorted(c["status"] for c in first) == [200] * QUOTA + [429] * refused, calls
    assert [c["status"] for c in after] == [200] * rest, calls
    window = {int(c["wall"] // WINDOW_S) for c in first}
    assert len(window) == 1 and all(c["wall"] // WINDOW_S > max(window) for c in after), calls
    events = (await run.fetch_history()).events
    timers = [e for e in events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
    assert len(timers) == 1
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]
    assert attempts and set(attempts) == {1}  # waiting burned no activity attempt
