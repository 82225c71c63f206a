"""Plays for the freshness tests: columns with and without ``fresh_for`` over the
provider server's mailfox (bills per hit, misses some) and verifly (a verdict)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from playline import Freshness, PlayContext, RowContext, play, resolver

NAME = ("first_name", "last_name", "company_domain")


def _person(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "first_name": row["first_name"],
        "last_name": row["last_name"],
        "domain": row["company_domain"],
    }


@resolver(name="fresh.email", tools=["mailfox_email"])
async def email(row: Mapping[str, Any], rc: RowContext) -> Any:
    found = await rc.tool("mailfox_email", _person(row))
    return found.get("email")


@resolver(name="fresh.verdict", tools=["verifly_verify"])
async def verdict(row: Mapping[str, Any], rc: RowContext) -> Any:
    address = f"{row['first_name']}.{row['last_name']}@{row['company_domain']}".lower()
    answer = await rc.tool("verifly_verify", {"email": address})
    return answer.get("status")


@resolver(name="fresh.seen")
async def seen(row: Mapping[str, Any], rc: RowContext) -> Any:
    """How many runs computed this cell: reads the value the previous run left."""
    before = rc.previous
    if before is not None and before.fetched_at is None:
        raise AssertionError("an earlier cell without its fetch date")
    return (before.value if before is not None else 0) + 1


class FreshInput(BaseModel):
    csv_path: str
    #: the email column's rule; ``None``: no column rule (receipts decide)
    email_found_s: float | None = None
    email_no_match_s: float | None = None
    #: seconds an ``invalid`` or ``risky`` verdict stays fresh (``valid``: an hour)
    retry_verdicts_s: float | None = None


class FreshOutput(BaseModel):
    rows: int
    run_ref: str


@play(name="t_fresh")
async def t_fresh(ctx: PlayContext, input: FreshInput) -> FreshOutput:
    leads = await ctx.csv("leads", input.csv_path)
    email_rule = None
    if input.email_found_s is not None or input.email_no_match_s is not None:
        email_rule = Freshness(found=input.email_found_s, no_match=input.email_no_match_s)
    builder = ctx.dataset("fresh_leads", leads).with_column("email", email, fresh_for=email_rule)
    if input.retry_verdicts_s is not None:
        retry = input.retry_verdicts_s
        builder = builder.with_column(
            "verdict",
            verdict,
            fresh_for={"found": "1h", "by_value": {"invalid": retry, "risky": retry}},
        )
    done = await builder.with_column("seen", seen, fresh_for=0).run(key="lead_id")
    assert done.result is not None
    return FreshOutput(rows=done.count, run_ref=done.result.run_ref)
