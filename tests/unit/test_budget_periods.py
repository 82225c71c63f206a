"""The budget ledger's pure rules: ids, periods (UTC), the reservation check, amounts."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from playline.errors import InvalidBudget, PlaylineError
from playline.stores.budget_ids import (
    NamedBudgetId,
    ProviderShareId,
    RunBudgetId,
    parse_budget_key,
)
from playline.stores.budgets import (
    BudgetLine,
    BudgetState,
    Draw,
    adjusted_limit,
    check_adjustment,
    first_refusal,
    period_end,
    period_id,
    unique_lines,
    unknown_budget,
)


def epoch(*parts: int) -> float:
    return datetime(*parts, tzinfo=UTC).timestamp()  # type: ignore[misc]


def test_budget_ids() -> None:
    assert RunBudgetId("enrich-1").key == "run:enrich-1"
    assert ProviderShareId("enrich-1", "acme").key == "run:enrich-1/provider:acme"
    assert NamedBudgetId("growth.team-2").key == "named:growth.team-2"
    assert parse_budget_key("named:growth") == NamedBudgetId("growth")
    assert not isinstance(parse_budget_key("run:x"), NamedBudgetId)


@pytest.mark.parametrize("name", ["", "a b", "a/b", "named@x", "é", "x" * 65])
def test_names_outside_the_alphabet_are_refused_in_one_line(name: str) -> None:
    with pytest.raises(InvalidBudget) as info:
        NamedBudgetId(name)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, PlaylineError) and isinstance(info.value, ValueError)


def test_a_day_period_is_its_utc_date() -> None:
    assert period_id("team", "day", epoch(2026, 12, 4, 0, 0, 0)) == "named:team@2026-12-04"
    assert period_id("team", "day", epoch(2026, 12, 4, 23, 59, 59)) == "named:team@2026-12-04"
    assert period_id("team", "day", epoch(2026, 12, 5)) == "named:team@2026-12-05"


def test_a_month_period_is_its_utc_month() -> None:
    assert period_id("team", "month", epoch(2026, 12, 31, 23, 59)) == "named:team@2026-12"
    assert period_id("team", "month", epoch(2027, 1, 1)) == "named:team@2027-01"


def test_a_period_ends_where_the_next_begins() -> None:
    assert period_end("day", epoch(2026, 12, 4, 13, 30)) == epoch(2026, 12, 5)
    assert period_end("day", epoch(2026, 12, 4)) == epoch(2026, 12, 5)
    assert period_end("day", epoch(2028, 2, 28, 12)) == epoch(2028, 2, 29)
    assert period_end("month", epoch(2026, 12, 4)) == epoch(2027, 1, 1)
    assert period_end("month", epoch(2026, 2, 1)) == epoch(2026, 3, 1)
    for period in ("day", "month"):
        now = epoch(2026, 12, 31, 23, 59, 59)
        end = period_end(period, now)  # type: ignore[arg-type]
        assert period_id("t", period, end - 0.001) == period_id("t", period, now)  # type: ignore[arg-type]
        assert period_id("t", period, end) != period_id("t", period, now)  # type: ignore[arg-type]


def test_an_unknown_period_is_refused() -> None:
    with pytest.raises(InvalidBudget):
        period_id("team", "week", 0.0)  # type: ignore[arg-type]


def test_the_first_budget_that_cannot_cover_it_refuses() -> None:
    roomy = Draw("run:r", "run:r", BudgetState("run:r", 100, 50, 20))
    tight = Draw("p", "p", BudgetState("p", 10, 4, 5))
    full = Draw("q", "q", BudgetState("q", 10, 10, 0))

    assert first_refusal([roomy, tight], 1) is None
    refusal = first_refusal([roomy, tight, full], 1.5)
    assert refusal is not None and refusal.state.budget == "p" and refusal.needed == 1.5
    assert first_refusal([roomy, full], 0) is None  # exactly at the limit still fits 0


def test_the_check_tolerates_float_residue_only() -> None:
    state = BudgetState("b", 1.0, 0.0, sum([0.1] * 9))
    assert first_refusal([Draw("b", "b", state)], 0.1) is None
    assert first_refusal([Draw("b", "b", state)], 0.1 + 1e-6) is not None


def test_used_and_remaining() -> None:
    state = BudgetState("b", 10, 4, 3)
    assert (state.used, state.remaining) == (7, 3)
    assert BudgetState("b", 5, 4, 3).remaining == 0


def test_repeated_lines_keep_the_first() -> None:
    lines = unique_lines([BudgetLine("a", 1), BudgetLine("b"), BudgetLine("a", 2)])
    assert lines == [BudgetLine("a", 1), BudgetLine("b")]


def test_adjustments() -> None:
    assert adjusted_limit("b", 10, add=5, set_to=None) == 15
    assert adjusted_limit("b", 10, add=None, set_to=3) == 3
    assert adjusted_limit("b", 10, add=-10, set_to=None) == 0
    with pytest.raises(InvalidBudget):
        adjusted_limit("b", 10, add=-10.5, set_to=None)
    for add, set_to in ((None, None), (1.0, 1.0), (float("nan"), None), (None, -1.0)):
        with pytest.raises(InvalidBudget):
            check_adjustment(add, set_to)


def test_an_unknown_named_budget_says_how_to_define_it() -> None:
    assert "playline budgets set team --per-day N" in str(unknown_budget("named:team"))
    assert "run:x" in str(unknown_budget("run:x"))
