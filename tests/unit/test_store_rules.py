"""The stores' pure rules, without a database: content addresses, the claim rule,
row keys, exported rows and the all-or-nothing inline result."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from playline.contract import RunMode
from playline.errors import InvalidPlayInput
from playline.stores.export import PREVIEW_ROWS, row_out, summarize_run
from playline.stores.receipts import (
    ClaimRequest,
    ClaimStatus,
    canonical_json,
    decide_claim,
    idempotency_key,
    receipt_key,
)
from playline.stores.sheet import RowResult, RunInfo, RunRow, row_key_of

NOW = 1_000.0


def test_receipt_key_is_a_content_address() -> None:
    a = receipt_key("t", "1", {"a": 1, "b": 2}, "scope")
    assert a == receipt_key("t", "1", {"b": 2, "a": 1}, "scope")
    assert a != receipt_key("t", "2", {"a": 1, "b": 2}, "scope")
    assert a != receipt_key("t", "1", {"a": 1, "b": 2}, "other-scope")
    assert a != receipt_key("t", "1", {"a": 1, "b": 3}, "scope")
    assert a.startswith("t:")


def test_idempotency_key_is_stable_unless_forced() -> None:
    key = receipt_key("t", "1", {"a": 1}, "s")
    assert idempotency_key(key, force=False, lease_id="L1") == idempotency_key(
        key, force=False, lease_id="L2"
    )
    assert idempotency_key(key, force=True, lease_id="L1") != idempotency_key(
        key, force=True, lease_id="L2"
    )


def test_canonical_json_ignores_key_order_and_keeps_unicode() -> None:
    assert canonical_json({"b": "é", "a": [1, {"d": 0, "c": 1}]}) == (
        '{"a":[1,{"c":1,"d":0}],"b":"é"}'
    )


def row(
    status: str,
    *,
    lease: str | None = None,
    expires: float | None = None,
    completed_at: float | None = None,
    result: Any = None,
) -> tuple[Any, ...]:
    """A receipt row as backends read it: status, result, owner, lease, expiry, completed_at."""
    return (status, json.dumps(result), "owner-x", lease, expires, completed_at)


@pytest.mark.parametrize(
    ("found", "request_", "expected"),
    [
        pytest.param(None, ClaimRequest("k", "t"), None, id="missing: claim"),
        pytest.param(
            row("completed", completed_at=NOW - 5, result={"v": 1}),
            ClaimRequest("k", "t"),
            ClaimStatus.HIT,
            id="completed: hit",
        ),
        pytest.param(
            row("completed", completed_at=NOW - 5),
            ClaimRequest("k", "t", force=True),
            None,
            id="completed but forced: claim",
        ),
        pytest.param(
            row("completed", completed_at=NOW - 100),
            ClaimRequest("k", "t", stale_after_s=60),
            None,
            id="completed but stale: claim",
        ),
        pytest.param(
            row("completed", completed_at=NOW - 30),
            ClaimRequest("k", "t", stale_after_s=60),
            ClaimStatus.HIT,
            id="completed and fresh enough: hit",
        ),
        pytest.param(
            row("running", lease="other", expires=NOW + 5),
            ClaimRequest("k", "t"),
            ClaimStatus.HELD,
            id="another live lease: wait",
        ),
        pytest.param(
            row("running", lease="other", expires=NOW - 1),
            ClaimRequest("k", "t"),
            None,
            id="another expired lease: take over",
        ),
        pytest.param(
            row("running", lease="mine", expires=NOW + 5),
            ClaimRequest("k", "t"),
            None,
            id="our own lease: claim again",
        ),
        pytest.param(row("failed"), ClaimRequest("k", "t"), None, id="failed: retry"),
    ],
)
def test_the_claim_rule(
    found: tuple[Any, ...] | None, request_: ClaimRequest, expected: ClaimStatus | None
) -> None:
    outcome = decide_claim(request_, found, now=NOW, lease_id="mine")
    assert (outcome.status if outcome else None) is expected
    if expected is ClaimStatus.HIT:
        assert outcome is not None and outcome.result == json.loads(found[1])  # type: ignore[index]
    if expected is ClaimStatus.HELD:
        assert outcome is not None and outcome.owner == "owner-x"


def test_row_keys_join_fields_or_use_the_position() -> None:
    assert row_key_of({"a": " 1 ", "b": "x"}, ["a", "b"], 7) == "1\x1fx"
    assert row_key_of({"a": "1"}, [], 7) == "#7"
    with pytest.raises(InvalidPlayInput, match="row 8 has an empty key field 'a'"):
        row_key_of({"a": "  "}, ["a"], 7)


def test_a_failed_row_carries_its_error_and_an_ok_row_does_not() -> None:
    assert row_out({"x": 1}, "ok", None) == {"x": 1}
    assert row_out({"x": 1}, "error", "boom") == {"x": 1, "_error": "boom"}


class PagedSheet:
    """Just enough of a ``SheetStore`` to read one finished run, page by page."""

    def __init__(self, rows: list[dict[str, Any]], failed: Iterable[int] = ()) -> None:
        bad = set(failed)
        self.rows = [
            RunRow(i, f"#{i}", data, "error" if i in bad else "ok", "no" if i in bad else None)
            for i, data in enumerate(rows)
        ]
        self.reads = 0

    async def run_info(self, run_ref: str) -> RunInfo | None:
        n = len(self.rows)
        return RunInfo(run_ref, "ds", n, n, 0, 0, ["x"])

    async def run_counts(self, run_ref: str) -> dict[str, int]:
        errors = sum(r.status == "error" for r in self.rows)
        return {"pending": 0, "ok": len(self.rows) - errors, "error": errors}

    async def read_run_rows(self, run_ref: str, start: int, end: int) -> list[RunRow]:
        self.reads += 1
        return self.rows[start:end]

    # unused by summaries; present so the fake is a whole SheetStore
    async def put_source(
        self, dataset_id: str, columns: Sequence[str], rows: Iterable[Sequence[str]]
    ) -> int:
        raise NotImplementedError

    async def source(self, dataset_id: str) -> tuple[list[str], int] | None:
        raise NotImplementedError

    async def prepare_run(
        self,
        run_ref: str,
        *,
        source_id: str,
        dataset: str,
        key_fields: Sequence[str],
        mode: RunMode,
        computed_columns: Sequence[str],
    ) -> RunInfo:
        raise NotImplementedError

    async def write_results(self, run_ref: str, results: Sequence[RowResult]) -> None:
        raise NotImplementedError

    async def read_source_rows(
        self, dataset_id: str, offset: int, limit: int
    ) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def close(self) -> None:
        return None


async def test_inline_rows_are_all_when_they_fit_the_budget() -> None:
    sheet = PagedSheet([{"x": i} for i in range(20)], failed=[3])
    summary = await summarize_run(sheet, "r", inline_budget_bytes=100_000)
    assert summary.rows is not None and len(summary.rows) == 20
    assert summary.rows[3] == {"x": 3, "_error": "no"}
    assert (summary.rows_ok, summary.rows_failed) == (19, 1)
    assert summary.preview == summary.rows[:PREVIEW_ROWS]


async def test_inline_rows_are_none_not_a_prefix_when_the_projection_exceeds_the_budget() -> None:
    sheet = PagedSheet([{"x": "y" * 50} for _ in range(5000)])
    summary = await summarize_run(sheet, "r", inline_budget_bytes=10_000)
    assert summary.rows is None
    assert len(summary.preview) == PREVIEW_ROWS
    # The projection gave up on the first page: the other four were never read.
    assert sheet.reads == 1


async def test_a_run_without_a_manifest_is_a_clear_error() -> None:
    class Empty(PagedSheet):
        async def run_info(self, run_ref: str) -> RunInfo | None:
            return None

    with pytest.raises(InvalidPlayInput, match="has no manifest"):
        await summarize_run(Empty([]), "r-gone", inline_budget_bytes=0)
