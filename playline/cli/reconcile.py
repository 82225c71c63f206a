"""``playline runs reconcile ID``: the run's reconciliation with its providers' balances.

Read from the workers' stores (the balance readings the play took before and after
it, and its receipts call by call) with the catalog this process would load (the
workers' catalog, for each tool's provider); see :mod:`playline.reconcile`. The run's
summary and ``runs get`` show the same lines. Exit status 1 when a balance does not
match, so a script can ask.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from temporalio.client import WorkflowExecutionDescription

from playline import demo
from playline.calls.catalog import Catalog
from playline.cli.render import print_store_report
from playline.cli.run_refs import memo_run_refs
from playline.cli.spend import store_spend
from playline.config import Settings
from playline.errors import PlaylineError
from playline.reconcile.compare import Reconciliation
from playline.reconcile.gather import reconcile_run
from playline.stores.backends import open_stores

__all__ = ["read_reconciliation"]

logger = logging.getLogger("playline.cli")


def _catalog(settings: Settings) -> Catalog | None:
    try:
        return Catalog.from_toml(settings.catalog_path or demo.CATALOG)
    except Exception as err:  # without a catalog, tools are their own providers
        logger.debug("no catalog for the reconciliation: %s", err)
        return None


def _cells(spend: Mapping[str, Any] | None) -> dict[str, float] | None:
    by_provider = (spend or {}).get("by_provider")
    if not isinstance(by_provider, Mapping):
        return None
    return {str(p): float(c) for p, c in by_provider.items()}


async def read_reconciliation(
    desc: WorkflowExecutionDescription,
    settings: Settings,
    spend: Mapping[str, Any] | None = None,
) -> Reconciliation | None:
    """The run's reconciliation, or ``None`` when the workers' store cannot be opened
    from here. ``spend`` (the cells' figures, ``cli.spend``) adds the cells' credits."""
    try:
        async with await open_stores(settings, create=False) as stores:
            return await reconcile_run(
                stores.receipts,
                stores.balances,
                _catalog(settings),
                desc.id,
                run_id=desc.run_id,
                cells=_cells(spend),
            )
    except (PlaylineError, OSError) as err:
        logger.debug("no reconciliation: the store cannot be opened from here: %s", err)
        return None


async def reconcile_command(
    desc: WorkflowExecutionDescription, settings: Settings, *, json_out: bool
) -> int:
    """``runs reconcile``: print the reconciliation; 1 when a balance does not match."""
    refs = await memo_run_refs(desc)
    report = await read_reconciliation(desc, settings, await store_spend(settings, refs))
    return print_store_report(report, f"reconcile {desc.id}", json_out=json_out)
