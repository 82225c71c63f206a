"""A money cap on the budget ledger, on SQLite and on PostgreSQL (``stores`` fixture):
a call reserves its credits times its provider's credit price on the run's money line,
settles at its charge times the same price, and the run's end settles, keeps or
releases it at that price too (the reservation stores its scale)."""

from __future__ import annotations

import pytest

from playline.stores.backends import Stores
from playline.stores.budget_ids import RunBudgetId, SpendBudgetId
from playline.stores.budgets import BudgetLine, BudgetState, RunEnd

RUN = RunBudgetId("p1")
SPEND = SpendBudgetId("p1")
ACME, FIRMO = 0.049, 0.125  # credit prices


def _lines(price: float) -> list[BudgetLine]:
    return [BudgetLine(RUN, limit=1_000), BudgetLine(SPEND, limit=1.0, scale=price)]


async def _state(stores: Stores, budget: RunBudgetId | SpendBudgetId) -> BudgetState:
    state = await stores.budgets.state(budget)
    assert state is not None, budget
    return state


async def test_a_call_reserves_and_settles_its_credits_at_its_providers_price(
    stores: Stores,
) -> None:
    budgets = stores.budgets
    assert await budgets.reserve("A#0", 5, _lines(ACME), run="p1") is None
    assert await budgets.reserve("B#0", 2, _lines(FIRMO), run="p1") is None
    spend = await _state(stores, SPEND)
    assert (spend.limit, spend.spent) == (1.0, 0)
    assert spend.reserved == pytest.approx(5 * ACME + 2 * FIRMO)
    assert (await _state(stores, RUN)).reserved == 7  # the credits line counts credits

    await budgets.settle("A#0", 3, [RUN, SPEND])  # charged 3 of its 5 worst-case credits
    await budgets.settle("A#0", 5, [RUN, SPEND])  # settled once
    await budgets.release("B#0", [RUN, SPEND])  # not sent
    spend = await _state(stores, SPEND)
    assert spend.spent == pytest.approx(3 * ACME) and spend.reserved == 0
    assert await _state(stores, RUN) == BudgetState(RUN.key, 1_000, 3, 0)


async def test_the_money_cap_refuses_what_its_price_does_not_fit(stores: Stores) -> None:
    budgets = stores.budgets
    # 8 credits at 0.125 = 1.0: exactly the cap
    for n in range(8):
        assert await budgets.reserve(f"K{n}#0", 1, _lines(FIRMO), run="p1") is None
    refusal = await budgets.reserve("L#0", 1, _lines(ACME), run="p1")
    assert refusal is not None
    assert refusal.state.ref == SPEND and refusal.needed == pytest.approx(ACME)
    assert refusal.state.reserved == pytest.approx(1.0)
    # all or nothing: the credits line did not take L#0 either
    assert (await _state(stores, RUN)).reserved == 8
    await budgets.adjust(SPEND, add=0.05)
    assert await budgets.reserve("L#0", 1, _lines(ACME), run="p1") is None


async def test_the_runs_end_settles_keeps_and_releases_money_at_the_stored_price(
    stores: Stores,
) -> None:
    budgets = stores.budgets
    for key, price in (("A#0", ACME), ("B#0", FIRMO), ("C#0", ACME)):
        assert await budgets.reserve(key, 4, _lines(price), run="p1") is None

    # A answered (1 credit), B may have been charged without an answer, C never sent.
    end = await budgets.end_run("p1", {"A#0": 1.0, "B#0": None})

    assert end == RunEnd("p1", 1, 1.0, 1, 4.0, 1, 4.0)  # counted in credits
    spend = await _state(stores, SPEND)
    assert spend.spent == pytest.approx(1 * ACME + 4 * FIRMO) and spend.reserved == 0
    assert await _state(stores, RUN) == BudgetState(RUN.key, 1_000, 5, 0)
    assert await budgets.open_reservations("p1") == []
