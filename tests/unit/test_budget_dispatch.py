"""The budget wrapper's rule: reserve before sending, settle at the actual charge, release
what cannot have been charged, keep what may have been (fakes for the store and the
wrapped dispatcher; the stores themselves are tested in tests/integration)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from playline import demo
from playline.calls.attempt import Attempt
from playline.calls.budget import BudgetedDispatcher, RunBudget
from playline.calls.catalog import Catalog
from playline.calls.dispatch import ClaimedCall, Settled
from playline.contract import RunOptions
from playline.errors import (
    BudgetReached,
    CallAmbiguous,
    ProviderQuotaExhausted,
    ProviderRejected,
    ProviderTimeout,
)
from playline.stores.budget_ids import BudgetId
from playline.stores.budgets import BudgetLine, BudgetState, Refusal, check_budget_id
from playline.workflows.status import budget_wait_message


class FakeBudgets:
    def __init__(self, refuse: bool = False, in_flight: list[float] | None = None) -> None:
        self.refuse = refuse
        #: reserved by others at each refusal, until the list runs out (then granted)
        self.in_flight = list(in_flight or [])
        self.calls: list[tuple[Any, ...]] = []

    async def reserve(
        self, key: str, credits: float, lines: Sequence[BudgetLine], *, run: str | None = None
    ) -> Any:
        self.calls.append(("reserve", key, credits, [line.key for line in lines]))
        if self.in_flight:
            return Refusal(BudgetState(lines[0].key, 10.0, 5.0, self.in_flight.pop(0)), credits)
        if self.refuse:
            return Refusal(BudgetState(lines[0].key, 10.0, 9.5, 0.0), credits)
        return None

    async def settle(self, key: str, credits: float, budgets: Sequence[BudgetId | str]) -> None:
        self.calls.append(("settle", key, credits, [check_budget_id(b) for b in budgets]))

    async def release(self, key: str, budgets: Sequence[BudgetId | str]) -> None:
        self.calls.append(("release", key, [check_budget_id(b) for b in budgets]))

    async def state(self, budget: BudgetId | str) -> BudgetState | None:
        self.calls.append(("state", check_budget_id(budget)))
        # the row's calls: 0.5 paid, 1 reserved
        return BudgetState(check_budget_id(budget), 9.0, 0.5, 1.0)


class FakeReceipts:
    def __init__(self) -> None:
        self.released: list[str] = []

    async def release(self, keys: Sequence[str], **kwargs: Any) -> None:
        self.released += list(keys)


class Inner:
    def __init__(self, outcome: Settled | BaseException) -> None:
        self.outcome = outcome

    def auth_scope(self, tool: Any) -> str:
        return "scope"

    async def settle(self, call: ClaimedCall) -> Settled:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    async def aclose(self) -> None:
        return None

    def abort(self) -> None:
        return None


def _wrapped(tmp_path: Any, outcome: Settled | BaseException, *, refuse: bool = False) -> Any:
    tool = Catalog.from_toml(demo.CATALOG).tool("email_finder")  # acme, 1 credit
    receipts = FakeReceipts()
    attempt = Attempt(receipts=receipts, owner="t", lease_id="L", lease_ttl_s=30)  # type: ignore[arg-type]
    store = FakeBudgets(refuse)
    budget = RunBudget("r1", max_credits=10, by_provider={"acme": 4})
    dispatcher = BudgetedDispatcher(Inner(outcome), attempt, store, budget)  # type: ignore[arg-type]
    return dispatcher, store, receipts, ClaimedCall(tool, {"name": "x"}, "K", generation=2)


async def test_a_paid_call_reserves_its_worst_case_on_every_line_then_settles_what_it_cost(
    tmp_path,
) -> None:
    dispatcher, store, _, call = _wrapped(tmp_path, Settled({"email": "a@b"}, 0.0))
    settled = await dispatcher.settle(call)
    assert settled.credits == 0.0  # a miss the provider did not bill
    lines = ["run:r1", "run:r1/provider:acme"]
    assert store.calls == [("reserve", "K#2", 1.0, lines), ("settle", "K#2", 0.0, lines)]


async def test_a_refused_reservation_sends_nothing_releases_the_receipt_and_says_why(
    tmp_path,
) -> None:
    dispatcher, store, receipts, call = _wrapped(
        tmp_path, AssertionError("must not be sent"), refuse=True
    )
    with pytest.raises(BudgetReached) as raised:
        await dispatcher.settle(call)
    assert receipts.released == ["K"]
    assert [c[0] for c in store.calls] == ["reserve"]
    assert raised.value.used == 9.5 and raised.value.limit == 10.0
    assert "9.5 of 10 credits" in str(raised.value)


@pytest.mark.parametrize(
    ("error", "released"),
    [
        (ProviderRejected("bad input", tool_id="email_finder", status=400), True),
        (ProviderQuotaExhausted("acme", 2e9), True),
        (ProviderTimeout("timed out", tool_id="email_finder", may_have_charged=True), False),
        (CallAmbiguous("find", "timed out"), False),
    ],
)
async def test_what_cannot_have_been_charged_is_released_and_what_may_have_is_kept(
    tmp_path, error, released
) -> None:
    dispatcher, store, _, call = _wrapped(tmp_path, error)
    with pytest.raises(type(error)):
        await dispatcher.settle(call)
    kinds = [c[0] for c in store.calls]
    assert kinds == (["reserve", "release"] if released else ["reserve"])


async def test_an_answer_another_owner_records_leaves_the_reservation_to_it(tmp_path) -> None:
    dispatcher, store, _, call = _wrapped(tmp_path, Settled({}, 0.0, recorded=False))
    await dispatcher.settle(call)
    assert [c[0] for c in store.calls] == ["reserve"]


def test_run_options_name_the_budgets_a_call_draws_on() -> None:
    assert RunBudget.of(RunOptions(), "r") is None
    budget = RunBudget.of(RunOptions(max_credits=5, budget="team-a", budget_run="run-9"), "x")
    assert budget is not None
    assert [line.key for line in budget.lines("acme")] == ["run:run-9", "named:team-a"]
    assert budget.lines("acme")[0].limit == 5


def test_the_wait_message_names_the_command_that_goes_on() -> None:
    from playline.contract import BudgetHold

    hold = BudgetHold(budget="run", limit=500, used=500, rows=12)
    assert budget_wait_message(hold, "p-1") == (
        "budget: 500 of 500 credits spent; `playline runs budget p-1 --add N` to go on"
    )
    capped = BudgetHold(budget="acme", limit=5, used=4.5, rows=1, provider="acme")
    assert "--provider acme --add N" in budget_wait_message(capped, "p-1")


async def test_a_row_reserves_its_worst_case_once_and_its_calls_draw_on_its_own_budget(
    tmp_path,
) -> None:
    dispatcher, store, _, call = _wrapped(tmp_path, Settled({"email": "a@b"}, 1.0))
    row = ClaimedCall(call.tool, call.payload, call.key, generation=2, payer="run#7")
    assert await dispatcher.open_row("run#7", 9.0)
    await dispatcher.settle(row)
    await dispatcher.close_row("run#7")
    assert store.calls == [
        ("reserve", "row:run#7", 9.0, ["run:r1"]),
        # the provider's cap still applies; the run's budget is the row's reservation
        ("reserve", "K#2", 1.0, ["row:run#7", "run:r1/provider:acme"]),
        ("settle", "K#2", 1.0, ["row:run#7", "run:r1/provider:acme"]),
        ("state", "row:run#7"),
        ("settle", "row:run#7", 1.5, ["run:r1"]),
    ]


async def test_a_row_left_pending_keeps_its_reservation(tmp_path) -> None:
    dispatcher, store, _, _ = _wrapped(tmp_path, Settled({}, 0.0))
    assert await dispatcher.open_row("run#8", 9.0)
    await dispatcher.close_row("run#8", pending=True)
    assert [c[0] for c in store.calls] == ["reserve"]


async def test_a_call_waits_while_reservations_in_flight_settle_then_goes(tmp_path) -> None:
    dispatcher, store, _, call = _wrapped(tmp_path, Settled({"email": "a@b"}, 1.0))
    store.in_flight = [5.0, 4.0, 2.0]  # full of reservations, settling: not spent
    settled = await dispatcher.settle(call)
    assert settled.credits == 1.0
    assert [c[0] for c in store.calls] == ["reserve"] * 4 + ["settle"]


# ----------------------------------------------------------------- money caps


def test_a_money_cap_draws_each_call_at_its_providers_price_and_rows_not_at_all() -> None:
    catalog = Catalog.from_toml(demo.CATALOG)
    options = RunOptions(max_credits=50, max_spend=2.5, budget_run="run-9")
    budget = RunBudget.of(options, "x", catalog)
    assert budget is not None and budget.currency == "USD"
    acme = budget.lines("acme")
    assert [line.key for line in acme] == ["run:run-9", "run:run-9/spend"]
    assert acme[1].limit == 2.5
    assert acme[1].scale == catalog.providers["acme"].credit_price
    assert budget.lines("firmo")[1].scale == catalog.providers["firmo"].credit_price
    # a row's worst case reserves on the credit lines only: its money depends on providers
    assert [line.key for line in budget.lines(None)] == ["run:run-9"]


def test_a_money_cap_refuses_a_provider_without_a_price_in_its_currency() -> None:
    from playline.calls.budget import CreditPrice
    from playline.errors import SpendUnpriced

    budget = RunBudget(
        "r1",
        max_spend=10,
        prices={"acme": CreditPrice(0.01, "USD"), "firmo": CreditPrice(0.02, "EUR")},
        currency="USD",
    )
    assert budget.lines("acme")[0].scale == 0.01
    with pytest.raises(SpendUnpriced, match="'mailfox' has no credit_price"):
        budget.lines("mailfox")
    with pytest.raises(SpendUnpriced, match="'firmo' prices its credits in EUR"):
        budget.lines("firmo")


async def test_a_call_refused_by_the_money_cap_says_so_in_money(tmp_path) -> None:
    tool = Catalog.from_toml(demo.CATALOG).tool("email_finder")  # acme
    receipts = FakeReceipts()
    attempt = Attempt(receipts=receipts, owner="t", lease_id="L", lease_ttl_s=30)  # type: ignore[arg-type]
    store = FakeBudgets(refuse=True)
    budget = RunBudget.of(
        RunOptions(max_spend=10, budget_run="r1"), "x", Catalog.from_toml(demo.CATALOG)
    )
    assert budget is not None
    dispatcher = BudgetedDispatcher(Inner(AssertionError("not sent")), attempt, store, budget)  # type: ignore[arg-type]
    with pytest.raises(BudgetReached) as raised:
        await dispatcher.settle(ClaimedCall(tool, {"name": "x"}, "K", generation=0))
    assert raised.value.currency == "USD" and raised.value.budget == "spend"
    assert "9.5 of 10 USD" in str(raised.value)
    assert receipts.released == ["K"]


def test_the_money_wait_message_reads_like_the_credits_one_in_money() -> None:
    from playline.contract import BudgetHold

    hold = BudgetHold(budget="spend", limit=0.5, used=0.49, spent=0.46, rows=3, currency="USD")
    assert budget_wait_message(hold, "p-1") == (
        "budget: 0.46 of 0.50 USD spent, 0.03 reserved by calls in flight; "
        "`playline runs budget p-1 --add-spend N` to go on"
    )


def test_run_max_spend_needs_every_provider_priced_in_one_currency() -> None:
    from playline.calls.estimate_tally import Estimate, EstimateTotals
    from playline.cli.estimate import spend_currency

    def found(prices: dict[str, Any]) -> Estimate:
        totals = {p: EstimateTotals(calls=1, worst_credits=1) for p in ("acme", "firmo")}
        return Estimate(play="p", by_provider=totals, prices=prices)

    usd = {"credit_price": 0.01, "currency": "USD"}
    assert spend_currency(found({"acme": usd, "firmo": usd}), 5) == ("USD", None)
    currency, refused = spend_currency(found({"acme": usd}), 5)
    assert currency is None and refused is not None and "\n" not in refused
    assert "provider firmo has no credit_price" in refused
    eur = {"credit_price": 0.01, "currency": "EUR"}
    _, refused = spend_currency(found({"acme": usd, "firmo": eur}), 5)
    assert refused is not None and "different currencies (EUR, USD)" in refused
