"""The play of the money matrix (tests/e2e/test_money_matrix.py): one column whose calls
take one of three shapes a budget meets differently.

``jobs``       FullEnrich's asynchronous job tool: rows leave their chunk while the job runs
``waterfall``  a catalog waterfall whose first step is that job tool, then a sync finder
``quota``      a sync finder whose provider's quota runs out: rows park until it resets
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel

from playline import PlayContext, RowContext, play, resolver


@resolver(tools=["fullenrich_contact"])
async def m_job_email(row: Mapping[str, Any], rc: RowContext) -> Any:
    contact = await rc.tool(
        "fullenrich_contact",
        {
            "firstname": row["first_name"],
            "lastname": row["last_name"],
            "domain": row["company_domain"],
        },
    )
    return contact.get("email")


@resolver(tools=["fullenrich_contact", "email_finder"])
async def m_waterfall_email(row: Mapping[str, Any], rc: RowContext) -> Any:
    found = await rc.waterfall(
        "matrix_email",
        {
            "firstname": row["first_name"],
            "lastname": row["last_name"],
            "first_name": row["first_name"],
            "last_name": row["last_name"],
            "domain": row["company_domain"],
        },
    )
    return found.value


@resolver(tools=["email_finder"])
async def m_quota_email(row: Mapping[str, Any], rc: RowContext) -> Any:
    found = await rc.tool(
        "email_finder",
        {
            "first_name": row["first_name"],
            "last_name": row["last_name"],
            "domain": row["company_domain"],
        },
    )
    return found.get("email")


RESOLVERS = {"jobs": m_job_email, "waterfall": m_waterfall_email, "quota": m_quota_email}


class MatrixInput(BaseModel):
    csv_path: str
    shape: Literal["jobs", "waterfall", "quota"]


@play(name="t_money")
async def t_money(ctx: PlayContext, input: MatrixInput) -> None:
    source = await ctx.csv("src", input.csv_path)
    await (
        ctx.dataset("t_money", source)
        .with_column("email", RESOLVERS[input.shape])
        .run(key="lead_id")
    )
