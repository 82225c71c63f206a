"""Estimate activities: a play's rows and scalar calls counted, nothing sent or written.

``playline.estimate_chunk`` is the chunk activity of an estimate (``RunOptions.estimate``):
it reads the run's rows ``[start, end)`` from the sheet store like
``playline.run_chunk`` and runs every column's resolver for each row with the run's
own row context (``RowCall``), whose tool calls and waterfalls go down the run's call
path to an :class:`~playline.calls.estimate.EstimatingDispatcher` (an
:class:`~playline.calls.estimate.Estimator`): answered by fresh receipts where they
exist, counted and priced where the run would pay. It sends no request, claims
no receipt and writes no cell, so it can run many rows at once; it returns the rows
it counted and the estimate's tally (``ChunkStats.estimate``).

A resolver (or ``run_if``) that raises on an unpaid answer (an ``Unknown`` has no
string methods, no arithmetic) leaves its column unknown, and the tools it declares
but did not call in that row are counted as dependent calls whose input is unknown
(the worst case). One that raises with every answer known would fail the row in
the run too: the row counts as failed and its later columns are not run.

A column whose resolver lets a ``BlankInput`` through (a required tool input left
blank) is empty, as in the run (``skipped_input``, never sent, free): the row goes on.

A column that ends without raising but met an unknown value (an unpaid answer, a
row's unknown cell, a branch on either: ``if not found.get("email")``, ``a or b``,
``== "valid"``) may have left a way untaken whose calls the run would make: its
declared tools it did not call are counted the same way, in the worst case in full,
expected at the chance the run goes another way (a measured miss rate, else 1).

``playline.estimate_tool`` and ``playline.estimate_waterfall`` do the same for a play's
scalar ``ctx.tool`` and ``ctx.waterfall``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from temporalio import activity

from playline import resolvers
from playline.activities.chunk import RowCall
from playline.calls.catalog import ToolSpec
from playline.calls.cell_freshness import later_columns, plan_column
from playline.calls.estimate import (
    Estimator,
    Unknown,
    UnpaidResult,
    counting_for,
    note_read,
    unknown_p,
    watching_unknowns,
)
from playline.calls.estimate_tally import PLAY_COLUMN
from playline.calls.fixtures import FIXTURE_SCOPE
from playline.calls.provenance import ColumnCalls
from playline.calls.runner import REFRESH_OLDER_THAN, ToolResult
from playline.calls.waterfall import WaterfallResult
from playline.contract import (
    ESTIMATE_DATASET_SUFFIX,
    ChunkInput,
    ChunkStats,
    ColumnSpec,
    EstimatedCall,
    RunOptions,
    ToolCallInput,
    WaterfallCallInput,
)
from playline.errors import BlankInput, InvalidPlayInput, PlaylineError
from playline.money import prices_of
from playline.services import HolderActivities, Services
from playline.stores.sheet import RunRow

#: Rows an estimate chunk runs at once: no provider is waited for, only the store.
ESTIMATE_ROW_CONCURRENCY = 256
#: Why an estimated scalar waterfall has no value: the run would pay to know it.
UNPAID = "not paid for: an estimate"


#: A real dataset row an estimate's scratch row stands for: its data and cell metadata.
EarlierRow = tuple[dict[str, Any], dict[str, Any]]


async def earlier_rows(
    services: Services, run_ref: str, rows: Sequence[RunRow]
) -> dict[str, EarlierRow]:
    """The real dataset's rows behind an estimate's scratch rows, by row key: the cells
    earlier runs left and when they were fetched, which say what is fresh."""
    info = await services.sheet.run_info(run_ref)
    if info is None or not info.dataset.endswith(ESTIMATE_DATASET_SUFFIX) or not rows:
        return {}
    dataset = info.dataset[: -len(ESTIMATE_DATASET_SUFFIX)]
    return await services.sheet.read_cells(dataset, [row.row_key for row in rows])


#: Estimates whose counted calls this worker remembers (the latest few).
SEEN_RUNS_KEPT = 4
_SEEN: OrderedDict[str, dict[bytes, int]] = OrderedDict()


def seen_calls(run_ref: str) -> dict[bytes, int]:
    """The calls this worker already counted to pay for the estimate ``run_ref``, by the
    chunk (its first row) that counted each."""
    seen = _SEEN.pop(run_ref, None)
    _SEEN[run_ref] = seen if seen is not None else {}
    while len(_SEEN) > SEEN_RUNS_KEPT:
        _SEEN.popitem(last=False)
    return _SEEN[run_ref]


def estimating_runner(
    services: Services,
    options: RunOptions,
    *,
    seen: dict[bytes, int] | None = None,
    chunk: int = 0,
) -> Estimator:
    """The run's call path counting instead of sending, keyed like the run's mode would
    key it (a fixture-mode run pays nothing, so its calls are counted at 0 credits)."""

    def fixture_scope(_tool: ToolSpec) -> str:
        return FIXTURE_SCOPE

    if options.integration_mode == "fixture":  # replayed answers: counted, never charged
        return Estimator(
            services.catalog, services.receipts, fixture_scope, free=True, seen=seen, chunk=chunk
        )
    return Estimator(
        services.catalog, services.receipts, services.provider.auth_scope, seen=seen, chunk=chunk
    )


class RowReads(Mapping[str, Any]):
    """A row as an estimated resolver sees it (read only, like the run's
    ``MappingProxyType``): reading a cell that holds an unknown value is recorded on the
    column being watched (:func:`~playline.calls.estimate.watching_unknowns`)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        value = self._data[key]
        if unknown_p(value) is not None:
            note_read()
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __or__(self, other: Mapping[str, Any]) -> dict[str, Any]:
        return {**self, **other}

    def __ror__(self, other: Mapping[str, Any]) -> dict[str, Any]:
        return {**other, **self}

    def copy(self) -> dict[str, Any]:
        return dict(self)

    def __repr__(self) -> str:
        return f"RowReads({self._data!r})"


