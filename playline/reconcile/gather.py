"""A run's reconciliation read from the stores (what ``playline runs reconcile`` prints,
``runs get`` and the run's summary show, and the play puts in its UI details)."""

from __future__ import annotations

from collections.abc import Mapping

from playline.calls.catalog import Catalog
from playline.reconcile.compare import Reconciliation, reconciliation
from playline.stores.balances import BalanceLedger
from playline.stores.receipts import ReceiptStore

__all__ = ["reconcile_run"]


async def reconcile_run(
    receipts: ReceiptStore,
    balances: BalanceLedger | None,
    catalog: Catalog | None,
    run: str,
    *,
    run_id: str | None = None,
    cells: Mapping[str, float] | None = None,
) -> Reconciliation:
    """The play run ``run``'s reconciliation (its Temporal ``run_id``'s readings; the
    latest run of the id's when not given).

    ``catalog`` maps each tool to its provider (``None``: tools are named by their id's
    provider prefix as the receipts have it: the tool id itself)."""
    calls = await receipts.run_calls(f"{run}/")
    readings = await balances.readings(run, run_id) if balances is not None else []
    if run_id is None and readings:
        latest = max(readings, key=lambda r: r.read_at).run_id
        readings = [r for r in readings if r.run_id == latest]
    provider_of = {t: spec.provider for t, spec in (catalog.tools if catalog else {}).items()}
    return reconciliation(run, calls, provider_of, readings, cells=cells)
