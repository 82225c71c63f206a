"""A play whose resolvers hold hand-written fallbacks, for the estimate's worst case.

``email``: mailfox (bills per hit), and prospectr (2 credits a hit) only when mailfox
found nothing (``if not found.get("email")``); ``title``: the verifier, and the person
enrichment (2 credits) only for a ``valid`` address (``== "valid"``). An estimate runs
each branch one way only; the run may pay for both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from playline import PlayContext, RowContext, play, resolver


def _person(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "first_name": row["first_name"],
        "last_name": row["last_name"],
        "domain": row["company_domain"],
    }


@resolver(name="fallback.email", tools=["mailfox_email", "prospectr_email"])
async def email(row: Mapping[str, Any], rc: RowContext) -> Any:
    found = await rc.tool("mailfox_email", _person(row))
    if not found.get("email"):
        found = await rc.tool("prospectr_email", _person(row))
    return found.get("email")


@resolver(name="fallback.title", tools=["verifly_verify", "person_enrich"])
async def title(row: Mapping[str, Any], rc: RowContext) -> Any:
    address = row["email"]
    if not address:
        return None
    verdict = await rc.tool("verifly_verify", {"email": address})
    if verdict.get("status") == "valid":
        return (await rc.tool("person_enrich", {"email": address})).get("title")
    return None


class FallbackInput(BaseModel):
    csv_path: str


class FallbackOutput(BaseModel):
    rows: int


@play(name="t_fallback")
async def t_fallback(ctx: PlayContext, input: FallbackInput) -> FallbackOutput:
    leads = await ctx.csv("leads", input.csv_path)
    done = await (
        ctx.dataset("fallback_leads", leads)
        .with_column("email", email)
        .with_column("title", title)
        .run(key="lead_id")
    )
    return FallbackOutput(rows=done.count)
