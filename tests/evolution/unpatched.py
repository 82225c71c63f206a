"""``t_evolving`` with a new step added unguarded: old histories no longer replay."""

from __future__ import annotations

from playline import PlayContext, play
from tests.evolution.steps import EvolvingInput, EvolvingOutput, t_audit, t_greet


@play(name="t_evolving")
async def t_evolving(ctx: PlayContext, input: EvolvingInput) -> EvolvingOutput:
    greeting = await ctx.step("greet", t_greet, input.name)
    audited = await ctx.step("audit", t_audit, greeting)
    return EvolvingOutput(greeting=greeting, audited=audited)
