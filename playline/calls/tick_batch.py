"""Requests queued in one event-loop tick go out as one batch.

Many rows of a chunk ask the receipt store at once (their first calls start in the
same tick); one round trip for all of them keeps the store's load per chunk, not per
row. The run's claims and an estimate's receipt reads batch this way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["TickBatch"]

Item = TypeVar("Item")
Answer = TypeVar("Answer")


class TickBatch(Generic[Item, Answer]):
    """Sends the items submitted in one event-loop tick with one call of ``send``, which
    answers them in order; its error is every submitter's."""

    def __init__(self, send: Callable[[list[Item]], Awaitable[Sequence[Answer]]]) -> None:
        self._send = send
        self._queue: list[tuple[Item, asyncio.Future[Answer]]] = []
        self._scheduled = False

    async def submit(self, item: Item) -> Answer:
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._start)
        return await future

    def _start(self) -> None:
        self._scheduled = False
        batch, self._queue = self._queue, []
        task = asyncio.ensure_future(self._flush(batch))
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def _flush(self, batch: list[tuple[Item, asyncio.Future[Answer]]]) -> None:
        try:
            answers = await self._send([item for item, _ in batch])
        except BaseException as err:
            for _, future in batch:
                if not future.done():
                    future.set_exception(err)
            return
        for (_, future), answer in zip(batch, answers, strict=True):
            if not future.done():
                future.set_result(answer)
