"""``AdjustableLimiter``: an aiolimiter bucket whose rate and burst change in place.

This is the one place playline relies on aiolimiter's internals (``_level``,
``_rate_per_sec``, ``_leak``, ``_wake_next``, ``_waiters``); aiolimiter is pinned
``<2`` in ``pyproject.toml`` and ``tests/unit/test_limiter.py`` pins the behaviour
this module needs from it, so an upgrade that changes them fails there first.
"""

from __future__ import annotations

import contextlib

from aiolimiter import AsyncLimiter

__all__ = ["AdjustableLimiter"]


class AdjustableLimiter(AsyncLimiter):
    """An :class:`AsyncLimiter` whose rate and burst change in place.

    aiolimiter derives its drain rate once, in ``__init__``; replacing the
    limiter on every AIMD step would forget how full the bucket is and hand
    out a fresh burst right after a cut. So this subclass adjusts the bucket
    in place (it relies on aiolimiter 1.x internals, pinned ``<2`` in
    ``pyproject.toml``):

    * :meth:`reconfigure` keeps the current level and re-times waiters;
    * :meth:`refund` gives back capacity a caller took but did not use
      (cancelled, or paused before it could dispatch);
    * :meth:`capacity_delay` and :meth:`try_take` let a caller take capacity
      from several limiters at one instant (see ``Governor._take_tokens``).

    Mapping: ``max_rate = burst`` and ``time_period = burst / rps``, i.e.
    ``burst`` acquisitions back to back after idling, ``rps`` per second on
    average.
    """

    __slots__ = ()

    def __init__(self, rps: float, burst: int) -> None:
        super().__init__(max_rate=float(burst), time_period=burst / rps)

    def reconfigure(self, rps: float, burst: int) -> None:
        with contextlib.suppress(RuntimeError):  # not used in a loop yet: nothing to drain
            self._leak()
        self.max_rate = float(burst)
        self.time_period = burst / rps
        self._rate_per_sec = rps
        if self._waiters:
            self._wake_next()

    def refund(self, amount: float = 1.0) -> None:
        self._leak()
        self._level = max(0.0, self._level - amount)
        self._wake_next()

    def capacity_delay(self) -> float:
        """Seconds until one unit of capacity is free (``0.0``: free now)."""
        self._leak()
        return max(0.0, (self._level + 1 - self.max_rate) / self._rate_per_sec)

    def try_take(self) -> bool:
        if not self.has_capacity():
            return False
        self._level += 1
        self._wake_next()
        return True
