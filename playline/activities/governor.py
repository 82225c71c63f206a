"""The governor: one per worker process, between every tool call and its provider.

Providers are paid and rate-limited, so a worker must never send faster than a
provider allows, and should go as fast as it does allow. The governor holds,
per **pacing key** (a provider name, or a compound key such as
``"acme:key=ab12cd"`` for one API key of a provider):

* a rate limiter (an :class:`aiolimiter.AsyncLimiter`, ``burst`` calls back to
  back, then ``rps`` per second),
* a concurrency gate (at most ``max_concurrency`` calls in flight),
* an AIMD controller (:class:`~playline.activities.pacing.AimdController`) that
  halves the rate in force on a 429 (once per burst), pauses the key for the
  provider's ``Retry-After``, and grows the rate back additively on success,
* a latency average, from which it suggests how many calls to keep in flight.

All of them can change while calls are waiting (``set_limit``, AIMD, fleet
limits), and every change applies to waiting calls too.

With a :class:`~playline.activities.fleet_pacing.FleetPacer` the governor
also takes a GCRA ticket from PostgreSQL for each call, so that N workers
together stay inside one provider budget, shares its rate cuts with the
fleet, and applies the limits that ``playline limits set`` writes, within a
second.

One tool call, end to end::

    async with governor.permit([provider]) as permit:
        started = time.monotonic()
        response = await client.send(request)
        if response.status_code == 429:
            permit.record_rate_limited(retry_after_s)
        elif response.is_success:
            permit.record_success(time.monotonic() - started)
        else:
            permit.record_failure()

Fixture mode does not call :meth:`Governor.permit` at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiolimiter import AsyncLimiter

from playline.activities.catalog import Catalog, PacingPolicy
from playline.activities.pacing import (
    AimdConfig,
    AimdController,
    Ewma,
    RateLimitOutcome,
    little_width,
)

if TYPE_CHECKING:
    from playline.activities.fleet_pacing import FleetKeyState, FleetPacer, FleetRate

__all__ = ["Governor", "Permit", "ResizableGate"]

log = logging.getLogger("playline.governor")

#: Latency assumed before a key has completed a call: small, so that the first
#: dispatch width (``rate x latency``) is a trickle, not the whole chunk.
LATENCY_PRIOR_S = 0.25


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


class _AdjustableLimiter(AsyncLimiter):
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


@dataclass(eq=False)
class _KeyState:
    """Everything the governor knows about one pacing key."""

    key: str
    policy: PacingPolicy
    aimd: AimdController
    limiter: _AdjustableLimiter
    gate: ResizableGate
    latency: Ewma = field(default_factory=lambda: Ewma(prior=LATENCY_PRIOR_S))
    in_flight: int = 0
    waiting: int = 0
    successes: int = 0
    failures: int = 0
    #: the (rps, burst, max_concurrency) last applied from the fleet limits table
    fleet_limits: tuple[float, int, int] | None = None
    #: the (epoch, rps) of the shared adapted rate last seen or written
    fleet_seen: tuple[int, float] | None = None
    batcher: _TicketBatcher | None = None


class Permit:
    """Held while one provider call is in flight.

    Record exactly one outcome for the call; the first one recorded counts
    and later ones are ignored. A permit left without an outcome (the call
    raised before it was sent, say) changes no rate.
    """

    __slots__ = ("_epochs", "_governor", "_recorded", "keys")

    def __init__(self, governor: Governor, keys: tuple[str, ...], epochs: tuple[int, ...]) -> None:
        self._governor = governor
        self._epochs = epochs
        self._recorded = False
        #: the pacing keys that admitted this call, sorted
        self.keys = keys

    def record_success(self, latency_s: float) -> None:
        """The provider answered usefully after ``latency_s`` seconds."""
        if self._claim():
            self._governor._on_success(self.keys, self._epochs, latency_s)

    def record_rate_limited(self, retry_after_s: float | None) -> None:
        """The provider answered 429 (or another rate-limit signal).

        Applies to every key of the permit: the governor cannot tell which of
        them the provider meant, and slowing all of them is the safe reading.
        """
        if self._claim():
            self._governor._on_rate_limited(self.keys, self._epochs, retry_after_s)

    def record_failure(self) -> None:
        """Any other failure (5xx, timeout, connection error): counted, no rate change."""
        if self._claim():
            self._governor._on_failure(self.keys)

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
        clock: monotonic seconds, for AIMD windows and pauses.
        fleet: share pacing with other workers through PostgreSQL. The
            governor does not own it: close it after :meth:`aclose`.
        aimd: the AIMD constants.
        fleet_refresh_s: how often the fleet's limits and shared rate are
            read (at most 1 s, so that limit changes apply within a second).
    """

    def __init__(
        self,
        policies: Mapping[str, PacingPolicy],
        *,
        global_ceiling: int = 256,
        clock: Callable[[], float] = time.monotonic,
        fleet: FleetPacer | None = None,
        aimd: AimdConfig | None = None,
        fleet_refresh_s: float = 0.5,
    ) -> None:
        if not 0 < fleet_refresh_s <= 1.0:
            raise ValueError("fleet_refresh_s must be in (0, 1]")
        self._policies = dict(policies)
        self._global_ceiling = global_ceiling
        self._global_gate = ResizableGate(global_ceiling)
        self._clock = clock
        self._fleet = fleet
        self._aimd_config = aimd or AimdConfig()
        self._fleet_refresh_s = fleet_refresh_s
        self._states: dict[str, _KeyState] = {}
        self._fleet_view: dict[str, FleetKeyState] = {}
        self._refresh_task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._closed = False

    @classmethod
    def from_catalog(cls, catalog: Catalog, **kwargs: Any) -> Governor:
        """A governor with one pacing key per provider of ``catalog``."""
        return cls({name: spec.pacing for name, spec in catalog.providers.items()}, **kwargs)

    # ------------------------------------------------------------------ admission

    def permit(self, keys: Sequence[str]) -> AbstractAsyncContextManager[Permit]:
        """Wait until EVERY key admits the call, then hold a :class:`Permit`.

        A key admits a call when it is not paused, has a concurrency slot and
        a rate token (and, with a fleet, a fleet ticket has come due). Slots
        are taken in sorted key order, so two calls over overlapping keys
        cannot deadlock; rate tokens of several keys are taken at one instant,
        so none is held (and aged) while waiting for another. Leaving the
        context releases the slots, also on error and cancellation. A waiter
        cancelled before admission consumes nothing locally (a fleet ticket
        already reserved is forfeit: that can only slow the fleet down).

        ``keys`` may be a single key string.
        """
        if isinstance(keys, str):
            keys = (keys,)
        unique = tuple(sorted(set(keys)))
        if not unique:
            raise ValueError("a permit needs at least one pacing key")
        return self._permit(unique)

    @contextlib.asynccontextmanager
    async def _permit(self, keys: tuple[str, ...]) -> AsyncIterator[Permit]:
        self._ensure_fleet_refresh()
        states = [self._state(key) for key in keys]
        gates: list[ResizableGate] = []
        tokens = False
        for state in states:
            state.waiting += 1
        try:
            for state in states:
                await state.gate.acquire()
                gates.append(state.gate)
            await self._global_gate.acquire()
            gates.append(self._global_gate)
            ticketed = self._fleet is None
            while True:
                await self._wait_unpaused(states)
                await self._take_tokens(states)
                tokens = True
                if not ticketed and not self._paused(states):
                    await self._take_fleet_tickets(states)
                    ticketed = True
                if self._paused(states):  # a cut landed while we waited
                    self._refund_tokens(states)
                    tokens = False
                    continue
                break
        except BaseException:
            if tokens:
                self._refund_tokens(states)
            for gate in reversed(gates):
                gate.release()
            raise
        finally:
            for state in states:
                state.waiting -= 1
        for state in states:
            state.in_flight += 1
        try:
            yield Permit(self, keys, tuple(state.aimd.epoch for state in states))
        finally:
            for state in states:
                state.in_flight -= 1
            for gate in reversed(gates):
                gate.release()

    def _paused(self, states: Sequence[_KeyState]) -> bool:
        now = self._clock()
        return any(state.aimd.pause_remaining(now) > 0 for state in states)

    async def _wait_unpaused(self, states: Sequence[_KeyState]) -> None:
        while True:
            now = self._clock()
            remaining = max(state.aimd.pause_remaining(now) for state in states)
            if remaining <= 0:
                return
            await asyncio.sleep(remaining)

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

    async def _take_fleet_tickets(self, states: Sequence[_KeyState]) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        for state in states:
            batcher = state.batcher
            if batcher is None:
                batcher = state.batcher = _TicketBatcher(self._require_fleet(), state)
            due = max(due, loop.time() + await batcher.ticket())
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)

    # ------------------------------------------------------------------ outcomes

    def _on_success(self, keys: Sequence[str], epochs: Sequence[int], latency_s: float) -> None:
        now = self._clock()
        for key, epoch in zip(keys, epochs, strict=True):
            state = self._state(key)
            state.successes += 1
            state.latency.observe(latency_s)
            if state.aimd.on_success(now, epoch):
                self._sync_limiter(state)
                if state.aimd.rate >= state.aimd.ceiling_rps:
                    log.info(
                        "pacing key %s recovered to its ceiling of %g rps", key, state.aimd.rate
                    )
                else:
                    log.debug("pacing key %s raised to %g rps", key, state.aimd.rate)
                self._report_increase(state)

    def _on_rate_limited(
        self, keys: Sequence[str], epochs: Sequence[int], retry_after_s: float | None
    ) -> None:
        now = self._clock()
        for key, epoch in zip(keys, epochs, strict=True):
            state = self._state(key)
            before = state.aimd.rate
            outcome = state.aimd.on_rate_limited(now, epoch, retry_after_s)
            if outcome is RateLimitOutcome.CUT:
                self._sync_limiter(state)
                pause_s = state.aimd.pause_remaining(now)
                log.warning(
                    "pacing key %s rate-limited by the provider: rate cut %g -> %g rps, "
                    "paused %.2f s (Retry-After: %s)",
                    key,
                    before,
                    state.aimd.rate,
                    pause_s,
                    "none" if retry_after_s is None else f"{retry_after_s:g} s",
                )
                self._report_cut(state, pause_s)
            else:
                log.debug("pacing key %s: 429 from a call sent before the last cut", key)

    def _on_failure(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._state(key).failures += 1

    # ------------------------------------------------------------------ limits

    def suggested_parallelism(self, key: str) -> int:
        """How many calls to keep in flight for ``key`` (Little's law).

        ``ceil(rate in force x latency EWMA)``, floored at 1, capped by the
        key's ``max_concurrency`` and the global ceiling. Before any call of
        the key completed, the latency is the prior ``LATENCY_PRIOR_S``, so a
        start-up burst stays small and grows as latencies come in.
        """
        state = self._state(key)
        cap = min(state.policy.max_concurrency, self._global_ceiling)
        return little_width(state.aimd.rate, state.latency.value, cap=cap)

    def set_limit(
        self,
        key: str,
        *,
        rps: float | None = None,
        max_concurrency: int | None = None,
        burst: int | None = None,
    ) -> None:
        """Change a key's limits in this process, for waiting and future calls.

        A new ``rps`` becomes both the ceiling and the rate in force (what AIMD
        had learnt is discarded: the operator has spoken). Lowering
        ``max_concurrency`` revokes no call in flight; it admits nobody until
        enough have finished. Fleet-wide limits are set with ``playline
        limits set`` (:meth:`FleetPacer.set_limits`) instead.
        """
        state = self._state(key)
        update: dict[str, Any] = {}
        if rps is not None:
            update["rps"] = rps
        if max_concurrency is not None:
            update["max_concurrency"] = max_concurrency
        if burst is not None:
            update["burst"] = burst
        if not update:
            return
        policy = PacingPolicy.model_validate({**state.policy.model_dump(), **update})
        state.policy = policy
        if rps is not None:
            state.aimd.set_ceiling(policy.rps, self._clock())
        self._sync_limiter(state)
        state.gate.resize(policy.max_concurrency)
        log.info(
            "pacing key %s limits set: %g rps, burst %d, max concurrency %d",
            key,
            policy.rps,
            policy.burst,
            policy.max_concurrency,
        )

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """The state of every configured key and every key used so far.

        Per key: ``rps`` (configured ceiling), ``rate_rps`` (rate in force),
        ``min_rps``, ``burst``, ``max_concurrency``, ``in_flight``, ``waiting``,
        ``rate_limited`` (429s recorded), ``cuts``, ``pauses``, ``increases``,
        ``paused_until`` (seconds from now, or ``None``), ``latency_ewma_s``
        (``None`` before the first success), ``successes``, ``failures``,
        ``suggested_parallelism``.
        """
        now = self._clock()
        out: dict[str, dict[str, Any]] = {}
        for key in sorted(self._policies.keys() | self._states.keys()):
            state = self._state(key)
            aimd = state.aimd
            remaining = aimd.pause_remaining(now)
            out[key] = {
                "rps": state.policy.rps,
                "rate_rps": aimd.rate,
                "min_rps": state.policy.min_rps,
                "burst": state.policy.burst,
                "max_concurrency": state.policy.max_concurrency,
                "in_flight": state.in_flight,
                "waiting": state.waiting,
                "rate_limited": aimd.rate_limited,
                "cuts": aimd.cuts,
                "pauses": aimd.pauses,
                "increases": aimd.increases,
                "paused_until": remaining if remaining > 0 else None,
                "latency_ewma_s": state.latency.observed,
                "successes": state.successes,
                "failures": state.failures,
                "suggested_parallelism": self.suggested_parallelism(key),
            }
        return out

    async def start(self) -> None:
        """Start reading fleet limits now rather than at the first permit."""
        self._ensure_fleet_refresh()
        if self._fleet is not None:
            await self._refresh_once()

    async def aclose(self) -> None:
        """Stop the fleet refresh and wait briefly for outstanding fleet reports."""
        self._closed = True
        task, self._refresh_task = self._refresh_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        pending = [t for t in self._background if not t.done()]
        if pending:
            _, late = await asyncio.wait(pending, timeout=2.0)
            for t in late:
                t.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    # ------------------------------------------------------------------ internals

    def _state(self, key: str) -> _KeyState:
        state = self._states.get(key)
        if state is None:
            policy = self._policies.get(key) or PacingPolicy()
            state = _KeyState(
                key=key,
                policy=policy,
                aimd=AimdController(policy.rps, policy.min_rps, self._aimd_config),
                limiter=_AdjustableLimiter(policy.rps, policy.burst),
                gate=ResizableGate(policy.max_concurrency),
            )
            self._states[key] = state
            view = self._fleet_view.get(key)
            if view is not None:
                self._apply_fleet(state, view)
        return state

    def _sync_limiter(self, state: _KeyState) -> None:
        state.limiter.reconfigure(state.aimd.rate, state.policy.burst)

    def _require_fleet(self) -> FleetPacer:
        if self._fleet is None:  # pragma: no cover - guarded by callers
            raise RuntimeError("fleet pacing is not configured")
        return self._fleet

    # --- fleet: background refresh and reports

    def _ensure_fleet_refresh(self) -> None:
        if self._fleet is None or self._closed or self._refresh_task is not None:
            return
        self._refresh_task = asyncio.get_running_loop().create_task(
            self._refresh_loop(), name="playline-governor-fleet-refresh"
        )

    async def _refresh_loop(self) -> None:
        while True:
            try:
                await self._refresh_once()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # keep pacing on local limits; retry next tick
                log.warning("fleet pacing refresh failed (%s); retrying", err)
            await asyncio.sleep(self._fleet_refresh_s)

    async def _refresh_once(self) -> None:
        view = await self._require_fleet().read_state()
        self._fleet_view = view
        for key, key_view in view.items():
            state = self._states.get(key)
            if state is not None:
                self._apply_fleet(state, key_view)

    def _apply_fleet(self, state: _KeyState, view: FleetKeyState) -> None:
        """Apply the fleet's limits, then its shared adapted rate, to one key."""
        limits = view.limits
        if limits is not None:
            wanted = (limits.rps, limits.burst, limits.max_concurrency)
            if wanted != state.fleet_limits:
                state.fleet_limits = wanted
                current = (state.policy.rps, state.policy.burst, state.policy.max_concurrency)
                if wanted != current:
                    log.info("pacing key %s: applying fleet limits", state.key)
                    self.set_limit(
                        state.key,
                        rps=limits.rps,
                        burst=limits.burst,
                        max_concurrency=limits.max_concurrency,
                    )
        if view.rate is not None:
            self._adopt_rate(state, view.rate)

    def _adopt_rate(self, state: _KeyState, rate: FleetRate) -> None:
        """Follow the shared rate when it is newer than what this worker saw.

        Cuts bump the row's epoch; increases only raise ``rps`` within an
        epoch. So a row is newer if its epoch is higher, or equal with a
        higher rate; anything else is a stale read racing our own write.
        """
        seen = state.fleet_seen
        if seen is not None and (rate.epoch, rate.rps) <= seen:
            return
        state.fleet_seen = (rate.epoch, rate.rps)
        before = state.aimd.rate
        if state.aimd.adopt(rate.rps, self._clock()):
            self._sync_limiter(state)
            log.info(
                "pacing key %s follows the fleet rate: %g -> %g rps",
                state.key,
                before,
                state.aimd.rate,
            )

    def _report_cut(self, state: _KeyState, pause_s: float) -> None:
        if self._fleet is None:
            return
        fleet, rate, floor = self._fleet, state.aimd.rate, state.aimd.floor_rps

        async def report() -> None:
            shared = await fleet.report_cut(state.key, rate, min_rps=floor, pause_s=pause_s)
            self._adopt_rate(state, shared)

        self._spawn(report(), f"report a rate cut of {state.key}")

    def _report_increase(self, state: _KeyState) -> None:
        if self._fleet is None or state.fleet_seen is None:
            return  # not synchronised with the fleet yet: the next refresh decides
        fleet, rate, ceiling = self._fleet, state.aimd.rate, state.aimd.ceiling_rps
        epoch = state.fleet_seen[0]

        async def report() -> None:
            shared = await fleet.report_increase(state.key, rate, ceiling_rps=ceiling, epoch=epoch)
            if shared is not None:
                self._adopt_rate(state, shared)

        self._spawn(report(), f"report a rate increase of {state.key}")

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:  # no loop: nothing in flight to report for
            coro.close()
            return
        self._background.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._background.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.warning("fleet pacing: could not %s: %s", what, t.exception())

        task.add_done_callback(done)


class _TicketBatcher:
    """Coalesces concurrent fleet-ticket requests of one key into blocks.

    A block is taken with one database round trip and covers exactly the
    callers waiting at that moment, each of which has already passed every
    local check and dispatches as soon as its ticket is due. Callers that
    arrive while a block is being fetched go into the next block. A caller
    cancelled before its block was fetched is left out of it.
    """

    def __init__(self, fleet: FleetPacer, state: _KeyState) -> None:
        self._fleet = fleet
        self._state = state
        self._pending: list[asyncio.Future[float]] = []
        self._drainer: asyncio.Task[None] | None = None

    async def ticket(self) -> float:
        """Seconds from now until this caller's ticket is due."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[float] = loop.create_future()
        self._pending.append(fut)
        if self._drainer is None:
            self._drainer = loop.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        try:
            while self._pending:
                block = [fut for fut in self._pending if not fut.done()]
                self._pending = []
                if not block:
                    continue
                policy = self._state.policy
                try:
                    delays = await self._fleet.take_many(
                        self._state.key, len(block), rps=policy.rps, burst=policy.burst
                    )
                except Exception as err:
                    for fut in block:
                        if not fut.done():
                            fut.set_exception(err)
                    continue
                # The delays count from when the database ran the statement; using
                # them from now (a half round trip later) errs on the slow side.
                for fut, delay in zip(block, delays, strict=True):
                    if not fut.done():
                        fut.set_result(delay)
        finally:
            self._drainer = None
