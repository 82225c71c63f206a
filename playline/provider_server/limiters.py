"""The limit shapes real providers use, for the local provider server.

Each limiter answers one question on a request's arrival, :meth:`Limiter.check`:
may it go ahead, and if not, how long until it could? A request goes ahead only
if every limiter of its provider says yes; then each :meth:`~Limiter.commit`\\ s
it. A rejected request consumes nothing (as with most real providers). Every
limiter also describes its state as a rate-limit window (``limit``,
``remaining``, ``reset``) for the response headers.

Shapes (``LimiterSpec.kind``):

``token_bucket`` - ``rate`` tokens per second, ``burst`` saved up at most.
``gcra``         - the generic cell rate algorithm: ``rate`` per second with a
                   tolerance of ``burst`` back-to-back requests (Redis-cell style).
``fixed_window`` - ``limit`` requests per window of ``window_s``, windows aligned
                   to the wall clock (a calendar minute for 60 s).
``sliding_log``  - ``limit`` requests in any ``window_s`` (a log of arrivals).
``concurrency``  - at most ``limit`` requests in flight; no rate limit at all.
``quota``        - ``limit`` requests per hour or day (``window_s`` 3600 or 86400),
                   a fixed window that answers 429 until it resets.

Times are the server's ``time.monotonic()`` except window alignment, which uses
the wall clock as a real provider's does.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from playline.provider_server.config import LimiterSpec

__all__ = ["Decision", "Limiter", "build_limiter"]


@dataclass(frozen=True, slots=True)
class Decision:
    """One limiter's answer for one request, and its window for the headers.

    ``wait_s`` is ``None`` when the limiter cannot tell (a concurrency cap).
    """

    allowed: bool
    wait_s: float | None
    limit: float
    remaining: float
    reset_s: float
    window_s: float
    name: str


class Limiter(Protocol):
    spec: LimiterSpec

    def check(self, now: float, in_flight: int) -> Decision: ...

    def commit(self, now: float) -> None: ...

    def describe(self, now: float, in_flight: int) -> Decision:
        """The state after a commit, for the response's headers."""
        ...


@dataclass
class TokenBucket:
    spec: LimiterSpec
    tokens: float = field(init=False)
    updated: float = field(default_factory=time.monotonic, init=False)

    def __post_init__(self) -> None:
        self.tokens = float(self.spec.burst)

    def _refill(self, now: float) -> None:
        rate = self._rate
        self.tokens = min(float(self.spec.burst), self.tokens + (now - self.updated) * rate)
        self.updated = now

    @property
    def _rate(self) -> float:
        assert self.spec.rate is not None
        return self.spec.rate

    def check(self, now: float, in_flight: int) -> Decision:
        self._refill(now)
        allowed = self.tokens >= 1.0
        wait = 0.0 if allowed else (1.0 - self.tokens) / self._rate
        return self._decision(allowed, wait)

    def commit(self, now: float) -> None:
        self.tokens -= 1.0

    def describe(self, now: float, in_flight: int) -> Decision:
        self._refill(now)
        return self._decision(True, 0.0)

    def _decision(self, allowed: bool, wait: float) -> Decision:
        burst = float(self.spec.burst)
        return Decision(
            allowed,
            wait,
            burst,
            math.floor(max(0.0, self.tokens)),
            (burst - self.tokens) / self._rate,
            burst / self._rate,
            self.spec.name,
        )


@dataclass
class Gcra:
    spec: LimiterSpec
    tat: float = field(default=-math.inf, init=False)

    @property
    def _interval(self) -> float:
        assert self.spec.rate is not None
        return 1.0 / self.spec.rate

    def check(self, now: float, in_flight: int) -> Decision:
        interval = self._interval
        tolerance = self.spec.burst * interval
        new_tat = max(self.tat, now) + interval
        allowed = new_tat - now <= tolerance + 1e-12
        wait = 0.0 if allowed else new_tat - tolerance - now
        return self._decision(allowed, wait, now)

    def commit(self, now: float) -> None:
        self.tat = max(self.tat, now) + self._interval

    def describe(self, now: float, in_flight: int) -> Decision:
        return self._decision(True, 0.0, now)

    def _decision(self, allowed: bool, wait: float, now: float) -> Decision:
        interval = self._interval
        ahead = max(self.tat, now) - now
        remaining = max(0, math.floor((self.spec.burst * interval - ahead) / interval + 1e-9))
        return Decision(
            allowed,
            wait,
            float(self.spec.burst),
            remaining,
            ahead,
            self.spec.burst * interval,
            self.spec.name,
        )


