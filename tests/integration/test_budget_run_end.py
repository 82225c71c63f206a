"""A run's reservations settled or released when it ends (issue 28, G4), and a named
budget's period changed without forgetting what was spent (G14), on SQLite and on
PostgreSQL (``stores`` fixture); an old ledger migrated in place."""

from __future__ import annotations

from pathlib import Path

from playline.stores.backends import Stores
from playline.stores.budget_ids import NamedBudgetId, RunBudgetId
from playline.stores.budgets import (
    BudgetLine,
    BudgetState,
    OpenReservation,
    RunEnd,
)
from playline.stores.budgets_ledger import BudgetLedger
from tests.integration.conftest import Clock
from tests.old_schemas import BUDGETS_SQLITE_V1, old_sqlite

RUN = RunBudgetId("p1").key
ROW = "row:p1-ref#1"


async def _state(stores: Stores, budget: str) -> BudgetState:
    state = await stores.budgets.state(budget)
    assert state is not None, budget
    return state


async def test_a_runs_open_reservations_are_settled_or_released_when_it_ends(
    stores: Stores,
) -> None:
    budgets = stores.budgets
    run_line = BudgetLine(RUN, limit=20)
    # A row reserved its worst case (9) on the run's budget; its calls draw on its own.
    assert await budgets.reserve(ROW, 9, [run_line], run="p1") is None
    row_line = BudgetLine(ROW, limit=9)
    for key in ("A#0", "B#0", "C#0"):
        assert await budgets.reserve(key, 3, [row_line], run="p1") is None
    await budgets.settle("A#0", 1, [ROW])  # answered: 1
    # A call past the row's worst case, on the run's budget; another run's call.
    assert await budgets.reserve("D#0", 2, [run_line], run="p1") is None
    assert await budgets.reserve("E#0", 1, [run_line], run="p2") is None

    opened = await budgets.open_reservations("p1")
    assert opened == [
        OpenReservation("B#0", ROW, ROW, 3, "p1", "call"),
        OpenReservation("C#0", ROW, ROW, 3, "p1", "call"),
        OpenReservation("D#0", RUN, RUN, 2, "p1", "call"),
        OpenReservation(ROW, RUN, RUN, 9, "p1", "row"),
    ]

    # B was sent and never answered (worst case), C never sent, D answered at 0.5.
    end = await budgets.end_run("p1", {"B#0": None, "D#0": 0.5})
    assert end == RunEnd(
        "p1",
        settled=2,
        settled_credits=4.5,
        kept_worst=1,
        kept_worst_credits=3,
        released=1,
        released_credits=3,
    )
    # The row settles at what its budget used: 1 paid + 3 kept at worst case.
    assert await _state(stores, ROW) == BudgetState(ROW, 9, 4, 0)
    assert await _state(stores, RUN) == BudgetState(RUN, 20, 4.5, 1)  # E is p2's
    assert await budgets.open_reservations("p1") == []
    assert [r.key for r in await budgets.open_reservations("p2")] == ["E#0"]

    # Again (a retried activity, the escape hatch after the hook): nothing changes.
    assert await budgets.end_run("p1", {"B#0": None, "D#0": 0.5}) == RunEnd("p1")
    assert await _state(stores, RUN) == BudgetState(RUN, 20, 4.5, 1)


async def test_a_named_budget_left_full_by_a_run_is_free_after_it_ends(
    stores: Stores,
) -> None:
    team = NamedBudgetId("team").key
    await stores.budgets.define("team", period="month", limit=20)
    for seq in range(4):
        row = f"row:p1-ref#{seq}"
        assert await stores.budgets.reserve(row, 5, [BudgetLine(team)], run="p1") is None
    assert await stores.budgets.reserve("x", 1, [BudgetLine(team)]) is not None

    await stores.budgets.end_run("p1", {})
    state = await _state(stores, team)
    assert (state.spent, state.reserved) == (0, 0)
    assert await stores.budgets.reserve("x", 1, [BudgetLine(team)], run="p2") is None


async def test_switching_a_day_budget_to_a_month_counts_the_months_days(
    stores: Stores, clock: Clock
) -> None:
    team = NamedBudgetId("team").key
    clock.now = 1_764_806_400.0 + 5 * 86_400 + 36_000  # 2025-12-09 10:00 UTC
    await stores.budgets.define("team", period="day", limit=100)
    assert await stores.budgets.reserve("k1", 100, [BudgetLine(team)]) is None
    await stores.budgets.settle("k1", 100, [team])

    await stores.budgets.define("team", period="month", limit=150)
    assert (await _state(stores, team)).budget == "named:team@2025-12"
    assert await stores.budgets.reserve("k2", 150, [BudgetLine(team)]) is not None
    assert await stores.budgets.reserve("k2", 50, [BudgetLine(team)]) is None
    assert await _state(stores, team) == BudgetState("named:team@2025-12", 150, 100, 50)

    # Back to per day, the same day: today's day already counts its 100; the month
    # adds what it settled today (50), not what it took over from the days.
    await stores.budgets.settle("k2", 50, [team])
    await stores.budgets.define("team", period="day", limit=200)
    assert await _state(stores, team) == BudgetState("named:team@2025-12-09", 200, 150, 0)
    assert await stores.budgets.reserve("k3", 60, [BudgetLine(team)]) is not None
    assert await stores.budgets.reserve("k3", 50, [BudgetLine(team)]) is None


async def test_an_old_ledger_is_migrated_in_place_and_its_reservations_still_work(
    tmp_path: Path,
) -> None:
    path = tmp_path / "budgets.db"
    old_sqlite(
        path,
        BUDGETS_SQLITE_V1,
        1,
        [
            (
                "INSERT INTO budgets (id, credit_limit, spent, reserved, created_at, updated_at)"
                " VALUES ('run:old', 10, 0, 4, 0, 0)",
                (),
            ),
            (
                "INSERT INTO budget_reservations (key, budget, drawn_on, credits, status,"
                " created_at) VALUES ('K#0', 'run:old', 'run:old', 4, 'open', 0)",
                (),
            ),
        ],
    )
    store = BudgetLedger.in_file(path)
    try:
        assert await store.open_reservations("old") == []  # no run recorded: not found
        await store.settle("K#0", 3, ["run:old"])
        assert await store.state("run:old") == BudgetState("run:old", 10, 3, 0)
        assert await store.reserve("L#0", 7, [BudgetLine("run:old")], run="new") is None
        assert [r.key for r in await store.open_reservations("new")] == ["L#0"]
    finally:
        await store.close()


async def test_an_add_applied_as_the_play_sends_it_raises_the_cap_once_on_retry(
    stores: Stores,
) -> None:
    # The play reads the cap, then sends ``set_to = cap + N`` (patch budget-add-once):
    # the activity retried after a lost completion applies the same figure again.
    await stores.budgets.adjust(RUN, set_to=100, create_with=100)
    read = await _state(stores, RUN)
    for _ in range(2):  # the first attempt and its retry
        await stores.budgets.adjust(RUN, set_to=read.limit + 50)
    assert (await _state(stores, RUN)).limit == 150
