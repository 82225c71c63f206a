"""A play for tests/e2e/test_change_report.py: every run pays for fresh answers.

Its resolvers refuse receipts of any age (``stale_after_seconds=0``), so a second run
over the same rows asks the provider again and its change report says what the
provider now answers differently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from playline import PlayContext, RowContext, play, resolver

#: The columns the play computes, and the provider endpoint behind each.
CHANGE_COLUMNS = {
    "work_email": "/mailfox/v1/email/find",
    "acme_email": "/acme/v1/email/find",
    "company_name": "/firmo/v1/company/lookup",
}


class ChangeInput(BaseModel):
    csv_path: str


class ChangeOutput(BaseModel):
    count: int


def _person(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "first_name": row["first_name"],
        "last_name": row["last_name"],
        "domain": row["company_domain"],
    }


@resolver(tools=["mailfox_email"])
async def t_fresh_work_email(row: Mapping[str, Any], rc: RowContext) -> Any:
    found = await rc.tool("mailfox_email", _person(row), stale_after_seconds=0)
    return found.get("email")


@resolver(tools=["email_finder"])
async def t_fresh_acme_email(row: Mapping[str, Any], rc: RowContext) -> Any:
    found = await rc.tool("email_finder", _person(row), stale_after_seconds=0)
    return found.get("email")


@resolver(tools=["company_lookup"])
async def t_fresh_company(row: Mapping[str, Any], rc: RowContext) -> Any:
    company = await rc.tool(
        "company_lookup", {"domain": row["company_domain"]}, stale_after_seconds=0
    )
    return company.get("name")


@play(name="t_change_report")
async def t_change_report(ctx: PlayContext, input: ChangeInput) -> ChangeOutput:
    source = await ctx.csv("src", input.csv_path)
    result = await (
        ctx.dataset("change_leads", source)
        .with_column("work_email", t_fresh_work_email)
        .with_column("acme_email", t_fresh_acme_email)
        .with_column("company_name", t_fresh_company)
        .run(key="lead_id")
    )
    return ChangeOutput(count=result.count)
