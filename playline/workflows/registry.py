"""``playline.Plays``: the plays the workers on a task queue registered, kept by Temporal.

A client cannot see what a worker registered: Temporal knows a task queue's pollers,
not their workflow types. So each worker, as it starts, tells this workflow (one per
task queue, ``playline-plays/QUEUE``, started by the first worker's signal) its
identity and its plays; ``playline plays list`` and ``playline run``'s name check ask
it (a query) and keep the workers that still poll the queue. It runs on the queue's
own workers, holds a few hundred bytes per worker, and continues as new when its
history grows, keeping workers heard from in the last 30 days.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio import workflow

__all__ = ["PLAYS_REGISTRY", "PlaysRegistry", "PublishedPlays", "WorkerPlays", "registry_id"]

#: The registry's workflow type.
PLAYS_REGISTRY = "playline.Plays"
#: Signals before the registry continues as new (its history stays small).
MAX_SIGNALS = 500
#: A worker not heard from for this long is forgotten when the registry continues.
FORGET_AFTER = timedelta(days=30)


def registry_id(task_queue: str) -> str:
    """The registry's workflow id for ``task_queue``."""
    return f"playline-plays/{task_queue}"


class WorkerPlays(BaseModel):
    """One worker's plays, as it said when it started."""

    identity: str
    plays: list[str]
    #: when it said so (the worker's clock, Unix epoch seconds)
    at: float
    #: the playline version it runs
    version: str = ""
    #: each play's declared required columns (``@play(required_columns=...)``); a play
    #: that declares none is absent. ``None``: a playline that did not publish them
    #: (payloads and histories from before the field decode to it).
    columns: dict[str, list[str]] | None = None


class PublishedPlays(BaseModel):
    """What the registry holds: the latest word of each worker, by identity."""

    workers: dict[str, WorkerPlays] = Field(default_factory=dict)


@workflow.defn(name=PLAYS_REGISTRY)
class PlaysRegistry:
    """See the module docstring."""

    def __init__(self) -> None:
        self._published = PublishedPlays()
        self._signals = 0

    @workflow.run
    async def run(self, published: PublishedPlays | None = None) -> None:
        if published is not None:
            self._published = published
        await workflow.wait_condition(
            lambda: self._signals >= MAX_SIGNALS or workflow.info().is_continue_as_new_suggested()
        )
        await workflow.wait_condition(workflow.all_handlers_finished)
        cutoff = (workflow.now() - FORGET_AFTER).timestamp()
        kept = {k: w for k, w in self._published.workers.items() if w.at >= cutoff}
        workflow.continue_as_new(PublishedPlays(workers=kept))

    @workflow.signal
    def register(self, worker: WorkerPlays) -> None:
        """A worker started with these plays."""
        self._published.workers[worker.identity] = worker
        self._signals += 1

    @workflow.query
    def plays(self) -> PublishedPlays:
        return self._published
