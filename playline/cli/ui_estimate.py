"""The estimate a run is shown beside, found in Temporal: same play, same input, before it.

``playline estimate`` (and ``playline run``'s pre-flight, ``--confirm-over`` /
``--max-spend``) runs the estimate as a workflow of its own (``PlaylineKind =
'estimate'``), whose result is the tally. A run is matched to the latest such estimate
that completed, of the same play, started before the run, whose input is the run's
input (the play's first argument, decoded and compared as canonical JSON: a CSV given
to ``playline run`` is uploaded to the store under its content's digest, so the same
file is the same input) in the same integration mode, with the same fixtures. Nothing
is written to find it and nothing changes on the run path; a view reads at most
:data:`CANDIDATES` first history events and one result.
"""

from __future__ import annotations

import contextlib
import json
from datetime import datetime
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from playline import search_attributes as sa
from playline.calls.estimate_tally import Estimate
from playline.contract import PlayRunResult
from playline.webview.desk import ProviderEstimate, RunEstimate

__all__ = ["CANDIDATES", "SAME_OPTIONS", "find_estimate", "input_digest"]

#: Estimates of the play (newest first, before the run) whose input is compared.
CANDIDATES = 10


#: The run options an estimate must share with the run (a fixture-mode estimate says
#: nothing of a live run's spend); the others (its budget, its width) change no price.
SAME_OPTIONS = ("integration_mode", "fixtures")


async def input_digest(client: Client, handle: WorkflowHandle[Any, Any]) -> str | None:
    """The workflow's input (its first argument) and :data:`SAME_OPTIONS` of its run
    options (its second) as canonical JSON (``None``: no history or input)."""
    with contextlib.suppress(RPCError):
        async for event in handle.fetch_history_events(page_size=1):
            started = event.workflow_execution_started_event_attributes
            payloads = list(started.input.payloads)
            if not payloads:
                return None
            values = await client.data_converter.decode(payloads[:2])
            options = values[1] if len(values) > 1 and isinstance(values[1], dict) else {}
            shown = [values[0], {k: options.get(k) for k in SAME_OPTIONS}]
            return json.dumps(shown, sort_keys=True, separators=(",", ":"), default=str)
    return None


async def find_estimate(
    client: Client,
    play: str,
    run_handle: WorkflowHandle[Any, Any],
    started: datetime,
    *,
    registered: set[str],
    ui_url: Any = None,
) -> RunEstimate | None:
    """The latest completed estimate of ``play`` on the run's input started before it."""
    if not {sa.PLAY.name, sa.KIND.name} <= registered:
        return None
    wanted = await input_digest(client, run_handle)
    if wanted is None:
        return None
    quoted = play.replace("\\", "\\\\").replace("'", "\\'")
    query = (
        f"{sa.PLAY.name} = '{quoted}' AND {sa.KIND.name} = 'estimate'"
        f" AND ExecutionStatus = 'Completed' AND StartTime < '{started.isoformat()}'"
    )
    try:
        async for execution in client.list_workflows(query, limit=CANDIDATES):
            handle = client.get_workflow_handle(execution.id, result_type=PlayRunResult)
            if await input_digest(client, handle) != wanted:
                continue
            result = await handle.result()
            found = Estimate.from_tally(
                result.stats.estimate,
                play=play,
                workflow_id=execution.id,
                prices=result.stats.prices,
            )
            return RunEstimate(
                workflow_id=execution.id,
                made=execution.start_time.strftime("%Y-%m-%d %H:%M:%S UTC"),
                rows=found.rows,
                by_provider={
                    p: ProviderEstimate(t.worst_credits, t.expected_credits)
                    for p, t in found.by_provider.items()
                },
                prices=dict(found.prices),
                ui_url=ui_url(execution.id, execution.run_id) if ui_url else None,
            )
    except RPCError:
        return None
    return None
