"""The chunk activity: run a dataset's column resolvers over one range of rows.

The workflow hands over a run reference and a ``[start, end)`` range; the rows
themselves are read from the sheet store and the computed cells written back to
it, so the activity's input and output are a few hundred bytes whatever the rows
hold. Rows already finished by an earlier attempt are skipped, which together with
completed receipts makes a retried chunk cheap and free of double payments.

One :class:`ChunkRun` per attempt. While it runs, each on a task of its own
(:class:`~playline.calls.upkeep.AttemptUpkeep` and the flush loop):

* Temporal heartbeats carrying progress,
* renewals of the receipt leases of every unsettled tool call (also those still
  queued at the governor), the lease TTL being the heartbeat timeout,
* flushes of finished rows to the sheet (a failing flush keeps its rows and tries
  again; it never holds up a heartbeat or a renewal).

What stops the chunk (a lost lease, a failed store write, an error about the play)
stops *new* work only: rows not started stay pending, calls in flight finish and
record their answers (they may be paid for), bulk requests in flight too, and every
finished row is flushed before the attempt reports.

An attempt that fails has paid for its calls all the same, but its stats never reach
the workflow, and the retry finds those calls as receipt hits (or their rows done).
So every heartbeat carries the call stats of this attempt and of the failed ones
before it, a failing attempt sends a last heartbeat with them, and the next attempt
starts from them: the run reports every call it paid for, once (a worker that dies
loses only what it paid since its last heartbeat).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields
from types import MappingProxyType
from typing import Any

from temporalio import activity

from playline import resolvers
from playline.activities.width import LiveRowGate
from playline.calls.accounting import accounts_as_dict, accounts_from
from playline.calls.attempt import Attempt, CallStats
from playline.calls.budget import BudgetedDispatcher, RunBudget
from playline.calls.catalog import Catalog
from playline.calls.cell_freshness import (
    cell_meta,
    fetch_dates,
    kept_provenance,
    later_columns,
    plan_column,
)
from playline.calls.dispatch import Dispatcher
from playline.calls.fixtures import FixtureDispatcher
from playline.calls.jobs import JobDispatcher, job_dispatcher
from playline.calls.live import LiveDispatcher, PacedSender
from playline.calls.provenance import ColumnCalls, SpendTally, blank_call, cell_provenance
from playline.calls.reading import ReadingDispatcher
from playline.calls.runner import REFRESH_OLDER_THAN, ToolResult, ToolRunner
from playline.calls.upkeep import AttemptUpkeep
from playline.calls.waterfall import Step, WaterfallResult, run_waterfall, waterfall_of
from playline.calls.waterfall_spec import AcceptSpec, ValidateSpec
from playline.contract import (
    BudgetHold,
    ChunkInput,
    ChunkStats,
    ColumnSpec,
    ParkedRows,
    RunOptions,
    merge_spend,
)
from playline.errors import (
    BlankInput,
    BudgetReached,
    CallAmbiguous,
    InvalidPlayInput,
    JobPending,
    NotSentCancelled,
    PlaylineError,
    ProviderQuotaExhausted,
    RowFailed,
    UnstorableValue,
)
from playline.freshness import PreviousCell
from playline.money import prices_of
from playline.services import HolderActivities, Services
from playline.stores.cells import unstorable_columns
from playline.stores.sheet import RowResult, RunRow
from playline.telemetry import ProviderMetrics, RowMetrics

logger = logging.getLogger("playline.chunk")

FLUSH_EVERY_ROWS = 50


def _is_chunk_fatal(err: BaseException) -> bool:
    """About the play or the worker, not one row: it stops the chunk (see ``errors``)."""
    return isinstance(err, PlaylineError) and err.chunk_fatal


class RowCall:
    """The ``rc`` a resolver receives: its row's key, tool calls, waterfalls and a logger.

    It also records what each column's calls were (``column``), from which the chunk
    writes the cell's provenance. ``payer`` names the row in receipts: an answer this
    row paid for in an earlier attempt (a retried chunk, a worker killed after the
    call) reads as paid by it, not as reused, so the run's credits stay exact. An
    estimate gives its rows the same, over a runner that counts instead of sending.
    """

    def __init__(
        self,
        row_key: str,
        runner: ToolRunner,
        payer: str | None = None,
        row: Mapping[str, Any] | None = None,
    ) -> None:
        self.row_key = row_key
        #: the row as the resolver sees it (earlier columns included)
        self.row: Mapping[str, Any] = row if row is not None else MappingProxyType({})
        self._runner = runner
        self._payer = payer
        self.paid_calls = 0  # calls of this row that went to the provider
        self.column = ColumnCalls()
        #: the current column's cell as an earlier run left it (``None``: none)
        self.previous: PreviousCell | None = None

    def next_column(self) -> ColumnCalls:
        """Start recording a new column's calls; the previous column's record."""
        done, self.column = self.column, ColumnCalls()
        return done

    async def tool(
        self,
        tool_id: str,
        input: Mapping[str, Any],
        *,
        force: bool = False,
        stale_after_seconds: float | None = None,
    ) -> ToolResult:
        self.column.asked.add(tool_id)
        try:
            result = await self._runner.call(
                tool_id,
                input,
                force=force,
                stale_after_seconds=stale_after_seconds,
                payer=self._payer,
            )
        except BlankInput as err:  # never sent: the cell (or the step) says skipped_input
            self.column.blank.append(blank_call(err))
            raise
        if not result.cached:
            self.paid_calls += 1
        self.column.calls.append(result)
        return result

    async def waterfall(
        self,
        name: str | None = None,
        input: Mapping[str, Any] | None = None,
        *,
        steps: Sequence[str | Step] | None = None,
        value: str | None = None,
        accept: AcceptSpec | None = None,
        validate: ValidateSpec | None = None,
        on_unavailable: str = "skip",
        max_credits: float | None = None,
        row: Mapping[str, Any] | None = None,
    ) -> WaterfallResult:
        """Try tools in order until one gives an accepted value (see
        :mod:`playline.calls.waterfall`): a catalog's named waterfall, or ``steps``
        written here with ``value`` (the getter each step's answer is read by)."""
        catalog = self._runner.catalog
        spec, code_steps = waterfall_of(
            catalog,
            name,
            steps,
            value=value,
            accept=accept,
            validate=validate,
            on_unavailable=on_unavailable,
            max_credits=max_credits,
        )
        self.column.asked.update(spec.tools())
        result = await run_waterfall(
            self.tool,
            catalog,
            spec,
            input or {},
            row if row is not None else self.row,
            name=name,
            steps=code_steps,
        )
        self.column.waterfalls.append(result)
        return result

    def log(self, message: str) -> None:
        activity.logger.info("[row %s] %s", self.row_key, message)


def make_runner(
    services: Services,
    options: RunOptions,
    *,
    lease_ttl_s: float,
    force_token: str,
    reading: bool = False,
    metrics: ProviderMetrics | None = None,
) -> ToolRunner:
    """A tool runner owned by the current activity attempt, in the run's integration mode.

    ``force_token`` names what the attempt's forced calls belong to (the dataset run,
    or the play's scalar call): the same for every attempt, so a retry reuses what an
    earlier attempt forced.
    """
    info = activity.info()
    attempt = Attempt(
        receipts=services.receipts,
        owner=f"{info.workflow_id}/{info.activity_id}#{info.attempt}",
        lease_id=uuid.uuid4().hex,
        lease_ttl_s=lease_ttl_s,
        # A provider blocked for longer than a heartbeat budget (a spent daily quota, a
        # Retry-After of minutes) is parked durably by the workflow, not waited for here.
        park_after_s=lease_ttl_s,
        metrics=metrics or ProviderMetrics(),
        force_token=force_token,
        retry_ambiguous=options.retry_ambiguous,
        journal=services.journal,
    )
    dispatcher: Dispatcher
    if options.integration_mode == "fixture":
        dispatcher = FixtureDispatcher(
            attempt,
            services.fixture_book(options.fixtures),
            pacer=services.governor,
            enforce_pacing=options.enforce_fixture_pacing,
        )
    else:
        sender = PacedSender(attempt, services.governor, services.provider)
        jobs = JobDispatcher(
            attempt,
            sender,
            services.jobs,
            waiter=info.workflow_id,
            webhook_base=services.settings.webhook_url,
        )
        dispatcher = LiveDispatcher(attempt, sender, jobs)
        budget = RunBudget.of(options, info.workflow_id or info.activity_id, services.catalog)
        if budget is not None:
            # Paid calls reserve their worst case first (fixture answers cost nothing).
            dispatcher = BudgetedDispatcher(dispatcher, attempt, services.budgets, budget)
        if reading:  # a cancelled run reading its jobs: nothing new is sent
            dispatcher = ReadingDispatcher(dispatcher, attempt, services.jobs)
    return ToolRunner(services.catalog, attempt, dispatcher)


def stats_from(runner: ToolRunner, into: ChunkStats) -> ChunkStats:
    s = runner.stats
    into.calls_made += s.made
    into.calls_cached += s.cached
    into.calls_shared += s.shared
    into.calls_waited += s.waited
    into.calls_failed += s.failed
    into.calls_ambiguous += s.ambiguous
    into.retries += s.retries
    into.credits += s.credits
    into.accounts = merge_spend(into.accounts, accounts_as_dict(s.by_provider))
    return into


def carried_calls(details: Any) -> CallStats:
    """The call stats an earlier attempt's heartbeat carried (none if it carried none)."""
    carried = details.get("calls") if isinstance(details, Mapping) else None
    if not isinstance(carried, Mapping):
        return CallStats()
    known = {f.name: type(getattr(CallStats(), f.name)) for f in fields(CallStats)}
    known.pop("by_provider")  # a table: read by accounts_from
    try:
        stats = CallStats(**{k: known[k](v) for k, v in carried.items() if k in known})
    except (TypeError, ValueError):
        return CallStats()
    stats.by_provider = accounts_from(carried.get("by_provider"))
    return stats


async def _evaluate(spec: ColumnSpec, row: Mapping[str, Any], rc: RowCall) -> tuple[bool, Any]:
    """Run one column for one row; (False, None) when ``run_if`` says skip."""
    if spec.run_if is not None:
        predicate = resolvers.lookup(spec.run_if)
        verdict = predicate(row)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if not verdict:
            return False, None
    fn = resolvers.lookup(spec.resolver)
    value = await fn(row, rc)
    if isinstance(value, ToolResult):
        value = value.data
    elif isinstance(value, WaterfallResult):
        value = value.value
    return True, value


class ChunkActivities(HolderActivities):
    """Activities that run resolvers over rows."""

    @activity.defn(name="playline.run_chunk")
    async def run_chunk(self, input: ChunkInput) -> ChunkStats:
        services = self._holder.services
        await services.settle_journal()
        # Its calls and 429s also count in the run's pace (the sheet view's chart).
        async with services.pace.recording(input.run_ref) as metrics:
            runner = make_runner(
                services,
                input.options,
                lease_ttl_s=input.options.heartbeat_timeout_s,
                force_token=input.run_ref,
                reading=input.reading,
                metrics=metrics,
            )
            return await ChunkRun(services, input, runner).run()


class ChunkRun:
    """One attempt of one chunk: its rows, what they did, and what stops it.

    The state its steps share is its fields: the rows finished (``done``) and how many
    are in the sheet (``flushed``), what stops new work (``fatal``), the rows parked
    for a provider's reset (``parked``) and the stats.
    """

    def __init__(self, services: Services, input: ChunkInput, runner: ToolRunner) -> None:
        self.services = services
        self.input = input
        self.runner = runner
        self.attempt = runner.attempt
        self.stats = ChunkStats()
        self.done: list[RowResult] = []
        self.flushed = 0
        self.fatal: list[BaseException] = []
        self.parked: list[ProviderQuotaExhausted] = []
        #: rows left pending until the run's budget is raised
        self.held: list[BudgetReached] = []
        dispatcher = runner.dispatcher
        if isinstance(dispatcher, ReadingDispatcher):
            dispatcher = dispatcher.inner
        self._budget = dispatcher if isinstance(dispatcher, BudgetedDispatcher) else None
        self._row_worst = row_worst_case(runner.catalog, input.columns) if self._budget else 0.0
        # Rows at once: the workflow's width, following the governor's while it runs.
        self._gate = LiveRowGate(services.governor, runner.catalog, input)
        self._row_metrics = RowMetrics()
        #: what the rows this attempt finished cost (credits by provider and column,
        #: waterfall steps): the run's current details sum these
        self.spend = SpendTally()
        self._flushing = asyncio.Lock()
        #: per column, what its resolver's input digest leaves out (itself and later ones)
        self._later = later_columns(input.columns)
        #: rows are named by key in history only when the run may show rows at all
        self._name_rows = input.options.preview_rows > 0

    async def run(self) -> ChunkStats:
        """Run the pending rows of the range; the chunk's stats, or what stopped it."""
        started = time.monotonic()
        todo = await self._pending_rows()
        try:
            await self._run_rows(todo)
            await self._count_jobs()
            return self._finish(started)
        except BaseException:
            # What this attempt paid for reaches the next one (see the module docstring).
            with contextlib.suppress(Exception):
                activity.heartbeat(self._progress())
            raise

    async def _run_rows(self, todo: list[RunRow]) -> None:
        upkeep = AttemptUpkeep(self.attempt, beat=activity.heartbeat, progress=self._progress)
        flusher = asyncio.create_task(self._flush_loop(upkeep.interval_s))
        tasks = [asyncio.ensure_future(self._run_row(row)) for row in todo]
        try:
            async with upkeep:
                try:
                    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
                    # A row records its own errors; one that escapes is playline's own
                    # failure: the chunk fails (its row stays pending), never drops it.
                    self.fatal += [err for err in outcomes if isinstance(err, Exception)]
                    # Bulk requests run on tasks of their own: they finish and record here.
                    await self.runner.dispatcher.aclose()
                finally:
                    flusher.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await flusher
                    for task in tasks:
                        task.cancel()
                # Rows that finished are kept even when the chunk fails: they are paid for.
                await self._flush(final=True)
        except asyncio.CancelledError:
            # Cancelled (the play was, or the attempt timed out): bulk requests are
            # cancelled with it rather than left running past their attempt.
            self.runner.dispatcher.abort()
            await asyncio.shield(self._flush_quietly())
            raise

    async def _pending_rows(self) -> list[RunRow]:
        input = self.input
        rows = await self.services.sheet.read_run_rows(input.run_ref, input.start, input.end)
        if len(rows) != input.end - input.start:
            raise InvalidPlayInput(
                f"run {input.run_ref} has {len(rows)} rows in [{input.start}, {input.end})"
            )
        todo = [r for r in rows if r.status == "pending"]
        self.stats.rows_resumed = len(rows) - len(todo)
        if self._budget is not None and activity.info().attempt > 1:
            # An earlier attempt may have written rows and failed (or died) before
            # settling their reservations: their own budgets say what they used.
            await self._budget.settle_rows(
                f"{input.run_ref}#{r.seq}" for r in rows if r.status != "pending"
            )
        details = activity.info().heartbeat_details
        if details:
            # The previous attempt's last heartbeat; the sheet's row statuses are
            # the authority on what is done (they are written before heartbeats).
            # Its calls are counted on: this attempt's stats start from them, and the
            # rows it finished count in this attempt's spend (it never reported them).
            self.attempt.stats = carried_calls(details[0])
            for done in rows:
                if done.status != "pending":
                    self.spend.add_row(done.provenance)
            activity.logger.info(
                "chunk %s-%s resumes: last attempt reported %s; %d rows already done",
                input.start,
                input.end - 1,
                details[0],
                self.stats.rows_resumed,
            )
        return todo

    def _progress(self) -> dict[str, Any]:
        """What a heartbeat carries: rows done, and the calls paid for so far (with
        those of earlier attempts)."""
        return {
            "rows_done": len(self.done) + self.stats.rows_resumed,
            "calls": asdict(self.runner.stats),
        }

    def _stopped(self) -> bool:
        """Whether new rows may start: not after a fatal error or a lost lease."""
        return bool(self.fatal) or self.attempt.leases.lost is not None

    async def _run_row(self, row: RunRow) -> None:
        async with self._gate:
            latch = self.attempt.latch
            if self._stopped():
                if latch.tripped:
                    latch.rows_held_back += 1
                return
            payer = f"{self.input.run_ref}#{row.seq}"
            if self._budget is None:
                await self._compute_row(row, payer)
                return
            if self.input.reading:  # reading jobs after a cancel reserves nothing new
                covered = await self._budget.adopt_row(payer)
            else:
                covered = await self._budget.open_row(payer, self._row_worst)
            pending = await self._compute_row(row, payer)
            if covered:
                await self._budget.close_row(payer, pending=pending)

    async def _compute_row(self, row: RunRow, payer: str) -> bool:
        """Run the row's columns and record how it ended; whether it is left pending
        (parked or held for budget: it runs again)."""
        data: dict[str, Any] = dict(row.data)
        cells: dict[str, Any] = {}
        provenance: dict[str, Any] = {}
        meta: dict[str, Any] = {}
        view = MappingProxyType(data)
        rc = RowCall(row.row_key, self.runner, payer, view)
        column = ""
        now = time.time()
        fresh = 0
        skipped = 0  # cells skipped for a blank input: due, computed, not fetched
        try:
            for spec, skip in zip(self.input.columns, self._later, strict=True):
                column = spec.name
                plan = plan_column(spec, skip, view, row.cell_meta, now)
                rc.previous = plan.previous
                if plan.keep:  # fresh: the earlier cell stands, nothing is called
                    fresh += 1
                    provenance[spec.name] = kept_provenance(plan.previous)
                    continue
                token = REFRESH_OLDER_THAN.set(plan.refresh_older_than)
                blank = False
                try:
                    ran, value = await _evaluate(spec, view, rc)
                except BlankInput:
                    # Missing data, not an error: the cell is empty and skipped_input
                    # (nothing was sent for it), and the row's other columns go on.
                    ran, value, blank = True, None, True
                finally:
                    REFRESH_OLDER_THAN.reset(token)
                made = rc.next_column()
                cells[spec.name] = value if ran else data.get(spec.name)
                data[spec.name] = cells[spec.name]
                provenance[spec.name] = cell_provenance(made, value, ran=ran, skipped_input=blank)
                if blank:
                    # No freshness metadata: nothing was fetched, so the next run
                    # looks again (free while the input stays blank).
                    skipped += 1
                elif ran:
                    meta[spec.name] = cell_meta(plan.digest, fetch_dates(made), now)
        except Exception as err:
            if column and column not in provenance:
                failed = type(err).__name__
                provenance[column] = cell_provenance(rc.next_column(), None, failed=failed)
            return self._row_failed(row, cells, err, provenance)
        bad = unstorable_columns(cells)
        if bad:
            name, why = next(iter(bad.items()))
            for column in bad:
                cells[column] = None
            self._row_failed(
                row,
                cells,
                UnstorableValue(f"column {name!r} returned a value the sheet cannot store: {why}"),
                provenance,
            )
            return False
        self.stats.rows_ok += 1
        if rc.paid_calls == 0:
            self.stats.rows_cached += 1
        self._row_metrics.row("cached" if rc.paid_calls == 0 else "ok")
        self.stats.cells_fresh += fresh
        self.stats.cells_due += len(meta) + skipped
        self.spend.add_row(provenance)
        self.done.append(
            RowResult(row.seq, row.row_key, cells, "ok", provenance=provenance, cell_meta=meta)
        )
        return False

    def _row_failed(
        self,
        row: RunRow,
        cells: dict[str, Any],
        err: Exception,
        provenance: dict[str, Any] | None = None,
    ) -> bool:
        """Record a row's error, or stop the chunk for an error about more than the row;
        whether the row is left pending (it runs again)."""
        if isinstance(err, ProviderQuotaExhausted):
            # Nothing was sent and its receipt was released: the row stays pending,
            # and the run re-runs it after the provider's reset.
            self.parked.append(err)
            return True
        if isinstance(err, BudgetReached):
            return self._over_budget(row, cells, err, provenance or {})
        if isinstance(err, NotSentCancelled):
            return self._not_sent(row, cells, err, provenance or {})
        if _is_chunk_fatal(err):
            self.fatal.append(err)
            return True
        message = f"{type(err).__name__}: {err}"
        stats = self.stats
        stats.rows_failed += 1
        if isinstance(err, CallAmbiguous):
            stats.rows_ambiguous += 1
        self._row_metrics.row("failed")
        # History sees the row by key and the error's text only when the run may show
        # rows (preview_rows > 0): both can hold personal data or provider text.
        shown = f"row {row.row_key!r}" if self._name_rows else f"row #{row.seq}"
        said = message if self._name_rows else type(err).__name__
        stats.first_error = stats.first_error or f"{shown}: {said}"
        self.spend.add_row(provenance)
        self.done.append(
            RowResult(row.seq, row.row_key, cells, "error", message[:1000], provenance=provenance)
        )
        if self.input.on_row_error == "fail":
            self.fatal.append(
                RowFailed(
                    f"{shown} failed in column "
                    f"{_failing_column(self.input.columns, cells)!r}: {said} "
                    '(on_row_error="fail"; use "isolate" to record and continue)'
                )
            )
        return False

    def _over_budget(
        self, row: RunRow, cells: dict[str, Any], err: BudgetReached, provenance: dict[str, Any]
    ) -> bool:
        """A row whose next paid call the budget cannot cover (nothing was sent for it).

        Waiting (the default), it stays pending and the run holds it until the budget
        is raised; stopping, it is recorded as skipped, cell by cell: the cells it has
        keep their values, the others say ``skipped_budget``.
        """
        if self.input.options.on_budget == "wait":
            self.held.append(err)
            return True
        self.stats.rows_skipped_budget += 1
        return self._stopped_row(row, cells, provenance, "skipped_budget", err)

    def _not_sent(
        self, row: RunRow, cells: dict[str, Any], err: NotSentCancelled, provenance: dict[str, Any]
    ) -> bool:
        """A row a cancelled run re-ran to read its jobs that needed a new call: recorded
        with what it had paid for (its job's answer included), the rest not sent."""
        self.stats.rows_not_sent += 1
        return self._stopped_row(row, cells, provenance, "not_sent", err)

    def _stopped_row(
        self,
        row: RunRow,
        cells: dict[str, Any],
        provenance: dict[str, Any],
        miss: str,
        err: Exception,
    ) -> bool:
        """Record a row stopped before a call was sent (a budget, a cancel), cell by cell:
        the cells it has keep their values and what their calls cost; the column it
        stopped in and those not reached say ``miss``. The row is not left pending."""
        for spec in self.input.columns:
            cell = provenance.get(spec.name)
            if cell is None:  # not reached
                provenance[spec.name] = {"tool": None, "credits": 0.0, "miss": miss}
            elif str(cell.get("miss") or "").startswith("error:"):
                cell["miss"] = miss  # the column it stopped in: what it cost before stays
        self._row_metrics.row(miss)
        self.spend.add_row(provenance)
        message = f"{miss}: {err}"
        self.done.append(
            RowResult(row.seq, row.row_key, cells, "error", message[:1000], provenance=provenance)
        )
        return False

    async def _flush_loop(self, interval_s: float) -> None:
        """Write finished rows to the sheet as they accumulate, off the heartbeat's path."""
        while True:
            await asyncio.sleep(interval_s)
            if len(self.done) - self.flushed >= FLUSH_EVERY_ROWS:
                try:
                    await self._flush()
                except Exception as err:  # kept in memory; tried again, and at the end
                    logger.warning("sheet flush failed, retrying: %s", err)

    async def _flush(self, *, final: bool = False) -> None:
        """Write the finished rows not yet in the sheet; at the end, retried until written."""
        async with self._flushing:
            batch = self.done[self.flushed :]
            if not batch:
                return
            sheet, run_ref = self.services.sheet, self.input.run_ref

            async def write() -> None:
                await sheet.write_results(run_ref, batch)

            try:
                if final:
                    await self.attempt.durably(write, what="the chunk's sheet write")
                else:
                    await write()
            except Exception as err:
                raise self.attempt.latch.trip(
                    f"sheet write failed: {type(err).__name__}: {err}"
                ) from err
            self.flushed += len(batch)

    async def _flush_quietly(self) -> None:
        """On cancellation: keep what finished if the store takes it at once."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await self._flush()

    async def _count_jobs(self) -> None:
        """The run's provider jobs, when this attempt called an asynchronous tool: what
        the run's current details show (pending, oldest, finished, failed)."""
        jobs = job_dispatcher(self.runner.dispatcher)
        if jobs is None or not jobs.touched:
            return
        try:
            counts = await self.services.jobs.counts(activity.info().workflow_id)
        except Exception as err:  # a figure for the UI: never worth failing the chunk
            activity.logger.info("job counts unavailable: %s", err)
            return
        self.stats.jobs = {
            c.provider: {
                "pending": c.pending,
                "finished": c.finished,
                "failed": c.failed,
                "oldest_pending_at": c.oldest_pending_at,
            }
            for c in counts
        }

    def _finish(self, started: float) -> ChunkStats:
        """The chunk's result, or the error that stopped it (all it held back counted)."""
        input, stats, latch = self.input, self.stats, self.attempt.latch
        if latch.tripped:
            raise latch.error()  # with everything held back counted, not just the first
        if self.fatal:
            raise self.fatal[0]
        if self.attempt.leases.lost is not None:
            raise self.attempt.leases.lost
        if self.held:
            fullest = max(self.held, key=lambda err: err.used)
            stats.over_budget = BudgetHold(
                budget=fullest.budget,
                limit=fullest.limit,
                used=fullest.used,
                rows=len(self.held),
                provider=fullest.provider,
                resets_at=fullest.resets_at,
                spent=fullest.spent,
                currency=fullest.currency,
            )
            activity.logger.info(
                "chunk %s-%s: %d row(s) wait for budget (%s)",
                input.start,
                input.end - 1,
                len(self.held),
                fullest,
            )
        if self.parked:
            latest = max(self.parked, key=lambda err: err.resume_at)
            stats.parked = ParkedRows(
                provider=latest.provider,
                until=latest.resume_at,
                rows=len(self.parked),
                jobs=all(isinstance(err, JobPending) for err in self.parked),
            )
            activity.logger.info(
                "chunk %s-%s: %d row(s) parked until %s (%s)",
                input.start,
                input.end - 1,
                len(self.parked),
                latest.resume_at,
                latest.provider,
            )
        stats.elapsed_s = time.monotonic() - started
        stats.spend = self.spend.as_dict()
        stats.cells_skipped_input = self.spend.skipped_input
        done = stats_from(self.runner, stats)
        used = set(done.accounts) | set(done.spend.get("by_provider") or {})
        done.prices = prices_of(self.runner.catalog, used)
        return done


def row_worst_case(catalog: Catalog, columns: Sequence[ColumnSpec]) -> float:
    """A row's worst case: every tool each column's resolver declares, once per column,
    and for a catalog waterfall whose tools it declares, its verifier once per step
    (undeclared calls reserve on their own)."""
    worst = 0.0
    for spec in columns:
        declared = set(resolvers.declared_tools(spec.resolver))
        for tool_id in declared:
            with contextlib.suppress(PlaylineError):
                worst += catalog.tool(tool_id).max_credits
        for waterfall in catalog.waterfalls.values():
            check = waterfall.validate_with
            steps = {step.tool for step in waterfall.steps}
            if check is not None and check.tool in declared and steps <= declared:
                with contextlib.suppress(PlaylineError):
                    worst += (len(steps) - 1) * catalog.tool(check.tool).max_credits
    return worst


def _failing_column(columns: list[ColumnSpec], cells: dict[str, Any]) -> str:
    for spec in columns:
        if spec.name not in cells:
            return spec.name
    return columns[-1].name if columns else "?"
