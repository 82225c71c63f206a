"""The ``playline.DatasetRun`` workflow: one ``dataset(...).run(...)``, chunk by chunk.

It runs the chunk activity over ``[0, admitted)`` in chunks under a sliding window of
``chunks_in_flight``, as in Temporal's batch sliding-window sample. Chunks are sized
by time (``target_chunk_seconds``, see :mod:`~playline.workflows.chunk_sizing`)
unless ``chunk_size`` pins them. History stays bounded however large the dataset: after
``chunks_per_workflow_run`` chunks it lets the window drain and continues as new,
carrying ``offset`` (every row before it is done) and the summed stats in its input.
A play starts it as a child workflow with id ``{play id}/dataset/{key}``.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from playline.activities.chunk import ChunkActivities
    from playline.activities.width import WidthActivities
    from playline.contract import (
        ChunkInput,
        ChunkStats,
        DatasetRunInput,
        DatasetRunState,
        Width,
        WidthInput,
    )
    from playline.workflows.chunk_sizing import FIRST_CHUNK_ROWS, ChunkSizer
    from playline.workflows.failures import CHUNK_RETRY, as_failure

#: Ask the governor for a fresh dispatch width after this many completed chunks.
WIDTH_REFRESH_CHUNKS = 8


@workflow.defn(name="playline.DatasetRun")
class DatasetRunWorkflow:
    """Runs one dataset's chunks under a sliding window; continues as new to bound history."""

    def __init__(self) -> None:
        self._input: DatasetRunInput | None = None
        self._stats = ChunkStats()
        self._rows_done = 0
        self._in_flight = 0

    @workflow.run
    async def run(self, input: DatasetRunInput) -> ChunkStats:
        self._input = input
        self._stats = input.stats.model_copy()
        prepared = input.prepared
        total = prepared.admitted
        pinned = input.options.chunk_size
        # Histories from before time-sized chunks ran every chunk at the old default.
        sized_by_time = pinned is None and workflow.patched("time-sized-chunks")
        sizer = ChunkSizer(input.options.target_chunk_seconds)
        if input.chunk_rows is not None:
            sizer.size = input.chunk_rows
        width = Width(
            chunks_in_flight=prepared.suggested_chunks_in_flight,
            row_concurrency=prepared.suggested_row_concurrency,
        )
        adaptive = workflow.patched("governor-dispatch-width")
        self._rows_done = input.offset
        next_start = input.offset
        launched = 0
        refreshed_at: int | None = None
        pending: dict[asyncio.Task[ChunkStats], tuple[int, int]] = {}
        try:
            while True:
                due = refreshed_at is None or launched - refreshed_at >= WIDTH_REFRESH_CHUNKS
                if adaptive and due and next_start < total:
                    width = await self._current_width(input)
                    refreshed_at = launched
                while (
                    len(pending) < width.chunks_in_flight
                    and next_start < total
                    and launched < input.options.chunks_per_workflow_run
                ):
                    size = sizer.size if sized_by_time else (pinned or FIRST_CHUNK_ROWS)
                    end = min(next_start + size, total)
                    task = self._start_chunk(input, next_start, end, width.row_concurrency)
                    pending[task] = (next_start, end)
                    next_start = end
                    launched += 1
                self._in_flight = len(pending)
                if not pending:
                    break
                done, _ = await workflow.wait(pending.keys(), return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    start, end = pending.pop(task)
                    chunk = task.result()
                    self._stats.add(chunk)
                    self._rows_done += end - start
                    sizer.observe(end - start, chunk.elapsed_s)
        except ActivityError as err:
            for task in pending:
                task.cancel()
            raise as_failure(err) from err
        if next_start < total:
            workflow.continue_as_new(
                DatasetRunInput(
                    prepared=prepared,
                    columns=input.columns,
                    on_row_error=input.on_row_error,
                    options=input.options,
                    offset=next_start,
                    stats=self._stats,
                    chunk_rows=sizer.size if sized_by_time else None,
                )
            )
        return self._stats

    async def _current_width(self, input: DatasetRunInput) -> Width:
        """The governor's width now, as a local activity so replay sees the same answer."""
        return await workflow.execute_local_activity_method(
            WidthActivities.suggest_width,
            WidthInput(providers=input.prepared.providers, options=input.options),
            start_to_close_timeout=timedelta(seconds=10),
        )

    def _start_chunk(
        self, input: DatasetRunInput, start: int, end: int, row_concurrency: int
    ) -> asyncio.Task[ChunkStats]:
        return asyncio.ensure_future(
            workflow.execute_activity_method(
                ChunkActivities.run_chunk,
                ChunkInput(
                    run_ref=input.prepared.run_ref,
                    start=start,
                    end=end,
                    columns=input.columns,
                    on_row_error=input.on_row_error,
                    options=input.options,
                    row_concurrency=row_concurrency,
                ),
                start_to_close_timeout=timedelta(hours=2),
                heartbeat_timeout=timedelta(seconds=input.options.heartbeat_timeout_s),
                retry_policy=CHUNK_RETRY,
                summary=f"rows {start}-{end - 1}",
            )
        )

    @workflow.query(name="state")
    def state(self) -> DatasetRunState:
        prepared = self._input.prepared if self._input else None
        return DatasetRunState(
            dataset=prepared.dataset if prepared else "",
            rows_total=prepared.admitted if prepared else 0,
            rows_done=self._rows_done,
            chunks_in_flight=self._in_flight,
            stats=self._stats,
        )
