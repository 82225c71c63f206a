"""``PlayContext``: what a play can do, as deterministic workflow operations.

Every method turns into Temporal commands (activities, child workflows) whose
results are recorded in history, so a play replays exactly. Nothing here touches a
file, a socket or the clock directly.

The context also keeps the play visible: its ``state`` (the query), its current
details in the Temporal UI and its search attributes are refreshed by
:meth:`PlayContext.publish` at every phase change and at every progress report of
the dataset run in flight (which the run spaces out), never per row or per chunk.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import Priority, SearchAttributeUpdate
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    is_cancelled_exception,
)

with workflow.unsafe.imports_passed_through():
    from playline import search_attributes as sa
    from playline.activities.datasets import DatasetActivities
    from playline.activities.estimate import EstimateActivities
    from playline.activities.scalar import ScalarActivities
    from playline.activities.sync import SyncActivities
    from playline.contract import (
        ESTIMATE_DATASET_SUFFIX,
        JOB_PENDING_ERROR,
        ChunkStats,
        ColumnSpec,
        DatasetRef,
        DatasetResult,
        DatasetRunInput,
        DatasetRunState,
        EstimatedCall,
        FinalizeInput,
        JobPendingDetails,
        LoadCsvInput,
        LoadRowsInput,
        OnRowError,
        PlayRunResult,
        PlayState,
        PreparedRun,
        PrepareRunInput,
        RunMode,
        RunOptions,
        RunStatus,
        StepInput,
        SyncInput,
        SyncSummary,
        ToolCallInput,
        WaterfallCallInput,
    )
    from playline.resolvers import registered_name
    from playline.workflows.controls import PlayControls
    from playline.workflows.dataset import SHORT_ACTIVITY, DatasetBuilder, DatasetHandle
    from playline.workflows.dataset_run import DatasetRunWorkflow
    from playline.workflows.failures import SETUP_RETRY, as_failure
    from playline.workflows.priority import temporal_priority
    from playline.workflows.status import dataset_static, play_current_details, sync_line

LOG_LINES_KEPT = 50
#: How long one ``ctx.sync`` attempt may take (429s are waited out inside it).
SYNC_TIMEOUT = timedelta(hours=1)
#: The memo key listing the run references of a play's dataset runs (``runs export``).
RUN_REFS_MEMO = "playline_run_refs"


class PlayContext:
    """The ``ctx`` a play function receives."""

    def __init__(
        self,
        play: str,
        options: RunOptions,
        controls: PlayControls | None = None,
        *,
        search_attributes: Sequence[str] = (),
        memo: bool = False,
        before_calls: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """
        Args:
            play: the play's name (its workflow type).
            options: how it runs.
            controls: the play's dispatch controls (its updates change them).
            search_attributes: names of playline's search attributes the namespace
                has registered; only these are upserted.
            memo: whether to record the dataset runs' references in the memo (runs
                recorded before it existed must replay without it).
            before_calls: run once before the play's first provider call (a dataset
                run's chunks, a scalar call, a child play): the play reads its
                providers' balances there (see ``PlayWorkflow``); never in an estimate.
        """
        self.play = play
        self.options = options
        self.controls = controls or PlayControls(play)
        self.state = PlayState(play=play)
        self.state.search_attributes = list(search_attributes)
        self.datasets: list[DatasetResult] = []
        self.stats = ChunkStats()
        #: the root cause of the play's failure, once it failed
        self.failure: str | None = None
        self._uses: dict[str, int] = {}
        self._memo = memo
        self._rows_finished = 0
        self._sources: dict[str, str] = {}  # source dataset id -> the file it was loaded from
        self._input_csv: str | None = None  # the play input's csv_path
        self._declared_columns: tuple[str, ...] = ()  # what @play says it must have
        self._upserted: dict[str, Any] = {}
        self._before_calls = before_calls
        #: held while ``before_calls`` runs: calls started meanwhile wait for it
        self._before_lock = asyncio.Lock()

    def _unique(self, kind: str, key: str) -> str:
        """``key``, or ``key#n`` for its n-th use in this play: deterministic ids."""
        name = f"{kind}:{key}"
        self._uses[name] = self._uses.get(name, 0) + 1
        n = self._uses[name]
        return key if n == 1 else f"{key}#{n}"

    # -- datasets -----------------------------------------------------------

    def declare_input_csv(self, path: str | None, required_columns: Sequence[str]) -> None:
        """The play input's ``csv_path`` and the columns ``@play(required_columns=...)``
        declares for it (what :meth:`csv` checks when it loads that file untold)."""
        self._input_csv = path
        self._declared_columns = tuple(required_columns)

    async def csv(
        self, key: str, path: str, *, required_columns: Sequence[str] | None = None
    ) -> DatasetHandle:
        """Load a CSV file (on the worker) into the sheet store; returns a handle.

        ``required_columns`` are the columns its header must have; without them, the
        play's input CSV (``path`` is the input's ``csv_path``) is checked for the
        columns ``@play(required_columns=...)`` declares, and any other file for none.
        """
        if required_columns is None:
            required_columns = self._declared_columns if path == self._input_csv else ()
        self.state.phase = f"loading {key}"
        self.publish()
        ref = await workflow.execute_activity_method(
            DatasetActivities.load_csv,
            LoadCsvInput(key=key, path=path, required_columns=list(required_columns)),
            start_to_close_timeout=SHORT_ACTIVITY,
            retry_policy=SETUP_RETRY,
            summary=f"load {_file_name(path)} as {key}",
        )
        self._sources[ref.id] = path
        self.log(f"loaded {ref.count} rows into {ref.id}")
        return DatasetHandle(ref)

    def dataset(
        self, key: str, source: DatasetHandle | DatasetRef | Sequence[Mapping[str, Any]]
    ) -> DatasetBuilder:
        """Start describing columns to add to ``source``, stored as dataset ``key``.

        ``source`` is a handle (from ``csv`` or an earlier run) or a short list of
        rows; a list is stored in the sheet store before the run and, being an
        activity argument, recorded in history once: load large data from a file.
        """
        if isinstance(source, DatasetHandle):
            return DatasetBuilder(self, key, source.ref)
        if isinstance(source, DatasetRef):
            return DatasetBuilder(self, key, source)
        rows = [dict(row) for row in source]
        return DatasetBuilder(self, key, None, inline_rows=tuple(rows))

    async def _source_of(self, builder: DatasetBuilder) -> DatasetRef:
        if builder.source is not None:
            return builder.source
        return await workflow.execute_activity_method(
            DatasetActivities.load_rows,
            LoadRowsInput(key=builder.key, rows=list(builder.inline_rows)),
            start_to_close_timeout=SHORT_ACTIVITY,
            retry_policy=SETUP_RETRY,
            summary=f"load {len(builder.inline_rows)} inline rows as {builder.key}",
        )

    async def run_dataset(
        self,
        builder: DatasetBuilder,
        key_fields: list[str],
        mode: RunMode,
        on_row_error: OnRowError,
    ) -> DatasetHandle:
        """Run a described dataset (``DatasetBuilder.run`` calls this): load inline rows,
        prepare the run, run its chunks as the ``playline.DatasetRun`` child, finalize."""
        info = workflow.info()
        name = self._unique("dataset", builder.key)
        run_ref = f"{info.workflow_id}/{info.run_id}/{name}"
        columns = list(builder.columns)
        source, prepared = await self._prepare(builder, name, run_ref, key_fields, mode, columns)
        run = DatasetRunInput(
            prepared=prepared,
            columns=columns,
            on_row_error=on_row_error,
            options=self._bounded_options(),
            control=self.controls.dispatch,
            source_path=self._sources.get(source.id),
        )
        await self._before_first_call()
        stats, cancelled = await self._run_chunks(name, run, source.id, mode, key_fields)
        return await self._finalize(name, run_ref, prepared, stats, cancelled)

    async def _prepare(
        self,
        builder: DatasetBuilder,
        name: str,
        run_ref: str,
        key_fields: list[str],
        mode: RunMode,
        columns: list[ColumnSpec],
    ) -> tuple[DatasetRef, PreparedRun]:
        """Load inline rows, then check everything and write the run's manifest."""
        self.state.phase = f"preparing {name}"
        self.publish()
        source = await self._source_of(builder)
        dataset, admitted_by = builder.key, mode
        if self.options.estimate:
            # An estimate's rows go to a scratch dataset, so the real one learns no key
            # from it (a later net_new run admits what it would have); every row counts.
            dataset, admitted_by = f"{builder.key}{ESTIMATE_DATASET_SUFFIX}", "upsert"
            self.log(f"estimate: {name} counted from receipts, no provider called")
        prepared = await workflow.execute_activity_method(
            DatasetActivities.prepare_run,
            PrepareRunInput(
                run_ref=run_ref,
                source_id=source.id,
                dataset=dataset,
                key_fields=key_fields,
                mode=admitted_by,
                columns=columns,
                options=self.options,
            ),
            start_to_close_timeout=SHORT_ACTIVITY,
            retry_policy=SETUP_RETRY,
            summary=f"prepare {name}: {source.count} rows of {source.id} ({mode})",
        )
        self.state.rows_total += prepared.admitted
        self.state.current_dataset = name
        self.state.run_refs.append(run_ref)
        if self._memo:
            workflow.upsert_memo({RUN_REFS_MEMO: self.state.run_refs})
        self.log(
            f"dataset {name}: {prepared.admitted} of {prepared.total} rows admitted"
            + (f", {prepared.duplicates} duplicate keys" if prepared.duplicates else "")
            + (f", {prepared.seen_before} seen before" if prepared.seen_before else "")
        )
        return source, prepared

    async def _run_chunks(
        self,
        name: str,
        run: DatasetRunInput,
        source_id: str,
        mode: RunMode,
        key_fields: list[str],
    ) -> tuple[ChunkStats, bool]:
        """The ``playline.DatasetRun`` child: its stats, and whether it was cancelled."""
        info = workflow.info()
        child_id = f"{info.workflow_id}/dataset/{name}"
        self.state.current_child_id = child_id
        self.state.phase = f"running {name}"
        summary, details = dataset_static(
            play=self.play,
            name=name,
            prepared=run.prepared,
            source_id=source_id,
            source_path=run.source_path,
            mode=mode,
            key_fields=key_fields,
            columns=run.columns,
            options=self.options,
        )
        self.publish()
        sent = run.control
        try:
            child = await workflow.start_child_workflow(
                DatasetRunWorkflow.run,
                run,
                id=child_id,
                static_summary=summary,
                static_details=details,
                priority=self._priority(),
            )
            self.controls.child = child
            if self.controls.dispatch != sent:  # changed while the run was starting
                await self.controls.apply()
            return await child, False
        except ChildWorkflowError as err:
            if not (is_cancelled_exception(err) and workflow.cancellation_reason() is not None):
                raise as_failure(err) from err
            # Cancelled gracefully: the run settled its chunks and reported its counts.
            return (self.state.current.stats if self.state.current else ChunkStats()), True
        finally:
            self.controls.child = None

    async def _finalize(
        self,
        name: str,
        run_ref: str,
        prepared: PreparedRun,
        stats: ChunkStats,
        cancelled: bool,
    ) -> DatasetHandle:
        """The run's counts and preview from the sheet; the play's tally; its handle."""
        result = await workflow.execute_activity_method(
            DatasetActivities.finalize_run,
            FinalizeInput(
                run_ref=run_ref,
                inline_rows_budget_bytes=self.options.inline_rows_budget_bytes,
                preview_rows=self.options.preview_rows,
            ),
            start_to_close_timeout=SHORT_ACTIVITY,
            retry_policy=SETUP_RETRY,
            summary=f"finalize {name}: counts and {self.options.preview_rows} preview rows",
        )
        # The sheet's counts; rows skipped for budget are stored as errors (their
        # export says why) but are not failures.
        stats.rows_ok = result.stats.rows_ok
        stats.rows_failed = max(0, result.stats.rows_failed - stats.rows_skipped_budget)
        # What the run changed in cells the dataset had, counted by the sheet store.
        stats.changes = result.stats.changes
        result.stats = stats
        self.stats.add(stats)
        self.datasets.append(result)
        self.state.current_child_id = None
        self.state.current = None
        if cancelled:
            done = stats.rows_ok + stats.rows_failed
            self._rows_finished += done
            self.state.phase = f"cancelled {name}"
            self.log(f"dataset {name}: cancelled after {done} of {prepared.admitted} rows")
            raise asyncio.CancelledError(f"cancelled after {done} of {prepared.admitted} rows")
        self._rows_finished += prepared.admitted
        self.state.phase = f"finished {name}"
        self.publish()
        if self.options.estimate:
            return DatasetHandle(result.ref, result, skip_writes=self.log)
        return DatasetHandle(result.ref, result)

    # -- scalar work --------------------------------------------------------

    async def tool(
        self,
        tool_id: str,
        input: dict[str, Any],
        *,
        force: bool = False,
        stale_after_seconds: float | None = None,
    ) -> Any:
        """One tool call outside a dataset (through receipts and the governor). In an
        estimate: the answer a fresh receipt holds, else ``{}`` (counted, not sent)."""
        await self.dispatch_allowed()
        await self._before_first_call()
        call = ToolCallInput(
            tool_id=tool_id,
            input=input,
            force=force,
            stale_after_seconds=stale_after_seconds,
            options=self.options,
        )
        if self.options.estimate:
            return await self._estimated(
                EstimateActivities.estimate_tool, call, f"estimate tool {tool_id}"
            )
        # Runs recorded before the scalar call heartbeated (its lease renewed, F4)
        # replay without the heartbeat timeout.
        heartbeat = (
            timedelta(seconds=self.options.heartbeat_timeout_s)
            if workflow.patched("scalar-tool-heartbeat")
            else None
        )
        return await self._scalar(ScalarActivities.call_tool, call, heartbeat, f"tool {tool_id}")

    async def waterfall(self, name: str, input: dict[str, Any]) -> dict[str, Any]:
        """One of the catalog's named waterfalls, run once for the play (through
        receipts and the governor, step by step): ``{"value", "step", "credits",
        "miss", "steps"}``, each step with its outcome. Like ``tool``, its answer is
        recorded in the play's history, so pass it no row data you would not log.
        In an estimate: that answer when receipts give it for sure, else no value."""
        await self.dispatch_allowed()
        await self._before_first_call()
        call = WaterfallCallInput(name=name, input=input, options=self.options)
        if self.options.estimate:
            found: dict[str, Any] = await self._estimated(
                EstimateActivities.estimate_waterfall, call, f"estimate waterfall {name}"
            )
            return found
        result: dict[str, Any] = await self._scalar(
            ScalarActivities.call_waterfall,
            call,
            timedelta(seconds=self.options.heartbeat_timeout_s),
            f"waterfall {name}",
        )
        return result

    async def _scalar(
        self,
        activity: Any,
        call: ToolCallInput | WaterfallCallInput,
        heartbeat: timedelta | None,
        summary: str,
    ) -> Any:
        """A scalar call (``tool``, ``waterfall``) run by ``activity``; a call whose
        provider job runs waits on a durable timer and is called again with the token
        the activity gave it, until it has its answer."""
        token: str | None = None
        while True:
            try:
                return await workflow.execute_activity_method(
                    activity,
                    call.model_copy(update={"call_token": token}),
                    start_to_close_timeout=SHORT_ACTIVITY,
                    heartbeat_timeout=heartbeat,
                    retry_policy=SETUP_RETRY,
                    summary=summary,
                    priority=self._priority(),
                )
            except ActivityError as err:
                token = await _wait_for_job(err, summary)

    async def step(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a registered function once as an activity; replays return its stored result.
        An estimate skips it (a step is a side effect) and gets ``None``."""
        await self.dispatch_allowed()
        if self.options.estimate:
            self.log(f"estimate: step {name} skipped")
            return None
        return await self._short_activity(
            ScalarActivities.run_step,
            StepInput(name=name, fn=registered_name(fn), args=list(args)),
            name,
        )

    async def _short_activity(self, activity: Any, arg: Any, summary: str) -> Any:
        """Run a short activity (setup retries, the play's priority); its failure is the
        play's root cause, a cancellation stays one."""
        try:
            return await workflow.execute_activity_method(
                activity,
                arg,
                start_to_close_timeout=SHORT_ACTIVITY,
                retry_policy=SETUP_RETRY,
                summary=summary,
                priority=self._priority(),
            )
        except ActivityError as err:
            raise _failure_or_cancel(err) from err

    async def sync(
        self,
        result: DatasetHandle | DatasetResult,
        sink: str,
        *,
        map: Mapping[str, str] | None = None,
        id: str | None = None,
        policies: Mapping[str, str] | None = None,
        park_wait: timedelta = timedelta(hours=1),
        max_parks: int = 48,
        takeover_after: timedelta = timedelta(minutes=1),
    ) -> SyncSummary:
        """Write a dataset run's rows back to the catalog's sink ``sink`` (a CRM, a
        table; see :mod:`playline.sinks`): changes only, the sink's overwrite policies
        (``policies`` override them), ``map`` columns to fields on top of the sink's,
        ``id`` the column identifying the record. A destination that parks the sync
        (its daily limit) is waited out on a durable timer (until it says, else
        ``park_wait``) and the sync goes on, at most ``max_parks`` times; counts of
        writes are summed over the attempts, the others are the last attempt's. A
        worker that dies mid-sync is taken over by another after ``takeover_after``
        (the activity's heartbeat timeout and the batch's lease). An estimate skips it
        (a write is a side effect)."""
        await self.dispatch_allowed()
        if self.options.estimate:
            self.log(f"estimate: sync to {sink} skipped")
            return SyncSummary(sink=sink)
        ran = result.result if isinstance(result, DatasetHandle) else result
        if ran is None:
            raise ApplicationError(
                "ctx.sync needs a dataset run's result (`await ctx.dataset(...).run(...)`), "
                "not a loaded source",
                non_retryable=True,
            )
        call = SyncInput(
            run_ref=ran.run_ref,
            sink=sink,
            map=dict(map or {}),
            id_column=id,
            policies=dict(policies or {}),
            lease_ttl_s=takeover_after.total_seconds(),
        )
        written = SyncSummary(sink=sink)
        done = written
        for _ in range(max_parks + 1):
            try:
                done = await workflow.execute_activity_method(
                    SyncActivities.sync_dataset,
                    call,
                    start_to_close_timeout=SYNC_TIMEOUT,
                    heartbeat_timeout=takeover_after,
                    retry_policy=SETUP_RETRY,
                    summary=f"sync {sink}",
                    priority=self._priority(),
                )
            except ActivityError as err:
                raise _failure_or_cancel(err) from err
            written = written.model_copy(
                update={
                    k: getattr(written, k) + getattr(done, k)
                    for k in ("created", "updated", "fields_written", "requests")
                }
            )
            if done.parked is None:
                break
            wait = park_wait
            if done.retry_at is not None:
                until = datetime.fromtimestamp(done.retry_at, UTC) - workflow.now()
                wait = max(until, timedelta(seconds=1))
            self.log(f"sync to {sink} parked ({done.parked}); going on in {wait}")
            await workflow.sleep(wait)
        summary = done.model_copy(
            update={
                k: getattr(written, k) for k in ("created", "updated", "fields_written", "requests")
            }
        )
        self.log(sync_line(summary))
        # The state query's and the next details' (no command: replays alike).
        self.state.syncs.append(summary)
        return summary

    async def run_play(
        self, play: str | type, input: Any, *, options: RunOptions | None = None
    ) -> PlayRunResult:
        """Run another play as a child workflow with a derived id."""
        name = play if isinstance(play, str) else getattr(play, "__playline_play__", None)
        if not isinstance(name, str):
            raise ApplicationError(f"{play!r} is not a play", non_retryable=True)
        child_id = f"{workflow.info().workflow_id}/play/{self._unique('play', name)}"
        await self._before_first_call()
        options = options or self.options
        if self.options.estimate:  # an estimate's child plays are estimated too
            options = options.model_copy(update={"estimate": True})
        try:
            result: PlayRunResult = await workflow.execute_child_workflow(
                name,
                args=[input, options],
                id=child_id,
                result_type=PlayRunResult,
                # Options given without a key name the child play itself, as it will.
                priority=temporal_priority(options, child_id),
            )
        except ChildWorkflowError as err:
            raise _failure_or_cancel(err) from err
        self.stats.add(result.stats)
        return result

    async def _estimated(self, activity: Any, arg: Any, summary: str) -> Any:
        """A scalar call estimated by ``activity``: its tally joins the play's; the
        answer receipts give."""
        estimated: EstimatedCall = await self._short_activity(activity, arg, summary)
        self.stats.add(ChunkStats(estimate=estimated.estimate))
        return estimated.data

    def _bounded_options(self) -> RunOptions:
        """The options a dataset run gets: a bound on budget waits (``budget_wait_s``, a
        scheduled firing's interval) becomes the time it ends, from the play's start."""
        options = self.options
        if options.budget_wait_s is None or options.budget_wait_until is not None:
            return options
        until = workflow.info().start_time + timedelta(seconds=options.budget_wait_s)
        return options.model_copy(update={"budget_wait_until": until})

    def _priority(self) -> Priority:
        """Temporal's priority of this play's dataset runs and paid (or estimated) calls:
        the key, weight and class the governor paces them by (see
        :mod:`playline.workflows.priority`)."""
        return temporal_priority(self.options, workflow.info().workflow_id)

    def log(self, message: str) -> None:
        """A line in the worker log and in the play's ``state`` query (last 50 kept)."""
        workflow.logger.info("%s: %s", self.play, message)
        self.state.log.append(message)
        del self.state.log[:-LOG_LINES_KEPT]

    async def _before_first_call(self) -> None:
        """Run ``before_calls`` once, before the first provider call (none in an
        estimate); concurrent first calls wait for it, so none goes out before it."""
        if self._before_calls is None or self.options.estimate:
            return
        async with self._before_lock:
            hook = self._before_calls
            if hook is not None:
                await hook()
                self._before_calls = None

    # -- controls and visibility -------------------------------------------------

    async def dispatch_allowed(self) -> None:
        """Return at once, or (paused) when the play is resumed: no new work while paused."""
        if self.controls.dispatch.paused:
            self.publish()
            await workflow.wait_condition(lambda: not self.controls.dispatch.paused)
            self.publish()

    def on_progress(self, report: DatasetRunState) -> None:
        """The dataset run in flight reported its progress (``playline.progress``)."""
        if self.state.current_child_id is None:
            return  # a late report of a run already accounted for
        current = self.state.current
        if current is not None and report.seq and current.seq > report.seq:
            return  # two reports sent at once arrived in the other order: keep the later
        self.state.current = report
        self.state.budget_wait = report.budget_wait
        self.publish()

    def end(self, status: RunStatus, failure: str | None = None) -> None:
        """The play completed, failed or was cancelled: say so in the UI and its attributes."""
        self.controls.ended = status
        self.failure = failure
        if status != "completed":
            self.state.current_child_id = None
        self.state.phase = status
        self.publish()

    def totals(self) -> ChunkStats:
        """The finished datasets' stats plus the running one's last report."""
        totals = self.stats.model_copy()
        if self.state.current is not None:
            totals.add(self.state.current.stats)
        return totals

    def _status(self) -> RunStatus:
        ended = self.controls.ended
        if ended in ("completed", "failed", "cancelled"):
            return ended  # type: ignore[return-value]
        if workflow.cancellation_reason() is not None:
            return "cancelling"
        if self.controls.dispatch.paused:
            return "paused"
        if self.state.current is not None and self.state.current.status == "waiting":
            return "waiting"
        return "running"

    def publish(self) -> None:
        """Refresh the ``state`` counts, the UI's current details and the search attributes.

        Current details are not a command; search attributes are upserted only when a
        value changed, and this runs at phase changes and progress reports only.
        """
        state, totals = self.state, self.totals()
        current = state.current
        state.status = self._status()
        state.paused = self.controls.dispatch.paused
        state.window = self.controls.dispatch.window
        state.rows_done = self._rows_finished + (current.rows_done if current else 0)
        state.rows_failed = totals.rows_failed
        state.rows_cached = totals.rows_cached
        state.calls_made = totals.calls_made
        state.calls_cached = totals.calls_cached
        state.calls_shared = totals.calls_shared
        state.credits = totals.credits
        workflow.set_current_details(
            play_current_details(state, totals, workflow.now(), self.failure)
        )
        self._upsert()

    def _upsert(self) -> None:
        registered = set(self.state.search_attributes)
        if not registered:
            return
        state = self.state
        values: list[tuple[Any, Any]] = [
            (sa.PLAY, self.play),
            (sa.STATUS, state.status),
            (sa.ROWS_TOTAL, state.rows_total),
            (sa.ROWS_DONE, state.rows_done),
            (sa.ROWS_FAILED, state.rows_failed),
            (sa.CREDITS, round(state.credits, 6)),
            # Only where the namespace has it, which a history from before it lacks.
            (sa.KIND, "estimate" if self.options.estimate else "run"),
        ]
        updates: list[SearchAttributeUpdate[Any]] = []
        for key, value in values:
            if key.name in registered and self._upserted.get(key.name) != value:
                updates.append(key.value_set(value))
                self._upserted[key.name] = value
        if updates:
            workflow.upsert_search_attributes(updates)


def _file_name(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


#: A scalar call whose job runs is called again this long after the job's next look.
JOB_MARGIN = timedelta(seconds=1)


async def _wait_for_job(err: ActivityError, what: str) -> str:
    """A scalar call failed: while its provider job runs (``JobPending``), wait on a
    durable timer until the job is looked at again and return the call's token to call
    with; any other failure (or a history from before these waits) is raised."""
    cause = err.cause
    if (
        not isinstance(cause, ApplicationError)
        or cause.type != JOB_PENDING_ERROR
        or not cause.details
        or not workflow.patched("scalar-job-waits")
    ):
        raise _failure_or_cancel(err) from err
    pending = JobPendingDetails.model_validate(cause.details[0])
    until = datetime.fromtimestamp(pending.resume_at, tz=UTC) + JOB_MARGIN
    delay = max(until - workflow.now(), timedelta(seconds=1))
    await workflow.sleep(delay, summary=f"{what}: {pending.provider} job runs")
    return pending.call_token


def _failure_or_cancel(err: ActivityError | ChildWorkflowError) -> BaseException:
    """The play's cancellation stays a cancellation; any other failure its root cause."""
    if is_cancelled_exception(err) and workflow.cancellation_reason() is not None:
        return asyncio.CancelledError(str(err))
    return as_failure(err)
