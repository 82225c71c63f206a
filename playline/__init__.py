"""playline: durable data-enrichment plays on Temporal.

Authoring (inside a plays module)::

    from playline import PlayContext, RowContext, play, resolver

Running: add ``PlaylinePlugin()`` to ``Client.connect(..., plugins=[...])`` and start a
worker, or use the ``playline`` command. Starting, typed by the play's own models::

    handle = await playline.start_play(client, enrich_leads, EnrichLeadsInput(...))
"""

from importlib.metadata import PackageNotFoundError, version

from playline.calls.estimate_tally import Estimate
from playline.calls.runner import ToolResult
from playline.calls.waterfall import Step, StepResult, WaterfallResult
from playline.calls.waterfall_spec import AcceptSpec as Accept
from playline.calls.waterfall_spec import ValidateSpec as Validate
from playline.client import PlayHandle, estimate_play, execute_play, get_play_handle, start_play
from playline.contract import DatasetRef, PlayRunResult, PlayState, RunOptions
from playline.plugin import PlaylinePlugin
from playline.resolvers import RowContext, resolver
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
    "PlayContext",
    "PlayHandle",
    "PlayRunResult",
    "PlayState",
    "PlaylinePlugin",
    "RowContext",
    "RunOptions",
    "Step",
    "StepResult",
    "ToolResult",
    "Validate",
    "WaterfallResult",
    "__version__",
    "estimate_play",
    "execute_play",
    "get_play_handle",
    "play",
    "resolver",
    "start_play",
]
