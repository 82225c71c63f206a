"""The plays the workers on a task queue registered: each worker publishes its own as
it starts, and clients read them back (see :mod:`playline.workflows.registry`).

:func:`publish_plays` is called by :class:`~playline.plugin.PlaylinePlugin` for every
worker it runs; it never fails the worker (a namespace that refuses the registry only
costs the CLI its exact list). :func:`read_published_plays` is what ``playline plays
list`` and ``playline run``'s name check use: the plays of the workers polling the
queue now, answered within a couple of seconds or not at all.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError

from playline.workflows.registry import PlaysRegistry, PublishedPlays, WorkerPlays, registry_id

__all__ = ["QueuePlays", "publish_plays", "queue_plays", "read_published_plays"]

log = logging.getLogger(__name__)

#: How long a client waits for the registry's answer (no worker: no answer).
READ_TIMEOUT = 2.0


async def publish_plays(
    client: Client,
    task_queue: str,
    identity: str,
    plays: list[str],
    version: str = "",
    columns: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """Tell the task queue's registry this worker's plays (starting it if need be), with
    the required columns of those that declare some."""
    worker = WorkerPlays(
        identity=identity,
        plays=sorted(plays),
        at=time.time(),
        version=version,
        columns={play: list(cols) for play, cols in (columns or {}).items() if cols},
    )
    try:
        await client.start_workflow(
            PlaysRegistry.run,
            None,
            id=registry_id(task_queue),
            task_queue=task_queue,
            start_signal="register",
            start_signal_args=[worker],
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            static_summary=f"the plays the workers on task queue {task_queue} registered",
        )
    except (RPCError, RuntimeError) as err:
        log.warning("could not publish this worker's plays on %s: %s", task_queue, err)


@dataclass
class QueuePlays:
    """The plays of the workers polling a task queue now (``None``: nobody answered)."""

    task_queue: str
    #: play name -> identities of the live workers that have it
    plays: dict[str, list[str]] = field(default_factory=dict)
    #: identities polling the queue now
    live: list[str] = field(default_factory=list)
    #: workers that published plays but do not poll now (stopped, or on another queue)
    gone: list[str] = field(default_factory=list)
    #: play name -> its declared required columns (``[]``: none), as the live worker
    #: that started last says; a play is absent when no live worker with it published
    #: columns (an older playline)
    columns: dict[str, list[str]] = field(default_factory=dict)


async def _pollers(client: Client, task_queue: str) -> list[str]:
    response = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    return [p.identity for p in response.pollers]


async def read_published_plays(
    client: Client, task_queue: str, timeout_s: float = READ_TIMEOUT
) -> QueuePlays | None:
    """The plays the live workers on ``task_queue`` published; ``None`` when no worker
    polls it, none published, or the registry did not answer within ``timeout_s``."""
    try:
        live = await asyncio.wait_for(_pollers(client, task_queue), timeout_s)
        if not live:
            return None
        handle = client.get_workflow_handle(registry_id(task_queue))
        published: PublishedPlays = await handle.query(
            PlaysRegistry.plays, rpc_timeout=timedelta(seconds=timeout_s)
        )
    except (RPCError, TimeoutError, RuntimeError):
        return None
    return queue_plays(task_queue, live, published)


def queue_plays(task_queue: str, live: list[str], published: PublishedPlays) -> QueuePlays | None:
    """What the registry holds, kept to the workers polling now (``live``); ``None`` when
    none of them published (they run an older playline)."""
    found = QueuePlays(task_queue, live=sorted(live))
    for identity, worker in sorted(published.workers.items()):
        if identity not in live:
            found.gone.append(identity)
            continue
        for play in worker.plays:
            found.plays.setdefault(play, []).append(identity)
    # Workers of two versions of a play may disagree: the one that started last wins.
    for worker in sorted(published.workers.values(), key=lambda w: w.at):
        if worker.identity in live and worker.columns is not None:
            for play in worker.plays:
                found.columns[play] = list(worker.columns.get(play, []))
    if not any(identity in live for identity in published.workers):
        return None  # the workers polling now have not published (an older playline)
    return found
