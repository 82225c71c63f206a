"""Pure pacing arithmetic: AIMD rate control, Little's-law width, latency averages.

Nothing here sleeps, locks or reads a clock: every function and method takes
``now`` (seconds on any monotonic scale) from its caller. That keeps the rules
that decide how fast playline calls a paid provider testable to the
microsecond with a fake clock.

Vocabulary (used the same way in :mod:`playline.pacing.governor` and
:mod:`playline.pacing.fleet_store`):

* **ceiling** - the configured rate (``PacingPolicy.rps``); adaptation never
  goes above it.
* **rate in force** - the rate the governor currently paces at; AIMD moves it
  between ``min_rps`` and the ceiling.
* **epoch** - a counter bumped every time the rate in force is cut. A call
  remembers the epoch it was dispatched in, so outcomes of calls that were
  already on the wire before a cut can be told apart from fresh evidence.
"""

from __future__ import annotations

import enum
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = [
    "AimdConfig",
    "AimdController",
    "Ewma",
    "RateLimitOutcome",
    "little_width",
]


@dataclass(frozen=True, slots=True)
class AimdConfig:
    """The constants of additive-increase / multiplicative-decrease.

    Attributes:
        decrease_factor: the rate in force is multiplied by this on a cut
            (``0.5`` halves it, as TCP does).
        increase_fraction: one additive step is ``max(min_increase_rps,
            increase_fraction x ceiling)``; proportional so that a 500 rps
            provider does not take minutes to recover, with a floor so that a
            2 rps provider recovers at all.
        min_increase_rps: the floor of one additive step.
        window_s: a "window" of successes is at least ``window_s`` seconds
            since the last rate change *and* at least ``ceil(rate x window_s)``
            successes dispatched at the current epoch. Requiring both means the
            rate only grows on evidence gathered at the rate in force, never on
            a handful of lucky calls.
        default_pause_s: pause after a 429 that carries no ``Retry-After``.
        max_pause_s: ``Retry-After`` values above this are capped, so that a
            misbehaving provider cannot park a worker for an hour.
        jitter_fraction: the pause is stretched by a uniform random fraction in
            ``[0, jitter_fraction)`` so that workers paused by the same burst
            do not all resume on the same millisecond.
        probe_fraction: after a cut, the rate grows with full steps only up to
            ``probe_fraction x`` the *limit estimate* (the rate of successes
            in the last ``window_s`` before the cut, at most the rate in force
            then); from there to ``estimate / probe_fraction`` it probes
            gently, and beyond (the limit has moved) full steps resume. Without this
            the rate overshoots an unknown limit by a full step every few
            seconds, and every overshoot costs a ``Retry-After`` pause.
        probe_step_fraction: one gentle step is ``max(min_increase_rps,
            probe_step_fraction x limit estimate)``.
        busy_fraction: a window only earns an increase if the successes of
            its last ``window_s`` seconds reach ``busy_fraction x rate x
            window_s``: a key that is not using its rate (the dispatch, not the
            limiter, holds it back) learns nothing about the provider's limit,
            and raising its rate anyway would let it burst far over the limit
            as soon as the dispatch catches up.
    """

    decrease_factor: float = 0.5
    increase_fraction: float = 0.05
    min_increase_rps: float = 1.0
    window_s: float = 1.0
    default_pause_s: float = 1.0
    max_pause_s: float = 30.0
    jitter_fraction: float = 0.1
    probe_fraction: float = 0.9
    probe_step_fraction: float = 0.01
    busy_fraction: float = 0.9

    def __post_init__(self) -> None:
        if not 0 < self.decrease_factor < 1:
            raise ValueError("decrease_factor must be in (0, 1)")
        if self.increase_fraction < 0 or self.min_increase_rps <= 0:
            raise ValueError("increase_fraction must be >= 0 and min_increase_rps > 0")
        if self.window_s <= 0 or self.default_pause_s < 0 or self.max_pause_s < 0:
            raise ValueError("window_s must be > 0; pauses must be >= 0")
        if self.jitter_fraction < 0:
            raise ValueError("jitter_fraction must be >= 0")
        if not 0 <= self.busy_fraction <= 1:
            raise ValueError("busy_fraction must be in [0, 1]")
        if not 0 < self.probe_fraction <= 1 or self.probe_step_fraction < 0:
            raise ValueError("probe_fraction must be in (0, 1] and probe_step_fraction >= 0")


