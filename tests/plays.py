"""Plays used only by the tests.

Every play and resolver here is registered when the worker imports this module
(``conftest.py`` imports it once per session). Play names start with ``t_`` so
they never collide with a real play. The helpers at the bottom are for the test
modules; the workflows never call them.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from playline import PlayContext, RowContext, Step, play, resolver
from playline.demo.enrich_leads import verified_email  # the catalog's work_email waterfall

#: Rows whose ``first_name`` is this value make ``fail_on_boom`` raise.
BOOM = "Boom"
UNDECLARED_TOOL = "nope_at_runtime"
DECLARED_UNKNOWN_TOOL = "nope"

# -- resolvers --------------------------------------------------------------


@resolver(tools=["email_finder"])
async def t_email(row: Mapping[str, Any], rc: RowContext) -> Any:
    found = await rc.tool(
        "email_finder",
        {
            "first_name": row["first_name"],
            "last_name": row["last_name"],
            "domain": row["company_domain"],
        },
    )
    return found.get("email")


@resolver(tools=["company_lookup"])
async def t_company(row: Mapping[str, Any], rc: RowContext) -> Any:
    company = await rc.tool("company_lookup", {"domain": row["company_domain"]})
    return company.get("name")


@resolver(tools=["email_finder"])
async def t_fail_on_boom(row: Mapping[str, Any], rc: RowContext) -> Any:
    if row["first_name"] == BOOM:
        raise ValueError(f"boom: refusing lead {row['lead_id']}")
    return await t_email(row, rc)


@resolver(tools=[DECLARED_UNKNOWN_TOOL])
async def t_declared_unknown(row: Mapping[str, Any], rc: RowContext) -> Any:
    return await rc.tool(DECLARED_UNKNOWN_TOOL, {"domain": row["company_domain"]})


@resolver
async def t_undeclared_unknown(row: Mapping[str, Any], rc: RowContext) -> Any:
    # Declares no tools, so nothing can be checked before the run: fails at run time.
    return await rc.tool(UNDECLARED_TOOL, {"domain": row["company_domain"]})


@resolver
def t_even_lead(row: Mapping[str, Any]) -> bool:
    """Leads with an even number need an email (``run_if``); the odd ones do not call acme."""
    return int(row["lead_id"][1:]) % 2 == 0


class TwoProvidersInput(BaseModel):
    csv_path: str


@resolver
def t_add(a: int, b: int) -> dict[str, int]:
    """A step function (run by ``ctx.step``)."""
    return {"sum": a + b}


COLUMN_RESOLVERS = {
    "email": t_email,
    "company": t_company,
    "fail_on_boom": t_fail_on_boom,
    "declared_unknown": t_declared_unknown,
    "undeclared_unknown": t_undeclared_unknown,
}

# -- plays ------------------------------------------------------------------


class ToolColumnInput(BaseModel):
    csv_path: str
    column_tool: Literal[
        "email", "company", "fail_on_boom", "declared_unknown", "undeclared_unknown"
    ] = "email"
    mode: Literal["upsert", "net_new"] = "upsert"
    on_row_error: Literal["isolate", "fail"] = "isolate"
    key: str = "lead_id"
    dataset: str = "t_rows"
    required_columns: list[str] = Field(
        default_factory=lambda: ["lead_id", "first_name", "last_name", "company_domain"]
    )


class ToolColumnOutput(BaseModel):
    rows: int
    rows_failed: int
    preview: list[dict[str, Any]]


@play(name="t_tool_column")
async def t_tool_column(ctx: PlayContext, input: ToolColumnInput) -> ToolColumnOutput:
    """One computed column, ``value``, from the resolver named by ``column_tool``."""
    source = await ctx.csv("src", input.csv_path, required_columns=input.required_columns)
    result = await (
        ctx.dataset(input.dataset, source)
        .with_column("value", COLUMN_RESOLVERS[input.column_tool])
        .run(key=input.key or None, mode=input.mode, on_row_error=input.on_row_error)
    )
    return ToolColumnOutput(
        rows=result.count,
        rows_failed=result.result.stats.rows_failed if result.result else 0,
        preview=result.preview,
    )


class ScalarInput(BaseModel):
    domain: str
    a: int = 2
    b: int = 3


class ScalarOutput(BaseModel):
    company_name: str | None
    industry: str | None
    step: dict[str, int]


@play(name="t_scalar")
async def t_scalar(ctx: PlayContext, input: ScalarInput) -> ScalarOutput:
    """``ctx.tool`` outside a dataset and a ``ctx.step``."""
    company = await ctx.tool("company_lookup", {"domain": input.domain})
    step = await ctx.step("add", t_add, input.a, input.b)
    return ScalarOutput(
        company_name=company.get("name"), industry=company.get("industry"), step=step
    )


@play(name="t_two_providers")
async def t_two_providers(ctx: PlayContext, input: TwoProvidersInput) -> None:
    """Every row's company (firmo); the even rows' email too (acme)."""
    source = await ctx.csv("src", input.csv_path)
    await (
        ctx.dataset("t_two", source)
        .with_column("company", t_company)
        .with_column("email", t_email, run_if=t_even_lead)
        .run(key="lead_id")
    )


class ParentInput(BaseModel):
    csv_path: str


class ParentOutput(BaseModel):
    child_play: str
    child_rows: int
    child_calls_made: int
    child_output: dict[str, Any] | None


@play(name="t_parent")
async def t_parent(ctx: PlayContext, input: ParentInput) -> ParentOutput:
    """Runs ``t_tool_column`` as a child play."""
    child = await ctx.run_play("t_tool_column", {"csv_path": input.csv_path, "dataset": "t_child"})
    return ParentOutput(
        child_play=child.play,
        child_rows=sum(d.admitted for d in child.datasets),
        child_calls_made=child.stats.calls_made,
        child_output=child.output,
    )


@resolver
def t_has_verified_email(row: Mapping[str, Any]) -> bool:
    return bool(row.get("verified_email"))


@resolver(tools=["prospectr_contact"])
async def t_mobile(row: Mapping[str, Any], rc: RowContext) -> Any:
    """Billed per field found, the charge reported in a header."""
    contact = await rc.tool("prospectr_contact", {"email": row["verified_email"]})
    return contact.get("mobile")


class WaterfallInput(BaseModel):
    csv_path: str
    dataset: str = "t_waterfall"


@play(name="t_waterfall")
async def t_waterfall(ctx: PlayContext, input: WaterfallInput) -> None:
    """A company per row (per request), a verified email by waterfall (per hit, refund
    on miss, a verifier) and the mobile of each verified email (per field, reported)."""
    source = await ctx.csv("src", input.csv_path)
    await (
        ctx.dataset(input.dataset, source)
        .with_column("company", t_company)
        .with_column("verified_email", verified_email)
        .with_column("mobile", t_mobile, run_if=t_has_verified_email)
        .run(key="lead_id")
    )


class ScalarWaterfallInput(BaseModel):
    first_name: str
    last_name: str
    domain: str


class ScalarWaterfallOutput(BaseModel):
    found: dict[str, Any]


@play(name="t_scalar_waterfall")
async def t_scalar_waterfall(
    ctx: PlayContext, input: ScalarWaterfallInput
) -> ScalarWaterfallOutput:
    """``ctx.waterfall`` outside a dataset."""
    return ScalarWaterfallOutput(found=await ctx.waterfall("work_email", input.model_dump()))


@resolver(tools=["hunter_email_finder", "findymail_email_finder"])
async def t_preset_email(row: Mapping[str, Any], rc: RowContext) -> Any:
    """A catalog waterfall over two presets: Hunter, then Findymail (which takes a name)."""
    found = await rc.waterfall(
        "preset_email",
        {
            "first_name": row["first_name"],
            "last_name": row["last_name"],
            "full_name": f"{row['first_name']} {row['last_name']}",
            "domain": row["company_domain"],
        },
    )
    return found.value


@resolver(tools=["apollo_people_match"])
async def t_apollo_title(row: Mapping[str, Any], rc: RowContext) -> Any:
    """Apollo's bulk match: members billed only when matched."""
    person = await rc.tool(
        "apollo_people_match",
        {
            "first_name": row["first_name"],
            "last_name": row["last_name"],
            "domain": row["company_domain"],
        },
    )
    return person.get("title")


