"""``RateSearch``: finding a provider's real limit from its 429s, without a 429 storm.

Pure arithmetic: every method takes ``now`` (monotonic seconds) from its caller.

The catalog's ``rps`` is a *ceiling*; the provider's real limit may be lower and
is learnt from evidence:

* a **429** is an upper bound: the provider would not take the rate that was
  being sent (the rate in force, or what was really sent if less). The rate
  goes back to the lower bound when one is known; otherwise it is cut to
  ``cut_fraction`` of the rate the provider *admitted* over the last
  ``measure_s`` (what really got through, read from the
  :class:`~playline.pacing.measure.DispatchLog`), not of the rate attempted,
  and when too little was sent to measure that, it is halved. Only the first
  429 of a burst counts (see *epoch* below). A 429 among few refusals (under
  ``clump_share`` of the calls sent over the span) while calls went slower than the
  rate is a clump a busy worker sent, not a rate above the limit: the rate is cut a
  step of ``cut_fraction``, and what was sent is no bound. Refusals are counted as
  *events* here and below: those within two intervals of each other are one clump.
* a **clean window** (``window_s`` without a 429, at least ``min_window_calls``
  accepted, the rate actually used) is a lower bound.
* between the bounds the rate **searches**: half way up after each clean window
  (multiplicative growth while no upper bound is known), and once the bounds
  are within ``settle_fraction`` it **holds** at the lower one. After
  ``hold_s`` clean at the hold the upper bound is raised by ``reprobe_factor``,
  so a limit that went up is found again, at the price of one 429. A re-probe
  that finds the limit where it was doubles the hold before the next (up to
  ``max_hold_s``: a provider that answers each 429 with a whole second of
  ``Retry-After`` costs a second per probe); one that finds it higher resets it.
* once a proof has been wrong (a 429 at a rate proven clean), a rate within
  ``confirm_fraction`` of the upper bound is proven only by ``confirm_window_s``
  clean: a provider's burst lets a rate a little above its limit run clean for a
  second or two (a GCRA with a burst of 3 absorbs two extra calls), and the search
  must not settle there.
* a 429 at a rate already proven clean is first taken as **noise** (a busy
  event loop sends a clump; loopback jitter): the key pauses but the rate stands.
  Another within ``noise_window_s``, when more than ``noise_share`` of the calls
  sent over that window and at least ``steady_events`` refusals in all were refused,
  means the limit moved down: the lower bound is dropped and the rate cut to
  ``cut_fraction`` of it. (A limit that moved down refuses a steady share of the
  calls, several within a second or two; jitter refuses one now and then, and at a
  slow rate, early in a run, two of them can fall within a few seconds.)
* a ``Retry-After`` of **one whole second** is a weak bound, not a wait: a strict
  GCRA whose next slot is 30 ms away still writes ``1``, and honouring it costs a
  second of calls per 429. The key pauses ``short_pause_intervals`` of the rate in
  force instead (one after a noise 429; the provider's next slot is within an
  interval of its true rate, at most twice the rate in force after a cut), until
  every call sent after such a pause is refused: then the provider meant it (a
  window that resets on the second) and it is honoured whole from then on
  (``retry_after_trusted``). Two seconds or more are honoured whole (a small-burst
  GCRA never asks for that much; a window does). What the provider admitted is
  then measured across such short pauses, not from the last one.
* a window is **used** when calls went at ``busy_fraction`` of the rate, or
  when at least half of them had others queued behind them (a worker whose
  fleet shares the rate sends only its part, but its calls still queue).
* a 429 whose ``Retry-After`` is at least ``long_pause_s`` means a window quota
  (a minute, an hour) ran out, not that the rate was too high: the rate becomes
  the calls admitted since the last such reset over the time until the next.

Vocabulary shared with the governor: the **ceiling** is the configured rate; the
**rate in force** moves between ``min_rps`` and it; the **epoch** counts cuts, so
429s of calls already on the wire before a cut are told apart from new evidence.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import Field, model_validator

from playline.pacing.measure import DispatchLog, check_rate
from playline.spec_model import SpecModel

__all__ = ["RateLimitOutcome", "RateSearch", "SearchConfig"]


Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Growth = Annotated[float, Field(gt=1)]


class SearchConfig(SpecModel):
    """The constants of the limit search (see the module docstring)."""

    cut_fraction: Annotated[float, Field(gt=0, le=1)] = 0.9
    blind_cut_factor: Annotated[float, Field(gt=0, lt=1)] = 0.5
    window_s: Positive = 1.0
    min_window_calls: int = 5
    busy_fraction: float = 0.8
    settle_fraction: float = 0.03
    hold_s: NonNegative = 10.0
    max_hold_s: float = 160.0
    reprobe_factor: Growth = 1.05
    confirm_window_s: float = 5.0
    confirm_fraction: float = 0.05
    growth_factor: Growth = 1.5
    measure_s: Positive = 2.0
    min_measure_s: float = 0.5
    noise_window_s: float = 10.0
    noise_share: float = 0.03
    """...unless more than this share of the calls sent over that window were refused
    (a limit that moved down refuses a steady share; jitter a few calls)..."""
    steady_events: int = 3
    """...and at least this many refusals (clumps counted once) over the window: two
    at a slow rate are a coincidence of jitter as often as a limit."""
    clump_share: float = 0.1
    """A 429 among so few refusals over the measured span (a rate above the limit
    refuses a steady share) cuts a step, not to what got through."""
    default_pause_s: NonNegative = 0.25
    """Pause after a 429 without ``Retry-After`` (a concurrency cap rarely sends one)."""
    long_pause_s: float = 5.0
    """A ``Retry-After`` this long or longer means a window quota ran out."""
    max_pause_s: NonNegative = 7 * 86400.0
    """``Retry-After`` is honoured up to this (a week: a daily quota is honoured whole)."""
    jitter_fraction: NonNegative = 0.1
    coarse_retry_after_s: float = 1.0
    """A ``Retry-After`` of whole seconds up to this is a coarse bound, not a wait..."""
    short_pause_intervals: float = 3.0
    """...so the key pauses this many intervals of the rate in force instead..."""
    noise_pause_intervals: float = 1.0
    """...one after a noise 429, at a rate proven clean (the provider's next slot is
    that close)..."""
    min_short_pause_s: float = 0.05
    """...and at least this long."""

    @model_validator(mode="after")
    def _ordered(self) -> SearchConfig:
        if self.max_hold_s < self.hold_s or self.confirm_window_s < self.window_s:
            raise ValueError("max_hold_s must be >= hold_s, confirm_window_s >= window_s")
        return self


class RateLimitOutcome(enum.Enum):
    """What :meth:`RateSearch.on_rate_limited` did with one 429."""

    #: New evidence: the rate was cut (or set from a window quota) and the key paused.
    CUT = "cut"
    #: A 429 at a rate proven clean, the first in a while: paused, rate kept.
    NOISE = "noise"
    #: A 429 of a call sent before the last cut: already accounted for.
    ABSORBED = "absorbed"


@dataclass(slots=True)
class RateSearch:
    """The rate in force of one pacing key, searched between learnt bounds.

    Args:
        ceiling_rps: the configured rate; the rate in force starts there.
        min_rps: the floor the search never goes below.
        config: the search constants.
        rng: returns a float in ``[0, 1)``; injected for the pause jitter.
    """

    ceiling_rps: float
    min_rps: float
    config: SearchConfig = field(default_factory=SearchConfig)
    rng: Callable[[], float] = random.random
    rate: float = field(init=False)
    epoch: int = field(default=0, init=False)
    paused_until: float = field(default=-math.inf, init=False)
    #: the lowest rate known to draw 429s (``None``: none yet, or forgotten)
    upper: float | None = field(default=None, init=False)
    #: the highest rate known to run clean (``None``: none yet, or disproved)
    lower: float | None = field(default=None, init=False)
    rate_limited: int = field(default=0, init=False)
    cuts: int = field(default=0, init=False)
    pauses: int = field(default=0, init=False)
    increases: int = field(default=0, init=False)
    noise: int = field(default=0, init=False)
    log: DispatchLog = field(default_factory=DispatchLog, init=False, repr=False)
    _epoch_started: float = field(default=-math.inf, init=False)
    #: what the provider admitted is measured from here: the epoch's start, unless the
    #: last pause was a short one (a few intervals stop nothing worth not measuring)
    _measure_start: float = field(default=-math.inf, init=False)
    _window_start: float | None = field(default=None, init=False)
    _window_calls: int = field(default=0, init=False)
    _hold_started: float | None = field(default=None, init=False)
    #: the hold in force (doubles after each re-probe that found the same limit)
    _hold_s: float = field(default=0.0, init=False)
    #: the upper bound a re-probe started from, until it is settled either way
    _reprobed_from: float | None = field(default=None, init=False)
    #: a rate proven clean drew a 429: near the upper bound, proofs take longer
    _proofs_lied: bool = field(default=False, init=False)
    #: when the search last raised the rate (what was attempted since is the new rate)
    _raised_at: float = field(default=-math.inf, init=False)
    _noise_at: float = field(default=-math.inf, init=False)
    _quota_mark: float | None = field(default=None, init=False)
    _quota_accepted: int = field(default=0, init=False)
    #: the provider's whole-second ``Retry-After`` proved to mean it (a call sent after a
    #: shorter pause was refused): it is honoured whole from then on
    retry_after_trusted: bool = field(default=False, init=False)
    #: short pauses taken instead of a coarse ``Retry-After``
    short_pauses: int = field(default=0, init=False)
    #: when the last short pause ends
    _short_pause_end: float | None = field(default=None, init=False)
    #: the provider's limit as learnt from its 429s: the highest rate proven clean
    #: below a rate that drew one (``None``: nothing learnt yet), and when (``now``)
    learned_rps: float | None = field(default=None, init=False)
    learned_at: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        check_rate(self.ceiling_rps, "ceiling_rps")
        check_rate(self.min_rps, "min_rps")
        self.rate = self.ceiling_rps
        self._hold_s = self.config.hold_s

    @property
    def floor_rps(self) -> float:
        """The lowest rate the search may reach: ``min_rps``, unless the ceiling is lower."""
        return min(self.min_rps, self.ceiling_rps)

    def pause_remaining(self, now: float) -> float:
        """Seconds until the key may dispatch again; ``0.0`` when it is not paused."""
        return max(0.0, self.paused_until - now)

    @property
    def _clump_gap_s(self) -> float:
        """Refusals closer than this (two intervals of the rate) are one clump's."""
        return 2.0 / self.rate

    @property
    def hold_in_force_s(self) -> float:
        """How long the search holds a settled rate before it re-probes the bound."""
        return self._hold_s

    # ------------------------------------------------------------------ evidence

    def on_dispatch(self, now: float, *, backlogged: bool = False) -> None:
        """A call was just dispatched; ``backlogged`` when others were waiting behind it."""
        self.log.sent(now, backlogged=backlogged)
        if self._quota_mark is None:
            self._quota_mark = now
        if self._epoch_started == -math.inf:
            self._epoch_started = now  # nothing before the first call is evidence
            self._measure_start = now

    def on_accepted(self, now: float, dispatched_at: float, dispatch_epoch: int) -> bool:
        """The provider took a call (success, 5xx, timeout); return whether the rate grew."""
        self.log.accepted(dispatched_at, now)
        self._quota_accepted += 1
        if dispatch_epoch != self.epoch or dispatched_at < self._epoch_started:
            return False
        if self._window_start is None:
            self._window_start = dispatched_at
        self._window_calls += 1
        cfg = self.config
        window_s = cfg.window_s
        upper = self.upper
        if (
            self._proofs_lied
            and upper is not None
            and self.rate >= (1 - cfg.confirm_fraction) * upper
        ):
            window_s = cfg.confirm_window_s  # close to a known 429: prove it for longer
        if now - self._window_start < window_s or self._window_calls < cfg.min_window_calls:
            return False
        start, self._window_start, self._window_calls = self._window_start, now, 0
        sent, _ = self.log.count(start, now)
        backlogged = self.log.backlogged(start, now)
        # The rate was used if it was sent at, or if calls queued for it (a fleet's
        # share of a shared rate is less than the rate, but its calls still queue).
        if sent < cfg.busy_fraction * self.rate * (now - start) and backlogged < sent / 2:
            return False  # the rate was not used: no evidence about the limit
        self.lower = self.rate if self.lower is None else max(self.lower, self.rate)
        if self.upper is not None and self.lower < self.upper:
            # A clean rate under one that drew a 429: what the provider takes, so far.
            self.learned_rps, self.learned_at = self.lower, now
        if self._reprobed_from is not None and self.lower > self._reprobed_from:
            # The re-probe ran clean past the old bound: the limit went up.
            self._hold_s, self._reprobed_from = cfg.hold_s, None
        return self._step_up(now)

    def _step_up(self, now: float) -> bool:
        cfg = self.config
        if self.rate >= self.ceiling_rps:
            return False
        upper, lower = self.upper, self.lower
        assert lower is not None
        if upper is None:
            target = self.rate * cfg.growth_factor
        elif upper - lower > cfg.settle_fraction * upper:
            target = (lower + upper) / 2
        else:
            if self._hold_started is None:
                self._hold_started = now
            elif now - self._hold_started >= self._hold_s:
                self._reprobed_from = upper
                self.upper = upper * cfg.reprobe_factor
                self._hold_started = None
            return False
        new = min(self.ceiling_rps, max(self.rate, target))
        if new <= self.rate:
            return False
        self.rate = new
        self.increases += 1
        self._raised_at = now
        return True

    def on_rate_limited(
        self,
        now: float,
        dispatched_at: float,
        dispatch_epoch: int,
        retry_after_s: float | None,
    ) -> RateLimitOutcome:
        """Account for one 429 of a call dispatched at ``dispatched_at`` in ``dispatch_epoch``."""
        self.rate_limited += 1
        self.log.refused(dispatched_at, now)
        end = self._short_pause_end
        if (
            end is not None
            and dispatched_at >= end
            and not self.retry_after_trusted
            and self.log.admitted(end, dispatched_at) == 0
        ):
            # Every call sent since a short pause was refused: the provider meant its
            # Retry-After (a window, not an emission interval). Honoured from now on.
            self.retry_after_trusted = True
        if dispatch_epoch != self.epoch:
            if self.paused_until > now:
                pause_s = self._pause_for(retry_after_s, now)
                self.paused_until = max(self.paused_until, now + pause_s)
            return RateLimitOutcome.ABSORBED
        cfg = self.config
        outcome = RateLimitOutcome.CUT
        if retry_after_s is not None and retry_after_s >= cfg.long_pause_s:
            pause_s = self._pause_for(retry_after_s, now)
            self._learn_quota(now, pause_s)
        else:
            outcome = self._cut(now, dispatched_at)
            intervals = cfg.short_pause_intervals
            if outcome is RateLimitOutcome.NOISE:
                intervals = cfg.noise_pause_intervals
            pause_s = self._pause_for(retry_after_s, now, short=True, intervals=intervals)
        self.epoch += 1
        self.pauses += 1
        self.paused_until = max(self.paused_until, now + pause_s)
        self._epoch_started = self.paused_until
        if not self._coarse(retry_after_s):
            self._measure_start = self.paused_until
        self._window_start, self._window_calls = None, 0
        return outcome

    def note_refused(self, now: float, dispatched_at: float, retry_after_s: float | None) -> None:
        """A 429 that was about something else than the rate (a concurrency cap).

        Counted, and the refused call is no longer counted as admitted; the rate and
        its bounds stand. A ``Retry-After`` is honoured all the same (the provider
        asked); without one the key is not paused.
        """
        self.rate_limited += 1
        self.log.refused(dispatched_at, now)
        if retry_after_s is not None:
            if self.paused_until <= now:
                self.pauses += 1
            self.paused_until = max(self.paused_until, now + self._pause_for(retry_after_s, now))
            # The pause is no measure of what the provider admits: measure after it.
            self._epoch_started = max(self._epoch_started, self.paused_until)
            self._measure_start = max(self._measure_start, self.paused_until)
            self._window_start, self._window_calls = None, 0

    def _cut(self, now: float, dispatched_at: float) -> RateLimitOutcome:
        cfg = self.config
        start = max(self._measure_start, dispatched_at - cfg.measure_s)
        span = dispatched_at - start
        measured = span >= cfg.min_measure_s
        admitted: float | None = None
        attempted = self.rate
        busy = False
        if measured:
            sent, _ = self.log.count(start, dispatched_at)
            attempted = min(self.rate, sent / span)
            lower = self.lower
            if self._raised_at > start and lower is not None:
                # The rate went up within the span and the 429 answers the raise: the
                # average over the span (mostly the old, proven rate) could pass it for
                # noise at a proven rate. The bound is at least half way up to the new
                # rate (the search between the bounds halves them, a 429 at a time).
                attempted = max(attempted, (lower + self.rate) / 2)
            admitted = self.log.admitted(start, dispatched_at) / span
            # Sent at the rate, or queued for it: what got through is what the provider
            # takes. Otherwise it is only a floor (the calls came slower than allowed).
            busy = sent >= cfg.busy_fraction * self.rate * span or (
                2 * self.log.backlogged(start, dispatched_at) >= sent
            )
        lower = self.lower
        if self._reprobed_from is not None:
            # A re-probe drew its 429: the limit is where it was; probe half as often.
            self._hold_s = min(cfg.max_hold_s, 2 * self._hold_s)
            self._reprobed_from = None
        if lower is not None and attempted <= lower * 1.001:
            self._proofs_lied = True
            since = dispatched_at - cfg.noise_window_s
            sent, _ = self.log.count(since, dispatched_at)
            refused = self.log.refusal_events(since, dispatched_at, self._clump_gap_s)
            steady = refused >= max(cfg.steady_events, cfg.noise_share * sent)
            if now - self._noise_at > cfg.noise_window_s or not steady:
                self._noise_at = now
                self.noise += 1
                return RateLimitOutcome.NOISE
            # A proven rate failed twice: the limit moved down (or the clumps are real).
            # The proven rate is the bound, not what was sent below it (a busy worker
            # sends slower than its rate and in clumps: that says nothing about lower).
            self.upper = lower if self.upper is None else min(self.upper, lower)
            self.lower = None
            self.rate = max(self.floor_rps, min(self.rate, cfg.cut_fraction * lower))
            self.cuts += 1
            self._hold_started = None
            return RateLimitOutcome.CUT
        refused_share = 1.0
        if admitted is not None:
            sent_n, _ = self.log.count(start, dispatched_at)
            events = self.log.refusal_events(start, dispatched_at, self._clump_gap_s)
            refused_share = events / max(1, sent_n)
        clump = refused_share < cfg.clump_share and self._raised_at <= start
        if clump and attempted < self.rate:
            # Few refused, and sent slower than the rate: calls that left in clumps (a
            # busy worker), not a rate above the limit; what was sent is no bound.
            attempted = self.rate
        self.upper = attempted if self.upper is None else min(self.upper, attempted)
        if lower is not None and lower < self.upper:
            target = lower  # back to the proven rate; the search goes on between the bounds
        elif admitted is not None:
            target = cfg.cut_fraction * admitted
            if not busy:
                target = max(target, cfg.blind_cut_factor * self.rate)
            if clump:
                target = max(target, cfg.cut_fraction * self.rate)  # a step, not a fall
        else:
            target = cfg.blind_cut_factor * self.rate
        self.rate = max(self.floor_rps, min(self.rate, target))
        self.cuts += 1
        self._hold_started = None
        return RateLimitOutcome.CUT

    def measure_from(self, now: float) -> None:
        """Calls dispatched before ``now`` were held back by the caller, not the rate.

        The governor sends a key's first call alone and holds the others until its
        answer (up to a second): that second is no measure of what the provider
        admits, and a 429 just after it must not be read as "it took one call in a
        second". Only before the first cut.
        """
        if self.cuts == 0 and self._epoch_started < now:
            self._epoch_started = self._measure_start = now
            self._window_start, self._window_calls = None, 0

    def _learn_quota(self, now: float, pause_s: float) -> None:
        """A window quota ran out: pace at what it admitted per window from now on."""
        mark = self._quota_mark if self._quota_mark is not None else now
        learnt = self._quota_accepted / max(now - mark + pause_s, 1e-9)
        if learnt < self.rate:
            self.rate = max(self.floor_rps, learnt)
            self.upper = self.rate * (1 + self.config.settle_fraction)
            self.lower = None
            self.cuts += 1
        self._quota_mark = now + pause_s
        self._quota_accepted = 0

    # ------------------------------------------------------------------ operator

    def set_ceiling(self, ceiling_rps: float, now: float) -> None:
        """Apply a new configured rate: the ceiling *and* the rate in force become it.

        An explicit limit change is an operator's statement about the provider,
        so it replaces whatever the search had learnt; the epoch moves on so
        429s of calls sent under the old limit do not cut the new one.
        """
        check_rate(ceiling_rps, "ceiling_rps")
        self.ceiling_rps = ceiling_rps
        self.rate = ceiling_rps
        self.upper = self.lower = None
        self.learned_rps = self.learned_at = None
        self._hold_s, self._reprobed_from, self._proofs_lied = self.config.hold_s, None, False
        self._new_epoch(now)

    def set_min_rps(self, min_rps: float) -> None:
        """Change the floor; the rate in force is raised to it if needed."""
        check_rate(min_rps, "min_rps")
        self.min_rps = min_rps
        self.rate = min(self.ceiling_rps, max(self.rate, self.floor_rps))

    def adopt(self, rate: float, now: float) -> bool:
        """Take over a rate learnt elsewhere (another worker, via the fleet store).

        Clamped to ``[floor_rps, ceiling_rps]``; adopting a lower rate starts a
        new epoch (the burst that caused it was accounted for by whoever cut).
        Returns whether the rate in force changed.
        """
        new = min(self.ceiling_rps, max(self.floor_rps, rate))
        if math.isclose(new, self.rate, rel_tol=1e-9, abs_tol=1e-9):
            return False
        lowered = new < self.rate
        self.rate = new
        if lowered:
            self.upper = (
                new if self.upper is None else min(self.upper, new / self.config.cut_fraction)
            )
            if self.lower is not None and self.lower > new:
                self.lower = new
            self._new_epoch(now)
        return True

    def seed(self, rps: float, now: float) -> bool:
        """Start from a limit learnt by an earlier run (the fleet store's).

        The rate in force becomes ``rps`` (clamped to the floor and the ceiling) and the
        upper bound a step above it, so the search proves it in a window and then holds
        there, re-probing as usual, instead of starting at the ceiling and paying the
        429s again. Returns whether anything changed (nothing once the search has
        evidence of its own).
        """
        if self.rate_limited or self.upper is not None or self.lower is not None:
            return False
        new = min(self.ceiling_rps, max(self.floor_rps, rps))
        if new >= self.ceiling_rps:
            return False
        self.rate = new
        self.upper = min(self.ceiling_rps, new * self.config.reprobe_factor)
        self.learned_rps, self.learned_at = new, now
        self._new_epoch(now)
        return True

    def _new_epoch(self, now: float) -> None:
        self.epoch += 1
        self._epoch_started = self._measure_start = now
        self._window_start, self._window_calls = None, 0
        self._hold_started = None

    def _coarse(self, retry_after_s: float | None) -> bool:
        """Whether ``retry_after_s`` is a whole-second bound to take as a weak one.

        ``Retry-After`` is written in whole seconds: a strict GCRA whose next slot is
        30 ms away still says ``1``. Honouring it whole costs a second of calls per
        429; the search pauses a few intervals of the rate in force instead, until a
        call sent after such a pause is refused (then the provider meant it).
        """
        return (
            retry_after_s is not None
            and not self.retry_after_trusted
            and 1.0 <= retry_after_s <= self.config.coarse_retry_after_s
            and float(retry_after_s).is_integer()
        )

    def _pause_for(
        self,
        retry_after_s: float | None,
        now: float,
        *,
        short: bool = False,
        intervals: float | None = None,
    ) -> float:
        cfg = self.config
        if self._coarse(retry_after_s):
            assert retry_after_s is not None
            intervals = cfg.short_pause_intervals if intervals is None else intervals
            pause = min(retry_after_s, max(cfg.min_short_pause_s, intervals / self.rate))
            if short:  # a new pause (not one extended by an absorbed 429)
                self.short_pauses += 1
            self._short_pause_end = max(self.paused_until, now + pause)
            return pause
        if retry_after_s is None or not math.isfinite(retry_after_s) or retry_after_s < 0:
            base = cfg.default_pause_s
        else:
            base = retry_after_s
        base = min(base, cfg.max_pause_s)
        # Jitter spreads workers paused by one burst; at most a second of it.
        return base + min(cfg.jitter_fraction * base, 1.0) * self.rng()
