"""Scalar activities: one tool call outside a dataset (``ctx.tool``) and a step (``ctx.step``)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from playline import resolvers
from playline.activities.chunk import make_runner
from playline.activities.width import share_of
from playline.calls.runner import ToolResult, ToolRunner
from playline.calls.upkeep import AttemptUpkeep
from playline.calls.waterfall import run_waterfall
from playline.contract import (
    JOB_PENDING_ERROR,
    JobPendingDetails,
    RunOptions,
    StepInput,
    ToolCallInput,
    WaterfallCallInput,
)
from playline.errors import JobPending
from playline.pacing.fair import SHARE
from playline.services import HolderActivities


class ScalarActivities(HolderActivities):
    """Side effects a play runs once and replays from history."""

    async def _runner(self, options: RunOptions, call_token: str | None) -> tuple[ToolRunner, str]:
        """The runner one scalar call goes through, and the token that makes its
        attempts one call: the journal settled first, the fair share of this play set,
        the lease kept as long as the play's heartbeat timeout."""
        services = self._holder.services
        await services.settle_journal()
        info = activity.info()
        SHARE.set(share_of(options, info.workflow_id or ""))
        token = call_token or f"{info.workflow_id}/{info.workflow_run_id}/{info.activity_id}"
        runner = make_runner(
            services, options, lease_ttl_s=options.heartbeat_timeout_s, force_token=token
        )
        return runner, token

    @activity.defn(name="playline.call_tool")
    async def call_tool(self, input: ToolCallInput) -> Any:
        """One tool call through receipts and the governor; returns the tool's data.

        Its lease is renewed (and the activity heartbeats, when the play gave it a
        heartbeat timeout) for as long as the call takes, as a chunk's are: a call
        queued at the governor or retrying is never taken over and paid again.
        """
        runner, token = await self._runner(input.options, input.call_token)
        async with AttemptUpkeep(runner.attempt, beat=activity.heartbeat):
            try:
                result = await runner.call(
                    input.tool_id,
                    input.input,
                    force=input.force,
                    stale_after_seconds=input.stale_after_seconds,
                )
            except JobPending as pending:
                raise await _job_pending(runner, pending, token) from pending
        return result.data

    @activity.defn(name="playline.call_waterfall")
    async def call_waterfall(self, input: WaterfallCallInput) -> dict[str, Any]:
        """A catalog waterfall run once (``ctx.waterfall``): its value, the step that
        gave it and every step's outcome (what the play's history records)."""
        runner, token = await self._runner(input.options, input.call_token)
        info = activity.info()
        payer = f"{info.workflow_id}/{info.activity_id}"

        async def call(tool_id: str, tool_input: Mapping[str, Any]) -> ToolResult:
            return await runner.call(tool_id, tool_input, payer=payer)

        catalog = self._holder.services.catalog
        spec = catalog.waterfall(input.name)
        async with AttemptUpkeep(runner.attempt, beat=activity.heartbeat):
            try:
                result = await run_waterfall(call, catalog, spec, input.input, {}, name=input.name)
            except JobPending as pending:
                raise await _job_pending(runner, pending, token) from pending
        return {
            "value": result.value,
            "step": result.step,
            "credits": result.credits,
            "miss": result.miss,
            "steps": [step.provenance() for step in result.steps],
        }

    @activity.defn(name="playline.run_step")
    async def run_step(self, input: StepInput) -> Any:
        """Run a registered function once; its (JSON) result is recorded in history."""
        fn = resolvers.lookup(input.fn)
        value = fn(*input.args)
        if inspect.isawaitable(value):
            value = await value
        return value


async def _job_pending(runner: ToolRunner, pending: JobPending, token: str) -> ApplicationError:
    """A call whose provider job runs, as its workflow reads it: not retried here (a
    retry in seconds would find the job running again), typed ``JobPending`` with when
    to call again; the workflow waits on a durable timer and calls with ``token``.
    A submit still queued is sent (and its job recorded) before the attempt ends."""
    await runner.dispatcher.aclose()
    details = JobPendingDetails(
        resume_at=pending.resume_at,
        call_token=token,
        provider=pending.provider,
        job_id=pending.job_id,
    )
    return ApplicationError(
        str(pending), details.model_dump(), type=JOB_PENDING_ERROR, non_retryable=True
    )