@dataclass
class FixedWindow:
    spec: LimiterSpec
    window: int = field(default=-1, init=False)
    count: int = field(default=0, init=False)

    def _roll(self) -> float:
        """Roll the window to the current one; seconds until it ends."""
        wall = time.time()
        size = self.spec.window_s
        index = math.floor(wall / size)
        if index != self.window:
            self.window, self.count = index, 0
        return (index + 1) * size - wall

    @property
    def _limit(self) -> int:
        assert self.spec.limit is not None
        return self.spec.limit

    def check(self, now: float, in_flight: int) -> Decision:
        left = self._roll()
        allowed = self.count < self._limit
        return self._decision(allowed, 0.0 if allowed else left, left)

    def commit(self, now: float) -> None:
        self.count += 1

    def describe(self, now: float, in_flight: int) -> Decision:
        return self._decision(True, 0.0, self._roll())

    def _decision(self, allowed: bool, wait: float, left: float) -> Decision:
        return Decision(
            allowed,
            wait,
            float(self._limit),
            max(0, self._limit - self.count),
            left,
            self.spec.window_s,
            self.spec.name,
        )


@dataclass
class SlidingLog:
    spec: LimiterSpec
    log: deque[float] = field(default_factory=deque, init=False)

    @property
    def _limit(self) -> int:
        assert self.spec.limit is not None
        return self.spec.limit

    def _prune(self, now: float) -> None:
        while self.log and self.log[0] <= now - self.spec.window_s:
            self.log.popleft()

    def check(self, now: float, in_flight: int) -> Decision:
        self._prune(now)
        allowed = len(self.log) < self._limit
        wait = 0.0 if allowed else self.log[len(self.log) - self._limit] + self.spec.window_s - now
        return self._decision(allowed, wait, now)

    def commit(self, now: float) -> None:
        self.log.append(now)

    def describe(self, now: float, in_flight: int) -> Decision:
        self._prune(now)
        return self._decision(True, 0.0, now)

    def _decision(self, allowed: bool, wait: float, now: float) -> Decision:
        # Reset: when the oldest logged request leaves the window (more quota frees up).
        reset = self.log[0] + self.spec.window_s - now if self.log else 0.0
        return Decision(
            allowed,
            wait,
            float(self._limit),
            max(0, self._limit - len(self.log)),
            max(0.0, reset),
            self.spec.window_s,
            self.spec.name,
        )


@dataclass
class Concurrency:
    spec: LimiterSpec

    @property
    def _limit(self) -> int:
        assert self.spec.limit is not None
        return self.spec.limit

    def check(self, now: float, in_flight: int) -> Decision:
        # ``in_flight`` counts this request too.
        allowed = in_flight <= self._limit
        return self._decision(allowed, None if not allowed else 0.0, in_flight)

    def commit(self, now: float) -> None:
        return None

    def describe(self, now: float, in_flight: int) -> Decision:
        return self._decision(True, 0.0, in_flight)

    def _decision(self, allowed: bool, wait: float | None, in_flight: int) -> Decision:
        return Decision(
            allowed,
            wait,
            float(self._limit),
            max(0, self._limit - in_flight),
            0.0,
            0.0,
            self.spec.name,
        )


def build_limiter(spec: LimiterSpec) -> Limiter:
    """A fresh limiter of ``spec``'s shape (full buckets, empty windows)."""
    kinds: dict[str, type[Limiter]] = {
        "token_bucket": TokenBucket,
        "gcra": Gcra,
        "fixed_window": FixedWindow,
        "quota": FixedWindow,
        "sliding_log": SlidingLog,
        "concurrency": Concurrency,
    }
    return kinds[spec.kind](spec)  # type: ignore[call-arg]


# ---------------------------------------------------------------- strict limits
#
# The strict limits below are written apart from the shapes above, from the
# algorithms' definitions, for the enforcing layer in front of the server
# (:mod:`playline.provider_server.strict`): they share no code or tuning with the
# server's limiters or with playline's own pacing, so a benchmark enforced by them
# judges the governor against an implementation it was not tuned to.


@dataclass
class StrictGcra:
    """GCRA as the virtual-scheduling meter of ITU-T I.371, with no slack at all.

    ``rate`` per second, ``burst`` requests back to back at most (a delay variation
    tolerance of ``(burst - 1) / rate``). A request earlier than the theoretical
    arrival time less the tolerance is refused and changes nothing; ``burst=1``
    refuses any request sooner than ``1 / rate`` after the previous one's slot.
    """

    rate: float
    burst: int = 1
    tat: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)) or self.burst < 1:
            raise ValueError("a strict GCRA needs rate > 0 and burst >= 1")

    def try_admit(self, now: float) -> float | None:
        """``None`` if the request is admitted (and counted), else seconds until it could be."""
        interval = 1.0 / self.rate
        tat = now if self.tat is None else self.tat
        earliest = tat - (self.burst - 1) * interval
        if now < earliest:
            return earliest - now
        self.tat = max(now, tat) + interval
        return None


@dataclass
class StrictConcurrency:
    """At most ``limit`` requests in flight, counted from admission to the last byte sent."""

    limit: int
    in_flight: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError("a strict concurrency cap needs limit >= 1")

    def try_acquire(self) -> bool:
        if self.in_flight >= self.limit:
            return False
        self.in_flight += 1
        return True

    def release(self) -> None:
        self.in_flight = max(0, self.in_flight - 1)
