"""A play run the CLI names by id, and the dataset runs it started, as its result or
its memo names them (``runs``, ``sync``, the web view)."""

from __future__ import annotations

import contextlib
from typing import Any

from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
)

from playline.client import not_found_as
from playline.contract import PlayRunResult
from playline.errors import PlaylineError
from playline.workflows.context import RUN_REFS_MEMO

__all__ = ["find_run", "last_run_ref", "memo_run_refs"]


async def find_run(
    client: Client, workflow_id: str, namespace: str
) -> tuple[WorkflowHandle[Any, PlayRunResult], WorkflowExecutionDescription]:
    """The run ``workflow_id`` names: its handle (typed with the play's result) and its
    description; a run that is gone, or never was, is one line naming the namespace
    looked in, not a gRPC status."""
    handle = client.get_workflow_handle(workflow_id, result_type=PlayRunResult)
    with not_found_as(PlaylineError(f"no run with id {workflow_id!r} in namespace {namespace}")):
        desc = await handle.describe()
    return handle, desc


async def memo_run_refs(desc: WorkflowExecutionDescription) -> list[str]:
    """The play's dataset runs in the order it started them, from its memo: what a
    failed or cancelled play had done, which its result cannot say (empty: none yet)."""
    with contextlib.suppress(KeyError):
        refs: list[str] = await desc.memo_value(RUN_REFS_MEMO, type_hint=list[str])
        return refs
    return []


async def last_run_ref(
    handle: WorkflowHandle[Any, PlayRunResult], desc: WorkflowExecutionDescription
) -> str | None:
    """The play's last dataset run, the one its export or sync reads: its result's once
    it completed, else the last its memo names (a failed, cancelled or running play's
    so far); None when it started none."""
    if desc.status == WorkflowExecutionStatus.COMPLETED:
        datasets = (await handle.result()).datasets
        if datasets:
            return datasets[-1].run_ref
    refs = await memo_run_refs(desc)
    return refs[-1] if refs else None
