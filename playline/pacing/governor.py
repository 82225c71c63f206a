"""The governor: one per worker process, between every tool call and its provider.

Providers are paid and rate-limited, so a worker must never send faster than a
provider allows, and should go as fast as it does allow. The governor holds,
per **pacing key** (a provider name, or a compound key such as
``"acme:key=ab12cd"`` for one API key of a provider):

* a rate limiter (an :class:`aiolimiter.AsyncLimiter`, ``burst`` calls back to
  back, then ``rps`` per second),
* a concurrency gate (at most ``max_concurrency`` calls in flight),
* an AIMD controller (:class:`~playline.pacing.aimd.AimdController`) that
  halves the rate in force on a 429 (once per burst), pauses the key for the
  provider's ``Retry-After``, and grows the rate back additively on success,
* a latency average, from which it suggests how many calls to keep in flight.

All of them can change while calls are waiting (``set_limit``, AIMD, fleet
limits), and every change applies to waiting calls too.

With a :class:`~playline.pacing.fleet_store.FleetPacer` the governor also
takes a GCRA ticket from PostgreSQL for each call, so that N workers together
stay inside one provider budget, shares its rate cuts with the fleet, and
applies the limits that ``playline limits set`` writes, within a second. All of
that lives in :class:`~playline.pacing.fleet_sync.FleetSync`; the governor only
asks it for tickets and tells it about cuts and increases.

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
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from playline.pacing.aimd import (
    AimdConfig,
    AimdController,
    Ewma,
    RateLimitOutcome,
    little_width,
)
from playline.pacing.gate import ResizableGate
from playline.pacing.limiter import AdjustableLimiter
from playline.pacing.policy import PacingPolicy

if TYPE_CHECKING:
    from playline.pacing.fleet_store import FleetPacer
    from playline.pacing.fleet_sync import FleetSync

__all__ = ["Governor", "Permit"]

log = logging.getLogger("playline.governor")

#: Latency assumed before a key has completed a call: small, so that the first
#: dispatch width (``rate x latency``) is a trickle, not the whole chunk.
LATENCY_PRIOR_S = 0.25


@dataclass(eq=False)
class _KeyState:
    """Everything the governor knows about one pacing key."""

    key: str
    policy: PacingPolicy
    aimd: AimdController
    limiter: AdjustableLimiter
    gate: ResizableGate
    latency: Ewma = field(default_factory=lambda: Ewma(prior=LATENCY_PRIOR_S))
    in_flight: int = 0
    waiting: int = 0
    successes: int = 0
    failures: int = 0


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
        fleet: share pacing with other workers through PostgreSQL (see
            :class:`~playline.pacing.fleet_sync.FleetSync`). The governor does
            not own the store: close it after :meth:`aclose`.
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
        self._policies = dict(policies)
        self._global_ceiling = global_ceiling
        self._global_gate = ResizableGate(global_ceiling)
        self._clock = clock
        self._aimd_config = aimd or AimdConfig()
        self._states: dict[str, _KeyState] = {}
        self._fleet: FleetSync | None = None
        if fleet is not None:
            from playline.pacing.fleet_sync import FleetSync

            self._fleet = FleetSync(fleet, self, refresh_s=fleet_refresh_s)

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
        if self._fleet is not None:
            self._fleet.ensure_running()
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
                    assert self._fleet is not None
                    await self._fleet.wait_for_tickets(keys)
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
                if self._fleet is not None:
                    self._fleet.report_increase(key, state.aimd.rate, state.aimd.ceiling_rps)

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
                if self._fleet is not None:
                    self._fleet.report_cut(key, state.aimd.rate, state.aimd.floor_rps, pause_s)
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
        limits set`` (:meth:`~playline.pacing.fleet_store.FleetPacer.set_limits`) instead.
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

    def policy(self, key: str) -> PacingPolicy:
        """The limits in force for ``key`` (its catalog policy, or as changed since)."""
        return self._state(key).policy

    def has_key(self, key: str) -> bool:
        """Whether ``key`` has been configured or used in this process."""
        return key in self._states

    def rate_in_force(self, key: str) -> float | None:
        """The rate in force for ``key``, requests per second."""
        return self._state(key).aimd.rate

    def adopt_rate(self, key: str, rps: float) -> bool:
        """Pace ``key`` at a rate learnt elsewhere (another worker of the fleet).

        Clamped to the key's floor and ceiling; a lower rate starts a new epoch
        (see :meth:`AimdController.adopt`). Returns whether the rate changed.
        """
        state = self._state(key)
        before = state.aimd.rate
        if not state.aimd.adopt(rps, self._clock()):
            return False
        self._sync_limiter(state)
        log.info("pacing key %s follows the fleet rate: %g -> %g rps", key, before, state.aimd.rate)
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
                aimd=AimdController(policy.rps, policy.min_rps, self._aimd_config),
                limiter=AdjustableLimiter(policy.rps, policy.burst),
                gate=ResizableGate(policy.max_concurrency),
            )
            self._states[key] = state
            if self._fleet is not None:
                self._fleet.key_created(key)
        return state

    def _sync_limiter(self, state: _KeyState) -> None:
        state.limiter.reconfigure(state.aimd.rate, state.policy.burst)
