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