def met_unpaid(column: ColumnCalls) -> bool:
    """Whether a column's calls met an answer the run would pay for (an ``Unknown``)."""
    return any(isinstance(call, UnpaidResult) for call in column.calls) or any(
        isinstance(found.value, Unknown) for found in column.waterfalls
    )


async def _evaluate(spec: ColumnSpec, row: Mapping[str, Any], rc: RowCall) -> Any:
    """One column for one row, as the chunk runs it; the value it would hold."""
    if spec.run_if is not None:
        verdict = resolvers.lookup(spec.run_if)(row)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if not verdict:
            return row.get(spec.name)
    value = await resolvers.lookup(spec.resolver)(row, rc)
    if isinstance(value, ToolResult):
        return value.data
    if isinstance(value, WaterfallResult):
        return value.value
    return value


class ChunkEstimate:
    """One attempt of one estimate chunk: its rows run on the estimate's call path."""

    def __init__(self, input: ChunkInput, estimator: Estimator) -> None:
        self.input = input
        self.estimator = estimator
        self.rows_done = 0
        #: cells the run would compute / keep because they are fresh (``plan_column``)
        self.cells_due = 0
        self.cells_fresh = 0
        self._later = later_columns(input.columns)
        self._gate = asyncio.Semaphore(ESTIMATE_ROW_CONCURRENCY)

    async def run(
        self, rows: list[RunRow], earlier: Mapping[str, EarlierRow] | None = None
    ) -> ChunkStats:
        started = time.monotonic()
        beats = asyncio.create_task(self._heartbeats())
        found = earlier or {}
        try:
            done = await asyncio.gather(
                *(self._row(row, found.get(row.row_key)) for row in rows), return_exceptions=True
            )
            for outcome in done:  # every row settled first: none is left running
                if isinstance(outcome, BaseException):
                    raise outcome
        finally:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
        tally = self.estimator.tally.as_dict()
        used = {p for tools in tally["lines"].values() for per in tools.values() for p in per}
        return ChunkStats(
            elapsed_s=time.monotonic() - started,
            estimate=tally,
            cells_due=self.cells_due,
            cells_fresh=self.cells_fresh,
            prices=prices_of(self.estimator.runner.catalog, used),
        )

    async def _heartbeats(self) -> None:
        interval = max(0.5, self.input.options.heartbeat_timeout_s / 3)
        while True:
            activity.heartbeat({"rows_done": self.rows_done})
            await asyncio.sleep(interval)

    async def _row(self, row: RunRow, earlier: EarlierRow | None = None) -> None:
        async with self._gate:
            # An estimate's rows live in a scratch dataset: the cells an earlier run left
            # (and when they were fetched) are the real dataset's row.
            data: dict[str, Any] = {**earlier[0], **row.data} if earlier else dict(row.data)
            meta: Mapping[str, Any] = earlier[1] if earlier else row.cell_meta
            view = MappingProxyType(data)
            reads = RowReads(data)
            rc = RowCall(row.row_key, self.estimator.runner, row=reads)
            failed = False
            now = time.time()
            for spec, skip in zip(self.input.columns, self._later, strict=True):
                rc.next_column()
                try:
                    plan = plan_column(spec, skip, view, meta, now)
                    rc.previous = plan.previous
                    if plan.keep:
                        self.cells_fresh += 1
                        continue
                    self.cells_due += 1
                    token = REFRESH_OLDER_THAN.set(plan.refresh_older_than)
                    try:
                        with counting_for(spec.name), watching_unknowns() as met:
                            try:
                                data[spec.name] = await _evaluate(spec, reads, rc)
                            except BlankInput:  # the run: skipped_input, free; the row goes on
                                data[spec.name] = None
                    finally:
                        REFRESH_OLDER_THAN.reset(token)
                except Exception as err:
                    if isinstance(err, PlaylineError) and err.chunk_fatal:
                        raise
                    chance = unknown_p(data)
                    if not met_unpaid(rc.column) and chance is None:
                        failed = True  # the run fails this row too: its later columns never run
                        break
                    await self._count_uncalled(spec, rc.column, 1.0 if chance is None else chance)
                    data[spec.name] = Unknown(1.0 if chance is None else chance)
                else:
                    if met_unpaid(rc.column) or met.any:
                        # A way the estimate did not take (a fallback) may call the rest.
                        await self._count_uncalled(spec, rc.column, met.fallback_chance())
            tally = self.estimator.tally
            tally.rows += 1
            tally.rows_failed += int(failed)
            self.rows_done += 1

    async def _count_uncalled(self, spec: ColumnSpec, made: ColumnCalls, chance: float) -> None:
        """The column's declared tools it did not reach: dependent calls, input unknown,
        each expected with ``chance``."""
        for tool_id in resolvers.declared_tools(spec.resolver):
            if tool_id not in made.asked:
                await self.estimator.dispatcher.count_unknown_input(spec.name, tool_id, chance)


