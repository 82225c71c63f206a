"""Freshness rules: durations, outcomes, values, and what a run does with a cell.

Pure logic (no store, no server): the end-to-end tests are tests/e2e/test_freshness.py.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from playline.calls.catalog import ToolSpec
from playline.calls.cell_freshness import cell_meta, later_columns, plan_column
from playline.contract import ColumnSpec
from playline.freshness import Freshness, freshness_of, parse_duration, stricter
from playline.stores.receipts import ClaimRequest, ClaimStatus, decide_claim
from tests.unit.test_store_rules import row as stored

DAY = 86400.0
NOW = 1_000_000.0


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        ("90d", 90 * DAY),
        ("12h", 12 * 3600.0),
        ("30m", 1800.0),
        ("45s", 45.0),
        ("45", 45.0),
        ("2w", 14 * DAY),
        (" 1.5D ", 1.5 * DAY),
        (7, 7.0),
        (timedelta(days=3), 3 * DAY),
        (None, None),
    ],
)
def test_durations_read_as_users_write_them(given: Any, seconds: float | None) -> None:
    assert parse_duration(given) == seconds


@pytest.mark.parametrize("bad", ["90x", "d", "-3d", -1, True, float("nan"), [1]])
def test_a_bad_duration_is_one_clear_line(bad: Any) -> None:
    with pytest.raises(ValueError) as err:
        parse_duration(bad)
    assert "\n" not in str(err.value)


def test_misses_are_retried_sooner_than_hits_and_a_listed_value_wins() -> None:
    rule = Freshness(found="90d", no_match="14d", by_value={"invalid": "7d", "catch_all": "7d"})
    assert rule.max_age("ada@example.com") == 90 * DAY
    assert rule.max_age(None) == rule.max_age("") == rule.max_age([]) == 14 * DAY
    assert rule.max_age("invalid") == rule.max_age("catch_all") == 7 * DAY
    assert Freshness(found="1d").max_age(None) is None  # a miss without a rule: for ever


def test_a_tool_rule_reads_its_answer_through_the_getters_and_the_billing_hit() -> None:
    tool = ToolSpec.model_validate(
        {
            "id": "finder",
            "provider": "p",
            "path": "/find",
            "getters": {"email": "data.email", "status": "data.status"},
            "billing": {"rule": "per_hit", "hit": "email"},
            "fresh_for": {
                "found": "90d",
                "no_match": "14d",
                "by": "status",
                "by_value": {"catch_all": "7d"},
            },
        }
    )
    assert tool.max_age({"data": {"email": "a@b.c", "status": "valid"}}) == 90 * DAY
    assert tool.max_age({"data": {"email": None}}) == 14 * DAY
    assert tool.max_age({"data": {"email": "a@b.c", "status": "catch_all"}}) == 7 * DAY
    assert ToolSpec(id="t", provider="p", path="/t").max_age({}) is None
    assert (
        ToolSpec.model_validate(
            {"id": "t", "provider": "p", "path": "/t", "fresh_for": "30d"}
        ).max_age({})
        == 30 * DAY
    )


def test_a_catalog_rule_may_not_name_a_function() -> None:
    with pytest.raises(ValueError, match="cannot name a function"):
        ToolSpec.model_validate(
            {"id": "t", "provider": "p", "path": "/t", "fresh_for": {"rule": "mod.fn"}}
        )


def test_a_registered_function_decides_with_the_value_and_its_outcome() -> None:
    asked: list[tuple[Any, str]] = []

    def rule(value: Any, outcome: str) -> Any:
        asked.append((value, outcome))
        return "1d" if outcome == "found" else 60

    spec = Freshness(rule="mine")
    assert spec.max_age("x", lookup=lambda name: rule) == DAY
    assert spec.max_age("", lookup=lambda name: rule) == 60
    assert asked == [("x", "found"), ("", "no_match")]


def test_what_users_write_becomes_a_rule() -> None:
    assert freshness_of(None) is None
    assert freshness_of("30d") == Freshness(found=30 * DAY, no_match=30 * DAY)
    assert freshness_of({"found": "1d"}) == Freshness(found=DAY)
    with pytest.raises(ValueError, match="not a duration") as err:
        freshness_of({"found": "soon"})
    assert "\n" not in str(err.value)
    assert stricter(None, 5) == 5 and stricter(3, 5) == 3 and stricter(None, None) is None


def test_a_tool_rule_makes_an_old_receipt_a_call_to_pay() -> None:
    def max_age(result: Any) -> float | None:
        return 14 * DAY if not result.get("email") else 90 * DAY

    miss = stored("completed", completed_at=NOW - 20 * DAY, result={"email": None})
    hit = stored("completed", completed_at=NOW - 20 * DAY, result={"email": "a@b.c"})
    request = ClaimRequest("k", "t", max_age=max_age)
    assert decide_claim(request, miss, now=NOW, lease_id="m", ttl_s=1).status is ClaimStatus.CLAIMED
    assert decide_claim(request, hit, now=NOW, lease_id="m", ttl_s=1).status is ClaimStatus.HIT
    # The call's own limit and the rule: the stricter wins.
    strict = ClaimRequest("k", "t", max_age=max_age, stale_after_seconds=DAY)
    assert decide_claim(strict, hit, now=NOW, lease_id="m", ttl_s=1).status is ClaimStatus.CLAIMED
    claimed = decide_claim(request, miss, now=NOW, lease_id="m", ttl_s=1)
    assert claimed.generation == 1  # a new Idempotency-Key for the fresh answer


def _columns(rule: Freshness | None) -> list[ColumnSpec]:
    return [
        ColumnSpec(name="email", resolver="r.email", fresh_for=rule),
        ColumnSpec(name="title", resolver="r.title"),
    ]


def _planned(row: dict[str, Any], meta: dict[str, Any], rule: Freshness | None) -> Any:
    columns = _columns(rule)
    return plan_column(columns[0], later_columns(columns)[0], row, meta, NOW)


def test_a_fresh_cell_with_the_same_inputs_is_kept() -> None:
    rule = Freshness(found="90d", no_match="14d")
    row = {"id": "1", "name": "Ada", "email": "ada@x.io", "title": "CTO"}
    digest = _planned(row, {}, rule).digest
    meta = {"email": cell_meta(digest, [NOW - 10 * DAY, None], NOW)}
    assert meta["email"]["at"] == NOW - 10 * DAY  # as old as its oldest answer
    kept = _planned(row, meta, rule)
    assert kept.keep and kept.previous is not None
    assert (kept.previous.value, kept.previous.outcome) == ("ada@x.io", "found")
    # A later column's value is not an input of this one.
    assert _planned({**row, "title": "CEO"}, meta, rule).keep


def test_an_aged_cell_is_due_and_refuses_receipts_older_than_its_rule() -> None:
    rule = Freshness(found="90d", no_match="14d")
    row = {"id": "1", "name": "Ada", "email": ""}
    digest = _planned(row, {}, rule).digest
    due = _planned(row, {"email": {"at": NOW - 15 * DAY, "in": digest}}, rule)
    assert not due.keep and due.refresh_older_than == 14 * DAY
    assert due.previous is not None and due.previous.outcome == "no_match"
    found = {**row, "email": "ada@x.io"}
    fresh = _planned(found, {"email": {"at": NOW - 15 * DAY, "in": digest}}, rule)
    assert fresh.keep  # the same age, but a hit stays fresh for 90 days


def test_new_inputs_or_no_rule_or_no_date_compute_the_cell() -> None:
    rule = Freshness(found="90d")
    row = {"id": "1", "name": "Ada", "email": "ada@x.io"}
    digest = _planned(row, {}, rule).digest
    meta = {"email": {"at": NOW, "in": digest}}
    moved = _planned({**row, "name": "Ada L."}, meta, rule)
    assert not moved.keep and moved.refresh_older_than is None  # a new call anyway
    assert not _planned(row, meta, None).keep  # no rule: the resolver runs (receipts answer)
    assert not _planned(row, {"email": {"in": digest}}, rule).keep
    assert _planned(row, {}, rule).previous is None  # never computed
