"""``ResizableGate``: a counting gate whose limit can change while callers wait.

Waiters are admitted oldest work first: a caller may say when the work it belongs to
started (``acquire(priority=...)``, or :data:`WORK_STARTED` for everything a task
does); callers that do not are ordered by when they asked. Ties go first come first
served.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from contextvars import ContextVar
from typing import Any, Protocol

__all__ = ["WORK_STARTED", "OldestFirst", "ResizableGate", "WaiterOrder"]

#: When the work a task's calls belong to started (monotonic seconds; ``None``: not
#: said). A chunk sets it for each of its rows, so that at a full gate the rows of the
#: oldest chunk go first: chunks then finish one after another and the dataset run
#: starts the next ones while the others still have rows to send, instead of every
#: chunk draining at once and the provider waiting for the next chunks to start.
WORK_STARTED: ContextVar[float | None] = ContextVar("playline_work_started", default=None)


class WaiterOrder(Protocol):
    """Which of a gate's waiting callers is admitted next."""

    def push(self, fut: asyncio.Future[None], priority: float, share: Any) -> object:
        """Queue a waiter; returns a handle for :meth:`remove`."""
        ...

    def pop(self) -> asyncio.Future[None] | None:
        """The next waiter to admit, taken off the queue (``None``: nobody waits)."""
        ...

    def remove(self, handle: object) -> None:
        """Take a waiter off the queue (it was cancelled before admission)."""
        ...

    def __len__(self) -> int: ...


class OldestFirst:
    """The default order: the lowest ``priority`` first, first come among equals."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def push(self, fut: asyncio.Future[None], priority: float, share: Any) -> object:
        entry = (priority, next(self._order), fut)
        heapq.heappush(self._heap, entry)
        return entry

    def pop(self) -> asyncio.Future[None] | None:
        return heapq.heappop(self._heap)[2] if self._heap else None

    def remove(self, handle: object) -> None:
        with contextlib.suppress(ValueError):
            self._heap.remove(handle)  # type: ignore[arg-type]
            heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)


class ResizableGate:
    """A counting gate whose limit can change while callers wait.

    :class:`asyncio.Semaphore` cannot be resized; this can. Contract:

    * :meth:`acquire` returns once fewer than ``limit`` slots are held, the waiter
      the gate's :class:`WaiterOrder` picks first (by default the lowest
      ``priority``, first come first served among equals);
    * :meth:`resize` takes effect immediately: a larger limit admits waiters
      at once; a smaller one admits nobody until enough holders released.
      Holders are never revoked.
    * A waiter cancelled before it was admitted holds nothing; one cancelled
      just as it was admitted gives its slot back. Either way the next
      waiter is considered.
    """

    def __init__(self, limit: int, order: WaiterOrder | None = None) -> None:
        self._check(limit)
        self._limit = limit
        self._held = 0
        self._waiters: WaiterOrder = order if order is not None else OldestFirst()

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def held(self) -> int:
        """Slots held right now."""
        return self._held

    @property
    def waiting(self) -> int:
        """Callers blocked in :meth:`acquire`."""
        return len(self._waiters)

    @property
    def order(self) -> WaiterOrder:
        return self._waiters

    async def acquire(self, priority: float = 0.0, share: Any = None) -> None:
        # Only undecided futures are queued: _wake pops the admitted ones and a
        # cancelled waiter removes its own, so an empty queue means nobody is ahead.
        if self._held < self._limit and not len(self._waiters):
            self._held += 1
            self._admitted(share)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        handle = self._waiters.push(fut, priority, share)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # admitted and cancelled in the same instant
            else:
                self._waiters.remove(handle)
                self._wake()
            raise

    def _admitted(self, share: Any) -> None:
        """A caller went through without waiting: a fair order counts it too."""
        admitted = getattr(self._waiters, "admitted", None)
        if admitted is not None:
            admitted(share)

    def release(self) -> None:
        if self._held <= 0:
            raise RuntimeError("ResizableGate released more often than acquired")
        self._held -= 1
        self._wake()

    def resize(self, limit: int) -> None:
        self._check(limit)
        self._limit = limit
        self._wake()

    def _wake(self) -> None:
        while self._held < self._limit:
            fut = self._waiters.pop()
            if fut is None:
                return
            if not fut.done():
                self._held += 1
                fut.set_result(None)

    @staticmethod
    def _check(limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a gate limit must be >= 1, got {limit!r}")
