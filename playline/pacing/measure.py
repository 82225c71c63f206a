"""Measurements the governor paces by: latency averages, Little's-law width, dispatch logs.

Nothing here sleeps, locks or reads a clock: every method takes ``now``
(seconds on any monotonic scale) from its caller, so the numbers the governor
decides by are testable with a fake clock.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

__all__ = ["EPSILON_S", "DispatchLog", "Ewma", "check_rate", "little_width"]


def little_width(rate_rps: float, latency_s: float, *, cap: int) -> int:
    """How many calls to keep in flight: ``ceil(rate x latency)``, in ``[1, cap]``.

    Little's law: in a steady state, calls in flight = arrival rate x time
    each spends in flight. Launching more than that only queues calls behind
    the rate limiter (where they hold leases and memory); launching fewer
    leaves rate unused. ``cap`` is the smallest of the hard concurrency
    limits and is itself floored at 1.
    """
    if not math.isfinite(latency_s) or latency_s < 0:
        latency_s = 0.0
    width = math.ceil(rate_rps * latency_s - EPSILON_S) if rate_rps > 0 else 1
    return max(1, min(width, max(1, cap)))


@dataclass(slots=True)
class Ewma:
    """An exponentially weighted moving average with a prior.

    ``value`` is ``prior`` until the first observation, which replaces it
    outright (a prior is a guess, not evidence); later observations move the
    average by ``alpha`` of their difference to it.
    """

    alpha: float = 0.2
    prior: float = 0.25
    samples: int = field(default=0, init=False)
    _value: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")

    @property
    def value(self) -> float:
        return self._value if self.samples else self.prior

    @property
    def observed(self) -> float | None:
        """The average of real observations, or ``None`` before the first."""
        return self._value if self.samples else None

    def observe(self, x: float) -> None:
        if not math.isfinite(x) or x < 0:
            return
        self._value = x if not self.samples else self._value + self.alpha * (x - self._value)
        self.samples += 1


#: Float noise below this is not a wait (sums of intervals, latency products).
EPSILON_S = 1e-9


@dataclass(slots=True)
class DispatchLog:
    """When recent calls of one key were dispatched, and which the provider accepted.

    The governor's evidence about an unknown limit is *rates*: how fast calls
    were sent, and how fast the provider let them through (anything but a 429
    counts as let through: a 5xx or a timeout still spent the provider's
    budget). Both are read over a span of dispatch times, so calls still in
    flight are not yet counted as accepted (the estimate errs low, the safe
    side). Entries older than ``keep_s`` are dropped.
    """

    keep_s: float = 10.0
    _sent: deque[float] = field(default_factory=deque, init=False)
    _accepted: deque[float] = field(default_factory=deque, init=False)
    _refused: deque[float] = field(default_factory=deque, init=False)
    _backlogged: deque[float] = field(default_factory=deque, init=False)

    def sent(self, dispatched_at: float, *, backlogged: bool = False) -> None:
        """A dispatch; ``backlogged`` when other calls were still waiting behind it."""
        self._sent.append(dispatched_at)
        self._trim(self._sent, dispatched_at)
        if backlogged:
            self._backlogged.append(dispatched_at)
            self._trim(self._backlogged, dispatched_at)

    def backlogged(self, start: float, end: float) -> int:
        """Dispatches in ``[start, end]`` that had calls waiting behind them."""
        return sum(1 for t in self._backlogged if start <= t <= end)

    def sent_since(self, start: float) -> int:
        """Dispatches after ``start`` (the most recent ones)."""
        count = 0
        for t in reversed(self._sent):
            if t <= start:
                break
            count += 1
        return count

    def accepted(self, dispatched_at: float, now: float) -> None:
        self._accepted.append(dispatched_at)
        self._trim(self._accepted, now)

    def refused(self, dispatched_at: float, now: float) -> None:
        """The provider refused (429) a call dispatched at ``dispatched_at``."""
        self._refused.append(dispatched_at)
        self._trim(self._refused, now)

    def count(self, start: float, end: float) -> tuple[int, int]:
        """``(sent, accepted)`` among calls dispatched in ``[start, end]``."""
        sent = sum(1 for t in self._sent if start <= t <= end)
        accepted = sum(1 for t in self._accepted if start <= t <= end)
        return sent, accepted

    def admitted(self, start: float, end: float) -> int:
        """Calls dispatched in ``[start, end]`` and not refused (so far).

        A refusal comes back at once while an answer takes the provider's latency, so
        a call still in flight was, almost surely, let through: counting only the
        answered calls would measure a provider slower than its window as admitting
        nothing (and cut its rate to the floor).
        """
        sent = sum(1 for t in self._sent if start <= t <= end)
        refused = sum(1 for t in self._refused if start <= t <= end)
        return max(0, sent - refused)

    def refusal_events(self, start: float, end: float, gap_s: float) -> int:
        """Refused calls dispatched in ``[start, end]``, those within ``gap_s`` of the
        previous one counted together: a clump a stalled sender let go at once is one
        event, however many of its calls were refused."""
        events, last = 0, -math.inf
        for t in self._refused:
            if start <= t <= end:
                if t - last > gap_s:
                    events += 1
                last = t
        return events

    def _trim(self, log: deque[float], now: float) -> None:
        while log and log[0] < now - self.keep_s:
            log.popleft()


def check_rate(value: float, name: str) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
