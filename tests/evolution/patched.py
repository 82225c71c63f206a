"""``t_evolving`` with a new step behind ``workflow.patched``: old runs keep replaying."""

from __future__ import annotations

from temporalio import workflow

from playline import PlayContext, play
from tests.evolution.steps import EvolvingInput, EvolvingOutput, t_audit, t_greet


@play(name="t_evolving")
async def t_evolving(ctx: PlayContext, input: EvolvingInput) -> EvolvingOutput:
    greeting = await ctx.step("greet", t_greet, input.name)
    audited = False
    if workflow.patched("t-evolving-audit"):
        audited = await ctx.step("audit", t_audit, greeting)
    return EvolvingOutput(greeting=greeting, audited=audited)
