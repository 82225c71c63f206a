"""The play authoring SDK used inside workflows, and the workflows themselves."""

from playline.workflows.context import PlayContext
from playline.workflows.dataset import DatasetBuilder, DatasetHandle
from playline.workflows.dataset_run import DatasetRunWorkflow
from playline.workflows.models import DatasetRef, PlayRunResult, PlayState, RunOptions
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