class EstimateActivities(HolderActivities):
    """Activities of an estimate: rows and scalar calls counted, nothing sent."""

    @activity.defn(name="playline.estimate_chunk")
    async def estimate_chunk(self, input: ChunkInput) -> ChunkStats:
        """Count what the run's rows ``[start, end)`` would cost; writes nothing."""
        services = self._holder.services
        rows = await services.sheet.read_run_rows(input.run_ref, input.start, input.end)
        if len(rows) != input.end - input.start:
            raise InvalidPlayInput(
                f"run {input.run_ref} has {len(rows)} rows in [{input.start}, {input.end})"
            )
        estimator = estimating_runner(
            services, input.options, seen=seen_calls(input.run_ref), chunk=input.start
        )
        earlier = await earlier_rows(services, input.run_ref, rows)
        return await ChunkEstimate(input, estimator).run(rows, earlier)

    @activity.defn(name="playline.estimate_tool")
    async def estimate_tool(self, input: ToolCallInput) -> EstimatedCall:
        """``ctx.tool`` estimated: the receipt's answer if a fresh one holds it, else
        ``{}``."""
        estimator = estimating_runner(self._holder.services, input.options)
        with counting_for(PLAY_COLUMN):
            result = await estimator.runner.call(
                input.tool_id,
                input.input,
                force=input.force,
                stale_after_seconds=input.stale_after_seconds,
            )
        # Unpaid, the play gets an empty answer: code reading it (``.get``) goes on.
        data: Any = {} if isinstance(result, UnpaidResult) else result.data
        return EstimatedCall(data=data, estimate=estimator.tally.as_dict())

    @activity.defn(name="playline.estimate_waterfall")
    async def estimate_waterfall(self, input: WaterfallCallInput) -> EstimatedCall:
        """``ctx.waterfall`` estimated, shaped as ``call_waterfall``'s answer: the value
        when receipts give it for sure, else ``None`` with the miss ``UNPAID``."""
        estimator = estimating_runner(self._holder.services, input.options)
        rc = RowCall(PLAY_COLUMN, estimator.runner)
        with counting_for(PLAY_COLUMN):
            result = await rc.waterfall(input.name, input.input)
        known = not isinstance(result.value, Unknown)
        data: dict[str, Any] = {
            "value": result.value if known else None,
            "step": result.step,
            "credits": 0.0,
            "miss": (result.miss if result.value is None else None) if known else UNPAID,
            "steps": [],
        }
        return EstimatedCall(data=data, estimate=estimator.tally.as_dict())
