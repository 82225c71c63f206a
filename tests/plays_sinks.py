"""A play for tests/e2e/test_sinks.py: enrich, then write back in the same durable run."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from playline import PlayContext, play
from playline.contract import SyncSummary
from tests.plays_changes import ChangeInput, t_fresh_company, t_fresh_work_email


class SyncOutput(BaseModel):
    first: SyncSummary
    again: SyncSummary


@play(name="t_enrich_and_sync")
async def t_enrich_and_sync(ctx: PlayContext, input: ChangeInput) -> SyncOutput:
    source = await ctx.csv("src", input.csv_path)
    result = await (
        ctx.dataset("sync_leads", source)
        .with_column("work_email", t_fresh_work_email)
        .with_column("company_name", t_fresh_company)
        .run(key="lead_id")
    )
    first = await ctx.sync(result, "small_contacts", map={"last_name": "lastname"})
    again = await ctx.sync(result, "small_contacts", map={"last_name": "lastname"})
    return SyncOutput(first=first, again=again)


class TakeoverInput(BaseModel):
    csv_path: str
    takeover_s: float


@play(name="t_sync_takeover")
async def t_sync_takeover(ctx: PlayContext, input: TakeoverInput) -> SyncSummary:
    """Enrich, then one sync a test kills the worker in the middle of."""
    source = await ctx.csv("src", input.csv_path)
    result = await (
        ctx.dataset("takeover_leads", source)
        .with_column("work_email", t_fresh_work_email)
        .with_column("company_name", t_fresh_company)
        .run(key="lead_id")
    )
    return await ctx.sync(
        result, "small_contacts", takeover_after=timedelta(seconds=input.takeover_s)
    )
