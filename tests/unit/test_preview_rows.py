"""How many preview rows a run records in history: five by default, none with 0."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from playline.contract import FinalizeInput, RunOptions
from playline.datasets.export import PREVIEW_ROWS, summarize_run
from tests.unit.test_store_rules import PagedSheet


def test_runs_preview_five_rows_unless_told_otherwise() -> None:
    assert RunOptions().preview_rows == PREVIEW_ROWS == 5
    assert FinalizeInput(run_ref="r", inline_rows_budget_bytes=0).preview_rows == 5


@pytest.mark.parametrize("bad", [-1, 101])
def test_preview_rows_outside_0_to_100_is_rejected(bad: int) -> None:
    with pytest.raises(ValidationError, match="preview_rows"):
        RunOptions(preview_rows=bad)


async def test_preview_rows_zero_previews_nothing_and_stops_reading_early() -> None:
    sheet = PagedSheet([{"x": "y" * 50} for _ in range(5000)])
    summary = await summarize_run(sheet, "r", inline_budget_bytes=10_000, preview_rows=0)
    assert summary.preview == []
    assert summary.rows is None
    assert sheet.reads == 1


async def test_preview_rows_picks_the_first_rows_even_when_all_rows_fit_inline() -> None:
    sheet = PagedSheet([{"x": i} for i in range(20)])
    summary = await summarize_run(sheet, "r", inline_budget_bytes=100_000, preview_rows=2)
    assert summary.preview == [{"x": 0}, {"x": 1}]
    assert summary.rows is not None and len(summary.rows) == 20
