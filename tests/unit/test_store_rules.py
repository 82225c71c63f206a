"""The stores' pure rules, without a database: content addresses, the claim rule,
row keys, exported rows and the all-or-nothing inline result."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from playline.contract import RunMode
from playline.datasets.export import PREVIEW_ROWS, row_out, summarize_run
from playline.errors import InvalidPlayInput
from playline.stores.receipts import (
    ClaimRequest,
    ClaimStatus,
    StoredState,
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


def test_idempotency_key_is_stable_within_a_generation_and_new_in_the_next() -> None:
    key = receipt_key("t", "1", {"a": 1}, "s")
    # Generation 0 keeps the key receipts have always sent (no attempt, no lease in it).
    assert idempotency_key(key) == idempotency_key(key, 0)
    assert idempotency_key(key, 1) == idempotency_key(key, 1)  # a crashed forced call's retry
    assert idempotency_key(key, 1) != idempotency_key(key, 0)  # a fresh answer, not the old
    assert idempotency_key(key, 2) != idempotency_key(key, 1)


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
    sent_at: float | None = None,
    generation: int = 0,
    forced_by: str | None = None,
    batch_key: str | None = None,
) -> StoredState:
    """A receipt row as backends read it."""
    return StoredState(
        status,
        json.dumps(result),
        "owner-x",
        lease,
        expires,
        completed_at,
        batch_key,
        sent_at,
        generation,
        "why" if status == "ambiguous" else None,
        forced_by,
    )


CLAIMED = ClaimStatus.CLAIMED
NONE_TOOL = {"ambiguous_if_sent": True}


@pytest.mark.parametrize(
    ("found", "request_", "expected"),
    [
        pytest.param(None, ClaimRequest("k", "t"), CLAIMED, id="missing: claim"),
        pytest.param(
            row("completed", completed_at=NOW - 5, result={"v": 1}),
            ClaimRequest("k", "t"),
            ClaimStatus.HIT,
            id="completed: hit",
        ),
        pytest.param(
            row("completed", completed_at=NOW - 5),
            ClaimRequest("k", "t", force=True),
            CLAIMED,
            id="completed but forced: claim",
        ),
        pytest.param(
            row("completed", completed_at=NOW - 100),
            ClaimRequest("k", "t", stale_after_seconds=60),
            CLAIMED,
            id="completed but stale: claim",
        ),
        pytest.param(
            row("completed", completed_at=NOW - 30),
            ClaimRequest("k", "t", stale_after_seconds=60),
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
            CLAIMED,
            id="another expired lease: take over",
        ),
        pytest.param(
            row("running", lease="mine", expires=NOW + 5),
            ClaimRequest("k", "t"),
            CLAIMED,
            id="our own lease: claim again",
        ),
        pytest.param(row("failed"), ClaimRequest("k", "t"), CLAIMED, id="failed: retry"),
        pytest.param(
            row("running", lease="other", expires=NOW - 1, sent_at=NOW - 20),
            ClaimRequest("k", "t", **NONE_TOOL),
            ClaimStatus.AMBIGUOUS,
            id="sent, owner gone, provider does not de-duplicate: ambiguous",
        ),
        pytest.param(
            row("running", lease="other", expires=NOW - 1, sent_at=NOW - 20),
            ClaimRequest("k", "t"),
            CLAIMED,
            id="sent, owner gone, a tool that may be re-sent: take over",
        ),
        pytest.param(
            row("running", lease="other", expires=NOW - 1, sent_at=NOW - 20),
            ClaimRequest("k", "t", retry_ambiguous=True, **NONE_TOOL),
            CLAIMED,
            id="sent, owner gone, retry asked for: take over",
        ),
        pytest.param(
            row("ambiguous"),
            ClaimRequest("k", "t"),
            ClaimStatus.AMBIGUOUS,
            id="ambiguous: stays so whatever the tool",
        ),
        pytest.param(
            row("ambiguous"),
            ClaimRequest("k", "t", force=True, **NONE_TOOL),
            ClaimStatus.AMBIGUOUS,
            id="ambiguous and forced: still not re-sent",
        ),
        pytest.param(
            row("ambiguous"),
            ClaimRequest("k", "t", retry_ambiguous=True),
            CLAIMED,
            id="ambiguous, retry asked for: claim",
        ),
        pytest.param(
            row("completed", completed_at=NOW - 5, forced_by="run-1", result={"v": 2}),
            ClaimRequest("k", "t", force=True, force_token="run-1"),
            ClaimStatus.HIT,
            id="forced by this run already: its answer",
        ),
        pytest.param(
            row("completed", completed_at=NOW - 5, forced_by="run-1"),
            ClaimRequest("k", "t", force=True, force_token="run-2"),
            CLAIMED,
            id="forced by another run: claim",
        ),
    ],
)
def test_the_claim_rule(
    found: StoredState | None, request_: ClaimRequest, expected: ClaimStatus
) -> None:
    outcome = decide_claim(request_, found, now=NOW, lease_id="mine", ttl_s=30)
    assert outcome.status is expected
    if expected is ClaimStatus.HIT:
        assert found is not None and outcome.result == json.loads(found.result)
    if expected is ClaimStatus.HELD:
        assert outcome.owner == "owner-x"
    if expected is CLAIMED:
        assert outcome.lease_expires_at == NOW + 30


def test_a_receipt_claimed_again_for_a_fresh_answer_moves_to_the_next_generation() -> None:
    done = row("completed", completed_at=NOW - 5, generation=2, batch_key="agg")
    forced = decide_claim(ClaimRequest("k", "t", force=True), done, now=NOW, lease_id="m", ttl_s=1)
    assert forced.generation == 3
    assert forced.batch_key is None  # a completed member joins a new batch, not its old one
    crashed = row("running", lease="o", expires=NOW - 1, generation=3, batch_key="agg")
    again = decide_claim(
        ClaimRequest("k", "t", force=True), crashed, now=NOW, lease_id="m", ttl_s=1
    )
    assert again.generation == 3 and again.batch_key == "agg"  # same key: no second charge


def test_a_claim_that_finds_a_sent_unsettled_receipt_says_so_once() -> None:
    sent = row("running", lease="o", expires=NOW - 1, sent_at=NOW - 9)
    found = decide_claim(ClaimRequest("k", "t", **NONE_TOOL), sent, now=NOW, lease_id="m", ttl_s=1)
    assert found.became_ambiguous and found.reason and "owner-x" in found.reason
    marked = row("ambiguous")
    later = decide_claim(
        ClaimRequest("k", "t", **NONE_TOOL), marked, now=NOW, lease_id="m", ttl_s=1
    )
    assert later.status is ClaimStatus.AMBIGUOUS and not later.became_ambiguous


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
