"""The balance readings of a play run: each provider's balance before its first call
and after its last, for ``playline runs reconcile`` (see :mod:`playline.reconcile`).

The play's workflow code does no I/O, so it runs this activity twice. A reading is
receipted: a retried attempt, a replay or another worker finds the one recorded and
does not ask the provider again. After the run, the activity also returns the run's
reconciliation as Markdown for the Temporal UI's details (rows never travel: only
per-provider figures and receipt keys do).
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from temporalio import activity

from playline.reconcile.gather import reconcile_run
from playline.reconcile.read import read_run_balances
from playline.services import HolderActivities
from playline.stores.balances import Phase

__all__ = ["BalanceActivities", "BalancesRead", "ReadBalancesInput"]


class ReadBalancesInput(BaseModel):
    """Which run's balances to read, and when."""

    run: str = Field(description="the play's workflow id")
    run_id: str = Field(description="its Temporal run id")
    phase: Phase = Field(description='"before" the first call or "after" the last')


class BalancesRead(BaseModel):
    """What was read: each provider's figure (``None``: the read failed), and after the
    run its reconciliation in Markdown."""

    balances: dict[str, float | None] = Field(default_factory=dict)
    reconciliation: list[str] = Field(default_factory=list)


class BalanceActivities(HolderActivities):
    """Activities on the providers' balances."""

    @activity.defn(name="playline.read_balances")
    async def read_balances(self, input: ReadBalancesInput) -> BalancesRead:
        """Read (or find recorded) every provider's balance at ``input.phase``."""
        services = self._holder.services
        readings = await read_run_balances(
            services.balances,
            services.http,
            services.catalog,
            services.settings.environ,
            run=input.run,
            run_id=input.run_id,
            phase=input.phase,
            scrub=services.scrub,
        )
        read = BalancesRead(balances={r.provider: r.value for r in readings})
        if input.phase == "after" and readings:
            report = await reconcile_run(
                services.receipts,
                services.balances,
                services.catalog,
                input.run,
                run_id=input.run_id,
            )
            read.reconciliation = report.markdown()
        return read
