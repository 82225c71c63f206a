"""The budget wrapper over a real ledger (SQLite): a row's reservation survives no
transient store error (issue 28, G5), and a charge above its reservation is reported
and stops the budget's further spending (G10)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from playline import demo
from playline.calls.attempt import Attempt
from playline.calls.budget import BudgetedDispatcher, RunBudget
from playline.calls.catalog import Catalog
from playline.calls.dispatch import ClaimedCall, Settled
from playline.errors import BudgetReached
from playline.stores.budget_ids import RunBudgetId
from playline.stores.budgets import BudgetLine, BudgetState, Refusal
from playline.stores.budgets_ledger import BudgetLedger

RUN = RunBudgetId("r1").key


class FlakyBudgets(BudgetLedger):
    """The ledger, whose ``state`` fails as often as asked (a reset connection)."""

    state_failures = 0

    async def state(self, budget: str) -> BudgetState | None:
        if self.state_failures:
            self.state_failures -= 1
            raise ConnectionError("server closed the connection unexpectedly")
        return await super().state(budget)


class Receipts:
    async def release(self, keys: Sequence[str], **kwargs: Any) -> None:
        return None


class Provider:
    """Answers each call at ``credits`` once ``together`` calls are in flight."""

    def __init__(self, credits: float, together: int = 1) -> None:
        self.credits = credits
        self.together = together
        self.sent = 0
        self._all_in = asyncio.Event()

    def auth_scope(self, tool: Any) -> str:
        return "scope"

    async def settle(self, call: ClaimedCall) -> Settled:
        self.sent += 1
        if self.sent >= self.together:
            self._all_in.set()
        await self._all_in.wait()
        return Settled({"email": "a@b", "total_cost": self.credits}, self.credits, "provider")

    async def aclose(self) -> None:
        return None

    def abort(self) -> None:
        return None


def _dispatcher(store: BudgetLedger, provider: Provider, cap: float) -> BudgetedDispatcher:
    attempt = Attempt(receipts=Receipts(), owner="t", lease_id="L", lease_ttl_s=30)  # type: ignore[arg-type]
    return BudgetedDispatcher(provider, attempt, store, RunBudget("r1", max_credits=cap))  # type: ignore[arg-type]


def _call(key: str, payer: str | None = None) -> ClaimedCall:
    tool = Catalog.from_toml(demo.CATALOG).tool("email_finder")  # 1 credit worst case
    return ClaimedCall(tool, {"name": key}, key, payer=payer)


async def test_a_transient_error_reading_the_row_budget_does_not_leak_the_row(
    tmp_path: Path,
) -> None:
    store = FlakyBudgets.in_file(tmp_path / "budgets.db")
    try:
        budgets = _dispatcher(store, Provider(1.0), cap=10)
        assert await budgets.open_row("ref#1", 5)
        await budgets.settle(_call("K1", payer="ref#1"))
        store.state_failures = 1
        await budgets.close_row("ref#1")
        assert await store.state(RUN) == BudgetState(RUN, 10, 1, 0)
        assert await store.reserve("next", 6, [BudgetLine(RUN)]) is None
    finally:
        await store.close()


async def test_a_retried_chunk_settles_the_rows_an_earlier_attempt_finished(
    tmp_path: Path,
) -> None:
    store = FlakyBudgets.in_file(tmp_path / "budgets.db")
    try:
        first = _dispatcher(store, Provider(1.0), cap=10)
        assert await first.open_row("ref#1", 5)
        await first.settle(_call("K1", payer="ref#1"))
        # The row was written, then its close failed (or the worker died).
        store.state_failures = 10**6
        first._attempt.settle_patience_s = 0.0
        with pytest.raises(ConnectionError):
            await first.close_row("ref#1")
        store.state_failures = 0
        assert await store.state(RUN) == BudgetState(RUN, 10, 0, 5)

        store.state_failures = 1  # the retry meets a blip too
        retry = _dispatcher(store, Provider(1.0), cap=10)
        await retry.settle_rows(["ref#1", "ref#2"])  # ref#2: never reserved
        assert await store.state(RUN) == BudgetState(RUN, 10, 1, 0)
    finally:
        await store.close()


async def test_a_charge_above_its_reservation_is_reported_and_stops_the_budget(
    tmp_path: Path,
) -> None:
    store = BudgetLedger.in_file(tmp_path / "budgets.db")
    try:
        provider = Provider(10.0, together=5)  # reserved at 1, billed 10
        budgets = _dispatcher(store, provider, cap=5)
        settled = await asyncio.gather(*(budgets.settle(_call(f"K{n}")) for n in range(5)))
        assert [s.credits for s in settled] == [10.0] * 5

        assert [(o.reserved, o.charged) for o in budgets.overshoots] == [(1.0, 10.0)] * 5
        assert await store.state(RUN) == BudgetState(RUN, 5, 50, 0)
        with pytest.raises(BudgetReached):
            await budgets.settle(_call("K5"))
        assert provider.sent == 5  # nothing more was admitted
        # From now on the tool reserves at the figure it was charged.
        refusal = await store.reserve("probe", 1, [BudgetLine(RUN)])
        assert isinstance(refusal, Refusal)
        await store.adjust(RUN, set_to=100)
        provider.together = 1
        await budgets.settle(_call("K6"))
        state = await store.state(RUN)
        assert state is not None and state.spent == 60
        with sqlite3.connect(tmp_path / "budgets.db") as conn:
            reserved = conn.execute(
                "SELECT credits FROM playline_budget_reservations WHERE key = 'K6#0'"
            ).fetchone()
        assert reserved == (10.0,)
    finally:
        await store.close()
