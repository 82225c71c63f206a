"""What a play's cells cost, as the CLI shows it: summed from the workers' store.

The play's result carries the chunks' own tally (``stats.spend``), which a chunk that
was retried after a crash under-reports; the sheet store's provenance is exact. So the
CLI reads the store when it can reach it (the same open as ``--out`` uses) and falls
back to the result's tally, saying so, when it cannot.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from playline.calls.provenance import run_spend
from playline.config import Settings
from playline.contract import merge_spend
from playline.errors import PlaylineError
from playline.money import amount_text
from playline.stores.backends import open_stores
from playline.stores.budget_ids import SpendBudgetId
from playline.stores.sheet import SheetStore

__all__ = ["money_cap_line", "store_changes", "store_spend", "summed_from_store"]

logger = logging.getLogger("playline.cli")


async def store_spend(settings: Settings, run_refs: Sequence[str]) -> dict[str, Any] | None:
    """The dataset runs' spend summed from the store; ``None`` when the store cannot be
    opened from here (a client without access to the workers' store)."""

    async def spend(sheet: SheetStore, run_ref: str) -> dict[str, Any]:
        return (await run_spend(sheet, run_ref)).as_dict()

    return await summed_from_store(settings, run_refs, spend, "spend")


async def store_changes(settings: Settings, run_refs: Sequence[str]) -> dict[str, Any] | None:
    """What the dataset runs changed (``{column: {"changed", "appeared",
    "disappeared"}}``), summed from the store; ``None`` when it cannot be opened."""

    async def changes(sheet: SheetStore, run_ref: str) -> dict[str, Any]:
        return dict(await sheet.run_changes(run_ref))

    return await summed_from_store(settings, run_refs, changes, "changes")


async def summed_from_store(
    settings: Settings,
    run_refs: Sequence[str],
    read: Callable[[SheetStore, str], Awaitable[dict[str, Any]]],
    what: str,
) -> dict[str, Any] | None:
    """``read`` of every dataset run, summed (``merge_spend``); ``None`` when there is no
    run or the store cannot be opened from here (the play's result then tells)."""
    if not run_refs:
        return None
    try:
        async with await open_stores(settings, create=False) as stores:
            total: dict[str, Any] = {}
            for run_ref in run_refs:
                total = merge_spend(total, await read(stores.sheet, run_ref))
            return total
    except (PlaylineError, OSError) as err:
        logger.debug("the %s is read from the play's result: %s", what, err)
        return None


async def money_cap_line(settings: Settings, run_id: str, currency: str | None) -> str | None:
    """``money cap: 12.40 of 30.00 USD spent (--max-spend)``, the run's money cap as the
    budget ledger holds it; ``None`` when the store cannot be opened from here or no
    call drew on the cap."""
    try:
        async with await open_stores(settings, create=False) as stores:
            state = await stores.budgets.state(SpendBudgetId(run_id))
    except (PlaylineError, OSError) as err:
        logger.debug("the money cap is not shown: %s", err)
        return None
    if state is None:
        return None
    unit = f" {currency}" if currency else ""
    held = f", {amount_text(state.reserved)} reserved" if state.reserved > 1e-9 else ""
    return (
        f"money cap: {amount_text(state.spent)} of {amount_text(state.limit)}{unit} spent"
        f"{held} (--max-spend)"
    )
