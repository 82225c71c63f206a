"""Plays for the fair-share tests (issue 19): one call per row on provider ``acme``.

``t_fair`` calls either ``email_finder`` (``/acme/v1/email/find``) or ``person_enrich``
(``/acme/v1/person/enrich``) once per row. Both tools belong to ``acme``, so every call
is paced by one key; the provider server's per-call records carry the path, so two
runs calling different tools can be told apart from the provider's side of the wire.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel

from playline import PlayContext, RowContext, play, resolver

#: The provider path each ``tool`` of ``t_fair`` calls.
PATHS = {"email": "/acme/v1/email/find", "person": "/acme/v1/person/enrich"}


@resolver(tools=["email_finder"])
async def t_fair_email(row: Mapping[str, Any], rc: RowContext) -> Any:
    found = await rc.tool(
        "email_finder",
        {
            "first_name": row["first_name"],
            "last_name": row["last_name"],
            "domain": row["company_domain"],
        },
    )
    return found.get("email")


@resolver(tools=["person_enrich"])
async def t_fair_person(row: Mapping[str, Any], rc: RowContext) -> Any:
    email = f"{row['first_name']}.{row['last_name']}@{row['company_domain']}".lower()
    person = await rc.tool("person_enrich", {"email": email})
    return person.get("title")


class FairInput(BaseModel):
    csv_path: str
    tool: Literal["email", "person"] = "email"
    dataset: str = "t_fair"


class FairOutput(BaseModel):
    rows: int
    rows_failed: int


@play(name="t_fair")
async def t_fair(ctx: PlayContext, input: FairInput) -> FairOutput:
    """One ``acme`` call per row, by the tool ``tool`` names."""
    source = await ctx.csv("src", input.csv_path)
    resolver_fn = t_fair_email if input.tool == "email" else t_fair_person
    result = await (
        ctx.dataset(input.dataset, source).with_column("value", resolver_fn).run(key="lead_id")
    )
    return FairOutput(
        rows=result.count,
        rows_failed=result.result.stats.rows_failed if result.result else 0,
    )
