"""Plays used only by the schedule tests (``tests/e2e/test_schedules.py`` imports this
module, so the in-process worker registers them)."""

from __future__ import annotations

from pydantic import BaseModel
from temporalio.exceptions import ApplicationError

from playline import PlayContext, play


class NoEstimateInput(BaseModel):
    label: str = "x"


class NoEstimateOutput(BaseModel):
    ran: bool


@play(name="t_no_estimate")
async def t_no_estimate(ctx: PlayContext, input: NoEstimateInput) -> NoEstimateOutput:
    """Fails when estimated, runs otherwise: an estimate-first firing must still run."""
    if ctx.options.estimate:
        raise ApplicationError("this play cannot be estimated", non_retryable=True)
    return NoEstimateOutput(ran=True)
