"""``ConcurrencySearch``: how many calls a provider takes in flight, learnt from its 429s.

Pure arithmetic, like :class:`~playline.pacing.search.RateSearch`: every method takes
``now`` (monotonic seconds) from its caller.

Many slow providers (an email finder doing SMTP checks, an enrichment API that waits
on its own sources) limit how many calls are in flight, not how many are sent per
second: a call past the cap is answered 429 at once, usually without ``Retry-After``
(the provider cannot know when a slot frees) and without rate-limit headers. Against
such a provider the rate is the wrong control: with a latency of seconds, Little's law
(calls in flight = rate x time in flight) makes any rate that keeps the cap busy on
average overflow it whenever answers come slowly, and leave it idle whenever they come
quickly. The right control is the width itself: keep exactly the cap in flight.

Evidence is the **width** a call was dispatched at (the calls of the key in flight
then, itself included), kept per width with a memory of ``memory_s``:

* a width is **proven** when calls dispatched at it or wider succeeded, several times
  and clearly more often than they were refused there;
* a 429 at a width that is not proven says the cap is below it (:meth:`classify`:
  ``CONCURRENCY``): the limit becomes one less, the rate is left alone. A 429 at a
  proven width is about the rate (``RATE``: the rate search cuts). A first 429 at an
  unproven width that comes with ``Retry-After`` is most likely a rate's
  (``EITHER``): the rate search cuts, and the refusal is remembered without
  narrowing. A rate limit goes on refusing at widths that then prove to work, while a
  concurrency cap that sends ``Retry-After`` is refused at the same unproven width
  again and again, and is ``CONCURRENCY`` from the ``retry_after_refusals``-th time
  on (a slow rate-limited provider's first 429s come at widths nothing proved yet,
  and a quick one's at one or two calls in flight: narrowing the gate there would
  starve it);
* the cap learnt is **probed** again (one wider) after a clean period at it: at least
  ``probe_after_s`` and ``probe_latencies`` times the time in flight. A probe that
  succeeds (a call dispatched at the new width answered) raises the cap, and the limit
  then grows at once by 1, 2, 4... per success at the top (a cap learnt while the
  provider had a bad minute is not kept for ever); a probe refused doubles the wait
  before the next one, up to ``max_probe_after_s``, so a stable cap costs a 429 a
  minute or so (a few per minute while it is young).

Quick failures (a 503, a refused connection) are no evidence either way: they say
nothing about the cap, and they must not shrink the width as a 429 does.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import Field, model_validator

from playline.spec_model import SpecModel

__all__ = ["ConcurrencyConfig", "ConcurrencySearch", "Refusal"]


class ConcurrencyConfig(SpecModel):
    """The constants of the concurrency search (see the module docstring)."""

    proof_successes: Annotated[int, Field(ge=1)] = 3
    """Successes at or above a width that prove it..."""
    proof_ratio: Annotated[float, Field(gt=0)] = 4.0
    """...and their least ratio to the refusals there."""
    memory_s: Annotated[float, Field(gt=0)] = 60.0
    """The evidence per width is halved this often (a cap can move)."""
    probe_after_s: Annotated[float, Field(gt=0)] = 2.0
    """A learnt cap is probed again after this long clean at it..."""
    probe_latencies: Annotated[float, Field(ge=0)] = 4.0
    """...and at least this many times the time in flight."""
    max_probe_after_s: float = 80.0
    """Each refused probe doubles the wait before the next, up to this (at least
    ``probe_after_s``)."""
    retry_after_refusals: int = 2
    """A 429 with ``Retry-After`` at an unproven width is taken for a cap only after
    this many earlier refusals at the same width..."""
    min_retry_after_cap: int = 2
    """...and for a cap of at least this."""

    @model_validator(mode="after")
    def _probe_bounds(self) -> ConcurrencyConfig:
        if self.max_probe_after_s < self.probe_after_s:
            raise ValueError("max_probe_after_s must be >= probe_after_s")
        return self


class Refusal(enum.Enum):
    """What one 429 says, by the width its call was dispatched at."""

    #: Refused wider than any width proven: the cap is below it.
    CONCURRENCY = "concurrency"
    #: Refused at a proven width: the rate (or a window) ran out, not the cap.
    RATE = "rate"
    #: A first refusal at an unproven width, with ``Retry-After``: the rate search acts,
    #: the refusal is remembered (:meth:`ConcurrencySearch.remember`).
    EITHER = "either"


@dataclass(slots=True)
class ConcurrencySearch:
    """The concurrency limit of one pacing key, between 1 and ``ceiling``.

    Args:
        ceiling: the configured ``max_concurrency``; the limit starts there.
        config: the search constants.
    """

    ceiling: int
    config: ConcurrencyConfig = field(default_factory=ConcurrencyConfig)
    #: the limit in force (the gate's size)
    limit: int = field(init=False)
    #: the cap learnt from 429s (``None``: no concurrency 429 seen, the limit is the ceiling)
    cap: int | None = field(default=None, init=False)
    #: a probe is out: the limit is above ``cap`` until a call at it succeeds or is refused
    probing: bool = field(default=False, init=False)
    refusals: int = field(default=0, init=False)
    probes: int = field(default=0, init=False)
    raises: int = field(default=0, init=False)
    _ok: Counter[int] = field(default_factory=Counter, init=False)
    _refused: Counter[int] = field(default_factory=Counter, init=False)
    _decayed_at: float | None = field(default=None, init=False)
    _changed_at: float = field(default=-math.inf, init=False)
    #: refused probes in a row at the same cap: each doubles the wait
    _backoff: int = field(default=0, init=False)
    _step: int = field(default=1, init=False)

    def __post_init__(self) -> None:
        if self.ceiling < 1:
            raise ValueError(f"ceiling must be >= 1, got {self.ceiling!r}")
        self.limit = self.ceiling

    # ------------------------------------------------------------------ evidence

    def proven(self, width: int) -> bool:
        """Whether calls dispatched at ``width`` or wider are known to succeed."""
        ok = sum(n for w, n in self._ok.items() if w >= width)
        refused = sum(n for w, n in self._refused.items() if w >= width)
        cfg = self.config
        return ok >= cfg.proof_successes and ok >= cfg.proof_ratio * refused

    def classify(self, width: int, *, retry_after: bool) -> Refusal:
        """What a 429 of a call dispatched at ``width`` says (before it is recorded)."""
        if width <= 1 or self.proven(width):
            return Refusal.RATE  # one call alone, or a width known to work: not the cap
        if not retry_after or width > self.limit:
            return Refusal.CONCURRENCY
        # A refusal that names a time to come back is most likely a rate's, and taking
        # a rate limit for a cap narrows the gate below the rate: only a width refused
        # again and again is a cap (one past it: a rate limit's refusals land wherever
        # the calls in flight happen to be), and never one or two calls.
        if width >= self.config.min_retry_after_cap + 1 and (
            self._refused[width] >= self.config.retry_after_refusals
        ):
            return Refusal.CONCURRENCY
        return Refusal.EITHER

    def remember(self, now: float, width: int) -> None:
        """A refusal classified ``EITHER``: counted against ``width``, the limit stands."""
        self._decay(now)
        self._refused[width] += 1

    def on_success(self, now: float, width: int) -> bool:
        """A call dispatched at ``width`` succeeded; return whether the limit grew."""
        self._decay(now)
        self._ok[width] += 1
        if not self.probing or width < self.limit:
            return False
        # A call at the top of a probe succeeded: the cap is at least this wide.
        self.cap = width
        self._backoff = 0
        grown = min(self.ceiling, self.limit + self._step)
        self._step *= 2
        if grown <= self.limit:
            self.probing = False
            self.cap = None if self.limit >= self.ceiling else self.cap
            return False
        self.limit = grown
        self.raises += 1
        self._changed_at = now
        return True

    def on_refused(self, now: float, width: int) -> bool:
        """A 429 at ``width`` classified ``CONCURRENCY``; whether the limit fell."""
        self._decay(now)
        self._refused[width] += 1
        self.refusals += 1
        refused = max(1, width - 1)  # the widest the provider may take
        old = self.cap
        if self.probing and old is not None and refused >= old:
            if refused == old:  # the probe one wider was refused: the cap stands
                self._backoff += 1
            else:  # growing after a probe, it met the cap further up: new evidence
                self._backoff = 0
            cap = refused
        elif old is None or refused < old:
            cap = refused  # a first cap, or the provider takes fewer than it did
            self._backoff = 0
        else:
            cap = old  # a call sent before the limit came down: nothing new
        self.cap = cap
        self.probing = False
        self._step = 1
        before, self.limit = self.limit, max(1, min(self.ceiling, cap))
        if self.limit != before:
            self._changed_at = now
        return self.limit < before

    def tick(self, now: float, latency_s: float) -> bool:
        """Probe one wider if the cap has been clean long enough; whether the limit grew."""
        cap = self.cap
        if cap is None or self.probing or self.limit > cap or cap >= self.ceiling:
            return False
        if now - self._changed_at < self.probe_wait_s(latency_s):
            return False
        self.probing = True
        self.probes += 1
        self.limit = cap + 1
        self._changed_at = now
        return True

    def reset(self, ceiling: int) -> None:
        """An operator set ``max_concurrency``: forget what was learnt."""
        if ceiling < 1:
            raise ValueError(f"ceiling must be >= 1, got {ceiling!r}")
        self.ceiling = ceiling
        self.limit = ceiling
        self.cap = None
        self.probing = False
        self._step = 1
        self._backoff = 0
        self._ok.clear()
        self._refused.clear()

    def probe_wait_s(self, latency_s: float) -> float:
        """How long the cap must stay clean before the next probe, for this latency.

        ``max(probe_after_s, probe_latencies x latency)``, doubled per refused probe
        in a row, at most ``max_probe_after_s``.
        """
        cfg = self.config
        base = max(cfg.probe_after_s, cfg.probe_latencies * max(0.0, latency_s))
        return min(cfg.max_probe_after_s, base * 2.0 ** min(self._backoff, 30))

    def _decay(self, now: float) -> None:
        if self._decayed_at is None:
            self._decayed_at = now
            return
        while now - self._decayed_at >= self.config.memory_s:
            self._decayed_at += self.config.memory_s
            for counts in (self._ok, self._refused):
                for width in list(counts):
                    counts[width] //= 2
                    if not counts[width]:
                        del counts[width]
