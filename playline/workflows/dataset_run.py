"""The ``playline.DatasetRun`` workflow: one ``dataset(...).run(...)``, chunk by chunk.

It runs the chunk activity over ``[0, admitted)`` in chunks under a sliding window of
``chunks_in_flight``, as in Temporal's batch sliding-window sample. Chunks are sized
by time (``target_chunk_seconds``, see :mod:`~playline.workflows.chunk_sizing`)
unless ``chunk_size`` pins them. History stays bounded however large the dataset: after
``chunks_per_workflow_run`` chunks it lets the window drain and continues as new,
carrying ``offset`` (every row before it is done) and the summed stats in its input.
A play starts it as a child workflow with id ``{play id}/dataset/{key}``.

Its play steers it with the ``playline.control`` signal (the play's ``pause``,
``resume`` and ``set_window`` updates forward it): paused, it starts no chunk and
waits (no timer, no activity attempt) while the chunks in flight finish and are
recorded; a window caps the chunks in flight. Cancelled (the play's cancellation
reaches it, or someone cancels it), it starts no chunk, lets those in flight
settle, reports its final counts to the play and ends as cancelled.

A chunk that meets a provider whose quota is spent until a reset further away than
its heartbeat budget (a daily quota, a ``Retry-After`` of minutes) settles what it can
and returns with those rows left pending (``ChunkStats.parked``); the other chunks keep
going. Once nothing else is in flight, the run waits for the reset on a durable timer
(status "waiting", "waiting for acme quota until 00:00 UTC" in the UI), then re-runs
the parked ranges: no activity attempt is spent and nothing busy-loops.

It reports its progress to the play by signal, at phase changes and at most every
``report_interval`` (10 s, growing with the run's age so a long run's play history
stays small), and keeps its own current details in the Temporal UI after every chunk.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from playline.activities.chunk import ChunkActivities
    from playline.activities.width import WidthActivities
    from playline.contract import (
        ChunkInput,
        ChunkStats,
        DatasetRunInput,
        DatasetRunState,
        DispatchControl,
        ParkedRows,
        ProviderWait,
        RunStatus,
        Width,
        WidthInput,
        merge_parked,
    )
    from playline.workflows.chunk_sizing import FIRST_CHUNK_ROWS, ChunkSizer
    from playline.workflows.failures import CHUNK_RETRY, as_failure
    from playline.workflows.status import dataset_current_details, waits_of

#: Parked rows resume this long after the provider's announced reset (clock skew).
RESET_MARGIN = timedelta(seconds=1)
#: Ask the governor for a fresh dispatch width after this many completed chunks.
WIDTH_REFRESH_CHUNKS = 8
#: Signal names between a play and its dataset run.
CONTROL_SIGNAL = "playline.control"
PROGRESS_SIGNAL = "playline.progress"
#: Progress reports to the play: at most one per this interval...
REPORT_MIN_INTERVAL = timedelta(seconds=10)
#: ...or per this fraction of the run's age, when that is longer...
REPORT_AGE_FRACTION = 50
#: ...and at least one per this interval.
REPORT_MAX_INTERVAL = timedelta(minutes=10)


def report_interval(age: timedelta) -> timedelta:
    """How long to wait between progress reports to the play, for a run ``age`` old.

    A fixed interval would add a signal and an upsert to the play's history every few
    seconds for hours; spacing them out with age keeps that to a few hundred events
    for a day-long run while a short run still reports every 10 s.
    """
    return min(REPORT_MAX_INTERVAL, max(REPORT_MIN_INTERVAL, age / REPORT_AGE_FRACTION))


@workflow.defn(name="playline.DatasetRun")
class DatasetRunWorkflow:
    """Runs one dataset's chunks under a sliding window; continues as new to bound history."""

    def __init__(self) -> None:
        self._input: DatasetRunInput | None = None
        self._stats = ChunkStats()
        self._rows_done = 0
        self._pending: dict[asyncio.Task[ChunkStats], tuple[int, int]] = {}
        self._control = DispatchControl()
        self._woken = False  # a control arrived since the loop last looked
        self._cancelling = False
        self._ended: RunStatus | None = None
        self._width = Width(chunks_in_flight=1, row_concurrency=1)
        self._waits: list[ProviderWait] = []
        self._waiting = False  # on the durable timer of a parked provider
        self._started_at: datetime | None = None
        self._reporting = False
        self._reported_at: datetime | None = None
        self._reported_status: RunStatus | None = None
        self._reports: list[asyncio.Task[None]] = []

    @workflow.signal(name=CONTROL_SIGNAL)
    def control(self, control: DispatchControl) -> None:
        """Pause, resume or resize dispatch (the play's updates forward them)."""
        self._control = control
        self._woken = True

    @workflow.run
    async def run(self, input: DatasetRunInput) -> ChunkStats:
        self._input = input
        self._stats = input.stats.model_copy()
        self._control = input.control
        self._started_at = input.started_at or workflow.now()
        prepared = input.prepared
        total = prepared.admitted
        pinned = input.options.chunk_size
        # Histories from before time-sized chunks ran every chunk at the old default.
        sized_by_time = pinned is None and workflow.patched("time-sized-chunks")
        sizer = ChunkSizer(input.options.target_chunk_seconds)
        if input.chunk_rows is not None:
            sizer.size = input.chunk_rows
        self._width = Width(
            chunks_in_flight=prepared.suggested_chunks_in_flight,
            row_concurrency=prepared.suggested_row_concurrency,
        )
        adaptive = workflow.patched("governor-dispatch-width")
        # Histories from before progress reports and row-range activity ids have neither.
        visible = workflow.patched("dataset-run-progress")
        self._reporting = visible and workflow.info().parent is not None
        self._rows_done = input.offset
        next_start = input.offset
        launched = 0
        refreshed_at: int | None = None
        pending = self._pending
        # Ranges whose rows a spent quota left pending, and the parking that holds them.
        parked_ranges: list[tuple[int, int]] = []
        parking: ParkedRows | None = None
        redo: list[tuple[int, int]] = []
        resumed = 0
        try:
            while True:
                dispatching = not self._cancelling and not self._control.paused
                due = refreshed_at is None or launched - refreshed_at >= WIDTH_REFRESH_CHUNKS
                if adaptive and due and dispatching and next_start < total:
                    try:
                        self._set_width(await self._current_width(input))
                    except (asyncio.CancelledError, ActivityError) as err:
                        self._on_cancel(err)
                        continue
                    refreshed_at = launched
                while (
                    not self._cancelling
                    and not self._control.paused
                    and len(pending) < self._window()
                    and (
                        redo
                        or (next_start < total and launched < input.options.chunks_per_workflow_run)
                    )
                ):
                    if redo:
                        start, end = redo.pop(0)
                        task = self._start_chunk(input, start, end, visible, resumed)
                        pending[task] = (start, end)
                        continue
                    size = sizer.size if sized_by_time else (pinned or FIRST_CHUNK_ROWS)
                    end = min(next_start + size, total)
                    task = self._start_chunk(input, next_start, end, visible)
                    pending[task] = (next_start, end)
                    next_start = end
                    launched += 1
                self._show()
                if not pending and parking is not None and not self._cancelling:
                    # Everything else is done: wait for the provider's reset, durably.
                    try:
                        await self._wait_for_reset(parking)
                    except asyncio.CancelledError as err:
                        self._on_cancel(err)
                        continue
                    redo, parked_ranges, parking = parked_ranges, [], None
                    resumed += 1
                    continue
                if not pending:
                    finished = next_start >= total
                    if (
                        finished
                        or self._cancelling
                        or launched >= input.options.chunks_per_workflow_run
                    ):
                        break
                # Here dispatch waits: for a chunk to finish, or (nothing in flight) for
                # the play to resume it. A parked provider waits above, on its timer.
                try:
                    await workflow.wait_condition(
                        lambda: self._woken or any(task.done() for task in pending)
                    )
                except asyncio.CancelledError as err:
                    self._on_cancel(err)
                    continue
                self._woken = False
                for task in [t for t in pending if t.done()]:
                    start, end = pending.pop(task)
                    chunk = task.result()
                    held = chunk.parked
                    if held is not None:
                        parked_ranges.append((start, end))
                        parking = merge_parked(parking, held)
                        chunk = chunk.model_copy(update={"parked": None})
                    self._stats.add(chunk)
                    self._rows_done += end - start - (held.rows if held else 0)
                    if held is None:
                        sizer.observe(end - start, chunk.elapsed_s)
                self._report()
        except ActivityError as err:
            for task in pending:
                task.cancel()
            failure = as_failure(err)
            self._ended = "failed"
            self._show()
            raise failure from err
        if self._cancelling:
            # Everything in flight settled: the play learns the final counts, then the
            # run ends as cancelled.
            self._ended = "cancelled"
            self._show()
            self._report(force=True)
            await self._reports_sent()
            raise asyncio.CancelledError(
                "cancelled: no new chunk started, in-flight chunks settled"
            )
        await self._reports_sent()
        if next_start >= total:
            self._ended = "completed"
            self._show()
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
                    control=self._control,
                    started_at=self._started_at,
                    source_path=input.source_path,
                )
            )
        return self._stats

    async def _wait_for_reset(self, parking: ParkedRows) -> None:
        """Sleep on a durable timer until ``parking``'s provider admits calls again."""
        until = datetime.fromtimestamp(parking.until, tz=UTC) + RESET_MARGIN
        self._waits = [
            ProviderWait(provider=parking.provider, until=until, reason=f"{parking.provider} quota")
        ]
        self._waiting = True
        self._show()
        self._report(force=True)
        try:
            delay = until - workflow.now()
            if delay > timedelta(0):
                await workflow.sleep(
                    delay, summary=f"{parking.provider} quota: {parking.rows} rows wait"
                )
        finally:
            self._waiting = False
            self._waits = []
        self._show()

    def _on_cancel(self, err: BaseException) -> None:
        """A cancellation request becomes "stop dispatching"; anything else is raised."""
        if not is_cancelled_exception(err) or workflow.cancellation_reason() is None:
            raise err
        self._cancelling = True

    def _window(self) -> int:
        return self._control.window or self._width.chunks_in_flight

    def _set_width(self, width: Width) -> None:
        self._width = width
        self._waits = waits_of(width.paces, workflow.now())

    async def _current_width(self, input: DatasetRunInput) -> Width:
        """The governor's width now, as a local activity so replay sees the same answer."""
        return await workflow.execute_local_activity_method(
            WidthActivities.suggest_width,
            WidthInput(providers=input.prepared.providers, options=input.options),
            start_to_close_timeout=timedelta(seconds=10),
            summary=f"dispatch width for {', '.join(input.prepared.providers) or 'no provider'}",
        )

    def _start_chunk(
        self,
        input: DatasetRunInput,
        start: int,
        end: int,
        named_by_rows: bool,
        resumed: int = 0,
    ) -> asyncio.Task[ChunkStats]:
        activity_id = f"rows-{start}-{end - 1}" + (f"-resumed-{resumed}" if resumed else "")
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
                    row_concurrency=self._width.row_concurrency,
                ),
                start_to_close_timeout=timedelta(hours=2),
                heartbeat_timeout=timedelta(seconds=input.options.heartbeat_timeout_s),
                retry_policy=CHUNK_RETRY,
                summary=f"rows {start}-{end - 1}",
                # The UI's pending activities list ids, not summaries: name the rows.
                activity_id=activity_id if named_by_rows else None,
            )
        )

    def _status(self) -> RunStatus:
        if self._ended is not None:
            return self._ended
        if self._cancelling:
            return "cancelling"
        if self._waiting:
            return "waiting"
        if self._control.paused:
            return "paused"
        return "running"

    def _show(self) -> None:
        """Refresh the run's current details in the UI (not a command: free)."""
        workflow.set_current_details(dataset_current_details(self.state(), workflow.now()))

    def _report(self, *, force: bool = False) -> None:
        """Signal the play a progress report, at phase changes and at a bounded rate."""
        if not self._reporting or self._started_at is None:
            return
        now = workflow.now()
        status = self._status()
        due = self._reported_at is None or now - self._reported_at >= report_interval(
            now - self._started_at
        )
        if not (force or due or status != self._reported_status):
            return
        parent = workflow.info().parent
        assert parent is not None  # _reporting says so
        self._reported_at, self._reported_status = now, status
        handle = workflow.get_external_workflow_handle(parent.workflow_id)
        self._reports.append(asyncio.ensure_future(handle.signal(PROGRESS_SIGNAL, self.state())))

    async def _reports_sent(self) -> None:
        """Wait for the reports in flight: the play has them before this run ends."""
        if self._reports:
            await asyncio.gather(*self._reports, return_exceptions=True)
            self._reports.clear()

    @workflow.query(name="state")
    def state(self) -> DatasetRunState:
        prepared = self._input.prepared if self._input else None
        return DatasetRunState(
            dataset=prepared.dataset if prepared else "",
            rows_total=prepared.admitted if prepared else 0,
            rows_done=self._rows_done,
            chunks_in_flight=len(self._pending),
            stats=self._stats,
            status=self._status(),
            window=self._window(),
            paused=self._control.paused,
            paces=self._width.paces,
            waits=self._waits,
            ranges=sorted(self._pending.values()),
        )
