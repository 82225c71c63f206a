"""A play for the reconciliation tests: Hunter's Email Finder (a preset) on every row.

Imported by the tests that use it (the worker registers every play imported so far).
Hunter's contract is ``idempotency = "none"``: a call whose answer is lost stays
ambiguous and is never re-sent, which is what makes a charge playline never saw.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from playline import PlayContext, RowContext, play, resolver
from tests.plays import WaterfallInput


@resolver(tools=["hunter_email_finder"])
async def t_hunter_email(row: Mapping[str, Any], rc: RowContext) -> Any:
    """Hunter's Email Finder, one call per row."""
    found = await rc.tool(
        "hunter_email_finder",
        {
            "first_name": row["first_name"],
            "last_name": row["last_name"],
            "domain": row["company_domain"],
        },
    )
    return (found.get("data") or {}).get("email")


@play(name="t_reconcile_hunter")
async def t_reconcile_hunter(ctx: PlayContext, input: WaterfallInput) -> None:
    """Every row through Hunter's Email Finder."""
    source = await ctx.csv("src", input.csv_path)
    await ctx.dataset(input.dataset, source).with_column("email", t_hunter_email).run(key="lead_id")