@resolver(tools=["prospeo_enrich_person"])
async def t_prospeo_email(row: Mapping[str, Any], rc: RowContext) -> Any:
    """Prospeo's bulk enrich: matched by identifier, free re-enrichments, total_cost."""
    person = await rc.tool(
        "prospeo_enrich_person",
        {
            "first_name": row["first_name"],
            "last_name": row["last_name"],
            "company_website": row["company_domain"],
        },
    )
    return person.get("email")


@play(name="t_presets")
async def t_presets(ctx: PlayContext, input: WaterfallInput) -> None:
    """The preset providers (pointed at the provider server) from a play."""
    source = await ctx.csv("src", input.csv_path)
    await (
        ctx.dataset(input.dataset, source)
        .with_column("email", t_preset_email)
        .with_column("title", t_apollo_title)
        .with_column("prospeo_email", t_prospeo_email)
        .run(key="lead_id")
    )


@resolver(tools=["fullenrich_contact"])
async def t_async_email(row: Mapping[str, Any], rc: RowContext) -> Any:
    """FullEnrich's asynchronous bulk enrichment: a job per batch, polled or called back."""
    contact = await rc.tool(
        "fullenrich_contact",
        {
            "firstname": row["first_name"],
            "lastname": row["last_name"],
            "domain": row["company_domain"],
        },
    )
    return contact.get("email")


@resolver(tools=["dropcontact_contact"])
async def t_dropcontact_email(row: Mapping[str, Any], rc: RowContext) -> Any:
    """Dropcontact's batch: 200 "not ready" while it runs, results in submit order."""
    record = await rc.tool(
        "dropcontact_contact",
        {
            "first_name": row["first_name"],
            "last_name": row["last_name"],
            "website": row["company_domain"],
        },
    )
    return record.get("email")


class AsyncInput(BaseModel):
    csv_path: str
    dataset: str = "t_async"
    dropcontact: bool = False


