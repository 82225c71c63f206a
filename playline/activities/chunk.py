"""The chunk activity: run a dataset's column resolvers over one range of rows.

The workflow hands over a run reference and a ``[start, end)`` range; the rows
themselves are read from the sheet store and the computed cells written back to
it, so the activity's input and output are a few hundred bytes whatever the rows
hold. Rows already finished by an earlier attempt are skipped, which together with
completed receipts makes a retried chunk cheap and free of double payments.

While the chunk runs, a heartbeat loop every third of the heartbeat timeout

* sends a Temporal heartbeat carrying progress,
* renews the receipt leases of every unsettled tool call (also those still queued
  at the governor), the lease TTL being the heartbeat timeout, and
* flushes finished rows to the sheet.

So a worker that dies stops heartbeating and stops renewing at the same moment:
Temporal retries the chunk elsewhere as its leases expire, and the new attempt
reclaims them.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from temporalio import activity

from playline import resolvers
from playline.calls.attempt import Attempt
from playline.calls.dispatch import Dispatcher
from playline.calls.fixtures import FixtureDispatcher
from playline.calls.live import LiveDispatcher, PacedSender
from playline.calls.runner import ToolResult, ToolRunner
from playline.contract import ChunkInput, ChunkStats, ColumnSpec, ParkedRows, RunOptions
from playline.errors import InvalidPlayInput, PlaylineError, ProviderQuotaExhausted, RowFailed
from playline.services import Services, ServicesHolder
from playline.stores.sheet import RowResult, RunRow
from playline.telemetry import ProviderMetrics, RowMetrics

logger = logging.getLogger("playline.chunk")

FLUSH_EVERY_ROWS = 50


def _is_chunk_fatal(err: BaseException) -> bool:
    """About the play or the worker, not one row: it stops the chunk (see ``errors``)."""
    return isinstance(err, PlaylineError) and err.chunk_fatal


class RowCall:
    """The ``rc`` a resolver receives: its row's key, tool calls and a logger."""

    def __init__(self, row_key: str, runner: ToolRunner) -> None:
        self.row_key = row_key
        self._runner = runner
        self.paid_calls = 0  # calls of this row that went to the provider

    async def tool(
        self,
        tool_id: str,
        input: Mapping[str, Any],
        *,
        force: bool = False,
        stale_after_seconds: float | None = None,
    ) -> ToolResult:
        result = await self._runner.call(
            tool_id, input, force=force, stale_after_s=stale_after_seconds
        )
        if not result.cached:
            self.paid_calls += 1
        return result

    def log(self, message: str) -> None:
        activity.logger.info("[row %s] %s", self.row_key, message)


