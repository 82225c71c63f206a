"""Budgets on the call path: a paid call's worst case is reserved before it is sent.

:class:`BudgetedDispatcher` wraps a run's live dispatcher. For every claimed call
(a receipt miss: hits never reach a dispatcher, so they never draw on a budget) it

1. reserves the tool's worst-case credits (``ToolSpec.max_credits``; a bulk member's
   share) against every budget the run names (:class:`RunBudget`), in one atomic
   store operation shared by the whole fleet. A refusal releases the receipt and
   raises :class:`~playline.errors.BudgetReached`: nothing was sent, the row is left
   for the dataset run to hold or skip;
2. lets the wrapped dispatcher send and record the call;
3. settles the reservation at what the call actually cost (0 for a miss on a
   charge-on-hit tool), or releases it when nothing can have been charged (parked,
   refused by the provider, the lease lost before sending).

The reservation is keyed by the receipt and its generation, so a retried attempt, a
SIGKILLed worker's successor or a replayed chunk of the same run reserves the same
call once: N workers, retries and crashes never take spend past the cap. What is
left open on purpose, counting at its worst case (never under): a call that may
have been charged without an answer (ambiguous), a bulk member another owner
answered, a receipt taken over (its new owner settles it), and a reservation whose
worker died between recording the answer and settling (the answer is then reused
by the retry, which sends nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from playline.calls.attempt import Attempt
from playline.calls.catalog import ToolSpec
from playline.calls.dispatch import ClaimedCall, Dispatcher, Settled
from playline.contract import RunOptions
from playline.errors import (
    BudgetReached,
    LeaseLost,
    ProviderError,
    ProviderQuotaExhausted,
)
from playline.stores.budgets import (
    BudgetLine,
    BudgetStore,
    Period,
    named_budget_ref,
    period_end,
    provider_budget_id,
    run_budget_id,
)

__all__ = ["BudgetedDispatcher", "RunBudget"]


@dataclass(frozen=True)
class RunBudget:
    """The budgets a play run's paid calls draw on (see ``RunOptions``).

    Attributes:
        run: the play run the caps belong to (its run id).
        max_credits: the run's cap over every provider (None: none).
        by_provider: caps per provider.
        named: a named budget of the store (a team's per-day or per-month cap).
    """

    run: str
    max_credits: float | None = None
    by_provider: Mapping[str, float] = field(default_factory=dict)
    named: str | None = None

    @classmethod
    def of(cls, options: RunOptions, run: str) -> RunBudget | None:
        """The run's budgets, or None when it has none."""
        if not options.budgeted:
            return None
        return cls(
            run=options.budget_run or run,
            max_credits=options.max_credits,
            by_provider=dict(options.max_credits_by_provider),
            named=options.budget,
        )

    def lines(self, provider: str | None) -> list[BudgetLine]:
        """What a call to ``provider`` reserves against, in refusal order (``None``:
        the lines every provider shares)."""
        lines: list[BudgetLine] = []
        if self.max_credits is not None:
            lines.append(BudgetLine(run_budget_id(self.run), self.max_credits))
        cap = None if provider is None else self.by_provider.get(provider)
        if provider is not None and cap is not None:
            lines.append(BudgetLine(provider_budget_id(self.run, provider), cap))
        if self.named is not None:
            lines.append(BudgetLine(named_budget_ref(self.named)))
        return lines

    def refs(self, provider: str | None) -> list[str]:
        return [line.budget for line in self.lines(provider)]


class BudgetedDispatcher:
    """Reserves before sending, settles after; see the module docstring.

    Args:
        inner: the dispatcher that sends and records (live, bulk behind it).
        attempt: the chunk attempt (its store writes trip its breaker).
        store: the budget ledger.
        budget: the run's budgets.
    """

    def __init__(
        self, inner: Dispatcher, attempt: Attempt, store: BudgetStore, budget: RunBudget
    ) -> None:
        self._inner = inner
        self._attempt = attempt
        self._store = store
        self.budget = budget

    # -- rows: admitted while the budget covers their worst case -----------------

    async def room(self) -> float | None:
        """What the run-wide budgets have left (spent and reserved taken off), the
        tightest of them; None when only provider caps apply.

        A read, not a reservation: the chunk uses it to start no more rows than the
        budget can finish, so a tight budget ends with whole rows rather than many
        half-paid ones. The reservations still decide what is sent.
        """
        left: float | None = None
        for line in self.budget.lines(None):
            state = await self._attempt.persist(self._store.state(line.budget))
            limit = line.limit if state is None else state.limit
            if limit is None:
                continue
            free = limit - (0.0 if state is None else state.used)
            left = free if left is None else min(left, free)
        return left

    def auth_scope(self, tool: ToolSpec) -> str:
        return self._inner.auth_scope(tool)

    async def settle(self, call: ClaimedCall) -> Settled:
        tool = call.tool
        worst = tool.max_credits
        if worst <= 0:
            return await self._inner.settle(call)
        key = f"{call.key}#{call.generation}"
        lines = self.budget.lines(tool.provider)
        refs = [line.budget for line in lines]
        attempt = self._attempt
        refusal = await attempt.persist(self._store.reserve(key, worst, lines))
        if refusal is not None:
            await attempt.best_effort(
                lambda: attempt.receipts.release([call.key], lease_id=attempt.lease_id),
                what=f"release of {call.key}",
            )
            state = refusal.state
            raise BudgetReached(
                _shown(state.budget),
                limit=state.limit,
                used=state.used,
                needed=refusal.needed,
                tool_id=tool.id,
                provider=tool.provider if "/provider:" in state.budget else None,
                resets_at=_period_end(state.budget),
                spent=state.spent,
            )
        try:
            settled = await self._inner.settle(call)
        except (ProviderQuotaExhausted, LeaseLost):
            await self._release(key, refs)  # not sent
            raise
        except ProviderError as err:
            if not err.may_have_charged:
                await self._release(key, refs)
            raise
        if settled.paid and settled.recorded:
            credits = settled.credits
            await attempt.durably(
                lambda: self._store.settle(key, credits, refs), what=f"budget of {call.key}"
            )
        return settled

    async def _release(self, key: str, refs: list[str]) -> None:
        await self._attempt.best_effort(
            lambda: self._store.release(key, refs), what=f"budget release of {key}"
        )

    async def aclose(self) -> None:
        await self._inner.aclose()

    def abort(self) -> None:
        self._inner.abort()


def _shown(budget: str) -> str:
    """A budget id as a person reads it: ``run``, ``acme``, ``team-a (2026-12-04)``."""
    if budget.startswith("named:"):
        name, _, period = budget.removeprefix("named:").partition("@")
        return f"{name} ({period})" if period else name
    if "/provider:" in budget:
        return f"{budget.rpartition('/provider:')[2]} (provider cap)"
    return "run"


def _period_end(budget: str) -> float | None:
    """When a named budget's period (``named:NAME@2026-12-04`` or ``@2026-12``) ends."""
    if not budget.startswith("named:") or "@" not in budget:
        return None
    stamp = budget.rpartition("@")[2]
    period: Period = "day" if stamp.count("-") == 2 else "month"
    start = datetime.strptime(stamp if period == "day" else f"{stamp}-01", "%Y-%m-%d")
    return period_end(period, start.replace(tzinfo=UTC).timestamp())