@play(name="t_async")
async def t_async(ctx: PlayContext, input: AsyncInput) -> None:
    """Asynchronous provider jobs: rows leave their chunk while their job runs."""
    source = await ctx.csv("src", input.csv_path)
    dataset = ctx.dataset(input.dataset, source).with_column("email", t_async_email)
    if input.dropcontact:
        dataset = dataset.with_column("dc_email", t_dropcontact_email)
    await dataset.run(key="lead_id")


@resolver(tools=["fullenrich_contact", "dropcontact_contact"])
async def t_async_waterfall_email(row: Mapping[str, Any], rc: RowContext) -> Any:
    """A waterfall whose first step is a job tool (FullEnrich), then Dropcontact."""
    found = await rc.waterfall(
        steps=["fullenrich_contact", "dropcontact_contact"],
        value="email",
        input={
            "firstname": row["first_name"],
            "lastname": row["last_name"],
            "domain": row["company_domain"],
            "first_name": row["first_name"],
            "last_name": row["last_name"],
            "website": row["company_domain"],
        },
    )
    return found.value


@play(name="t_async_waterfall")
async def t_async_waterfall(ctx: PlayContext, input: AsyncInput) -> None:
    """A waterfall over two job tools: a pending step parks the row."""
    source = await ctx.csv("src", input.csv_path)
    await (
        ctx.dataset(input.dataset, source)
        .with_column("email", t_async_waterfall_email)
        .run(key="lead_id")
    )


class AsyncScalarOutput(BaseModel):
    found: Any = None
    waterfall: dict[str, Any] | None = None


@play(name="t_async_scalar")
async def t_async_scalar(ctx: PlayContext, input: AsyncInput) -> AsyncScalarOutput:
    """``ctx.tool`` on a job tool outside a dataset: the play waits for the job."""
    answer = await ctx.tool(
        "fullenrich_contact", {"firstname": "Ada", "lastname": "Lovelace", "domain": "co1.example"}
    )
    return AsyncScalarOutput(found=answer)


@resolver(tools=["mailfox_email", "prospectr_email"])
async def t_email_by_domain_or_website(row: Mapping[str, Any], rc: RowContext) -> Any:
    """mailfox by the company's domain, then prospectr by the row's website: a row
    without a domain skips the first step (``skipped_input``, nothing sent) and still
    gets the second; a row with neither skips both."""
    person = {"first_name": row["first_name"], "last_name": row["last_name"]}
    found = await rc.waterfall(
        steps=[
            Step("mailfox_email", input={**person, "domain": row["company_domain"]}),
            Step("prospectr_email", input={**person, "domain": row["website"]}),
        ],
        value="email",
    )
    return found.value


@play(name="t_blank_input")
async def t_blank_input(ctx: PlayContext, input: WaterfallInput) -> None:
    """A company by domain (a direct ``rc.tool``) and an email by domain or website (a
    waterfall): rows missing either cost nothing for it."""
    source = await ctx.csv("src", input.csv_path)
    await (
        ctx.dataset("t_blank", source)
        .with_column("company", t_company)
        .with_column("email", t_email_by_domain_or_website)
        .run(key="lead_id")
    )


# -- helpers for the test modules (never called by a workflow) -------------

LEAD_COLUMNS = ["lead_id", "first_name", "last_name", "company_domain"]


def lead(n: int, *, first_name: str | None = None, domain: str | None = None) -> list[str]:
    """A lead row with a distinct person per ``n``; ``domain`` defaults to one of three."""
    return [
        f"T{n:04d}",
        first_name or f"Fn{n}",
        f"Ln{n}",
        domain or f"co{n % 3}.example",
    ]


def write_csv(
    path: Path, rows: Sequence[Sequence[str]], columns: Sequence[str] = LEAD_COLUMNS
) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerows(rows)
    return path


def read_csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


async def run(
    client: Any,
    play_name: str,
    play_input: Any,
    *,
    task_queue: str,
    options: Any = None,
    workflow_id: str | None = None,
    timeout_s: float = 60.0,
) -> Any:
    """Execute a play and return its ``PlayRunResult``; a hang fails after ``timeout_s``."""
    import asyncio
    import uuid
    from datetime import timedelta

    from playline.contract import PlayRunResult, RunOptions

    return await asyncio.wait_for(
        client.execute_workflow(
            play_name,
            args=[play_input, options or RunOptions()],
            id=workflow_id or f"{play_name}-{uuid.uuid4().hex[:10]}",
            task_queue=task_queue,
            result_type=PlayRunResult,
            execution_timeout=timedelta(seconds=timeout_s + 30),
        ),
        timeout_s,
    )


async def export_rows(home: Path, run_ref: str, path: Path) -> bytes:
    """Export a run's rows the way ``playline run --out`` does; returns the file's bytes."""
    from playline.config import Settings
    from playline.datasets import export_run
    from playline.services import Services

    services = await Services.open(Settings.from_env(home=home))
    try:
        await export_run(services.sheet, run_ref, str(path))
    finally:
        await services.close()
    return path.read_bytes()
