"""The queue, linger timer and task bookkeeping shared by the batching dispatchers.

:class:`~playline.calls.bulk.BulkDispatcher` (members of one bulk request) and
:class:`~playline.calls.jobs.JobDispatcher` (members of one job submit) both gather
claimed calls per tool until a batch is full or its linger ends, send each batch as a
task of its own, and wait for those tasks before the attempt reports. That life cycle
is one piece of code here; what a batch is, how it is sent and how a queued member is
let go when the attempt is cancelled stay with each dispatcher.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Generic, TypeVar

from playline.calls.catalog import ToolSpec

__all__ = ["QueueingDispatcher"]

M = TypeVar("M")


class QueueingDispatcher(Generic[M]):
    """Per-tool queues of members ``M``, sent by :meth:`_send` as tracked tasks."""

    def __init__(self) -> None:
        self._queues: dict[str, list[M]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tools: dict[str, ToolSpec] = {}
        self.tasks: set[asyncio.Future[Any]] = set()

    async def aclose(self) -> None:
        """Send what is still queued, then wait for every batch sent to finish and
        record; cancelled, the batches running are cancelled with it."""
        for tool_id in list(self._queues):
            self._flush(self._tools[tool_id])
        try:
            while self.tasks:
                await asyncio.gather(*list(self.tasks), return_exceptions=True)
        except asyncio.CancelledError:
            for task in self.tasks:
                task.cancel()
            raise

    def abort(self) -> None:
        """The attempt was cancelled: nothing queued is sent (each member is let go by
        :meth:`_drop`), no linger timer fires, and the batches running are cancelled."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for queue in self._queues.values():
            for member in queue:
                self._drop(member)
        self._queues.clear()
        for task in list(self.tasks):
            task.cancel()

    def _queue(self, tool: ToolSpec, member: M, max_items: int, linger_ms: float) -> None:
        """Queue ``member`` for ``tool``'s next batch: sent at once when it is full,
        else when the linger started by its first member ends."""
        queue = self._queues.setdefault(tool.id, [])
        self._tools[tool.id] = tool
        queue.append(member)
        if len(queue) >= max_items:
            self._flush(tool)
        elif tool.id not in self._timers:
            loop = asyncio.get_running_loop()
            self._timers[tool.id] = loop.call_later(linger_ms / 1000, self._flush, tool)

    def _flush(self, tool: ToolSpec) -> None:
        timer = self._timers.pop(tool.id, None)
        if timer is not None:
            timer.cancel()
        members = self._queues.pop(tool.id, [])
        if members:
            self._track(asyncio.ensure_future(self._send(tool, members)))

    def _track(self, task: asyncio.Future[Any]) -> None:
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    def _send(self, tool: ToolSpec, members: list[M]) -> Coroutine[Any, Any, None]:
        """Send one batch of ``tool``'s members and record what it answered."""
        raise NotImplementedError

    def _drop(self, member: M) -> None:
        """Let go of a member that will not be sent (the attempt was cancelled)."""
        raise NotImplementedError
