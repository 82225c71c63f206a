"""The governor: one per worker process, between every tool call and its provider.

Providers are paid and rate-limited, so a worker must never send faster than a
provider allows, and should go as fast as it does allow. The governor holds,
per **pacing key** (a provider name, or ``"acme:key=ACME_KEY_B"`` for one API key
of a provider), every limit that applies, all enforced together:

* the **rate in force**: a :class:`~playline.pacing.search.RateSearch` between
  ``min_rps`` and the catalog's ``rps``, learnt from 429s (cut to a fraction of
  what the provider admitted, then searched between the bounds), paced by an
  :class:`~playline.pacing.limiter.AdjustableLimiter`;
* the **quota windows** (``per_minute``, ``per_hour``, ``per_day``): hard caps
  (:class:`~playline.pacing.budget.WindowCap`); a minute is spent evenly;
* what the provider **reports** in its headers
  (:class:`~playline.pacing.budget.HeaderBudget`): spent evenly until the reset,
  blocked once gone, so no 429 is needed to learn the limit;
* **pauses** for ``Retry-After``, whatever its length (a daily quota answers
  429 for hours: the key is blocked until then, see :meth:`Governor.blocked_until`);
* a **concurrency gate** (``max_concurrency``), searched by a
  :class:`~playline.pacing.concurrency.ConcurrencySearch`: a 429 at a width never
  proven to succeed is a concurrency cap, not a rate (the gate narrows to just under
  it and the rate stands); the cap is probed one wider after a clean period, so a cap
  learnt during a bad minute is not kept for ever. Quick failures (a 503) change
  neither the gate nor the suggested width;
* a **time-in-flight average** over the outcomes (slow failures such as timeouts
  included, quick ones not), from which it suggests how many calls to keep in
  flight: Little's law, so a provider answering in 4 s is kept as full as one
  answering in 200 ms;
* a **first answer**: a key's first call goes alone (for up to a second), because
  what the provider answers (its rate-limit headers, or a 429) is worth a round trip
  before a burst.

All of them can change while calls are waiting (``set_limit``, the search, a
report, fleet limits), and every change applies to waiting calls too.

With a :class:`~playline.pacing.fleet_store.FleetPacer` the governor also takes
a GCRA ticket (and, for keys with quota windows, window slots) from PostgreSQL
for each call, so N workers together stay inside one provider budget; that is
:class:`~playline.pacing.fleet_sync.FleetSync`.

One tool call, end to end::

    async with governor.permit([provider], park_after_s=60) as permit:
        started = time.monotonic()
        response = await client.send(request)
        permit.observe(parse_rate_limit(response.headers, now_wall=time.time()))
        if response.status_code == 429:
            permit.record_rate_limited(retry_after_s)
        elif response.is_success:
            permit.record_success(time.monotonic() - started)
        else:
            permit.record_failure(time.monotonic() - started)

Fixture mode does not call :meth:`Governor.permit` at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import statistics
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from playline.pacing.budget import HeaderBudget, WindowCap
from playline.pacing.concurrency import ConcurrencySearch, Refusal
from playline.pacing.fair import ANONYMOUS, FORGET_AFTER_S, SHARE, FairOrder, Share
from playline.pacing.gate import WORK_STARTED, ResizableGate
from playline.pacing.headers import RateLimitReport
from playline.pacing.limiter import AdjustableLimiter
from playline.pacing.margin import PacingMargin
from playline.pacing.measure import EPSILON_S, Ewma, little_width
from playline.pacing.pacer import KeyBlocked
from playline.pacing.policy import Limits, PacingPolicy
from playline.pacing.search import RateLimitOutcome, RateSearch, SearchConfig
from playline.pacing.sending import sending_stamp

if TYPE_CHECKING:
    from playline.pacing.fleet_store import FleetPacer, LearnedLimit
    from playline.pacing.fleet_sync import FleetSync

__all__ = ["Governor", "KeyBlocked", "Permit"]

log = logging.getLogger("playline.governor")

#: Time in flight assumed before a key has completed a call: small, so that the
#: first dispatch width (``rate x time in flight``) is a trickle, not the whole chunk.
LATENCY_PRIOR_S = 0.25
#: The limiter runs this much below the rate in force: the provider's bucket then
#: refills a little faster than it is spent, and absorbs the clumps a busy event
#: loop and the network make of evenly spaced calls.
PACING_MARGIN = 0.98
#: A provider with no burst at all (``burst = 1``: a strict GCRA refuses any call
#: sooner than ``1 / rate`` after the last) has no bucket to absorb those clumps: the
#: spacing itself must, so such a key starts further below its rate.
NO_BURST_MARGIN = 0.96
#: From there the margin follows the "noise" 429s (refusals at a rate proven clean:
#: calls that left evenly spaced arrived bunched), by their measured share of the calls
#: sent: see :class:`~playline.pacing.margin.PacingMargin` (0.90-0.98).
#: The least part of a key's rate a worker keeps while the fleet's higher classes or
#: other keys are owed the rest: a trickle, so its own calls are never starved.
MIN_FLEET_PART = 0.02
#: How many recent admission-to-wire times a key keeps (see ``_lead``).
PATH_SAMPLES = 32
#: A no-burst key's calls leave a little later than they are spaced (a timer fires
#: late, one call's path to the wire is longer than the last's) and a late call is
#: never made up: the key measures its calls' departure gaps against its interval,
#: this many at a time, and is spaced that much faster (its *trim*, see
#: ``_note_departure``), so that its calls leave at its pace rate, up to this factor.
TRIM_SAMPLES = 16
MAX_TRIM = 1.08
#: How long a key's other calls wait for its first call's answer at most.
FIRST_ANSWER_WAIT_S = 1.0
#: How soon a key blocked by a reported quota looks again while answers are due.
REPORT_RECHECK_S = 0.05
#: A limit learnt by an earlier run is a starting point for this long; older, the
#: provider may have changed its plans, and the catalog applies again.
LEARNED_MAX_AGE_S = 7 * 86400.0
#: How a key's rate in force was learnt (``snapshot()["limit_source"]``).
FROM_CATALOG = "catalog"
FROM_HEADERS = "headers"
FROM_429S = "429 measurement"
FROM_LIMITS_SET = "limits set"
FROM_FLEET_STORE = "fleet store"
#: Rows kept in flight beyond Little's law: a row also spends time on receipts
#: and chunk turnover, and a row waiting at the governor costs only a lease.
WIDTH_HEADROOM = 2.0
#: The least time in flight Little's law counts per call: a row spends about this
#: much on its receipt, its settlement and its chunk whatever the provider's latency,
#: so a provider answering in 20 ms still gets enough rows to use its rate.
MIN_TIME_IN_FLIGHT_S = 0.1


@dataclass(eq=False)
class _KeyState:
    """Everything the governor knows about one pacing key."""

    key: str
    policy: PacingPolicy
    search: RateSearch
    limiter: AdjustableLimiter
    gate: ResizableGate
    #: the key's turn for a rate token: a one-wide gate in fair order (the
    #: concurrency ``gate`` has a fair order of its own)
    turn: ResizableGate
    concurrency: ConcurrencySearch
    windows: list[WindowCap]
    budget: HeaderBudget = field(default_factory=HeaderBudget)
    latency: Ewma = field(default_factory=lambda: Ewma(prior=LATENCY_PRIOR_S))
    in_flight: int = 0
    waiting: int = 0
    #: the quickest answer seen, seconds (a round trip with no queueing)
    fastest: float = math.inf
    #: while a key's first call is out, the others wait for its answer until this
    #: (what the provider reports, or its first 429, is worth a round trip)
    first_answer_due: float | None = None
    successes: int = 0
    failures: int = 0
    #: how far below the rate in force the limiter runs (see ``PACING_MARGIN``)
    steer: PacingMargin = field(default_factory=lambda: PacingMargin(PACING_MARGIN))
    #: when its last call left (the event loop's clock): a key without a local burst
    #: spaces the next from then, not from its token (see ``Governor._wait_spacing``)
    sent_at: float = -math.inf
    #: how long its recent calls took from admission to leaving (stamped by the
    #: transport): the next call is admitted that much before it is due to leave
    paths: deque[float] = field(default_factory=lambda: deque(maxlen=PATH_SAMPLES))
    #: when its last call left (stamped), and the departure gaps of its calls held by
    #: the rate over the interval of its pace rate, and how much faster than its
    #: pace rate a no-burst key is spaced so that its calls leave at that rate
    left_at: float = -math.inf
    gaps: list[float] = field(default_factory=list)
    trim: float = 1.0
    #: calls waiting to be dispatched, by fairness key (at the slots, the turn or a
    #: fleet ticket), the share they count for and when one last waited: what this
    #: worker tells the fleet (``Governor.waiting_shares``)
    pending: dict[str, int] = field(default_factory=dict)
    pending_share: dict[str, Share] = field(default_factory=dict)
    pending_at: dict[str, float] = field(default_factory=dict)
    #: with a fleet: the part of the provider's rate this worker's waiting fairness
    #: keys are owed among the fleet's (``None``: all of it, nobody else waits)
    fleet_part: float | None = None
    #: how the rate in force was learnt (``FROM_*``) and when (Unix seconds; ``None``:
    #: the catalog's, from the start)
    limit_source: str = FROM_CATALOG
    limit_since: float | None = None

    @property
    def margin(self) -> float:
        return self.steer.value

    def rate_in_force(self, now: float) -> float:
        return self._lowest([self.search.rate], now)

    def pace_rate(self, now: float) -> float:
        """The limiter's rate: the searched rate with the margin, the providers' as said,
        and in a fleet whose other workers wait for the key too, this worker's part."""
        rates = [self.search.rate * self.margin]
        if self.fleet_part is not None:
            rates.append(self.search.rate * self.margin * self.fleet_part)
        return self._lowest(rates, now)

    def _lowest(self, rates: list[float], now: float) -> float:
        """The lowest of ``rates`` and what the provider says (its windows' even rates,
        the rate its headers report), never quite 0."""
        rates.extend(w.even_rps for w in self.windows if w.even_rps is not None)
        reported = self.budget.rate(now)
        if reported is not None:
            rates.append(reported)
        return max(min(rates), 1e-6)

    def blocked_until(self, now: float) -> float:
        """The earliest time this key may dispatch (``<= now``: it may now)."""
        until = max([self.search.paused_until, *(w.available_at(now) for w in self.windows)])
        if self.first_answer_due is not None and self.in_flight:
            until = max(until, self.first_answer_due)
        reported = self.budget.blocked_until(now)
        return until if reported is None else max(until, reported)


