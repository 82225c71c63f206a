"""Group commit: many concurrent store calls, one write.

A :class:`Coalescer` collects the items submitted in one event-loop tick, and every
item submitted while the previous group is being written, and hands each group to
its ``flush`` function at once: under load the groups grow by themselves, and an
idle store still answers a lone call within one tick. One group is in flight at a
time, so groups are written in submission order.

Each caller awaits its own result; ``flush`` returns one result per item, in order,
and an item whose result is an exception gets that exception. If ``flush`` itself
raises, every item of the group gets the error (nothing of the group was written,
as far as the caller may assume). A caller that is cancelled while waiting does not
withdraw its item: once submitted it is written, and its result is dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["Coalescer"]

Item = TypeVar("Item")
Result = TypeVar("Result")


class Coalescer(Generic[Item, Result]):
    """Submissions of one tick (or queued behind a write) go to ``flush`` together.

    Args:
        flush: writes a group; returns one result (or exception) per item, in order.
    """

    def __init__(
        self, flush: Callable[[list[Item]], Awaitable[Sequence[Result | BaseException]]]
    ) -> None:
        self._flush = flush
        self._queue: list[tuple[Item, asyncio.Future[Result]]] = []
        self._sender: asyncio.Task[None] | None = None

    async def submit(self, item: Item) -> Result:
        """Queue ``item`` for the next group; its result once the group is written."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        self._queue.append((item, future))
        if self._sender is None:
            # The task's first step runs on the next loop iteration: everything
            # submitted in this tick joins the first group.
            self._sender = loop.create_task(self._send())
        return await future

    async def _send(self) -> None:
        group: list[tuple[Item, asyncio.Future[Result]]] = []
        try:
            while self._queue:
                group, self._queue = self._queue, []
                try:
                    results = await self._flush([item for item, _ in group])
                except Exception as err:
                    results = [err] * len(group)
                for (_, future), result in zip(group, results, strict=True):
                    if future.done():
                        continue
                    if isinstance(result, BaseException):
                        future.set_exception(result)
                    else:
                        future.set_result(result)
        except BaseException:  # cancelled (the loop is closing): nobody may hang
            for _, future in (*group, *self._queue):
                future.cancel()
            self._queue = []
            raise
        finally:
            self._sender = None

    async def drain(self) -> None:
        """Wait until every submitted item has been written."""
        while self._sender is not None:
            await asyncio.shield(self._sender)
