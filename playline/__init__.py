"""playline: durable data-enrichment plays on Temporal.

Authoring (inside a plays module)::

    from playline import PlayContext, RowContext, play, resolver

Running: add ``PlaylinePlugin()`` to ``Client.connect(..., plugins=[...])`` and start a
worker, or use the ``playline`` command. Starting, typed by the play's own models::

    handle = await playline.start_play(client, enrich_leads, EnrichLeadsInput(...))

Re-running on a Temporal Schedule (each firing estimates first, then pays only for
what is due)::

    await playline.create_schedule(client, "weekly-leads", enrich_leads, EnrichLeadsInput(...),
                                   every="7d", task_queue="playline")
"""

from importlib.metadata import PackageNotFoundError, version

from playline.calls.estimate_tally import Estimate
from playline.calls.row_context import RowContext
from playline.calls.runner import ToolResult
from playline.calls.waterfall import Step, StepResult, WaterfallResult
from playline.calls.waterfall_spec import AcceptSpec as Accept
from playline.calls.waterfall_spec import ValidateSpec as Validate
from playline.client import PlayHandle, estimate_play, execute_play, get_play_handle, start_play
from playline.contract import DatasetRef, PlayRunResult, PlayState, RunOptions
from playline.freshness import Freshness
from playline.plugin import PlaylinePlugin
from playline.resolvers import resolver
from playline.schedules import (
    ScheduleView,
    create_schedule,
    delete_schedule,
    describe_schedule,
    list_schedules,
    pause_schedule,
    trigger_schedule,
    unpause_schedule,
)
from playline.workflows import DatasetHandle, PlayContext, play

try:
    __version__ = version("playline")
except PackageNotFoundError:  # pragma: no cover - imported from a source tree, not installed
    __version__ = "0+unknown"

__all__ = [
    "Accept",
    "DatasetHandle",
    "DatasetRef",
    "Estimate",
    "Freshness",
    "PlayContext",
    "PlayHandle",
    "PlayRunResult",
    "PlayState",
    "PlaylinePlugin",
    "RowContext",
    "RunOptions",
    "ScheduleView",
    "Step",
    "StepResult",
    "ToolResult",
    "Validate",
    "WaterfallResult",
    "__version__",
    "create_schedule",
    "delete_schedule",
    "describe_schedule",
    "estimate_play",
    "execute_play",
    "get_play_handle",
    "list_schedules",
    "pause_schedule",
    "play",
    "resolver",
    "start_play",
    "trigger_schedule",
    "unpause_schedule",
]
