"""The budget ledger's contract, on SQLite and on PostgreSQL (``stores`` fixture).

Reservations are all or nothing, drawn once per key, settled once, given back on
release; named budgets renew per UTC period by the store's clock; and many processes
reserving against one budget at once never get more than it holds.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

import pytest

from playline.config import Settings
from playline.errors import InvalidBudget, UnknownBudget
from playline.stores.backends import Stores, open_stores
from playline.stores.budget_ids import NamedBudgetId, ProviderShareId, RunBudgetId
from playline.stores.budgets import (
    BudgetLine,
    BudgetState,
    Refusal,
    period_end,
)
from playline.stores.budgets_ledger import BudgetLedger
from tests.integration.conftest import Clock

RUN = RunBudgetId("r1").key
ACME = ProviderShareId("r1", "acme").key
DAY_S = 86_400.0


async def _state(stores: Stores, budget: str) -> BudgetState:
    state = await stores.budgets.state(budget)
    assert state is not None, budget
    return state


# ------------------------------------------------------------------ reserving


async def test_a_reservation_within_the_limit_is_granted_and_counted(stores: Stores) -> None:
    assert await stores.budgets.reserve("k1", 30, [BudgetLine(RUN, limit=100)]) is None
    assert await stores.budgets.reserve("k2", 70, [BudgetLine(RUN, limit=100)]) is None

    state = await _state(stores, RUN)
    assert (state.limit, state.spent, state.reserved) == (100, 0, 100)
    assert (state.used, state.remaining) == (100, 0)


async def test_a_reservation_over_the_limit_is_refused_and_records_nothing(
    stores: Stores,
) -> None:
    await stores.budgets.reserve("k1", 80, [BudgetLine(RUN, limit=100)])

    refusal = await stores.budgets.reserve("k2", 20.5, [BudgetLine(RUN, limit=100)])

    assert refusal is not None
    assert refusal.state == BudgetState(RUN, 100, 0, 80)
    assert refusal.needed == 20.5
    assert (await _state(stores, RUN)).reserved == 80
    # Refused means nothing was recorded under k2: with room made, it is drawn in full.
    await stores.budgets.adjust(RUN, add=0.5)
    assert await stores.budgets.reserve("k2", 20.5, [BudgetLine(RUN)]) is None
    assert (await _state(stores, RUN)).reserved == 100.5


async def test_float_sums_that_reach_the_limit_exactly_fit(stores: Stores) -> None:
    for n in range(10):
        assert await stores.budgets.reserve(f"k{n}", 0.1, [BudgetLine(RUN, limit=1.0)]) is None
    assert await stores.budgets.reserve("k10", 0.1, [BudgetLine(RUN)]) is not None


async def test_all_or_nothing_across_lines(stores: Stores) -> None:
    lines = [BudgetLine(RUN, limit=100), BudgetLine(ACME, limit=10)]
    assert await stores.budgets.reserve("k1", 8, lines) is None

    refusal = await stores.budgets.reserve("k2", 5, lines)

    assert refusal is not None
    assert refusal.state == BudgetState(ACME, 10, 0, 8)
    # The run's budget could cover it, but nothing was drawn from it either.
    assert (await _state(stores, RUN)).reserved == 8
    assert (await _state(stores, ACME)).reserved == 8


async def test_the_refusal_names_the_first_budget_in_the_order_given(stores: Stores) -> None:
    await stores.budgets.reserve("k1", 10, [BudgetLine(RUN, limit=10), BudgetLine(ACME, 10)])

    refusal = await stores.budgets.reserve("k2", 1, [BudgetLine(ACME), BudgetLine(RUN)])

    assert refusal is not None and refusal.state.budget == ACME


async def test_reserving_again_under_one_key_draws_once(stores: Stores) -> None:
    lines = [BudgetLine(RUN, limit=100), BudgetLine(ACME, limit=50)]
    assert await stores.budgets.reserve("k1", 30, lines) is None
    assert await stores.budgets.reserve("k1", 30, lines) is None
    # A line added on the retry is drawn, the one already reserved is not.
    other = ProviderShareId("r1", "firmo").key
    assert await stores.budgets.reserve("k1", 30, [*lines, BudgetLine(other, 30)]) is None

    assert (await _state(stores, RUN)).reserved == 30
    assert (await _state(stores, ACME)).reserved == 30
    assert (await _state(stores, other)).reserved == 30

    await stores.budgets.settle("k1", 12, [RUN, ACME, other])
    # Settled still counts as reserved under the key: a re-run of the call draws nothing.
    assert await stores.budgets.reserve("k1", 30, lines) is None
    assert await _state(stores, RUN) == BudgetState(RUN, 100, 12, 0)


async def test_a_line_repeated_in_one_reservation_is_drawn_once(stores: Stores) -> None:
    assert await stores.budgets.reserve("k1", 6, [BudgetLine(RUN, 10), BudgetLine(RUN, 10)]) is None
    assert (await _state(stores, RUN)).reserved == 6


async def test_a_budget_without_a_limit_to_create_it_is_unknown(stores: Stores) -> None:
    with pytest.raises(UnknownBudget):
        await stores.budgets.reserve("k1", 1, [BudgetLine(RUN, 100), BudgetLine(ACME)])

    assert await stores.budgets.state(ACME) is None
    # All or nothing holds for errors too: the run's budget was not drawn on.
    run = await stores.budgets.state(RUN)
    assert run is None or run.reserved == 0


async def test_an_existing_budget_keeps_its_limit_whatever_a_line_says(stores: Stores) -> None:
    await stores.budgets.reserve("k1", 1, [BudgetLine(RUN, limit=10)])
    await stores.budgets.adjust(RUN, set_to=5)

    assert await stores.budgets.reserve("k2", 5, [BudgetLine(RUN, limit=1000)]) is not None
    assert (await _state(stores, RUN)).limit == 5


async def test_malformed_amounts_and_ids_are_refused_before_anything_is_stored(
    stores: Stores,
) -> None:
    for credits in (-1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidBudget):
            await stores.budgets.reserve("k1", credits, [BudgetLine(RUN, 100)])
    with pytest.raises(InvalidBudget):
        await stores.budgets.reserve("k1", 1, [BudgetLine(RUN, limit=-5)])
    for budget in ("", " run:x", "named:has space", "named:" + "x" * 65):
        with pytest.raises(InvalidBudget):
            await stores.budgets.reserve("k1", 1, [BudgetLine(budget, 100)])
    assert await stores.budgets.state(RUN) is None


# ------------------------------------------------------- settling and releasing


async def test_settling_moves_the_reservation_to_spent_at_the_actual_charge(
    stores: Stores,
) -> None:
    lines = [BudgetLine(RUN, limit=100), BudgetLine(ACME, limit=50)]
    await stores.budgets.reserve("k1", 30, lines)
    await stores.budgets.reserve("k2", 30, lines)

    await stores.budgets.settle("k1", 12.5, [RUN, ACME])
    await stores.budgets.settle("k2", 0, [RUN, ACME])  # a miss on a charge-on-hit tool

    assert await _state(stores, RUN) == BudgetState(RUN, 100, 12.5, 0)
    assert await _state(stores, ACME) == BudgetState(ACME, 50, 12.5, 0)


async def test_settling_twice_charges_once(stores: Stores) -> None:
    await stores.budgets.reserve("k1", 30, [BudgetLine(RUN, limit=100)])
    await stores.budgets.settle("k1", 12, [RUN])
    await stores.budgets.settle("k1", 25, [RUN])

    assert await _state(stores, RUN) == BudgetState(RUN, 100, 12, 0)


async def test_settling_touches_only_the_budgets_named_and_reserved_under_the_key(
    stores: Stores,
) -> None:
    await stores.budgets.reserve("k1", 30, [BudgetLine(RUN, 100), BudgetLine(ACME, 50)])
    await stores.budgets.reserve("k2", 10, [BudgetLine(RUN)])

    await stores.budgets.settle("k1", 20, [ACME])
    await stores.budgets.settle("unknown-key", 99, [RUN, ACME])
    await stores.budgets.settle("k2", 5, [ACME])  # k2 holds nothing on ACME

    assert await _state(stores, ACME) == BudgetState(ACME, 50, 20, 0)
    assert await _state(stores, RUN) == BudgetState(RUN, 100, 0, 40)


async def test_releasing_gives_the_credits_back_for_a_later_attempt(stores: Stores) -> None:
    lines = [BudgetLine(RUN, limit=100)]
    await stores.budgets.reserve("k1", 60, lines)
    assert await stores.budgets.reserve("k2", 50, lines) is not None

    await stores.budgets.release("k1", [RUN])
    await stores.budgets.release("k1", [RUN])  # nothing left to give back

    assert (await _state(stores, RUN)).reserved == 0
    assert await stores.budgets.reserve("k2", 50, lines) is None
    # The released key may reserve again (a later attempt of the same call).
    assert await stores.budgets.reserve("k1", 50, lines) is None
    assert await _state(stores, RUN) == BudgetState(RUN, 100, 0, 100)


async def test_releasing_a_settled_reservation_changes_nothing(stores: Stores) -> None:
    await stores.budgets.reserve("k1", 30, [BudgetLine(RUN, limit=100)])
    await stores.budgets.settle("k1", 30, [RUN])
    await stores.budgets.release("k1", [RUN])

    assert await _state(stores, RUN) == BudgetState(RUN, 100, 30, 0)
    assert await stores.budgets.reserve("k1", 30, [BudgetLine(RUN)]) is None
    assert (await _state(stores, RUN)).reserved == 0


async def test_calls_made_together_apply_in_the_order_they_were_made(stores: Stores) -> None:
    await stores.budgets.definitions()  # the ledger is open: the calls below go in one group
    budgets = stores.budgets

    results = await asyncio.gather(
        budgets.reserve("k1", 60, [BudgetLine(RUN, limit=100)]),
        budgets.reserve("k2", 60, [BudgetLine(RUN, limit=100)]),
        budgets.release("k1", [RUN]),
        budgets.reserve("k3", 60, [BudgetLine(RUN)]),
        budgets.reserve("k4", 1, [BudgetLine(RUN), BudgetLine("named:nobody")]),
        budgets.settle("k3", 10, [RUN]),
        budgets.reserve("k3", 60, [BudgetLine(RUN)]),
        budgets.reserve("k5", 90, [BudgetLine(RUN)]),
        return_exceptions=True,
    )

    assert results[0] is None
    assert results[1] == Refusal(BudgetState(RUN, 100, 0, 60), 60)
    assert results[2:4] == [None, None]
    assert isinstance(results[4], UnknownBudget)
    assert results[5:] == [None, None, None]
    assert await _state(stores, RUN) == BudgetState(RUN, 100, 10, 90)


# -------------------------------------------------------------------- adjust


async def test_adjust_adds_sets_and_creates(stores: Stores) -> None:
    await stores.budgets.reserve("k1", 100, [BudgetLine(RUN, limit=100)])
    assert await stores.budgets.reserve("k2", 40, [BudgetLine(RUN)]) is not None

    assert await stores.budgets.adjust(RUN, add=50) == BudgetState(RUN, 150, 0, 100)
    assert await stores.budgets.reserve("k2", 40, [BudgetLine(RUN)]) is None
    assert await stores.budgets.adjust(RUN, set_to=120) == BudgetState(RUN, 120, 0, 140)
    assert await stores.budgets.reserve("k3", 0.5, [BudgetLine(RUN)]) is not None

    created = await stores.budgets.adjust(ACME, add=5, create_with=10)
    assert created == BudgetState(ACME, 15, 0, 0)
    assert await stores.budgets.adjust(ACME, set_to=3, create_with=99) == BudgetState(ACME, 3, 0, 0)


async def test_adjust_refuses_an_unknown_budget_and_malformed_changes(stores: Stores) -> None:
    with pytest.raises(UnknownBudget):
        await stores.budgets.adjust(RUN, add=10)
    assert await stores.budgets.state(RUN) is None
    await stores.budgets.adjust(RUN, set_to=10, create_with=10)
    with pytest.raises(InvalidBudget):
        await stores.budgets.adjust(RUN)
    with pytest.raises(InvalidBudget):
        await stores.budgets.adjust(RUN, add=1, set_to=1)
    with pytest.raises(InvalidBudget):
        await stores.budgets.adjust(RUN, add=-11)
    with pytest.raises(InvalidBudget):
        await stores.budgets.adjust(RUN, set_to=-1)
    assert (await _state(stores, RUN)).limit == 10


# ------------------------------------------------------------- named budgets


async def test_a_named_budget_draws_on_its_current_day(stores: Stores, clock: Clock) -> None:
    team = NamedBudgetId("team").key
    clock.now = 1_764_806_400.0 + 3_600  # 2025-12-04 01:00 UTC
    await stores.budgets.define("team", period="day", limit=50)

    assert await stores.budgets.reserve("k1", 40, [BudgetLine(team, limit=1e9)]) is None
    refusal = await stores.budgets.reserve("k2", 20, [BudgetLine(team)])
    assert refusal is not None
    assert refusal.state == BudgetState("named:team@2025-12-04", 50, 0, 40)
    assert await _state(stores, team) == BudgetState("named:team@2025-12-04", 50, 0, 40)

    clock.now = period_end("day", clock.now)  # midnight: a fresh day
    assert await _state(stores, team) == BudgetState("named:team@2025-12-05", 50, 0, 0)
    assert await stores.budgets.reserve("k2", 20, [BudgetLine(team)]) is None

    # Yesterday's call settles on yesterday's budget, by the reference the caller holds.
    await stores.budgets.settle("k1", 35, [team])
    assert await _state(stores, "named:team@2025-12-04") == BudgetState(
        "named:team@2025-12-04", 50, 35, 0
    )
    assert await _state(stores, team) == BudgetState("named:team@2025-12-05", 50, 0, 20)


async def test_a_monthly_budget_renews_on_the_first(stores: Stores, clock: Clock) -> None:
    team = NamedBudgetId("ops.team-1").key
    clock.now = 1_767_139_200.0  # 2025-12-31 00:00 UTC
    await stores.budgets.define("ops.team-1", period="month", limit=10)
    assert await stores.budgets.reserve("k1", 10, [BudgetLine(team)]) is None

    clock.now += DAY_S - 1
    assert await stores.budgets.reserve("k2", 1, [BudgetLine(team)]) is not None
    clock.now += 1
    assert await stores.budgets.reserve("k2", 1, [BudgetLine(team)]) is None
    assert await _state(stores, team) == BudgetState("named:ops.team-1@2026-01", 10, 0, 1)


async def test_defining_again_changes_the_current_period_and_adjust_changes_both(
    stores: Stores,
) -> None:
    team = NamedBudgetId("team").key
    await stores.budgets.define("team", period="day", limit=50)
    await stores.budgets.reserve("k1", 50, [BudgetLine(team)])

    await stores.budgets.define("team", period="day", limit=80)
    assert (await _state(stores, team)).limit == 80
    assert await stores.budgets.reserve("k2", 30, [BudgetLine(team)]) is None

    raised = await stores.budgets.adjust(team, add=20)
    assert (raised.limit, raised.reserved) == (100, 80)
    assert [(d.name, d.period, d.limit) for d in await stores.budgets.definitions()] == [
        ("team", "day", 100)
    ]
    assert (await stores.budgets.adjust(team, set_to=60)).limit == 60


async def test_a_new_period_takes_the_definition_adjusted_before_it(
    stores: Stores, clock: Clock
) -> None:
    team = NamedBudgetId("team").key
    await stores.budgets.define("team", period="day", limit=50)
    await stores.budgets.adjust(team, add=25)

    clock.now += DAY_S
    assert (await _state(stores, team)).limit == 75


async def test_definitions_are_listed_by_name(stores: Stores) -> None:
    assert await stores.budgets.definitions() == []
    await stores.budgets.define("zeta", period="month", limit=5)
    await stores.budgets.define("alpha", period="day", limit=7.5)

    assert [(d.name, d.period, d.limit) for d in await stores.budgets.definitions()] == [
        ("alpha", "day", 7.5),
        ("zeta", "month", 5),
    ]


async def test_an_undefined_named_budget_is_unknown(stores: Stores) -> None:
    with pytest.raises(UnknownBudget, match="playline budgets set nobody"):
        await stores.budgets.reserve("k1", 1, [BudgetLine(RUN, 10), BudgetLine("named:nobody")])
    with pytest.raises(UnknownBudget):
        await stores.budgets.adjust("named:nobody", add=1, create_with=5)
    assert await stores.budgets.state("named:nobody") is None
    run = await stores.budgets.state(RUN)
    assert run is None or run.reserved == 0
    with pytest.raises(InvalidBudget):
        await stores.budgets.define("no spaces", period="day", limit=1)
    with pytest.raises(InvalidBudget):
        await stores.budgets.define("team", period="week", limit=1)  # type: ignore[arg-type]


# ------------------------------------------------------------- opening, closing


async def test_a_client_uses_budgets_and_sees_what_workers_reserved(
    store_url: str, clock: Clock
) -> None:
    settings = Settings(store_url=store_url)
    async with await open_stores(settings, create=True, clock=clock) as worker:
        await worker.budgets.reserve("k1", 4, [BudgetLine(RUN, limit=10)])
    if not store_url.startswith("postgres"):
        assert settings.budgets_path.is_file()

    async with await open_stores(settings, create=False, clock=clock) as client:
        await client.budgets.define("team", period="day", limit=3)
        assert (await _state(client, RUN)).reserved == 4
    async with await open_stores(settings, create=True, clock=clock) as worker:
        assert (await _state(worker, NamedBudgetId("team").key)).limit == 3


async def test_a_client_that_never_uses_budgets_creates_no_ledger(tmp_path: Path) -> None:
    settings = Settings(store_url=f"sqlite:///{tmp_path}")
    async with await open_stores(settings, create=True):
        pass
    async with await open_stores(settings, create=False):
        pass
    assert not settings.budgets_path.exists()


# ---------------------------------------------------------------- concurrency

PROCESSES = 8
TASKS_PER_PROCESS = 100
#: reservations each process keeps in flight: small groups, so the processes interleave
IN_FLIGHT = 4
LIMIT = 400


async def _contend(store_url: str, worker: int, go: EventType, results: Any) -> int:
    """One process: TASKS_PER_PROCESS 1-credit reservations, IN_FLIGHT at a time; how
    many were granted."""
    if store_url.startswith("postgres"):
        from playline.db.postgres import PostgresPool

        pool = await PostgresPool.open(store_url, min_size=1, max_size=3)
        budgets: Any = BudgetLedger.in_database(pool)

        async def close() -> None:
            await budgets.close()
            await pool.close()

    else:
        budgets = BudgetLedger.in_file(Settings(store_url=store_url).budgets_path)
        close = budgets.close
    try:
        await budgets.definitions()  # opened (and migrated) before the race starts
        results.put(("ready", worker))
        await asyncio.to_thread(go.wait)
        lines = [
            BudgetLine(RUN, limit=LIMIT),
            BudgetLine(ProviderShareId("r1", f"p{worker % 2}").key, limit=10 * LIMIT),
        ]
        slots = asyncio.Semaphore(IN_FLIGHT)

        async def reserve(n: int) -> bool:
            async with slots:
                return await budgets.reserve(f"w{worker}-{n}", 1, lines) is None

        granted = await asyncio.gather(*(reserve(n) for n in range(TASKS_PER_PROCESS)))
        return sum(granted)
    finally:
        await close()


def _contender(store_url: str, worker: int, go: EventType, results: Any) -> None:
    try:
        results.put(("granted", asyncio.run(_contend(store_url, worker, go, results))))
    except BaseException as err:  # reported, so the test fails at once and says why
        results.put(("error", f"process {worker}: {err!r}"))
        raise


async def test_many_processes_never_reserve_more_than_the_budget(
    stores: Stores, store_url: str
) -> None:
    await stores.budgets.definitions()  # the ledger exists before the processes open it
    context = multiprocessing.get_context("spawn")
    go = context.Event()
    results = context.Queue()
    processes = [
        context.Process(target=_contender, args=(store_url, n, go, results))
        for n in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    try:
        ready = [await asyncio.to_thread(results.get, True, 120) for _ in processes]
        assert all(kind == "ready" for kind, _ in ready), ready
        go.set()  # every process is open and waiting: they start together
        done = [await asyncio.to_thread(results.get, True, 300) for _ in processes]
        assert all(kind == "granted" for kind, _ in done), done
        granted = [count for _, count in done]
    finally:
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()
    assert all(process.exitcode == 0 for process in processes)

    assert sum(granted) == LIMIT
    state = await _state(stores, RUN)
    assert (state.reserved, state.spent) == (LIMIT, 0)
    providers = [await stores.budgets.state(ProviderShareId("r1", f"p{n}").key) for n in (0, 1)]
    assert sum(p.reserved for p in providers if p is not None) == LIMIT
    assert await _open_reservations(stores, store_url, RUN) == LIMIT


async def _open_reservations(stores: Stores, store_url: str, budget: str) -> int:
    """The reservations stored on ``budget``, counted in the ledger's own table."""
    if store_url.startswith("postgres"):
        import psycopg

        async with await psycopg.AsyncConnection.connect(store_url) as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM playline_budget_reservations WHERE drawn_on = %s",
                [budget],
            )
            row = await cur.fetchone()
            assert row is not None
            return int(row[0])
    path = Settings(store_url=store_url).budgets_path
    with sqlite3.connect(path) as conn:
        return int(
            conn.execute(
                "SELECT count(*) FROM playline_budget_reservations WHERE drawn_on = ?", (budget,)
            ).fetchone()[0]
        )
