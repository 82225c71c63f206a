"""A group of ledger calls applied in order, in memory, as separate transactions would."""

from __future__ import annotations

import pytest

from playline.errors import UnknownBudget
from playline.stores.budgets import BudgetLine, BudgetState
from playline.stores.budgets_group import GroupLedger, Held, LedgerOp

RUN = "run:r"


def reserve(key: str, credits: float, *budgets: str) -> LedgerOp:
    return LedgerOp("reserve", key, credits, lines=tuple(BudgetLine(b) for b in budgets))


def settle(key: str, credits: float, *budgets: str) -> LedgerOp:
    return LedgerOp("settle", key, credits, budgets=budgets)


def release(key: str, *budgets: str) -> LedgerOp:
    return LedgerOp("release", key, budgets=budgets)


def ledger(*states: BudgetState, held: dict[tuple[str, str], Held] | None = None) -> GroupLedger:
    return GroupLedger({s.budget: s for s in states}, held or {}, now=5.0)


def test_a_later_call_sees_an_earlier_ones_reservation() -> None:
    group = ledger(BudgetState(RUN, 10, 0, 0))

    assert group.reserve(reserve("k1", 6, RUN), {RUN: RUN}) is None
    refusal = group.reserve(reserve("k2", 6, RUN), {RUN: RUN})
    assert refusal is not None and refusal.state == BudgetState(RUN, 10, 0, 6)
    assert group.reserve(reserve("k1", 6, RUN), {RUN: RUN}) is None  # same key: once

    assert group.changed_states() == [BudgetState(RUN, 10, 0, 6)]
    assert group.new_rows() == [(("k1", RUN), Held(RUN, 6, "open", 5.0))]
    assert group.stale_pairs() == []


def test_all_or_nothing_across_lines() -> None:
    group = ledger(BudgetState(RUN, 10, 0, 0), BudgetState("p", 1, 0, 0))

    refusal = group.reserve(reserve("k1", 2, RUN, "p"), {RUN: RUN, "p": "p"})

    assert refusal is not None and refusal.state.budget == "p"
    assert group.changed_states() == [] and group.new_rows() == []


def test_reserved_then_settled_in_one_group_is_stored_settled() -> None:
    group = ledger(BudgetState(RUN, 10, 1, 0))

    group.reserve(reserve("k1", 6, RUN), {RUN: RUN})
    group.settle(settle("k1", 2.5, RUN))
    group.settle(settle("k1", 9, RUN))  # settled once

    assert group.changed_states() == [BudgetState(RUN, 10, 3.5, 0)]
    assert group.new_rows() == [
        (("k1", RUN), Held(RUN, 6, "settled", 5.0, charged=2.5, settled_at=5.0))
    ]


def test_a_stored_reservation_released_and_reserved_again_is_rewritten() -> None:
    stored = {("k1", RUN): Held(RUN, 4, "open", 1.0)}
    group = ledger(BudgetState(RUN, 10, 0, 4), held=stored)

    group.release(release("k1", RUN))
    assert group.reserve(reserve("k1", 3, RUN), {RUN: RUN}) is None

    assert group.changed_states() == [BudgetState(RUN, 10, 0, 3)]
    assert group.stale_pairs() == [("k1", RUN)]
    assert group.new_rows() == [(("k1", RUN), Held(RUN, 3, "open", 5.0))]


def test_a_stored_reservation_released_is_only_deleted() -> None:
    stored = {("k1", RUN): Held(RUN, 4, "open", 1.0)}
    group = ledger(BudgetState(RUN, 10, 0, 4), held=stored)

    group.release(release("k1", RUN))
    group.release(release("k1", RUN))

    assert group.changed_states() == [BudgetState(RUN, 10, 0, 0)]
    assert (group.stale_pairs(), group.new_rows()) == ([("k1", RUN)], [])


def test_settled_reservations_are_neither_settled_nor_released_again() -> None:
    stored = {("k1", RUN): Held(RUN, 4, "settled", 1.0, charged=4, settled_at=2.0)}
    group = ledger(BudgetState(RUN, 10, 4, 0), held=stored)

    group.settle(settle("k1", 1, RUN))
    group.release(release("k1", RUN))
    assert group.reserve(reserve("k1", 4, RUN), {RUN: RUN}) is None

    assert (group.changed_states(), group.stale_pairs(), group.new_rows()) == ([], [], [])


def test_a_named_reservation_settles_on_the_period_it_drew_on() -> None:
    stored = {("k1", "named:t"): Held("named:t@2026-12-04", 5, "open", 1.0)}
    group = ledger(
        BudgetState("named:t@2026-12-04", 50, 0, 5),
        BudgetState("named:t@2026-12-05", 50, 0, 0),
        held=stored,
    )

    group.settle(settle("k1", 2, "named:t"))

    assert group.changed_states() == [BudgetState("named:t@2026-12-04", 50, 2, 0)]


def test_a_line_whose_budget_row_is_missing_is_unknown() -> None:
    group = ledger(BudgetState(RUN, 10, 0, 0))

    with pytest.raises(UnknownBudget):
        group.reserve(reserve("k1", 1, RUN, "run:other"), {RUN: RUN, "run:other": "run:other"})
    assert group.changed_states() == []


# --------------------------------------------------------------- money lines


def test_a_scaled_line_reserves_settles_and_releases_credits_times_its_scale() -> None:
    spend = "run:r/spend"
    group = ledger(BudgetState(spend, 1.0, 0, 0), BudgetState(RUN, 100, 0, 0))
    money = LedgerOp("reserve", "k1", 5, lines=(BudgetLine(RUN), BudgetLine(spend, scale=0.049)))
    assert group.reserve(money, {RUN: RUN, spend: spend}) is None
    assert group.state(spend) == BudgetState(spend, 1.0, 0, pytest.approx(0.245))
    assert group.state(RUN) == BudgetState(RUN, 100, 0, 5)  # the credits line: 1 per credit

    # 20 credits at 0.049 = 0.98 fits 1.0 beside nothing else, not beside k1's 0.245
    refusal = group.reserve(
        LedgerOp("reserve", "k2", 20, lines=(BudgetLine(spend, scale=0.049),)), {spend: spend}
    )
    assert refusal is not None and refusal.needed == pytest.approx(0.98)

    group.settle(settle("k1", 3, RUN, spend))  # charged 3 credits: 0.147 in money
    assert group.state(spend) == BudgetState(spend, 1.0, pytest.approx(0.147), 0)
    assert group.state(RUN) == BudgetState(RUN, 100, 3, 0)
    (held,) = [h for (key, budget), h in group.new_rows() if budget == spend]
    assert (held.credits, held.charged, held.scale) == (5, 3, 0.049)

    assert (
        group.reserve(
            LedgerOp("reserve", "k3", 10, lines=(BudgetLine(spend, scale=0.05),)), {spend: spend}
        )
        is None
    )
    group.release(release("k3", spend))
    assert group.state(spend) == BudgetState(spend, 1.0, pytest.approx(0.147), 0)
