"""Plays for tests/test_e2e_datasets.py: inline rows, the inline budget, peek."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from playline import PlayContext, RowContext, play, resolver


class InlineInput(BaseModel):
    rows: list[dict[str, Any]]


class InlineOutput(BaseModel):
    count: int
    rows: list[dict[str, Any]] | None
    peek: list[dict[str, Any]]
    iterated: int


@resolver(tools=["company_lookup"])
async def inline_company(row: Mapping[str, Any], rc: RowContext) -> Any:
    return (await rc.tool("company_lookup", {"domain": row["domain"]})).get("name")


@play(name="t_inline_rows")
async def t_inline_rows(ctx: PlayContext, input: InlineInput) -> InlineOutput:
    result = await (
        ctx.dataset("inline_companies", input.rows)
        .with_column("company", inline_company)
        .run(key="domain")
    )
    iterated = 0
    async for _ in result.iterate(page_size=3):
        iterated += 1
    return InlineOutput(
        count=result.count, rows=result.rows, peek=await result.peek(2), iterated=iterated
    )


# -- hostile cells (tests/e2e/test_hostile_rows.py) ---------------------------

#: What ``t_hostile_value`` returns for a row whose ``kind`` names it: values the
#: sheet cannot store (JSON has no NaN or Infinity, jsonb no NUL, JSON no datetime).
HOSTILE_KINDS = ("nan", "inf", "nul", "datetime")


@resolver
async def t_hostile_value(row: Mapping[str, Any], rc: RowContext) -> Any:
    kind = row["kind"]
    if kind == "nan":
        return float("nan")
    if kind == "inf":
        return float("inf")
    if kind == "nul":
        return "before\x00after"
    if kind == "datetime":
        import datetime

        return datetime.datetime(2026, 12, 3, 18, 0)
    return f"ok:{row['id']}"


@resolver
async def t_after_value(row: Mapping[str, Any], rc: RowContext) -> Any:
    """A second column: it sees the first one's value (ok rows only get this far)."""
    return f"after:{row['value']}"


class HostileOutput(BaseModel):
    count: int
    rows_ok: int
    rows_failed: int
    rows: list[dict[str, Any]]


@play(name="t_hostile_cells")
async def t_hostile_cells(ctx: PlayContext, input: InlineInput) -> HostileOutput:
    """A column whose value for some rows cannot be stored; the others are fine."""
    result = await (
        ctx.dataset("t_hostile", input.rows)
        .with_column("value", t_hostile_value)
        .with_column("after", t_after_value)
        .run(key="id")
    )
    stats = result.result.stats if result.result else None
    return HostileOutput(
        count=result.count,
        rows_ok=stats.rows_ok if stats else 0,
        rows_failed=stats.rows_failed if stats else 0,
        rows=await result.peek(len(input.rows)),
    )
