"""The dataset runs a play started, as its memo names them (``runs``, ``sync``)."""

from __future__ import annotations

import contextlib

from temporalio.client import WorkflowExecutionDescription

from playline.workflows.context import RUN_REFS_MEMO

__all__ = ["memo_run_refs"]


async def memo_run_refs(desc: WorkflowExecutionDescription) -> list[str]:
    """The play's dataset runs in the order it started them, from its memo: what a
    failed or cancelled play had done, which its result cannot say (empty: none yet)."""
    with contextlib.suppress(KeyError):
        refs: list[str] = await desc.memo_value(RUN_REFS_MEMO, type_hint=list[str])
        return refs
    return []