def make_runner(services: Services, options: RunOptions, *, lease_ttl_s: float) -> ToolRunner:
    """A tool runner owned by the current activity attempt, in the run's integration mode."""
    info = activity.info()
    attempt = Attempt(
        receipts=services.receipts,
        owner=f"{info.workflow_id}/{info.activity_id}#{info.attempt}",
        lease_id=uuid.uuid4().hex,
        lease_ttl_s=lease_ttl_s,
        # A provider blocked for longer than a heartbeat budget (a spent daily quota, a
        # Retry-After of minutes) is parked durably by the workflow, not waited for here.
        park_after_s=lease_ttl_s,
        metrics=ProviderMetrics(),
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
        dispatcher = LiveDispatcher(attempt, sender)
    return ToolRunner(services.catalog, attempt, dispatcher)


def stats_from(runner: ToolRunner, into: ChunkStats) -> ChunkStats:
    s = runner.stats
    into.calls_made += s.made
    into.calls_cached += s.cached
    into.calls_shared += s.shared
    into.calls_waited += s.waited
    into.calls_failed += s.failed
    into.retries += s.retries
    into.credits += s.credits
    return into


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
    return True, value


class ChunkActivities:
    """Activities that run resolvers over rows."""

    def __init__(self, holder: ServicesHolder) -> None:
        self._holder = holder

    @activity.defn(name="playline.run_chunk")
    async def run_chunk(self, input: ChunkInput) -> ChunkStats:
        started = time.monotonic()
        services = self._holder.services
        ttl = input.options.heartbeat_timeout_s
        runner = make_runner(services, input.options, lease_ttl_s=ttl)
        stats = ChunkStats()
        rows = await services.sheet.read_run_rows(input.run_ref, input.start, input.end)
        if len(rows) != input.end - input.start:
            raise InvalidPlayInput(
                f"run {input.run_ref} has {len(rows)} rows in [{input.start}, {input.end})"
            )
        todo = [r for r in rows if r.status == "pending"]
        stats.rows_resumed = len(rows) - len(todo)
        details = activity.info().heartbeat_details
        if details:
            # The previous attempt's last heartbeat; the sheet's row statuses are
            # the authority on what is done (they are written before heartbeats).
            activity.logger.info(
                "chunk %s-%s resumes: last attempt reported %s; %d rows already done",
                input.start,
                input.end - 1,
                details[0],
                stats.rows_resumed,
            )
        done: list[RowResult] = []
        flushed = 0
        latch = runner.attempt.latch

        async def flush() -> None:
            nonlocal flushed
            batch = done[flushed:]
            if not batch:
                return
            try:
                await services.sheet.write_results(input.run_ref, batch)
            except Exception as err:
                raise latch.trip(f"sheet write failed: {type(err).__name__}: {err}") from err
            flushed += len(batch)

        gate = asyncio.Semaphore(max(1, input.row_concurrency))
        fatal: list[BaseException] = []
        parked: list[ProviderQuotaExhausted] = []
        row_metrics = RowMetrics()

        async def run_row(row: RunRow) -> None:
            async with gate:
                if fatal:
                    if latch.tripped:
                        latch.rows_held_back += 1
                    return
                data: dict[str, Any] = dict(row.data)
                cells: dict[str, Any] = {}
                rc = RowCall(row.row_key, runner)
                try:
                    for spec in input.columns:
                        ran, value = await _evaluate(spec, MappingProxyType(data), rc)
                        cells[spec.name] = value if ran else data.get(spec.name)
                        data[spec.name] = cells[spec.name]
                except Exception as err:
                    if isinstance(err, ProviderQuotaExhausted):
                        # Nothing was sent and its receipt was released: the row stays
                        # pending, and the run re-runs it after the provider's reset.
                        parked.append(err)
                        return
                    if _is_chunk_fatal(err):
                        fatal.append(err)
                        return
                    message = f"{type(err).__name__}: {err}"
                    stats.rows_failed += 1
                    row_metrics.row("failed")
                    stats.first_error = stats.first_error or f"row {row.row_key!r}: {message}"
                    done.append(RowResult(row.seq, row.row_key, cells, "error", message[:1000]))
                    if input.on_row_error == "fail":
                        fatal.append(
                            RowFailed(
                                f"row {row.row_key!r} failed in column "
                                f"{_failing_column(input.columns, cells)!r}: {message} "
                                '(on_row_error="fail"; use "isolate" to record and continue)'
                            )
                        )
                    return
                stats.rows_ok += 1
                if rc.paid_calls == 0:
                    stats.rows_cached += 1
                row_metrics.row("cached" if rc.paid_calls == 0 else "ok")
                done.append(RowResult(row.seq, row.row_key, cells, "ok"))

        async def heartbeat_loop() -> None:
            interval = max(0.2, ttl / 3)
            while True:
                await asyncio.sleep(interval)
                activity.heartbeat({"rows_done": len(done) + stats.rows_resumed})
                try:
                    await runner.renew_leases()
                except Exception as err:  # transport failure: retry on the next beat
                    logger.warning("lease renewal failed, retrying: %s", err)
                if runner.lease_lost is not None:
                    fatal.append(runner.lease_lost)
                    for task in row_tasks:
                        task.cancel()
                    return
                if len(done) - flushed >= FLUSH_EVERY_ROWS:
                    await flush()

        row_tasks = [asyncio.ensure_future(run_row(r)) for r in todo]
        beat = asyncio.ensure_future(heartbeat_loop())
        try:
            await asyncio.gather(*row_tasks, return_exceptions=True)
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
            for task in row_tasks:
                task.cancel()
        # Rows that finished are kept even when the chunk fails: they are paid for.
        await flush()
        if latch.tripped:
            raise latch.error()  # with everything held back counted, not just the first
        if fatal:
            raise fatal[0]
        if parked:
            latest = max(parked, key=lambda err: err.resume_at)
            stats.parked = ParkedRows(
                provider=latest.provider, until=latest.resume_at, rows=len(parked)
            )
            activity.logger.info(
                "chunk %s-%s: %d row(s) parked until %s (%s)",
                input.start,
                input.end - 1,
                len(parked),
                latest.resume_at,
                latest.provider,
            )
        stats.elapsed_s = time.monotonic() - started
        return stats_from(runner, stats)


def _failing_column(columns: list[ColumnSpec], cells: dict[str, Any]) -> str:
    for spec in columns:
        if spec.name not in cells:
            return spec.name
    return columns[-1].name if columns else "?"