@dataclass(frozen=True, slots=True)
class _Ticket:
    """What a permit remembers of each key at dispatch."""

    epoch: int
    concurrency: int


@dataclass(slots=True, eq=False)
class Permit:
    """Held while one provider call is in flight.

    Record exactly one outcome for the call; the first one recorded counts and
    later ones are ignored. A permit left without an outcome (the call raised
    before it was sent, say) changes no rate. :meth:`observe` may come before it.
    """

    _governor: Governor
    #: the pacing keys that admitted this call, sorted
    keys: tuple[str, ...]
    _tickets: tuple[_Ticket, ...]
    _dispatched_at: float
    _recorded: bool = field(default=False, init=False)

    def observe(self, report: RateLimitReport | None) -> None:
        """What the response said about the provider's limits (its headers)."""
        if report is not None and report.quotas:
            self._governor._on_report(self.keys, report, self._dispatched_at)

    def record_success(self, latency_s: float) -> None:
        """The provider answered usefully after ``latency_s`` seconds."""
        if self._claim():
            self._governor._on_accepted(self.keys, self._tickets, self._dispatched_at, latency_s)

    def record_rate_limited(self, retry_after_s: float | None) -> None:
        """The provider answered 429 (or another rate-limit signal).

        Applies to every key of the permit: the governor cannot tell which of
        them the provider meant, and slowing all of them is the safe reading.
        """
        if self._claim():
            self._governor._on_rate_limited(
                self.keys, self._tickets, self._dispatched_at, retry_after_s
            )

    def record_failure(self, latency_s: float | None = None) -> None:
        """Any other failure (5xx, timeout, bad body): counted, no rate change.

        ``latency_s`` (the time the call held its slot) feeds the time-in-flight
        average, so timeouts widen the suggested dispatch as they should.
        """
        if self._claim():
            self._governor._on_failure(self.keys, self._tickets, self._dispatched_at, latency_s)

    def _claim(self) -> bool:
        if self._recorded:
            return False
        self._recorded = True
        return True


