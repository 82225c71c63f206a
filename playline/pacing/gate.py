"""``ResizableGate``: a FIFO counting gate whose limit can change while callers wait."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

__all__ = ["ResizableGate"]


class ResizableGate:
    """A FIFO counting gate whose limit can change while callers wait.

    :class:`asyncio.Semaphore` cannot be resized; this can. Contract:

    * :meth:`acquire` returns once fewer than ``limit`` slots are held,
      first come first served.
    * :meth:`resize` takes effect immediately: a larger limit admits waiters
      at once; a smaller one admits nobody until enough holders released.
      Holders are never revoked.
    * A waiter cancelled before it was admitted holds nothing; one cancelled
      just as it was admitted gives its slot back. Either way the next
      waiter is considered.
    """

    def __init__(self, limit: int) -> None:
        self._check(limit)
        self._limit = limit
        self._held = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

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

    async def acquire(self) -> None:
        # Only undecided futures are queued: _wake pops the admitted ones and a
        # cancelled waiter removes its own, so an empty queue means nobody is ahead.
        if self._held < self._limit and not self._waiters:
            self._held += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # admitted and cancelled in the same instant
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(fut)
                self._wake()
            raise

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
        while self._waiters and self._held < self._limit:
            fut = self._waiters.popleft()
            if not fut.done():
                self._held += 1
                fut.set_result(None)

    @staticmethod
    def _check(limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a gate limit must be >= 1, got {limit!r}")
