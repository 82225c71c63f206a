"""``playline.adjust_budget``: change a run's budget in the store (the ``budget`` update).

The play's ``budget`` update cannot touch the store itself (workflow code does no
I/O), so it runs this activity: the new cap is written where every worker's
reservations read it, then the play tells its dataset run to try the held rows again.
"""

from __future__ import annotations

from temporalio import activity

from playline.contract import AdjustBudgetInput, BudgetReport
from playline.services import ServicesHolder
from playline.stores.budgets import named_budget_ref, provider_budget_id, run_budget_id


class BudgetActivities:
    """Activities on the budget ledger."""

    def __init__(self, holder: ServicesHolder) -> None:
        self._holder = holder

    @activity.defn(name="playline.adjust_budget")
    async def adjust_budget(self, input: AdjustBudgetInput) -> BudgetReport:
        """Raise or set the cap (or only read it, with neither); the budget as it now is."""
        store = self._holder.services.budgets
        if input.named is not None:
            budget = named_budget_ref(input.named)
        elif input.provider is not None:
            budget = provider_budget_id(input.run, input.provider)
        else:
            budget = run_budget_id(input.run)
        if input.add is None and input.set_to is None:
            state = await store.state(budget)
            if state is None:
                limit = input.create_with or 0.0
                return BudgetReport(budget=budget, limit=limit, spent=0.0, reserved=0.0)
        else:
            state = await store.adjust(
                budget, add=input.add, set_to=input.set_to, create_with=input.create_with
            )
        return BudgetReport(
            budget=state.budget, limit=state.limit, spent=state.spent, reserved=state.reserved
        )
