"""``PlayContext``: what a play can do, as deterministic workflow operations.

Every method turns into Temporal commands (activities, child workflows) whose
results are recorded in history, so a play replays exactly. Nothing here touches a
file, a socket or the clock directly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from playline.activities.datasets import DatasetActivities
    from playline.activities.scalar import ScalarActivities
    from playline.contract import (
        ChunkStats,
        DatasetRef,
        DatasetResult,
        DatasetRunInput,
        FinalizeInput,
        LoadCsvInput,
        LoadRowsInput,
        OnRowError,
        PlayRunResult,
        PlayState,
        PrepareRunInput,
        RunMode,
        RunOptions,
        StepInput,
        ToolCallInput,
    )
    from playline.resolvers import registered_name
    from playline.workflows.dataset import SHORT_ACTIVITY, DatasetBuilder, DatasetHandle
    from playline.workflows.dataset_run import DatasetRunWorkflow
    from playline.workflows.failures import SETUP_RETRY, as_failure

LOG_LINES_KEPT = 50


class PlayContext:
    """The ``ctx`` a play function receives."""

    def __init__(self, play: str, options: RunOptions) -> None:
        self.play = play
        self.options = options
        self.state = PlayState(play=play)
        self.datasets: list[DatasetResult] = []
        self.stats = ChunkStats()
        self._uses: dict[str, int] = {}

    def _unique(self, kind: str, key: str) -> str:
        """``key``, or ``key#n`` for its n-th use in this play: deterministic ids."""
        name = f"{kind}:{key}"
        self._uses[name] = self._uses.get(name, 0) + 1
        n = self._uses[name]
        return key if n == 1 else f"{key}#{n}"

    # -- datasets -----------------------------------------------------------

    async def csv(
        self, key: str, path: str, *, required_columns: Sequence[str] = ()
    ) -> DatasetHandle:
        """Load a CSV file (on the worker) into the sheet store; returns a handle."""
        self.state.phase = f"loading {key}"
        ref = await workflow.execute_activity_method(
            DatasetActivities.load_csv,
            LoadCsvInput(key=key, path=path, required_columns=list(required_columns)),
            start_to_close_timeout=SHORT_ACTIVITY,
            retry_policy=SETUP_RETRY,
        )
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
        self.state.phase = f"preparing {name}"
        source = await self._source_of(builder)
        prepared = await workflow.execute_activity_method(
            DatasetActivities.prepare_run,
            PrepareRunInput(
                run_ref=run_ref,
                source_id=source.id,
                dataset=builder.key,
                key_fields=key_fields,
                mode=mode,
                columns=columns,
                options=self.options,
            ),
            start_to_close_timeout=SHORT_ACTIVITY,
            retry_policy=SETUP_RETRY,
        )
        self.state.rows_total += prepared.admitted
        self.state.current_dataset = name
        self.log(
            f"dataset {name}: {prepared.admitted} of {prepared.total} rows admitted"
            + (f", {prepared.duplicates} duplicate keys" if prepared.duplicates else "")
            + (f", {prepared.seen_before} seen before" if prepared.seen_before else "")
        )
        child_id = f"{info.workflow_id}/dataset/{name}"
        self.state.current_child_id = child_id
        self.state.phase = f"running {name}"
        try:
            stats = await workflow.execute_child_workflow(
                DatasetRunWorkflow.run,
                DatasetRunInput(
                    prepared=prepared,
                    columns=columns,
                    on_row_error=on_row_error,
                    options=self.options,
                ),
                id=child_id,
            )
        except ChildWorkflowError as err:
            raise as_failure(err) from err
        result = await workflow.execute_activity_method(
            DatasetActivities.finalize_run,
            FinalizeInput(
                run_ref=run_ref,
                inline_rows_budget_bytes=self.options.inline_rows_budget_bytes,
                preview_rows=self.options.preview_rows,
            ),
            start_to_close_timeout=SHORT_ACTIVITY,
            retry_policy=SETUP_RETRY,
        )
        stats.rows_ok, stats.rows_failed = result.stats.rows_ok, result.stats.rows_failed
        result.stats = stats
        self.stats.add(stats)
        self.datasets.append(result)
        self.state.current_child_id = None
        self.state.rows_done += prepared.admitted
        self.state.rows_failed += stats.rows_failed
        self.state.calls_made += stats.calls_made
        self.state.calls_cached += stats.calls_cached
        self.state.credits += stats.credits
        self.state.phase = f"finished {name}"
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
        """One tool call outside a dataset (through receipts and the governor)."""
        try:
            data = await workflow.execute_activity_method(
                ScalarActivities.call_tool,
                ToolCallInput(
                    tool_id=tool_id,
                    input=input,
                    force=force,
                    stale_after_seconds=stale_after_seconds,
                    options=self.options,
                ),
                start_to_close_timeout=SHORT_ACTIVITY,
                retry_policy=SETUP_RETRY,
            )
        except ActivityError as err:
            raise as_failure(err) from err
        return data

    async def step(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a registered function once as an activity; replays return its stored result."""
        try:
            return await workflow.execute_activity_method(
                ScalarActivities.run_step,
                StepInput(name=name, fn=registered_name(fn), args=list(args)),
                start_to_close_timeout=SHORT_ACTIVITY,
                retry_policy=SETUP_RETRY,
                summary=name,
            )
        except ActivityError as err:
            raise as_failure(err) from err

    async def run_play(
        self, play: str | type, input: Any, *, options: RunOptions | None = None
    ) -> PlayRunResult:
        """Run another play as a child workflow with a derived id."""
        name = play if isinstance(play, str) else getattr(play, "__playline_play__", None)
        if not isinstance(name, str):
            raise ApplicationError(f"{play!r} is not a play", non_retryable=True)
        child_id = f"{workflow.info().workflow_id}/play/{self._unique('play', name)}"
        try:
            result: PlayRunResult = await workflow.execute_child_workflow(
                name,
                args=[input, options or self.options],
                id=child_id,
                result_type=PlayRunResult,
            )
        except ChildWorkflowError as err:
            raise as_failure(err) from err
        self.stats.add(result.stats)
        return result

    def log(self, message: str) -> None:
        """A line in the worker log and in the play's ``state`` query (last 50 kept)."""
        workflow.logger.info("%s: %s", self.play, message)
        self.state.log.append(message)
        del self.state.log[:-LOG_LINES_KEPT]