class Governor:
    """Paces every provider call of one worker process.

    Args:
        policies: the pacing policy per pacing key, looked up by exact key. A
            key without a policy gets ``PacingPolicy()``'s defaults.
        global_ceiling: the most calls in flight across all keys of this
            process; also caps :meth:`suggested_parallelism`.
        clock: monotonic seconds, for windows, pauses and the search.
        wall_clock: Unix seconds, for :meth:`blocked_until`.
        fleet: share pacing with other workers through PostgreSQL (see
            :class:`~playline.pacing.fleet_sync.FleetSync`). The governor does
            not own the store: close it after :meth:`aclose`.
        search: the constants of the limit search.
        fleet_refresh_s: how often the fleet's limits and shared rate are
            read (at most 1 s, so that limit changes apply within a second).
    """

    def __init__(
        self,
        policies: Mapping[str, PacingPolicy],
        *,
        global_ceiling: int = 256,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        fleet: FleetPacer | None = None,
        search: SearchConfig | None = None,
        fleet_refresh_s: float = 0.5,
    ) -> None:
        self._policies = dict(policies)
        self._global_ceiling = global_ceiling
        self._global_gate = ResizableGate(global_ceiling)
        self._clock = clock
        self._wall_clock = wall_clock
        self._search_config = search or SearchConfig()
        self._states: dict[str, _KeyState] = {}
        #: weights set while runs go (``playline limits share``), by fairness key
        self._share_weights: dict[str, float] = {}
        self._fleet: FleetSync | None = None
        if fleet is not None:
            from playline.pacing.fleet_sync import FleetSync

            self._fleet = FleetSync(
                fleet,
                self,
                refresh_s=fleet_refresh_s,
                margin=PACING_MARGIN,
                burst=_local_burst,
            )

    # ------------------------------------------------------------------ admission

    def permit(
        self, keys: Sequence[str], *, park_after_s: float | None = None
    ) -> AbstractAsyncContextManager[Permit]:
        """Wait until EVERY key admits the call, then hold a :class:`Permit`.

        A key admits a call when it is not blocked (paused, a quota window
        full, a reported quota spent), has a concurrency slot and a rate token
        (and, with a fleet, its fleet ticket has come due). Slots are taken in
        sorted key order, so calls over overlapping keys cannot deadlock; rate
        tokens of several keys are taken at one instant. Leaving the context
        releases the slots, also on error and cancellation; a waiter cancelled
        before admission consumes nothing locally.

        With ``park_after_s`` set, a key blocked for longer than that raises
        :class:`KeyBlocked` instead of waiting, before anything is consumed.
        ``keys`` may be a single key string.
        """
        if isinstance(keys, str):
            keys = (keys,)
        unique = tuple(sorted(set(keys)))
        if not unique:
            raise ValueError("a permit needs at least one pacing key")
        return self._permit(unique, park_after_s)

    @contextlib.asynccontextmanager
    async def _permit(
        self, keys: tuple[str, ...], park_after_s: float | None
    ) -> AsyncIterator[Permit]:
        if self._fleet is not None:
            self._fleet.ensure_running()
        states = [self._state(key) for key in keys]
        self._check_park(states, park_after_s)
        gates: list[ResizableGate] = []
        tokens = False
        # At a full gate the oldest work goes first (a chunk's rows: see WORK_STARTED).
        started = WORK_STARTED.get()
        priority = self._clock() if started is None else started
        share = SHARE.get() or ANONYMOUS
        now = self._clock()
        for state in states:
            state.waiting += 1
            idle = state.pending_at.get(share.key, -math.inf) < now - 1.0
            if self._fleet is not None and idle and not state.pending.get(share.key):
                self._fleet.nudge()  # a key starts waiting here: the fleet weighs it now
            state.pending[share.key] = state.pending.get(share.key, 0) + 1
            state.pending_share[share.key] = share
            state.pending_at[share.key] = now
        try:
            # Whose call goes next is a fair order's choice (priority class, weighted
            # share of the fairness keys, oldest work), at the concurrency gate and at
            # the key's turn for a rate token. Fleet tickets are taken after the turn,
            # so callers still share their round trips.
            for state in states:
                await state.gate.acquire(priority, share)
                gates.append(state.gate)
            await self._global_gate.acquire(priority)
            gates.append(self._global_gate)
            async with self._turns(states, share, priority):
                await self._wait_unblocked(states, park_after_s)
                asked = self._clock()
                await self._take_tokens(states)
                tokens = True
            ticketed = self._fleet is None
            rate_wait = 0.0
            while True:
                if not tokens:
                    await self._wait_unblocked(states, park_after_s)
                    asked = self._clock()
                    await self._take_tokens(states)
                    tokens = True
                await self._wait_spacing(states)
                if not ticketed and not self._blocked(states):
                    assert self._fleet is not None
                    await self._fleet.wait_for_tickets(keys)
                    ticketed = True
                rate_wait += self._clock() - asked
                if self._blocked(states):  # a cut or a report landed while we waited
                    self._refund_tokens(states)
                    tokens = False
                    continue
                if any(state.in_flight >= state.gate.limit for state in states):
                    # A gate narrowed while this call waited for its tokens (a provider's
                    # concurrency cap was learnt): its slot is gone, so it gives the tokens
                    # back and queues for a slot again rather than be refused.
                    self._refund_tokens(states)
                    tokens = False
                    for gate in reversed(gates):
                        gate.release()
                    gates.clear()
                    for state in states:
                        await state.gate.acquire(priority, share)
                        gates.append(state.gate)
                    await self._global_gate.acquire(priority)
                    gates.append(self._global_gate)
                    continue
                break
        except BaseException:
            if tokens:
                self._refund_tokens(states)
            for gate in reversed(gates):
                gate.release()
            raise
        finally:
            now = self._clock()
            for state in states:
                state.waiting -= 1
                left = state.pending.get(share.key, 1) - 1
                if left > 0:
                    state.pending[share.key] = left
                else:
                    state.pending.pop(share.key, None)
                state.pending_at[share.key] = now
        now = self._clock()
        tickets = []
        rate_bound = []
        for state in states:
            first = state.successes + state.failures + state.search.rate_limited == 0
            if first and state.first_answer_due is None:
                state.first_answer_due = now + FIRST_ANSWER_WAIT_S
            state.in_flight += 1
            for window in state.windows:
                window.take(now)
            # Held back by the rate (a token, a fleet ticket) or queued behind others for
            # it: the rate, not the dispatch, limited this call. Calls queued at the
            # concurrency gate do not count: a narrow gate says nothing about the rate.
            held = rate_wait > 0.5 / state.pace_rate(now)
            queued = state.waiting > state.gate.waiting
            state.search.on_dispatch(now, backlogged=held or queued)
            rate_bound.append(held or queued)
            state.budget.on_dispatch(now)
            state.steer.on_sent(now)
            state.sent_at = asyncio.get_running_loop().time()
            tickets.append(_Ticket(state.search.epoch, state.in_flight))
        admitted = asyncio.get_running_loop().time()
        try:
            # The transport stamps when the request really leaves (see pacing.sending).
            with sending_stamp(lambda: self._left(states, admitted, rate_bound)):
                yield Permit(self, keys, tuple(tickets), now)
        finally:
            for state in states:
                state.in_flight -= 1
                state.first_answer_due = None
            for gate in reversed(gates):
                gate.release()

    @staticmethod
    @contextlib.asynccontextmanager
    async def _turns(
        states: Sequence[_KeyState], share: Share, started: float
    ) -> AsyncIterator[None]:
        """Every key's turn, taken in sorted key order (as the gates: no deadlock)."""
        taken: list[ResizableGate] = []
        try:
            for state in states:
                await state.turn.acquire(started, share)
                taken.append(state.turn)
            yield
        finally:
            for turn in reversed(taken):
                turn.release()

    def _blocked(self, states: Sequence[_KeyState]) -> bool:
        now = self._clock()
        return any(state.blocked_until(now) > now for state in states)

    def _check_park(self, states: Sequence[_KeyState], park_after_s: float | None) -> None:
        if park_after_s is None:
            return
        now = self._clock()
        for state in states:
            until = state.blocked_until(now)
            if until - now > park_after_s:
                raise KeyBlocked(state.key, until, self._wall_clock() + (until - now))

    async def _wait_unblocked(
        self, states: Sequence[_KeyState], park_after_s: float | None
    ) -> None:
        while True:
            self._check_park(states, park_after_s)
            now = self._clock()
            until = max(state.blocked_until(now) for state in states)
            if until <= now:
                return
            # Re-check at least once a minute: a limit change may free the key; and
            # soon when calls are in flight, whose answers bring fresh reports.
            busy = any(state.in_flight for state in states)
            await asyncio.sleep(min(until - now, REPORT_RECHECK_S if busy else 60.0))

    async def _wait_spacing(self, states: Sequence[_KeyState]) -> None:
        """Keep a key without burst one interval from its last call as really sent.

        Its rate token paces the calls as they are admitted, but a call can leave
        later than its token (the event loop was busy, a fleet ticket was slow) and
        the next one on time: they arrive together, and a provider that allows no
        burst (a strict GCRA) refuses the second. So such a key also waits, after its
        token, until an interval has passed since the last call left.
        """
        loop = asyncio.get_running_loop()
        while True:
            now = self._clock()
            due = [
                state.sent_at + _interval_less_lead(state, 1 / _spacing_rate(state, now))
                for state in states
                if state.limiter.max_rate <= 1  # no local burst: spaced one by one
            ]
            wait = max(due, default=-math.inf) - loop.time()
            if wait <= EPSILON_S:
                return
            await asyncio.sleep(wait)

    @staticmethod
    async def _take_tokens(states: Sequence[_KeyState]) -> None:
        """Take one rate token from every key, all at the same instant.

        One key: aiolimiter's own FIFO wait. Several: sleep until all have
        capacity at once, then take all without yielding. Taking them one by
        one would hold the first key's token while waiting for the second,
        and a token used later than it was taken lets calls bunch up.
        """
        if len(states) == 1:
            await states[0].limiter.acquire()
            return
        while True:
            delay = max(state.limiter.capacity_delay() for state in states)
            if delay <= 0:
                for state in states:
                    state.limiter.try_take()
                return
            await asyncio.sleep(delay)

    @staticmethod
    def _refund_tokens(states: Sequence[_KeyState]) -> None:
        for state in states:
            state.limiter.refund()

    def pick(self, keys: Sequence[str]) -> str:
        """The key (of several interchangeable ones, e.g. API keys) to send the next call with.

        The one that can admit soonest: not blocked, then the shortest queue for
        its rate; ties go to the first, so callers can pass their own
        preference order.
        """
        if not keys:
            raise ValueError("pick needs at least one key")
        now = self._clock()

        def expected_wait(key: str) -> float:
            state = self._state(key)
            blocked = max(0.0, state.blocked_until(now) - now)
            queue = state.waiting / state.rate_in_force(now)
            busy = 0.0 if state.in_flight < state.gate.limit else state.latency.value
            return blocked + queue + busy

        return min(keys, key=expected_wait)

    # ------------------------------------------------------------------ outcomes

    def _on_report(
        self, keys: Sequence[str], report: RateLimitReport, dispatched_at: float
    ) -> None:
        now = self._clock()
        for _key, state in self._answering(keys, now):
            # Calls sent within half the quickest round trip may not have reached
            # the provider when it wrote this report: count them as spent. The call
            # this report answers was counted by it, however quick its round trip.
            one_way = state.fastest / 2 if math.isfinite(state.fastest) else 0.0
            unseen = state.search.log.sent_since(max(now - one_way, dispatched_at))
            state.budget.observe(report, now, unseen)
            self._sync_limiter(state)

    def _on_accepted(
        self,
        keys: Sequence[str],
        tickets: Sequence[_Ticket],
        dispatched_at: float,
        latency_s: float,
    ) -> None:
        now = self._clock()
        for (key, state), ticket in zip(self._answering(keys, now), tickets, strict=True):
            state.successes += 1
            state.latency.observe(latency_s)
            state.fastest = min(state.fastest, latency_s)
            if state.concurrency.on_success(now, ticket.concurrency):
                log.debug("pacing key %s: %d in flight is fine", key, ticket.concurrency)
            self._probe_gate(state, now)
            grew = state.search.on_accepted(now, dispatched_at, ticket.epoch)
            if state.search.learned_at == now:
                self._learned(key, state)
            if state.steer.relax(now, _margin_ceiling(state)) and not grew:
                self._sync_limiter(state)
            if grew:
                self._sync_limiter(state)
                log.debug("pacing key %s raised to %g rps", key, state.search.rate)
                if self._fleet is not None:
                    self._fleet.report_increase(key, state.search.rate, state.search.ceiling_rps)

    def _learned(self, key: str, state: _KeyState) -> None:
        """The search just proved a rate under one that drew a 429: say so, and
        remember it for the fleet's next run when it is below the catalog's."""
        search = state.search
        learned = search.learned_rps
        if learned is None or not search.rate_limited:
            return  # a limit seeded from the store, proven clean: still the store's
        if state.limit_source != FROM_429S:
            log.info(
                "pacing key %s: limit learnt from 429s: %g rps (catalog %g)",
                key,
                learned,
                search.ceiling_rps,
            )
        state.limit_source, state.limit_since = FROM_429S, self._wall_clock()
        if self._fleet is not None and learned < search.ceiling_rps:
            self._fleet.report_learned(key, learned, search.ceiling_rps, FROM_429S)

    def seed_learned(self, key: str, learned: LearnedLimit) -> bool:
        """Start ``key`` at a limit an earlier run learnt (the fleet store's), if it is
        younger than ``LEARNED_MAX_AGE_S`` and this run has no evidence of its own yet.

        The search starts at it with its upper bound a step above (see
        :meth:`RateSearch.seed`): the first calls go at the learnt rate, not the
        catalog's. Returns whether it was applied.
        """
        if learned.age_s > LEARNED_MAX_AGE_S:
            return False
        state = self._state(key)
        if not state.search.seed(learned.rps, self._clock()):
            return False
        self._sync_limiter(state)
        state.limit_source = f"{FROM_FLEET_STORE} ({learned.source})"
        state.limit_since = learned.learned_at
        log.info(
            "pacing key %s starts at %g rps, learnt %.0f s ago by %s (catalog %g)",
            key,
            state.search.rate,
            learned.age_s,
            learned.source,
            state.search.ceiling_rps,
        )
        return True

    def _on_rate_limited(
        self,
        keys: Sequence[str],
        tickets: Sequence[_Ticket],
        dispatched_at: float,
        retry_after_s: float | None,
    ) -> None:
        now = self._clock()
        for (key, state), ticket in zip(self._answering(keys, now), tickets, strict=True):
            search = state.search
            before = search.rate
            for window in state.windows:  # refused: the provider did not count it
                window.refund(dispatched_at)
            width = ticket.concurrency
            refusal = Refusal.RATE  # sent before the last cut: the search absorbs it
            if ticket.epoch == search.epoch:
                refusal = state.concurrency.classify(width, retry_after=retry_after_s is not None)
            if refusal is Refusal.EITHER:
                # A first refusal at an unproven width that names a time to come back:
                # most likely a rate; remembered, so that a cap is known by a second.
                state.concurrency.remember(now, width)
            elif refusal is Refusal.CONCURRENCY:
                # Refused wider than any width proven to work: a concurrency cap.
                if state.concurrency.on_refused(now, width):
                    log.info(
                        "pacing key %s refused at %d in flight: keeping %d in flight",
                        key,
                        width,
                        state.concurrency.limit,
                    )
                state.gate.resize(state.concurrency.limit)
            if refusal is Refusal.CONCURRENCY:
                search.note_refused(now, dispatched_at, retry_after_s)
                self._sync_limiter(state)
                continue
            outcome = search.on_rate_limited(now, dispatched_at, ticket.epoch, retry_after_s)
            if outcome is RateLimitOutcome.ABSORBED:
                log.debug("pacing key %s: 429 from a call sent before the last cut", key)
                continue
            if outcome is RateLimitOutcome.NOISE:
                # Evenly spaced calls arrived bunched: more margin if that is no longer
                # an isolated refusal (their share of the calls sent says so).
                if state.steer.on_noise(now):
                    log.info("pacing key %s: pacing margin now %.3f", key, state.margin)
            else:
                state.steer.hold(now)  # a cut: the margin relaxes only once it is clean
            self._sync_limiter(state)
            pause_s = search.pause_remaining(now)
            log.warning(
                "pacing key %s rate-limited by the provider (%s): rate %g -> %g rps, "
                "paused %.2f s (Retry-After: %s)",
                key,
                outcome.value,
                before,
                search.rate,
                pause_s,
                "none" if retry_after_s is None else f"{retry_after_s:g} s",
            )
            if self._fleet is not None:
                self._fleet.report_cut(key, search.rate, search.floor_rps, pause_s)

    def _on_failure(
        self,
        keys: Sequence[str],
        tickets: Sequence[_Ticket],
        dispatched_at: float,
        latency_s: float | None,
    ) -> None:
        now = self._clock()
        for (_key, state), ticket in zip(self._answering(keys, now), tickets, strict=True):
            state.failures += 1
            if latency_s is not None and latency_s >= state.latency.value:
                # A slow failure (a timeout) held its slot that long: it widens the
                # suggested width. A quick one (a 503) held it for nothing and is retried
                # after a backoff: it must not narrow it.
                state.latency.observe(latency_s)
            # The provider took the request (it spent its budget): evidence for the search.
            state.search.on_accepted(now, dispatched_at, ticket.epoch)
            self._probe_gate(state, now)

    def _answering(self, keys: Sequence[str], now: float) -> Iterator[tuple[str, _KeyState]]:
        """Each key of an answered call with its state, marked answered as it comes."""
        for key in keys:
            state = self._state(key)
            self._answered(state, now)
            yield key, state

    @staticmethod
    def _answered(state: _KeyState, now: float) -> None:
        """An answer came: a key waiting for its first one stops waiting."""
        if state.first_answer_due is not None:
            state.first_answer_due = None
            # The other calls were held for it: that wait is no measure of the rate.
            state.search.measure_from(now)
            # It may have arrived late (it opened the connection): a key without burst
            # spaces the next call from its answer, not from when it left.
            with contextlib.suppress(RuntimeError):  # no running loop: nothing to space
                state.sent_at = asyncio.get_running_loop().time()

    def _left(
        self, states: Sequence[_KeyState], admitted: float, rate_bound: Sequence[bool]
    ) -> None:
        """A permit's request (admitted at ``admitted``, the loop's clock) is being
        written now: its keys space their next call from here (a call that left late
        pushes the next one, see ``_wait_spacing``), learn how long a call takes from
        admission to the wire, and, for a no-burst key whose call waited for the rate,
        how far its departures fall behind their spacing (its trim)."""
        now = asyncio.get_running_loop().time()
        for state, bound in zip(states, rate_bound, strict=True):
            if bound and state.limiter.max_rate <= 1:
                spaced = (now - state.left_at) * _spacing_rate(state, self._clock())
                # Only gaps the spacing made (a pause or a stall in between is no measure);
                # noted against the pace rate's interval (> 1: it left late).
                if 0.5 < spaced < 1.5 and _note_departure(state, spaced / state.trim):
                    self._sync_limiter(state)
            state.left_at = now
            state.sent_at = max(state.sent_at, now)
            state.paths.append(now - admitted)

    def _probe_gate(self, state: _KeyState, now: float) -> None:
        """Probe a learnt concurrency cap one wider once it has been clean long enough."""
        if state.concurrency.tick(now, state.latency.value):
            log.debug("pacing key %s: probing %d in flight", state.key, state.concurrency.limit)
        if state.gate.limit != state.concurrency.limit:
            state.gate.resize(state.concurrency.limit)

    # ------------------------------------------------------------------ limits

    def suggested_parallelism(self, key: str) -> int:
        """How many calls to keep in flight for ``key`` (Little's law, with headroom).

        ``ceil(rate in force x time in flight x WIDTH_HEADROOM)``, floored at 1 (the
        time in flight at least ``MIN_TIME_IN_FLIGHT_S``),
        capped by ``WIDTH_HEADROOM`` x the key's concurrency gate (calls queued at
        the gate with their receipts claimed refill it the moment a slot frees)
        and the global ceiling. The time in flight averages every outcome, so
        timeouts widen it. Before any call completed it is ``LATENCY_PRIOR_S``.
        """
        state = self._state(key)
        cap = min(math.ceil(state.gate.limit * WIDTH_HEADROOM), self._global_ceiling)
        rate = state.rate_in_force(self._clock())
        latency = max(state.latency.value, MIN_TIME_IN_FLIGHT_S)
        return little_width(rate * WIDTH_HEADROOM, latency, cap=cap)

    def blocked_until(self, key: str) -> float | None:
        """When ``key`` can admit again (Unix epoch seconds), or ``None`` if it can now.

        Blocked means paused by a ``Retry-After``, a quota window full, or a
        reported quota spent; a key merely waiting for its next rate token is
        not blocked.
        """
        now = self._clock()
        until = self._state(key).blocked_until(now)
        if until <= now:
            return None
        return self._wall_clock() + (until - now)

    def set_limit(self, key: str, limits: Limits) -> None:
        """Change a key's limits in this process, for waiting and future calls.

        Limits not given are kept. A new ``rps`` becomes both the ceiling and the rate
        in force (what the search had learnt is discarded: the operator has spoken).
        Lowering ``max_concurrency`` revokes no call in flight. Fleet-wide limits are
        set with ``playline limits set``
        (:meth:`~playline.pacing.fleet_store.FleetPacer.set_limits`) instead.
        """
        if not limits.given():
            return
        state = self._state(key)
        self._apply_policy(state, limits.applied_to(state.policy))

    def replace_policy(self, key: str, policy: PacingPolicy) -> None:
        """Make ``policy`` the key's limits, as a whole (windows it lacks are dropped)."""
        self._apply_policy(self._state(key), policy)

    def _apply_policy(self, state: _KeyState, policy: PacingPolicy) -> None:
        old, state.policy = state.policy, policy
        if policy.rps != old.rps:
            state.search.set_ceiling(policy.rps, self._clock())
            state.limit_source, state.limit_since = FROM_LIMITS_SET, self._wall_clock()
        if policy.min_rps != old.min_rps:
            state.search.set_min_rps(policy.min_rps)
        if policy.windows() != old.windows():
            kept = {w.window_s: w for w in state.windows}
            state.windows = []
            for seconds, limit in policy.windows().items():
                window = kept.get(seconds) or WindowCap(limit, seconds)
                window.resize(limit)
                state.windows.append(window)
        if policy.max_concurrency != old.max_concurrency:
            state.concurrency.reset(policy.max_concurrency)  # forget the learnt cap
        state.gate.resize(state.concurrency.limit)
        if policy.burst != old.burst:
            state.steer.reset(_base_margin(policy))
        self._sync_limiter(state)
        log.info(
            "pacing key %s limits set: %g rps, burst %d, windows %s, max concurrency %d",
            state.key,
            policy.rps,
            policy.burst,
            policy.windows() or "none",
            policy.max_concurrency,
        )

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """The state of every configured key and every key used so far.

        Per key: ``rps`` (configured ceiling), ``rate_rps`` (rate in force,
        every limit together), ``search_rps`` (the search's own rate),
        ``upper_rps`` / ``lower_rps`` (its bounds), ``min_rps``, ``burst``,
        ``windows`` (seconds -> limit), ``max_concurrency``, ``concurrency``
        (the gate now), ``concurrency_cap`` (the cap learnt from 429s, or ``None``),
        ``concurrency_probing``, ``in_flight``, ``waiting``, ``rate_limited`` (429s
        recorded), ``cuts``, ``pauses``, ``noise``, ``increases``,
        ``paused_until`` / ``blocked_for_s`` (seconds from now, or ``None``),
        ``reported`` (the provider's header windows), ``latency_ewma_s``
        (``None`` before the first outcome), ``successes``, ``failures``,
        ``suggested_parallelism``, ``learned_rps`` (the limit learnt from 429s, or
        ``None``), ``limit_source`` (how the rate in force was learnt: ``catalog``,
        ``headers``, ``429 measurement``, ``limits set``, ``fleet store (...)``) and
        ``limit_since`` (when, Unix seconds; ``None`` for the catalog's).
        """
        now = self._clock()
        out: dict[str, dict[str, Any]] = {}
        for key in sorted(self._policies.keys() | self._states.keys()):
            state = self._state(key)
            search = state.search
            remaining = search.pause_remaining(now)
            blocked = state.blocked_until(now) - now
            out[key] = {
                "rps": state.policy.rps,
                "rate_rps": state.rate_in_force(now),
                "search_rps": search.rate,
                "upper_rps": search.upper,
                "lower_rps": search.lower,
                "min_rps": state.policy.min_rps,
                "burst": state.policy.burst,
                "windows": state.policy.windows(),
                "max_concurrency": state.policy.max_concurrency,
                "concurrency": state.gate.limit,
                "concurrency_cap": state.concurrency.cap,
                "concurrency_probing": state.concurrency.probing,
                "in_flight": state.in_flight,
                "waiting": state.waiting,
                "rate_limited": search.rate_limited,
                "cuts": search.cuts,
                "pauses": search.pauses,
                "noise": search.noise,
                "increases": search.increases,
                "paused_until": remaining if remaining > 0 else None,
                "blocked_for_s": blocked if blocked > 0 else None,
                "reported": state.budget.snapshot(now),
                "latency_ewma_s": state.latency.observed,
                "pacing_margin": state.margin,
                "departure_trim": state.trim,
                "successes": state.successes,
                "failures": state.failures,
                "suggested_parallelism": self.suggested_parallelism(key),
                "shares": _fair(state.turn).snapshot(),
                "fleet_part": state.fleet_part,
                "learned_rps": search.learned_rps,
                "limit_source": _limit_source(state, now),
                "limit_since": state.limit_since,
            }
        return out

    def set_share_weight(self, fairness_key: str, weight: float | None) -> None:
        """Weigh ``fairness_key``'s calls by ``weight`` from now on, whatever its runs
        said (``None``: what they say again); applies to calls already waiting."""
        if weight is None:
            self._share_weights.pop(fairness_key, None)
        elif weight > 0:
            self._share_weights[fairness_key] = weight

    def shares(self, key: str) -> dict[str, dict[str, Any]]:
        """Who shares ``key`` now: per fairness key its weight, class, calls waiting,
        recent rate and part of the key's recent calls (see ``FairQueue.snapshot``)."""
        state = self._states.get(key)
        return _fair(state.turn).snapshot() if state is not None else {}

    def waiting_shares(self, key: str, within_s: float = 0.0) -> dict[str, tuple[float, int, int]]:
        """The fairness keys with calls waiting for ``key`` (anywhere before dispatch:
        its slots, its turn, a fleet ticket), or that had some in the last ``within_s``
        seconds:
        ``{fairness key: (weight, class, calls waiting)}``."""
        state = self._states.get(key)
        if state is None:
            return {}
        now = self._clock()
        since = now - within_s
        for gone in [
            k
            for k, at in state.pending_at.items()
            if not state.pending.get(k) and at < now - FORGET_AFTER_S
        ]:
            del state.pending_at[gone]
            state.pending_share.pop(gone, None)
        return {
            fkey: (
                # Its own weight (or one set while runs go), never the fleet's allotment
                # here: that is computed from what this says.
                self._share_weights.get(fkey) or share.weight,
                share.priority,
                state.pending.get(fkey, 0),
            )
            for fkey, share in state.pending_share.items()
            if state.pending.get(fkey, 0) > 0 or state.pending_at.get(fkey, -math.inf) >= since
        }

    def pacing_keys(self) -> list[str]:
        """Every key this governor has used or configured."""
        return sorted(self._states)

    def set_fleet_part(
        self, key: str, part: float | None, weights: dict[str, float] | None = None
    ) -> None:
        """Pace ``key`` at ``part`` of its rate: this worker's due among the fleet's
        waiting fairness keys (``None``: the whole rate), and weigh its own waiting keys
        by ``weights`` (their fleet allotments here) so it splits its part as the fleet
        would (``None``: by their own weights)."""
        state = self._state(key)
        for gate in (state.gate, state.turn):
            _fair(gate).set_fleet_weights(weights or {})
        if part is not None:
            part = min(1.0, max(part, MIN_FLEET_PART))
        if part != state.fleet_part:
            state.fleet_part = part
            self._sync_limiter(state)

    def policy(self, key: str) -> PacingPolicy:
        """The limits in force for ``key`` (its catalog policy, or as changed since)."""
        return self._state(key).policy

    def has_key(self, key: str) -> bool:
        """Whether ``key`` has been configured or used in this process."""
        return key in self._states

    def rate_in_force(self, key: str) -> float | None:
        """The rate ``key`` is paced at now, every limit together, requests per second."""
        return self._state(key).rate_in_force(self._clock())

    def adopt_rate(self, key: str, rps: float) -> bool:
        """Pace ``key`` at a rate learnt elsewhere (another worker of the fleet).

        Clamped to the key's floor and ceiling; a lower rate starts a new epoch
        (see :meth:`RateSearch.adopt`). Returns whether the rate changed.
        """
        state = self._state(key)
        before = state.search.rate
        if not state.search.adopt(rps, self._clock()):
            return False
        self._sync_limiter(state)
        log.info(
            "pacing key %s follows the fleet rate: %g -> %g rps", key, before, state.search.rate
        )
        return True

    async def start(self) -> None:
        """Start reading fleet limits now rather than at the first permit."""
        if self._fleet is not None:
            self._fleet.ensure_running()
            await self._fleet.refresh_once()

    async def aclose(self) -> None:
        """Stop the fleet refresh and wait briefly for outstanding fleet reports."""
        if self._fleet is not None:
            await self._fleet.aclose()

    # ------------------------------------------------------------------ internals

    def _state(self, key: str) -> _KeyState:
        state = self._states.get(key)
        if state is None:
            policy = self._policies.get(key) or PacingPolicy()
            state = _KeyState(
                key=key,
                policy=policy,
                steer=PacingMargin(_base_margin(policy)),
                search=RateSearch(policy.rps, policy.min_rps, self._search_config),
                limiter=AdjustableLimiter(policy.rps, _local_burst(policy.burst)),
                gate=ResizableGate(policy.max_concurrency, self._fair_order()),
                concurrency=ConcurrencySearch(policy.max_concurrency),
                windows=[WindowCap(limit, seconds) for seconds, limit in policy.windows().items()],
                turn=ResizableGate(1, self._fair_order()),
            )
            self._states[key] = state
            self._sync_limiter(state)
            if self._fleet is not None:
                self._fleet.key_created(key)
        return state

    def _fair_order(self) -> FairOrder:
        return FairOrder(self._share_weights.get, self._clock)

    def _sync_limiter(self, state: _KeyState) -> None:
        limiter = state.limiter
        burst = _local_burst(state.policy.burst)
        now = self._clock()
        rate = _spacing_rate(state, now) if burst <= 1 else state.pace_rate(now)
        if not (
            math.isclose(limiter._rate_per_sec, rate, rel_tol=1e-3) and limiter.max_rate == burst
        ):
            limiter.reconfigure(rate, burst)


