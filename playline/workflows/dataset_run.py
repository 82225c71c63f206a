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
import contextlib
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta

from temporalio import workflow
from temporalio.common import Priority
from temporalio.exceptions import ActivityError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from playline.activities.chunk import ChunkActivities
    from playline.activities.estimate import EstimateActivities
    from playline.activities.width import WidthActivities
    from playline.contract import (
        MAX_CHUNK_ROWS,
        BudgetHold,
        ChunkInput,
        ChunkStats,
        DatasetRunInput,
        DatasetRunState,
        DispatchControl,
        Outstanding,
        ParkedRows,
        ProviderWait,
        RowRange,
        RunStatus,
        Width,
        WidthInput,
        merge_holds,
        merge_parked,
    )
    from playline.workflows.chunk_sizing import FIRST_CHUNK_ROWS, ChunkSizer, chunks_to_fill
    from playline.workflows.failures import CHUNK_RETRY, as_failure
    from playline.workflows.priority import temporal_priority
    from playline.workflows.status import (
        budget_wait_message,
        dataset_current_details,
        waits_of,
    )

#: Parked rows resume this long after the provider's announced reset (clock skew).
RESET_MARGIN = timedelta(seconds=1)
#: Ask the governor for a fresh dispatch width after this many completed chunks.
WIDTH_REFRESH_CHUNKS = 8
#: Signal names between a play and its dataset run.
CONTROL_SIGNAL = "playline.control"
#: A webhook delivery finished a job this run waits on (``playline webhook`` sends it).
JOBS_READY_SIGNAL = "jobs_ready"
#: A run that waited this many times for asynchronous jobs continues as new, so a
#: job of hours polled every few seconds never grows one history past its limits.
MAX_JOB_WAITS_PER_RUN = 40
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
    """Runs one dataset's chunks under a sliding window; continues as new to bound history.

    Its work still to do is one :class:`~playline.contract.Outstanding` (rows never
    started, ranges to redo, ranges parked until a provider's reset), carried across
    continue-as-new; it completes only when that is empty, whatever pauses, waits
    and hand-overs happened on the way.
    """

    def __init__(self) -> None:
        self._input: DatasetRunInput | None = None
        self._stats = ChunkStats()
        self._work = Outstanding()
        self._pending: dict[asyncio.Task[ChunkStats], RowRange] = {}
        self._control = DispatchControl()
        self._woken = False  # a control arrived since the loop last looked
        self._cancelling = False
        self._ended: RunStatus | None = None
        self._width = Width(chunks_in_flight=1, row_concurrency=1)
        self._waits: list[ProviderWait] = []
        self._waiting = False  # on the durable timer of a parked provider
        self._budget_wait: str | None = None  # what the run says while it waits for budget
        self._started_at: datetime | None = None
        self._reporting = False
        self._reported_at: datetime | None = None
        self._reported_status: RunStatus | None = None
        self._reports: list[asyncio.Task[None]] = []
        #: reports sent: each carries its number, so the play keeps the latest even when
        #: two sent at once arrive in the other order
        self._report_seq = 0
        self._sizer = ChunkSizer(5.0)
        self._sized_by_time = False
        self._adaptive = False
        self._visible = False
        self._launched = 0  # chunks of new rows started by this run (not redone ones)
        self._refreshed_at: int | None = None
        self._resumed = 0  # provider resets waited for by this run
        self._jobs_ready = False  # a webhook said a job finished since the last wait
        self._budget_stop = False  # the options' budget wait ended: held rows are skipped
        self._note: str | None = None  # what a cancelling run still does

    @workflow.signal(name=CONTROL_SIGNAL)
    def control(self, control: DispatchControl) -> None:
        """Pause, resume or resize dispatch (the play's updates forward them)."""
        self._control = control
        self._woken = True

    @workflow.signal(name=JOBS_READY_SIGNAL)
    def jobs_ready(self) -> None:
        """A job finished (a webhook delivery): rows waiting on jobs run again now."""
        self._jobs_ready = True

    @workflow.run
    async def run(self, input: DatasetRunInput) -> ChunkStats:
        self._begin(input)
        try:
            await self._dispatch_until_done(input)
        except ActivityError as err:
            for task in self._pending:
                task.cancel()
            failure = as_failure(err)
            self._ended = "failed"
            self._show()
            raise failure from err
        return await self._end(input)

    def _begin(self, input: DatasetRunInput) -> None:
        """Take over the input's state: counts, controls, chunk sizing, the work left."""
        self._input = input
        self._stats = input.stats.model_copy()
        self._control = input.control
        self._started_at = input.started_at or workflow.now()
        self._report_seq = input.reports_sent
        prepared = input.prepared
        # Histories from before time-sized chunks ran every chunk at the old default.
        self._sized_by_time = input.options.chunk_size is None and workflow.patched(
            "time-sized-chunks"
        )
        self._sizer = ChunkSizer(input.options.target_chunk_seconds)
        if input.chunk_rows is not None:
            self._sizer.size = input.chunk_rows
        self._width = Width(
            chunks_in_flight=prepared.suggested_chunks_in_flight,
            row_concurrency=prepared.suggested_row_concurrency,
        )
        # An estimate waits on no provider: its chunks are as large as chunks go.
        self._adaptive = workflow.patched("governor-dispatch-width") and not input.options.estimate
        # Histories from before progress reports and row-range activity ids have neither.
        self._visible = workflow.patched("dataset-run-progress")
        self._reporting = self._visible and workflow.info().parent is not None
        self._work = input.outstanding or Outstanding(
            next_start=input.offset, rows_done=input.offset
        )

    async def _dispatch_until_done(self, input: DatasetRunInput) -> None:
        """Keep the window full until nothing is left for this run (or it must hand over)."""
        work, pending = self._work, self._pending
        total = input.prepared.admitted
        while True:
            if self._width_due(total):
                try:
                    self._set_width(await self._current_width(input))
                except (asyncio.CancelledError, ActivityError) as err:
                    self._on_cancel(err)
                    continue
                self._refreshed_at = self._launched
            self._launch(input)
            self._show()
            if (
                not pending
                and work.holding is not None
                and work.parking is not None
                and not self._cancelling
                and workflow.patched("parked-before-budget")
            ):
                # Rows parked on a job or a quota hold reservations the held rows may be
                # waiting for: wait for the parked rows first, never for a raise.
                work.holding = None
            if (
                not pending
                and work.holding is None
                and work.parking is None
                and work.held
                and not self._cancelling
            ):
                # Held while parked rows held reservations: those settled, run them again.
                work.redo, work.held = [*work.redo, *work.held], []
                self._resumed += 1
                continue
            if not pending and work.holding is not None and not self._cancelling:
                # Everything in flight settled: wait, durably, for more budget.
                if await self._waited(self._wait_for_budget(work.holding)):
                    work.redo, work.held, work.holding = [*work.redo, *work.held], [], None
                    self._resumed += 1
                continue
            if not pending and work.parking is not None and not self._cancelling:
                if self._job_waits_done(work.parking):
                    return  # continue as new with the rows still waiting on jobs
                # Everything else is done: wait for the provider's reset, durably.
                if await self._waited(self._wait_for_reset(work.parking)):
                    work.redo, work.parked, work.parking = [*work.redo, *work.parked], [], None
                    self._resumed += 1
                continue
            if not pending and self._cancelling and await self._read_jobs_on_cancel(input):
                continue  # rows whose jobs are paid for are read before the run ends
            if not pending and (
                work.empty(total) or self._cancelling or (self._handing_over() and not work.redo)
            ):
                return
            # Here dispatch waits: for a chunk to finish, or (nothing in flight) for
            # the play to resume it. A parked provider waits above, on its timer.
            if not await self._waited(
                workflow.wait_condition(lambda: self._woken or any(t.done() for t in pending))
            ):
                continue
            self._woken = False
            self._collect()
            self._report()

    def _width_due(self, total: int) -> bool:
        """Whether to ask the governor for a fresh width before launching more."""
        dispatching = not self._cancelling and not self._control.paused
        refreshed = self._refreshed_at
        due = refreshed is None or self._launched - refreshed >= WIDTH_REFRESH_CHUNKS
        return self._adaptive and due and dispatching and self._work.next_start < total

    def _handing_over(self) -> bool:
        """This run has started its share of chunks: it continues as new once drained."""
        assert self._input is not None
        return self._launched >= self._input.options.chunks_per_workflow_run

    def _launch(self, input: DatasetRunInput) -> None:
        """Start chunks while the window has room: ranges to redo first, then new rows."""
        work, pending = self._work, self._pending
        total = input.prepared.admitted
        while (
            not self._cancelling
            and not self._control.paused
            and work.holding is None
            and len(pending) < self._window()
            and (work.redo or (work.next_start < total and not self._handing_over()))
        ):
            if work.redo:
                again = work.redo.pop(0)
                task = self._start_chunk(input, again.start, again.end, self._resumed)
                pending[task] = again
                continue
            start = work.next_start
            pinned = input.options.chunk_size
            size = self._sizer.size if self._sized_by_time else (pinned or FIRST_CHUNK_ROWS)
            if input.options.estimate:
                size = MAX_CHUNK_ROWS
            end = min(start + size, total)
            pending[self._start_chunk(input, start, end)] = RowRange(
                start=start, end=end, rows=end - start
            )
            work.next_start = end
            self._launched += 1

    def _collect(self) -> None:
        """Account the chunks that finished; the rows they parked join ``parked``."""
        work = self._work
        for task in [t for t in self._pending if t.done()]:
            span = self._pending.pop(task)
            chunk = task.result()
            held = chunk.parked
            left = 0
            if held is not None:
                on_jobs = held.jobs and chunk.over_budget is None
                work.parked.append(
                    RowRange(
                        start=span.start,
                        end=span.end,
                        rows=held.rows,
                        jobs=on_jobs,
                        until=held.until if held.jobs else None,
                        some_jobs=held.jobs,
                    )
                )
                work.parking = merge_parked(work.parking, held)
                chunk = chunk.model_copy(update={"parked": None})
                left += held.rows
            hold = chunk.over_budget
            if hold is not None:
                if held is None:  # a range parked and held runs again once, whole
                    work.held.append(RowRange(start=span.start, end=span.end, rows=hold.rows))
                work.holding = merge_holds(work.holding, hold)
                chunk = chunk.model_copy(update={"over_budget": None})
                left += hold.rows
            self._stats.add(chunk)
            # Only the rows this range still had to do, less those left pending again:
            # a redone range never counts its finished rows twice.
            work.rows_done += span.rows - left
            if not left:
                self._sizer.observe(span.end - span.start, chunk.elapsed_s)

    async def _end(self, input: DatasetRunInput) -> ChunkStats:
        """Ended cancelled, completed, or continued as new with the work left."""
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
        work = self._work
        if work.empty(input.prepared.admitted):
            self._ended = "completed"
            self._show()
            return self._stats
        workflow.continue_as_new(
            DatasetRunInput(
                prepared=input.prepared,
                columns=input.columns,
                on_row_error=input.on_row_error,
                options=input.options,
                offset=work.next_start,
                stats=self._stats,
                chunk_rows=self._sizer.size if self._sized_by_time else None,
                control=self._control,
                started_at=self._started_at,
                source_path=input.source_path,
                outstanding=work,
                reports_sent=self._report_seq,
            )
        )

    async def _wait_for_budget(self, hold: BudgetHold) -> None:
        """Wait (no timer, no activity) until the play raises the budget; a named
        budget's next period also ends the wait, and so does the options' bound on it
        (``budget_wait_until``: a scheduled firing's next one), after which the held
        rows are skipped as with ``on_budget="stop"``."""
        assert self._input is not None
        bound = self._input.options.budget_wait_until
        if bound is not None and workflow.now() >= bound:
            self._budget_stop = True
            return
        epoch = self._control.budget_epoch
        self._budget_wait = budget_wait_message(hold, self._play_id(), bound)
        self._show()
        self._report(force=True)
        try:

            def raised() -> bool:
                return self._control.budget_epoch != epoch

            ends: list[tuple[timedelta, str]] = []
            if hold.resets_at is not None:
                delay = datetime.fromtimestamp(hold.resets_at, tz=UTC) - workflow.now()
                ends.append((max(delay, timedelta(seconds=1)) + RESET_MARGIN, "next period"))
            if bound is not None:
                ends.append((max(bound - workflow.now(), timedelta(seconds=1)), "wait bound"))
            if not ends:
                await workflow.wait_condition(raised)
            else:
                timeout, why = min(ends, key=lambda end: end[0])
                with contextlib.suppress(TimeoutError):
                    await workflow.wait_condition(
                        raised, timeout=timeout, timeout_summary=f"{hold.budget}: {why}"
                    )
        finally:
            self._budget_wait = None
        if bound is not None and self._control.budget_epoch == epoch and workflow.now() >= bound:
            self._budget_stop = True
        self._show()

    def _play_id(self) -> str:
        parent = workflow.info().parent
        return parent.workflow_id if parent is not None else workflow.info().workflow_id

    def _job_waits_done(self, parking: ParkedRows) -> bool:
        """Whether this run has waited on jobs often enough to hand over (bounded history)."""
        return (
            parking.jobs
            and self._resumed >= MAX_JOB_WAITS_PER_RUN
            and workflow.patched("async-job-waits")
        )

    async def _wait_for_reset(self, parking: ParkedRows) -> None:
        """Sleep on a durable timer until ``parking``'s provider admits calls again, or
        (rows waiting on jobs) until their next poll or a webhook says a job finished."""
        until = datetime.fromtimestamp(parking.until, tz=UTC) + RESET_MARGIN
        what = "jobs" if parking.jobs else "quota"
        self._waits = [
            ProviderWait(
                provider=parking.provider, until=until, reason=f"{parking.provider} {what}"
            )
        ]
        self._waiting = True
        self._show()
        self._report(force=True)
        try:
            delay = until - workflow.now()
            summary = f"{parking.provider} {what}: {parking.rows} rows wait"
            if parking.jobs and workflow.patched("async-job-waits"):
                if delay > timedelta(0):
                    with contextlib.suppress(TimeoutError):
                        await workflow.wait_condition(
                            lambda: self._jobs_ready, timeout=delay, timeout_summary=summary
                        )
                self._jobs_ready = False
            elif delay > timedelta(0):
                await workflow.sleep(delay, summary=summary)
        finally:
            self._waiting = False
            self._waits = []
        self._show()

    async def _read_jobs_on_cancel(self, input: DatasetRunInput) -> bool:
        """Cancelled with rows waiting on provider jobs already submitted (paid for when
        they finish): wait for those jobs and re-run only those rows, until none is left
        (a job ends within its ``max_wait_s``); rows parked on a quota or held for
        budget are not run. Whether chunks were started (the loop goes on)."""
        work = self._work
        # Ranges whose rows wait on jobs and were held for budget too are read as well,
        # in chunks that send nothing new (histories from before read only pure ones).
        only = workflow.patched("cancel-reads-only-jobs") if work.parked else False
        reading = [span for span in work.parked if span.jobs or (only and span.some_jobs)]
        if not reading or not workflow.patched("cancel-reads-jobs"):
            self._note = None
            return False
        work.parked = [span for span in work.parked if all(span is not r for r in reading)]
        rows = sum(span.rows for span in reading)
        self._note = f"cancelling: reading {self._jobs_pending(rows)} submitted jobs ({rows} rows)"
        soonest = min((span.until for span in reading if span.until is not None), default=None)
        if soonest is not None:
            parking = ParkedRows(provider=self._job_provider(), until=soonest, rows=rows, jobs=True)
            # A second cancellation request changes nothing: the run is ending already.
            with contextlib.suppress(asyncio.CancelledError):
                await self._wait_for_reset(parking)
        for span in reading:
            again = RowRange(start=span.start, end=span.end, rows=span.rows)
            task = self._start_chunk(input, span.start, span.end, self._resumed, reading=only)
            self._pending[task] = again
        self._resumed += 1
        return True

    def _jobs_pending(self, rows: int) -> int:
        """Jobs still running as the chunks last counted them (else the rows' count)."""
        counted = sum(int(p.get("pending", 0)) for p in self._stats.jobs.values())
        return counted or rows

    def _job_provider(self) -> str:
        providers = list(self._stats.jobs) or (
            self._input.prepared.providers if self._input else []
        )
        return providers[0] if providers else "provider"

    async def _waited(self, wait: Awaitable[None]) -> bool:
        """Await ``wait``; False when a cancellation request interrupted it (the run then
        stops dispatching, see :meth:`_on_cancel`)."""
        try:
            await wait
        except asyncio.CancelledError as err:
            self._on_cancel(err)
            return False
        return True

    def _on_cancel(self, err: BaseException) -> None:
        """A cancellation request becomes "stop dispatching"; anything else is raised."""
        if not is_cancelled_exception(err) or workflow.cancellation_reason() is None:
            raise err
        self._cancelling = True

    def _window(self) -> int:
        # Enough chunks for the rows the governor wants in flight, however small the
        # sizer makes them (a slow provider's are); pure on recorded data.
        sized = self._sizer.size if self._sized_by_time else None
        return self._control.window or chunks_to_fill(self._width, sized)

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
        resumed: int = 0,
        *,
        reading: bool = False,
    ) -> asyncio.Task[ChunkStats]:
        named_by_rows = self._visible
        activity_id = f"rows-{start}-{end - 1}" + (f"-resumed-{resumed}" if resumed else "")
        options = input.options
        if self._budget_stop:  # the budget wait's bound passed: skip what it cannot cover
            options = options.model_copy(update={"on_budget": "stop"})
        # An estimate counts its rows' calls instead of making them (RunOptions.estimate).
        chunk = (
            EstimateActivities.estimate_chunk
            if input.options.estimate
            else ChunkActivities.run_chunk
        )
        return asyncio.ensure_future(
            workflow.execute_activity_method(
                chunk,
                ChunkInput(
                    run_ref=input.prepared.run_ref,
                    start=start,
                    end=end,
                    columns=input.columns,
                    on_row_error=input.on_row_error,
                    options=options,
                    row_concurrency=self._width.row_concurrency,
                    reading=reading,
                ),
                start_to_close_timeout=timedelta(hours=2),
                heartbeat_timeout=timedelta(seconds=input.options.heartbeat_timeout_s),
                retry_policy=CHUNK_RETRY,
                summary=f"rows {start}-{end - 1}",
                # The UI's pending activities list ids, not summaries: name the rows.
                activity_id=activity_id if named_by_rows else None,
                # Not checked on replay: histories from before priorities replay as is.
                priority=self._priority(input),
            )
        )

    def _priority(self, input: DatasetRunInput) -> Priority:
        """Temporal's priority of a chunk: its play's key, weight and class (the play
        sets the key; a run started on its own falls back to its parent's, or its
        own, workflow id)."""
        info = workflow.info()
        owner = info.parent.workflow_id if info.parent is not None else info.workflow_id
        return temporal_priority(input.options, owner)

    def _status(self) -> RunStatus:
        if self._ended is not None:
            return self._ended
        if self._cancelling:
            return "cancelling"
        if self._waiting or self._budget_wait is not None:
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
        self._report_seq += 1
        report = self.state().model_copy(update={"seq": self._report_seq})
        self._reports.append(asyncio.ensure_future(handle.signal(PROGRESS_SIGNAL, report)))

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
            rows_done=self._work.rows_done,
            chunks_in_flight=len(self._pending),
            stats=self._stats,
            status=self._status(),
            window=self._window(),
            paused=self._control.paused,
            paces=self._width.paces,
            waits=self._waits,
            ranges=sorted((span.start, span.end) for span in self._pending.values()),
            budget_wait=self._budget_wait,
            note=self._note,
        )
