"""Activities on the budget ledger: a run's cap changed (the ``budget`` update), and a
run's reservations settled or released when it ends.

The play's workflow code cannot touch the store itself (it does no I/O), so it runs
these: ``playline.adjust_budget`` writes the new cap where every worker's reservations
read it (then the play tells its dataset run to try the held rows again);
``playline.end_run_budgets`` applies "a run's reservations are settled or released
when the run ends, however it ends" (:func:`playline.calls.budget.end_run_budgets`).
"""

from __future__ import annotations

import dataclasses

from pydantic import BaseModel
from temporalio import activity

from playline.calls.budget import end_run_budgets
from playline.contract import AdjustBudgetInput, BudgetReport
from playline.services import HolderActivities
from playline.stores.budget_ids import (
    BudgetId,
    NamedBudgetId,
    ProviderShareId,
    RunBudgetId,
    SpendBudgetId,
    budget_key,
    check_name,
)

__all__ = ["BudgetActivities", "EndRunBudgetsInput", "RunBudgetsEnded"]


class EndRunBudgetsInput(BaseModel):
    """The play run whose open reservations are settled or released (``budget_run``),
    and how it ended (for the log)."""

    run: str
    outcome: str


class RunBudgetsEnded(BaseModel):
    """What ending a run's budgets did (see ``playline.stores.budgets.RunEnd``):
    ``kept_worst`` calls may have been charged without an answer (a job submitted and
    not read, an ambiguous call) and count at their worst case."""

    run: str
    settled: int
    settled_credits: float
    kept_worst: int
    kept_worst_credits: float
    released: int
    released_credits: float
    summary: str


class BudgetActivities(HolderActivities):
    """Activities on the budget ledger."""

    @activity.defn(name="playline.adjust_budget")
    async def adjust_budget(self, input: AdjustBudgetInput) -> BudgetReport:
        """Raise or set the cap (or only read it, with neither); the budget as it now is."""
        store = self._holder.services.budgets
        budget: BudgetId
        if input.named is not None:
            budget = NamedBudgetId(check_name(input.named))
        elif input.provider is not None:
            budget = ProviderShareId(input.run, input.provider)
        elif input.spend:
            budget = SpendBudgetId(input.run)
        else:
            budget = RunBudgetId(input.run)
        if input.add is None and input.set_to is None:
            state = await store.state(budget)
            if state is None:
                limit = input.create_with or 0.0
                return BudgetReport(budget=budget_key(budget), limit=limit, spent=0.0, reserved=0.0)
        else:
            state = await store.adjust(
                budget, add=input.add, set_to=input.set_to, create_with=input.create_with
            )
        return BudgetReport(
            budget=state.budget, limit=state.limit, spent=state.spent, reserved=state.reserved
        )

    @activity.defn(name="playline.end_run_budgets")
    async def end_run_budgets(self, input: EndRunBudgetsInput) -> RunBudgetsEnded:
        """Settle or release every reservation the run left open (idempotent)."""
        services = self._holder.services
        end = await end_run_budgets(
            services.budgets, services.receipts, services.jobs, input.run, services.catalog
        )
        summary = end.line()
        if end.kept_worst:
            activity.logger.warning("%s ended (%s): %s", input.run, input.outcome, summary)
        else:
            activity.logger.info("%s ended (%s): %s", input.run, input.outcome, summary)
        # The same fields as RunEnd, and its line.
        return RunBudgetsEnded(**dataclasses.asdict(end), summary=summary)
