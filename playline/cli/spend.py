"""What a play's cells cost, as the CLI shows it: summed from the workers' store.

The play's result carries the chunks' own tally (``stats.spend``), which a chunk that
was retried after a crash under-reports; the sheet store's provenance is exact. So the
CLI reads the store when it can reach it (the same open as ``--out`` uses) and falls
back to the result's tally, saying so, when it cannot.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from playline.calls.provenance import run_spend
from playline.config import Settings
from playline.contract import merge_spend
from playline.errors import PlaylineError
from playline.stores.backends import open_stores

__all__ = ["store_spend"]

logger = logging.getLogger("playline.cli")


async def store_spend(settings: Settings, run_refs: Sequence[str]) -> dict[str, Any] | None:
    """The dataset runs' spend summed from the store; ``None`` when the store cannot be
    opened from here (a client without access to the workers' store)."""
    if not run_refs:
        return None
    try:
        async with await open_stores(settings, create=False) as stores:
            total: dict[str, Any] = {}
            for run_ref in run_refs:
                total = merge_spend(total, (await run_spend(stores.sheet, run_ref)).as_dict())
            return total
    except (PlaylineError, OSError) as err:
        logger.debug("the spend is read from the play's result: %s", err)
        return None
