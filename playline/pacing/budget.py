"""Quotas as hard budgets: the catalog's windows and what the provider's headers report.

Two small types, pure arithmetic on a caller's monotonic ``now``:

* :class:`WindowCap` - at most ``limit`` calls in any ``window_s`` (a sliding
  log of dispatch times). A sliding window also keeps every fixed window a
  provider may count in, whatever its alignment. ``per_minute`` / ``per_hour`` /
  ``per_day`` of the catalog are one each.
* :class:`HeaderBudget` - what the provider said is left (``X-RateLimit-*``, the
  IETF ``RateLimit`` fields): ``remaining`` calls until ``reset``. It blocks the
  key once that is spent, until the reset, and for windows no longer than
  ``horizon_s`` it paces the key so the remainder is spent **evenly** until the
  reset, so no 429 is needed to learn the limit. Longer windows (hourly, daily
  quotas) are spent as fast as the other limits allow and then block until
  their reset: spreading a daily quota over a day would make every play that
  fits in it take a day.
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass, field

from playline.pacing.headers import RateLimitReport

__all__ = ["EVEN_SPEND_HORIZON_S", "HeaderBudget", "WindowCap"]

#: Windows up to this long are spent evenly until their reset.
EVEN_SPEND_HORIZON_S = 120.0


@dataclass(slots=True)
class WindowCap:
    """At most ``limit`` dispatches in any ``window_s`` seconds.

    Contract: :meth:`available_at` is the earliest time a dispatch keeps the
    cap; :meth:`take` records one (the caller checked first). ``even_rps`` is
    the rate that spends the window evenly, for windows up to the horizon.
    """

    limit: int
    window_s: float
    _times: deque[float] = field(default_factory=deque, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.limit < 1 or not self.window_s > 0:
            raise ValueError("a window needs limit >= 1 and window_s > 0")

    @property
    def even_rps(self) -> float | None:
        return self.limit / self.window_s if self.window_s <= EVEN_SPEND_HORIZON_S else None

    def available_at(self, now: float) -> float:
        self._prune(now)
        if len(self._times) < self.limit:
            return now
        return self._times[len(self._times) - self.limit] + self.window_s

    def take(self, now: float) -> None:
        self._times.append(now)

    def refund(self, taken_at: float) -> None:
        """Forget one dispatch taken at ``taken_at`` (the provider refused it: a 429)."""
        with contextlib.suppress(ValueError):  # already aged out of the window
            self._times.remove(taken_at)

    def used(self, now: float) -> int:
        self._prune(now)
        return len(self._times)

    def resize(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a window needs limit >= 1")
        self.limit = limit

    def _prune(self, now: float) -> None:
        times = self._times
        while times and times[0] <= now - self.window_s:
            times.popleft()


@dataclass(slots=True)
class _Reported:
    limit: float | None
    remaining: float
    reset_at: float
    window_s: float
    #: the provider named the window's length (IETF ``w``): its sustained rate is known
    window_known: bool


@dataclass(slots=True)
class HeaderBudget:
    """The quota windows a provider reports in its responses, as a budget to spend.

    The newest answer's report wins. Calls dispatched so recently that the
    provider cannot have counted them yet (``unseen``, the caller's estimate)
    are taken off its ``remaining``, and every later dispatch takes one more
    off, until a newer report comes.

    The even-spend rate of a window is ``remaining / time to reset``; when the
    provider also says how long the window is, never less than its sustained
    rate ``limit / window`` (a sliding window refills continuously, and its reset
    is often rounded up to whole seconds, so ``remaining / reset`` alone would
    undershoot), slowed in proportion once fewer than ``reserve`` calls are left
    so the remainder rarely runs out between two reports; the block at
    ``remaining < 1`` still prevents the 429.
    """

    horizon_s: float = EVEN_SPEND_HORIZON_S
    #: below this many calls left (or 3 % of the window's limit, if more), a window
    #: of known length is spent slower in proportion, so that what is left rarely
    #: runs out between two reports
    reserve: float = 4.0
    _windows: dict[str, _Reported] = field(default_factory=dict, init=False)

    @property
    def reporting(self) -> bool:
        """Whether the provider has reported any window."""
        return bool(self._windows)

    def on_dispatch(self, now: float) -> None:
        """Account one dispatch against every reported window that has not reset."""
        for window in self._windows.values():
            if now < window.reset_at:
                window.remaining -= 1

    def observe(self, report: RateLimitReport, now: float, unseen: int = 0) -> None:
        """Read a report from an answer received at ``now``."""
        for quota in report.quotas:
            known = self._windows.get(quota.name)
            window = quota.window_s or max(known.window_s if known else 0.0, quota.reset_s)
            self._windows[quota.name] = _Reported(
                quota.limit,
                quota.remaining - unseen,
                now + quota.reset_s,
                window,
                quota.window_s is not None,
            )

    def blocked_until(self, now: float) -> float | None:
        """When a spent window resets (the latest of them), or ``None`` when none is spent."""
        spent = [w.reset_at for w in self._windows.values() if w.remaining < 1 and now < w.reset_at]
        return max(spent) if spent else None

    def rate(self, now: float) -> float | None:
        """The rate that spends every short window evenly (``None``: no limit from them)."""
        rates = []
        for window in self._windows.values():
            if window.window_s > self.horizon_s:
                continue
            sustained = None
            if window.limit is not None and window.window_s > 0:
                sustained = window.limit / window.window_s
            left = window.reset_at - now
            if left > 0:
                if window.remaining >= 1:
                    even = window.remaining / left
                    if window.window_known and sustained is not None:
                        reserve = max(self.reserve, 0.03 * (window.limit or 0.0))
                        share = min(1.0, window.remaining / reserve)
                        even = max(even, sustained * share)
                    rates.append(even)
            elif sustained is not None:
                rates.append(sustained)
        return min(rates) if rates else None

    def snapshot(self, now: float) -> dict[str, dict[str, float | None]]:
        return {
            name or "default": {
                "limit": w.limit,
                "remaining": w.remaining,
                "reset_in_s": max(0.0, w.reset_at - now),
                "window_s": w.window_s,
            }
            for name, w in self._windows.items()
        }
