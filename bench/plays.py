"""The benchmark's play: exactly one call on the rate-limited provider per row.

``bench_one_call`` adds one column, ``email``, from one ``email_finder`` call
(provider ``acme``) per row, so calls = rows and every call is paced by the
same key. Workers started by ``bench/governor.py`` import it with
``--plays bench.plays`` (run from the repository root).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from playline import PlayContext, RowContext, play, resolver

COLUMNS = ["lead_id", "first_name", "last_name", "company_domain"]


@resolver(tools=["email_finder"])
async def bench_email(row: Mapping[str, Any], rc: RowContext) -> Any:
    found = await rc.tool(
        "email_finder",
        {
            "first_name": row["first_name"],
            "last_name": row["last_name"],
            "domain": row["company_domain"],
        },
    )
    return found.get("email")


class OneCallInput(BaseModel):
    csv_path: str
    dataset: str = "bench"


class OneCallOutput(BaseModel):
    rows: int
    rows_failed: int


@play(name="bench_one_call")
async def bench_one_call(ctx: PlayContext, input: OneCallInput) -> OneCallOutput:
    source = await ctx.csv("src", input.csv_path, required_columns=COLUMNS)
    result = await (
        ctx.dataset(input.dataset, source).with_column("email", bench_email).run(key="lead_id")
    )
    return OneCallOutput(
        rows=result.count,
        rows_failed=result.result.stats.rows_failed if result.result else 0,
    )


# -- issue 19's fairness benchmark (bench/fairness.py) -------------------------------
#: The acme path each ``tool`` of ``bench_fair`` calls: two tools of one provider, one
#: pacing key, told apart in the provider server's per-call records.
FAIR_PATHS = {"email": "/acme/v1/email/find", "person": "/acme/v1/person/enrich"}


@resolver(tools=["person_enrich"])
async def bench_person(row: Mapping[str, Any], rc: RowContext) -> Any:
    email = f"{row['first_name']}.{row['last_name']}@{row['company_domain']}".lower()
    person = await rc.tool("person_enrich", {"email": email})
    return person.get("title")


class FairInput(BaseModel):
    csv_path: str
    tool: str = "email"  # "email" (email_finder) or "person" (person_enrich)
    dataset: str = "bench_fair"


@play(name="bench_fair")
async def bench_fair(ctx: PlayContext, input: FairInput) -> OneCallOutput:
    """One acme call per row, by ``email_finder`` or ``person_enrich``."""
    source = await ctx.csv("src", input.csv_path, required_columns=COLUMNS)
    resolver_fn = bench_person if input.tool == "person" else bench_email
    result = await (
        ctx.dataset(input.dataset, source).with_column("value", resolver_fn).run(key="lead_id")
    )
    return OneCallOutput(
        rows=result.count,
        rows_failed=result.result.stats.rows_failed if result.result else 0,
    )
