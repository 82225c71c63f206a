"""Sandbox-safe workflow code only: ``@play``, ``PlayContext``, datasets, ``DatasetRun``.

Everything here is deterministic and replays from history: activities are called
by reference to their ``@activity.defn`` methods (imported through the sandbox
like Temporal's samples do); nothing here touches a file, a socket or the clock.
"""

from playline.contract import DatasetRef, PlayRunResult, PlayState, RunOptions
from playline.workflows.context import PlayContext
from playline.workflows.dataset import DatasetBuilder, DatasetHandle
from playline.workflows.dataset_run import DatasetRunWorkflow
from playline.workflows.play import PlayWorkflow, play, registered_plays

__all__ = [
    "DatasetBuilder",
    "DatasetHandle",
    "DatasetRef",
    "DatasetRunWorkflow",
    "PlayContext",
    "PlayRunResult",
    "PlayState",
    "PlayWorkflow",
    "RunOptions",
    "play",
    "registered_plays",
]
