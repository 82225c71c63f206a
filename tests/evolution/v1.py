"""``t_evolving`` as it was when its history was recorded: one step."""

from __future__ import annotations

from playline import PlayContext, play
from tests.evolution.steps import EvolvingInput, EvolvingOutput, t_greet


@play(name="t_evolving")
async def t_evolving(ctx: PlayContext, input: EvolvingInput) -> EvolvingOutput:
    greeting = await ctx.step("greet", t_greet, input.name)
    return EvolvingOutput(greeting=greeting)
