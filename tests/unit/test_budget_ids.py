"""Budget ids are typed values: every kind renders to its stored key and reads back as
itself, in the stored format written before (so existing ledgers and histories keep
working); malformed keys are one ``InvalidBudget``."""

from __future__ import annotations

import pytest

from playline.errors import InvalidBudget
from playline.stores.budget_ids import (
    BudgetId,
    NamedBudgetId,
    OtherBudgetId,
    ProviderShareId,
    RowBudgetId,
    RunBudgetId,
    SpendBudgetId,
    as_budget_id,
    budget_key,
    parse_budget_key,
)
from playline.stores.budgets import BudgetLine, BudgetState, reservation_kind

KINDS: list[tuple[BudgetId, str]] = [
    (
        RunBudgetId("0f6c2a9e-41d3-4b7a-9d52-2f1f7d6b1c11"),
        "run:0f6c2a9e-41d3-4b7a-9d52-2f1f7d6b1c11",
    ),
    (ProviderShareId("r-1", "acme"), "run:r-1/provider:acme"),
    (SpendBudgetId("r-1"), "run:r-1/spend"),
    (RowBudgetId("enrich-1-ref#7"), "row:enrich-1-ref#7"),
    (NamedBudgetId("growth.team-2"), "named:growth.team-2"),
    (NamedBudgetId("growth", "2026-12-04"), "named:growth@2026-12-04"),
    (NamedBudgetId("growth", "2026-12"), "named:growth@2026-12"),
    (OtherBudgetId("team-budget"), "team-budget"),
]


@pytest.mark.parametrize(("budget", "key"), KINDS, ids=[k for _, k in KINDS])
def test_every_kind_renders_its_stored_key_and_reads_back_as_itself(
    budget: BudgetId, key: str
) -> None:
    assert budget_key(budget) == key == budget.key
    assert parse_budget_key(key) == budget
    assert as_budget_id(key) == as_budget_id(budget) == budget


def test_a_line_given_a_stored_key_holds_the_typed_id() -> None:
    line = BudgetLine("run:r1/provider:acme", 4)
    assert line.budget == ProviderShareId("r1", "acme") and line.key == "run:r1/provider:acme"
    assert BudgetState("named:t@2026-12-04", 5, 0, 0).ref == NamedBudgetId("t", "2026-12-04")


def test_a_rows_reservation_is_keyed_by_its_budget_and_a_calls_is_not() -> None:
    assert reservation_kind(RowBudgetId("run#7").key) == "row"
    assert reservation_kind("3f9a0c#2") == "call"


@pytest.mark.parametrize(
    "key", ["", " run:x", "run:x ", "named:has space", "named:" + "x" * 65, "named:t@tuesday"]
)
def test_malformed_keys_are_refused_in_one_line(key: str) -> None:
    with pytest.raises(InvalidBudget) as info:
        parse_budget_key(key)
    assert "\n" not in str(info.value)


def test_a_typed_id_that_would_not_read_back_is_refused() -> None:
    with pytest.raises(InvalidBudget):
        as_budget_id(OtherBudgetId("run:x"))  # reads back as RunBudgetId("x")
    with pytest.raises(InvalidBudget):
        as_budget_id(RunBudgetId("x/spend"))  # reads back as the money cap
    with pytest.raises(InvalidBudget):
        NamedBudgetId("team", "12/04")