def _spacing_rate(state: _KeyState, now: float) -> float:
    """The rate a no-burst key's calls are spaced and admitted at: its pace rate, made
    up for how late its calls leave (its trim)."""
    return state.pace_rate(now) * state.trim


def _note_departure(state: _KeyState, ratio: float) -> bool:
    """One departure gap of a call held by the rate, over its pace rate's interval;
    every ``TRIM_SAMPLES`` the trim moves half way (geometrically) to what their
    median says, within ``[1, MAX_TRIM]``. Returns whether it moved.

    A median rather than a mean: a stalled event loop sends one long gap now and then,
    which is not the spacing's fault and must not make the key faster after it.
    """
    state.gaps.append(ratio)
    if len(state.gaps) < TRIM_SAMPLES:
        return False
    median = statistics.median(state.gaps)
    state.gaps.clear()
    trim = min(MAX_TRIM, max(1.0, state.trim * math.sqrt(median)))
    moved = not math.isclose(trim, state.trim, rel_tol=1e-3)
    state.trim = trim
    return moved


def _interval_less_lead(state: _KeyState, interval: float) -> float:
    """How long after the last call left to admit a no-burst key's next one, so that
    it *leaves* ``interval`` after it: less the quickest of the key's recent
    admission-to-wire times (the next call takes at least about that; spaced from the
    last one's departure without it, every call's own path would be added to the
    interval), and less no more than half an interval."""
    if len(state.paths) < PATH_SAMPLES // 4:
        return interval
    return interval - min(min(state.paths), 0.5 * interval)


