"""``enrich_leads``: the example play.

For each lead: look up the company (one call per domain, however many leads work
there), find the work email, and, where an email was found, enrich the person; and a
``verified_email`` by the catalog's ``work_email`` waterfall: mailfox (cheap, bills only
what it finds), then prospectr (dearer, refunds a miss), keeping the first address the
verifier calls valid. ``--provenance`` on the export says which step filled each cell.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

from playline import PlayContext, RowContext, play, resolver

REQUIRED_COLUMNS = ["lead_id", "first_name", "last_name", "company_domain"]


class EnrichLeadsInput(BaseModel):
    csv_path: str = Field(description="CSV of leads, readable by the worker")
    mode: str = Field(default="upsert", pattern="^(upsert|net_new)$")
    on_row_error: str = Field(default="isolate", pattern="^(isolate|fail)$")


class EnrichLeadsOutput(BaseModel):
    rows: int
    rows_failed: int
    preview: list[dict[str, Any]]


@resolver(tools=["company_lookup"])
async def company_name(row: Mapping[str, Any], rc: RowContext) -> Any:
    company = await rc.tool("company_lookup", {"domain": row["company_domain"]})
    return company.get("name")


@resolver(tools=["company_lookup"])
async def industry(row: Mapping[str, Any], rc: RowContext) -> Any:
    # The same input as company_name: answered by the same receipt, not a second call.
    company = await rc.tool("company_lookup", {"domain": row["company_domain"]})
    return company.get("industry")


def person_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """What the email tools (and the email waterfall) are asked: a lead's name and
    company domain, in the names the catalog's tools take."""
    return {
        "first_name": row["first_name"],
        "last_name": row["last_name"],
        "domain": row["company_domain"],
    }


@resolver(tools=["email_finder"])
async def work_email(row: Mapping[str, Any], rc: RowContext) -> Any:
    found = await rc.tool("email_finder", person_of(row))
    return found.get("email")


@resolver(tools=["mailfox_email", "prospectr_email", "verifly_verify"])
async def verified_email(row: Mapping[str, Any], rc: RowContext) -> Any:
    found = await rc.waterfall("work_email", person_of(row))
    return found.value


@resolver
def has_work_email(row: Mapping[str, Any]) -> bool:
    return bool(row.get("work_email"))


@resolver(tools=["person_enrich"])
async def title(row: Mapping[str, Any], rc: RowContext) -> Any:
    person = await rc.tool("person_enrich", {"email": row["work_email"]})
    return person.get("title")


@play(name="enrich_leads", required_columns=REQUIRED_COLUMNS)
async def enrich_leads(ctx: PlayContext, input: EnrichLeadsInput) -> EnrichLeadsOutput:
    # Checked for REQUIRED_COLUMNS: by `playline run --csv` before it uploads the file,
    # and here as it is loaded.
    leads = await ctx.csv("leads", input.csv_path)
    enriched = await (
        ctx.dataset("enriched_leads", leads)
        .with_column("company_name", company_name)
        .with_column("industry", industry)
        .with_column("work_email", work_email)
        .with_column("title", title, run_if=has_work_email)
        .with_column("verified_email", verified_email)
        .run(key="lead_id", mode=input.mode, on_row_error=input.on_row_error)  # type: ignore[arg-type]
    )
    return EnrichLeadsOutput(
        rows=enriched.count,
        rows_failed=enriched.result.stats.rows_failed if enriched.result else 0,
        preview=enriched.preview,
    )
