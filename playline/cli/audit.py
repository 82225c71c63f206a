"""``playline runs audit ID``: the run's four money invariants (see :mod:`playline.audit`).

The run's dataset runs come from its memo, whether it asked to re-send ambiguous calls
from its start input, and each tool's idempotency contract from the catalog this
process would load (the worker's catalog; a tool it does not know is judged by the
store's own rule). Exit status 1 when an invariant does not hold, so a script can ask.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from temporalio.client import WorkflowExecutionDescription, WorkflowExecutionStatus, WorkflowHandle

from playline import demo
from playline.audit import RunAudit, audit_run
from playline.calls.catalog import Catalog
from playline.config import Settings
from playline.contract import RunOptions
from playline.errors import PlaylineError
from playline.stores.backends import open_stores
from playline.workflows.context import RUN_REFS_MEMO

__all__ = ["read_audit"]

logger = logging.getLogger("playline.cli")


async def read_audit(
    handle: WorkflowHandle[Any, Any], desc: WorkflowExecutionDescription, settings: Settings
) -> RunAudit | None:
    """The run's audit, or ``None`` when the workers' store cannot be opened from here."""
    refs: list[str] = []
    with contextlib.suppress(KeyError):
        refs = await desc.memo_value(RUN_REFS_MEMO, type_hint=list[str])
    run = desc.id
    waiters = [f"{run}/dataset/{_dataset_name(run, ref)}" for ref in refs]
    options = await _options(handle)
    try:
        async with await open_stores(settings, create=False) as stores:
            return await audit_run(
                stores,
                run,
                refs,
                ended=desc.status != WorkflowExecutionStatus.RUNNING,
                retry_ambiguous=options.retry_ambiguous if options is not None else False,
                resend_safe=_contracts(settings),
                waiters=waiters,
                budget_run=desc.run_id,
            )
    except (PlaylineError, OSError) as err:
        logger.debug("no audit: the store cannot be opened from here: %s", err)
        return None


def _dataset_name(run: str, ref: str) -> str:
    """The dataset's name in its run ref (``{play id}/{run id}/{name}``)."""
    return ref.removeprefix(f"{run}/").partition("/")[2]


async def _options(handle: WorkflowHandle[Any, Any]) -> RunOptions | None:
    """The run's options, from its start input (the play's second argument)."""
    try:
        async for event in handle.fetch_history_events():
            started = event.workflow_execution_started_event_attributes
            payloads = list(started.input.payloads)
            if len(payloads) < 2:
                return None
            [options] = await handle._client.data_converter.decode(payloads[1:2], [RunOptions])
            return options if isinstance(options, RunOptions) else None
    except Exception as err:  # an unreadable input only loses the --retry-ambiguous note
        logger.debug("the run's options could not be read: %s", err)
    return None


def _contracts(settings: Settings) -> dict[str, bool]:
    """Per tool id, whether its provider de-duplicates re-sends (``{}``: no catalog)."""
    try:
        catalog = Catalog.from_toml(settings.catalog_path or demo.CATALOG)
    except Exception as err:
        logger.debug("no catalog for the audit: %s", err)
        return {}
    return {tool_id: tool.resend_safe for tool_id, tool in catalog.tools.items()}