def _limit_source(state: _KeyState, now: float) -> str:
    """How the rate in force was learnt: the provider's headers when they bind it."""
    reported = state.budget.rate(now)
    if reported is not None and reported < state.search.rate * state.margin:
        return FROM_HEADERS
    return state.limit_source


def _fair(gate: ResizableGate) -> FairOrder:
    order = gate.order
    assert isinstance(order, FairOrder)
    return order


def _base_margin(policy: PacingPolicy) -> float:
    """The margin a key starts with: more for a provider that allows no burst."""
    return NO_BURST_MARGIN if policy.burst <= 1 else PACING_MARGIN


def _margin_ceiling(state: _KeyState) -> float:
    """How close to its rate a clean key may be paced: as close as the margin allows
    while its rate is the catalog's; once the search has learnt a limit from 429s, no
    closer than the key's base margin (the rate it proved clean was proven *with* that
    margin: paced closer, it would send above what was proven)."""
    return PACING_MARGIN if state.search.upper is None else _base_margin(state.policy)


def _local_burst(burst: int) -> int:
    """The burst this process allows itself: half the provider's, rounded up.

    The provider's bucket must also absorb what the network and a busy event
    loop do to the spacing (calls admitted apart arriving together); spending
    all of it locally leaves nothing for that.
    """
    return max(1, math.ceil(burst / 2))
