"""playline: durable data-enrichment plays on Temporal.

Authoring (inside a plays module)::

    from playline import PlayContext, play, resolver

Running: add ``PlaylinePlugin()`` to ``Client.connect(..., plugins=[...])`` and start a
worker, or use the ``playline`` command.
"""

from playline.activities.resolvers import RowContext, resolver
from playline.workflows import (
    DatasetHandle,
    DatasetRef,
    PlayContext,
    PlayRunResult,
    PlayState,
    RunOptions,
    play,
)

__all__ = [
    "DatasetHandle",
    "DatasetRef",
    "PlayContext",
    "PlayRunResult",
    "PlayState",
    "RowContext",
    "RunOptions",
    "play",
    "resolver",
]