class RateLimitOutcome(enum.Enum):
    """What :meth:`AimdController.on_rate_limited` did with one 429."""

    #: First 429 of a burst: the rate was cut and the key paused.
    CUT = "cut"
    #: A 429 from a call dispatched before the last cut: already accounted for;
    #: at most it lengthened the running pause to honour its ``Retry-After``.
    ABSORBED = "absorbed"


@dataclass(slots=True)
class AimdController:
    """The adaptive rate of one pacing key.

    Contract:

    * :meth:`on_rate_limited` cuts the rate in force to ``max(min_rps, rate x
      decrease_factor)`` and pauses the key **once per burst of 429s**: a 429
      counts as a new burst only if the call was dispatched at the current
      epoch (i.e. after the previous cut took effect). Every other 429 of the
      burst is *absorbed*: counted, never cut on again.
    * :meth:`on_success` grows the rate by one additive step per window of
      successes (see :class:`AimdConfig`), up to the ceiling; near the rate
      that drew the last cut (``limit_estimate``) the steps are small.
    * The rate in force always stays in ``[min(min_rps, ceiling), ceiling]``.

    Args:
        ceiling_rps: the configured rate; the rate in force starts there.
        min_rps: the floor adaptation never goes below.
        config: the AIMD constants.
        rng: returns a float in ``[0, 1)``; injected for the pause jitter.
    """

    ceiling_rps: float
    min_rps: float
    config: AimdConfig = field(default_factory=AimdConfig)
    rng: Callable[[], float] = random.random
    rate: float = field(init=False)
    epoch: int = field(default=0, init=False)
    paused_until: float = field(default=-math.inf, init=False)
    rate_limited: int = field(default=0, init=False)
    cuts: int = field(default=0, init=False)
    pauses: int = field(default=0, init=False)
    increases: int = field(default=0, init=False)
    #: the rate of successes just before the last cut (``None``: never cut, or reset)
    limit_estimate: float | None = field(default=None, init=False)
    _last_change_at: float = field(default=-math.inf, init=False)
    _window_successes: int = field(default=0, init=False)
    _recent: deque[float] = field(default_factory=deque, init=False, repr=False)

    def __post_init__(self) -> None:
        check_rate(self.ceiling_rps, "ceiling_rps")
        check_rate(self.min_rps, "min_rps")
        self.rate = self.ceiling_rps

    @property
    def floor_rps(self) -> float:
        """The lowest rate adaptation may reach: ``min_rps``, unless the ceiling is lower."""
        return min(self.min_rps, self.ceiling_rps)

    @property
    def step_rps(self) -> float:
        """One additive increase step."""
        return max(self.config.min_increase_rps, self.config.increase_fraction * self.ceiling_rps)

    def pause_remaining(self, now: float) -> float:
        """Seconds until the key may dispatch again; ``0.0`` when it is not paused."""
        return max(0.0, self.paused_until - now)

    def on_rate_limited(
        self, now: float, dispatch_epoch: int, retry_after_s: float | None
    ) -> RateLimitOutcome:
        """Account for one 429 from a call dispatched at ``dispatch_epoch``.

        On a cut the key is paused for ``min(retry_after_s, max_pause_s)`` (or
        ``default_pause_s`` when the provider sent no usable ``Retry-After``),
        stretched by the jitter. An absorbed 429 whose ``Retry-After`` reaches
        beyond a pause that is still running extends that pause (the provider
        said so) but neither cuts nor counts as a new pause; once the pause is
        over, stale 429s cannot start a new one.
        """
        self.rate_limited += 1
        pause_s = self._pause_for(retry_after_s)
        if dispatch_epoch != self.epoch:
            if self.paused_until > now:
                self.paused_until = max(self.paused_until, now + pause_s)
            return RateLimitOutcome.ABSORBED
        achieved = sum(1 for t in self._recent if t >= now - self.config.window_s)
        achieved_rps = achieved / self.config.window_s
        self.limit_estimate = min(self.rate, max(achieved_rps, self.floor_rps))
        self.rate = max(self.floor_rps, self.rate * self.config.decrease_factor)
        self.epoch += 1
        self.cuts += 1
        self.pauses += 1
        self.paused_until = max(self.paused_until, now + pause_s)
        self._last_change_at = now
        self._window_successes = 0
        self._recent.clear()
        return RateLimitOutcome.CUT

    def on_success(self, now: float, dispatch_epoch: int) -> bool:
        """Account for one success; return whether the rate was increased.

        Only calls dispatched at the current epoch count towards a window.
        """
        if dispatch_epoch != self.epoch:
            return False
        window = self.config.window_s
        recent = self._recent
        recent.append(now)
        while recent and recent[0] < now - window:
            recent.popleft()
        # Recorded even at the ceiling: the first 429 usually comes there, and its
        # limit estimate is read from these.
        if self.rate >= self.ceiling_rps:
            return False
        self._window_successes += 1
        needed = max(1, math.ceil(self.rate * window))
        if self._window_successes < needed or now - self._last_change_at < window:
            return False
        if len(recent) < self.config.busy_fraction * self.rate * window:
            return False  # not using the rate in force: no evidence for more
        self.rate = min(self.ceiling_rps, self._next_rate())
        self.increases += 1
        self._last_change_at = now
        self._window_successes = 0
        return True

    def _next_rate(self) -> float:
        """One additive step: full far below the limit estimate, gentle near it."""
        full = self.rate + self.step_rps
        estimate = self.limit_estimate
        knee = self.config.probe_fraction * estimate if estimate is not None else 0.0
        if estimate is None or self.rate >= estimate / self.config.probe_fraction:
            return full
        if self.rate < knee:
            return min(full, knee)
        gentle = max(self.config.min_increase_rps, self.config.probe_step_fraction * estimate)
        return min(full, self.rate + gentle)

    def set_ceiling(self, ceiling_rps: float, now: float) -> None:
        """Apply a new configured rate: the ceiling *and* the rate in force become it.

        An explicit limit change is an operator's statement about the
        provider, so it replaces whatever adaptation had learnt. The epoch is
        bumped so that 429s of calls dispatched under the old limit do not
        immediately cut the new one.
        """
        check_rate(ceiling_rps, "ceiling_rps")
        self.ceiling_rps = ceiling_rps
        self.rate = ceiling_rps
        self.limit_estimate = None
        self._rate_changed(now)

    def set_min_rps(self, min_rps: float) -> None:
        """Change the floor; the rate in force is raised to it if needed."""
        check_rate(min_rps, "min_rps")
        self.min_rps = min_rps
        self.rate = min(self.ceiling_rps, max(self.rate, self.floor_rps))

    def adopt(self, rate: float, now: float) -> bool:
        """Take over a rate learnt elsewhere (another worker, via the fleet store).

        The rate is clamped to ``[floor_rps, ceiling_rps]``. Adopting a lower
        rate bumps the epoch: the burst that caused it has been accounted for
        by whoever cut. Returns whether the rate in force changed.
        """
        new = min(self.ceiling_rps, max(self.floor_rps, rate))
        if math.isclose(new, self.rate, rel_tol=1e-9, abs_tol=1e-9):
            return False
        lowered = new < self.rate
        self.rate = new
        if lowered:
            self._rate_changed(now)
        else:
            self._last_change_at = now
            self._window_successes = 0
        return True

    def _rate_changed(self, now: float) -> None:
        self.epoch += 1
        self._last_change_at = now
        self._window_successes = 0
        self._recent.clear()

    def _pause_for(self, retry_after_s: float | None) -> float:
        cfg = self.config
        if retry_after_s is None or not math.isfinite(retry_after_s) or retry_after_s < 0:
            base = cfg.default_pause_s
        else:
            base = retry_after_s
        return min(base, cfg.max_pause_s) * (1.0 + cfg.jitter_fraction * self.rng())


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


def check_rate(value: float, name: str) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
