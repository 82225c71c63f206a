"""Dataset handles end to end: inline rows in, the all-or-nothing inline budget out."""

from __future__ import annotations

import pytest

from playline.contract import PlayRunResult, RunOptions
from tests.conftest import new_id

ROWS = [{"domain": f"inline{i}.example", "note": f"n{i}"} for i in range(7)]


async def run_inline(client, task_queue, budget: int) -> PlayRunResult:  # type: ignore[no-untyped-def]
    return await client.execute_workflow(
        "t_inline_rows",
        args=[{"rows": ROWS}, RunOptions(inline_rows_budget_bytes=budget, chunk_size=3)],
        id=new_id("inline"),
        task_queue=task_queue,
        result_type=PlayRunResult,
    )


@pytest.mark.parametrize(
    ("budget", "inline"),
    [(0, False), (200, False), (100_000, True)],
    ids=["off-by-default", "too-small-no-prefix", "fits"],
)
async def test_inline_rows_are_all_or_nothing(client, worker, provider, task_queue, budget, inline):  # type: ignore[no-untyped-def]
    async with worker():
        result = await run_inline(client, task_queue, budget)
    output = result.output or {}
    assert output["count"] == 7
    assert output["iterated"] == 7
    assert [r["domain"] for r in output["peek"]] == ["inline0.example", "inline1.example"]
    assert all(r["company"] for r in output["peek"])
    if inline:
        assert output["rows"] is not None and len(output["rows"]) == 7
        assert {r["domain"] for r in output["rows"]} == {r["domain"] for r in ROWS}
    else:
        assert output["rows"] is None  # never a prefix
    # Rows passed inline were stored once, then enriched with one call per domain.
    assert provider.ledger()["charged"] == 7
    # The play's own result keeps rows out of history.
    assert all(d.rows is None for d in result.datasets)
