"""What every tool call of one chunk attempt shares: its leases, its breaker, its tally.

A chunk attempt (one Temporal activity attempt) owns one :class:`Attempt`. The
runner and every dispatcher receive it and use only its public methods:

* :class:`LeaseKeeper` - the receipt keys this attempt has claimed and not yet
  settled, with how long each lease is known to last; a renewal task renews them
  all, a renewal that finds another owner marks the attempt's lease as lost (no
  new dispatch; calls in flight finish and record), and no call is sent under a
  lease with less than its timeout left;
* :class:`PersistenceLatch` - the persistence circuit breaker: the first failed
  receipt or sheet write trips it, after which no provider call is dispatched
  and every call held back is counted;
* :class:`CallStats` - what the calls cost, summed into the play's accounting;
* :class:`CallMetrics` - where per-call metrics and spans go (the worker's Temporal
  meter and OpenTelemetry inside an activity, nowhere otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from playline.calls.accounting import ProviderCounts
from playline.errors import LeaseLost, PersistenceCircuitOpen, PlaylineError
from playline.stores.journal import ResultJournal
from playline.stores.receipts import ReceiptStore

__all__ = [
    "Attempt",
    "CallMetrics",
    "CallSpan",
    "CallStats",
    "LeaseKeeper",
    "NoMetrics",
    "PersistenceLatch",
    "until_released",
]

T = TypeVar("T")

logger = logging.getLogger("playline.calls")


@dataclass
class CallStats:
    """What a chunk's tool calls cost; summed into the play's summary."""

    made: int = 0  # provider requests that produced a result (paid)
    cached: int = 0  # answered by a completed receipt (free)
    shared: int = 0  # answered by an identical call in flight in this chunk (free)
    waited: int = 0  # answered by another live owner's call (free)
    failed: int = 0
    #: calls this attempt found (or left) ambiguous: sent, no definitive answer, not re-sent
    ambiguous: int = 0
    retries: int = 0
    credits: float = 0.0
    #: the account with each provider (:mod:`playline.calls.accounting` defines the terms)
    by_provider: dict[str, ProviderCounts] = field(default_factory=dict)

    def account(self, provider: str) -> ProviderCounts:
        """``provider``'s counts in this attempt (created at its first use)."""
        counts = self.by_provider.get(provider)
        if counts is None:
            counts = self.by_provider[provider] = ProviderCounts()
        return counts


class CallSpan(Protocol):
    """The trace span of one tool call; its outcome is recorded when it closes."""

    def receipt(self, status: str) -> None:
        """How the receipt store answered: ``hit``, ``miss``, ``waited``, ``shared`` or
        ``ambiguous`` (sent earlier, may have been charged: not sent again)."""
        ...


class CallMetrics(Protocol):
    """Where per-call metrics and spans go; :mod:`playline.telemetry` has the Temporal one.

    Every method is called on the call path, so none may block or raise.
    """

    def call(self, provider: str, tool: str, outcome: str, latency_s: float | None = None) -> None:
        """One provider request ended with ``outcome`` after ``latency_s``."""
        ...

    def rate(self, provider: str, rps: float | None) -> None:
        """The governor's rate in force for ``provider`` now."""
        ...

    def receipt(self, provider: str, tool: str, status: str) -> None:
        """A claimed call's receipt: ``hit`` (free), ``miss`` (dispatched) or ``waited``."""
        ...

    def credits(self, provider: str, tool: str, credits: float) -> None:
        """A paid request charged ``credits``."""
        ...

    def request(self, provider: str, tool: str, *, replayed: bool) -> None:
        """A request went out to ``provider`` (``replayed``: its answer was a replay)."""
        ...

    def saved(self, provider: str, tool: str, credits: float) -> None:
        """A completed receipt answered a call free; it had cost ``credits``."""
        ...

    def overshoot(self, tool: str) -> None:
        """A call settled above what its budget reserved for it."""
        ...

    def governor_wait(self, provider: str, waited_s: float) -> None:
        """A request waited ``waited_s`` for the governor's permit."""
        ...

    def span(self, provider: str, tool: str) -> AbstractContextManager[CallSpan]:
        """The span of one tool call (an exception leaving it is its outcome)."""
        ...


class _NoSpan:
    def receipt(self, status: str) -> None:
        return None


class NoMetrics:
    """Metrics that go nowhere (scripts, unit tests)."""

    def call(self, provider: str, tool: str, outcome: str, latency_s: float | None = None) -> None:
        return None

    def rate(self, provider: str, rps: float | None) -> None:
        return None

    def receipt(self, provider: str, tool: str, status: str) -> None:
        return None

    def credits(self, provider: str, tool: str, credits: float) -> None:
        return None

    def request(self, provider: str, tool: str, *, replayed: bool) -> None:
        return None

    def saved(self, provider: str, tool: str, credits: float) -> None:
        return None

    def overshoot(self, tool: str) -> None:
        return None

    def governor_wait(self, provider: str, waited_s: float) -> None:
        return None

    def span(self, provider: str, tool: str) -> AbstractContextManager[CallSpan]:
        return contextlib.nullcontext(_NoSpan())


@dataclass
class PersistenceLatch:
    """Trips on the first failed receipt or sheet write; then nothing is dispatched.

    ``prevented`` counts every provider call held back after the trip (refused at
    dispatch or at claim); ``rows_held_back`` the rows that never started because of it.
    """

    cause: str | None = None
    prevented: int = 0
    rows_held_back: int = 0

    @property
    def tripped(self) -> bool:
        return self.cause is not None

    def trip(self, cause: str) -> PersistenceCircuitOpen:
        """Record the first cause (later ones are ignored); return the error to raise."""
        if self.cause is None:
            self.cause = cause
            logger.error("a store write failed; no further provider calls in this chunk: %s", cause)
        return self.error()

    def error(self) -> PersistenceCircuitOpen:
        """The error to raise now, with the counts so far."""
        return PersistenceCircuitOpen(self.cause or "", self.prevented, self.rows_held_back)


class LeaseKeeper:
    """The receipt keys an attempt holds leases on and has not settled yet.

    For each key it also knows until when (``time.monotonic()``) its lease is
    certainly valid: the start of the claim or renewal that last confirmed it plus
    the lease TTL. A call is not sent under a lease about to lapse (see
    :meth:`Attempt.check_before_dispatch`).
    """

    def __init__(self) -> None:
        self._held: dict[str, int] = {}  # key -> blocks holding it (a plain dict: hot path)
        self._valid_until: dict[str, float] = {}
        self.lost: LeaseLost | None = None

    def keys(self) -> list[str]:
        return sorted(self._held)

    @contextlib.contextmanager
    def holding(self, keys: Iterable[str], *, valid_until: float | None = None) -> Iterator[None]:
        """Keep ``keys`` renewed while the block runs (blocks may nest); ``valid_until``
        is when the claim that took them lapses unless renewed."""
        keys = list(keys)
        held, valid = self._held, self._valid_until
        for key in keys:
            held[key] = held.get(key, 0) + 1
            if valid_until is not None and valid_until > valid.get(key, 0.0):
                valid[key] = valid_until
        try:
            yield
        finally:
            for key in keys:
                left = held.get(key, 0) - 1
                if left > 0:
                    held[key] = left
                else:
                    held.pop(key, None)
                    valid.pop(key, None)

    def confirm(self, keys: Iterable[str], valid_until: float) -> None:
        """The store just confirmed these leases until ``valid_until`` (monotonic)."""
        valid, held = self._valid_until, self._held
        for key in keys:
            if key in held and valid_until > valid.get(key, 0.0):
                valid[key] = valid_until

    def time_left(self, key: str, now: float) -> float:
        """Seconds the lease on ``key`` is certainly valid for (``inf`` if untracked)."""
        until = self._valid_until.get(key)
        return float("inf") if until is None else until - now

    async def renew(self, receipts: ReceiptStore, *, lease_id: str, ttl_s: float) -> None:
        """Renew every held key; record ``LeaseLost`` if another owner took one."""
        keys = self.keys()
        if not keys:
            return
        started = time.monotonic()
        owned = await receipts.renew(keys, lease_id=lease_id, ttl_s=ttl_s)
        confirmed = []
        for key, still_owned in zip(keys, owned, strict=True):
            if still_owned:
                confirmed.append(key)
            # A call that settled while the renewal was in flight no longer needs
            # its lease; only a still-held key counts as lost.
            elif key in self._held and self.lost is None:
                self.lost = LeaseLost(
                    f"receipt {key} is now held by another owner; this chunk attempt "
                    "starts no new call (those in flight finish) and Temporal will retry it"
                )
        self.confirm(confirmed, started + ttl_s)


#: How many times a write that only helps (a failure, a release) is tried.
BEST_EFFORT_TRIES = 3


@dataclass
class Attempt:
    """One chunk attempt's identity and shared state (see the module docstring).

    Args:
        receipts: the receipt store.
        owner: who holds the leases, for humans (``workflow/activity#attempt``).
        lease_id: the fencing token of this attempt's leases.
        lease_ttl_s: how long a lease lives without renewal (the heartbeat timeout).
        max_wait_s: how long a call waits for another live owner's lease before
            giving up (default ``4 x lease_ttl_s``).
        park_after_s: a call whose provider cannot admit it within this many
            seconds raises ``ProviderQuotaExhausted`` instead of waiting (its
            receipt released), so the caller can park durably; ``None`` never parks.
        force_token: the run this attempt belongs to (the same for every attempt of
            a chunk): a receipt the run already forced is the answer of its forced
            calls, so a retried chunk does not pay for them again.
        retry_ambiguous: re-send calls whose receipts are ambiguous (the user asked).
        settle_patience_s: how long a paid result's write is retried while the store
            fails before it is journalled (``journal``) and the attempt gives up.
        journal: where paid results the store would not take are kept until it
            takes them (``None``: nowhere; the attempt keeps retrying them instead).
    """

    receipts: ReceiptStore
    owner: str
    lease_id: str
    lease_ttl_s: float
    metrics: CallMetrics = field(default_factory=NoMetrics)
    max_wait_s: float | None = None
    park_after_s: float | None = None
    force_token: str | None = None
    retry_ambiguous: bool = False
    settle_patience_s: float = 300.0
    journal: ResultJournal | None = None
    stats: CallStats = field(default_factory=CallStats)
    latch: PersistenceLatch = field(default_factory=PersistenceLatch)
    leases: LeaseKeeper = field(default_factory=LeaseKeeper)

    def __post_init__(self) -> None:
        if self.max_wait_s is None:
            self.max_wait_s = 4 * self.lease_ttl_s

    def check_before_dispatch(self, keys: Iterable[str] = (), *, timeout_s: float = 0.0) -> None:
        """Raise instead of sending when the lease is lost, persistence failed, or a
        lease the call needs may lapse before the call can time out.

        The margin is the call's timeout, at most a third of the TTL (the renewal
        period): a healthy attempt always has that much left, one whose renewals are
        failing stops sending before another owner could take its calls over.
        """
        if self.leases.lost is not None:
            raise self.leases.lost
        if self.latch.tripped:
            self.latch.prevented += 1
            raise self.latch.error()
        if keys:
            now = time.monotonic()
            margin = min(timeout_s, self.lease_ttl_s / 3)
            for key in keys:
                left = self.leases.time_left(key, now)
                if left < margin:
                    raise LeaseLost(
                        f"the lease on receipt {key} has {max(left, 0):.1f}s left, less than "
                        f"the call needs ({margin:g}s): its renewals are failing, so this "
                        "chunk attempt sends nothing more and Temporal retries it"
                    )

    async def mark_sent(self, keys: Sequence[str]) -> None:
        """Record that these calls go out now (tools that do not de-duplicate) and
        refresh their leases; ``LeaseLost`` if one is no longer ours (do not send)."""
        started = time.monotonic()
        marked = await self.persist(
            self.receipts.mark_sent(keys, lease_id=self.lease_id, ttl_s=self.lease_ttl_s)
        )
        lost = [key for key, ok in zip(keys, marked, strict=True) if not ok]
        if lost:
            raise LeaseLost(f"receipt {lost[0]} was taken over before it was sent; not sending")
        self.leases.confirm(keys, started + self.lease_ttl_s)

    async def persist(self, write: Awaitable[T]) -> T:
        """Run a store write; a failure trips the latch so nothing more is dispatched."""
        try:
            return await write
        except PlaylineError:
            raise
        except Exception as err:
            raise self.latch.trip(f"{type(err).__name__}: {err}") from err

    async def durably(self, write: Callable[[], Awaitable[T]], *, what: str) -> T:
        """Run a write that must not be lost (a paid result), retrying while the store
        fails, for up to ``settle_patience_s``.

        The first failure trips the latch (no new call is dispatched); the leases stay
        renewed meanwhile by the attempt's renewal task, so nobody takes the call over.
        """
        deadline = time.monotonic() + self.settle_patience_s
        delay = 0.1
        while True:
            try:
                return await write()
            except PlaylineError:
                raise
            except Exception as err:
                self.latch.trip(f"{type(err).__name__}: {err}")
                if time.monotonic() + delay > deadline:
                    raise
                logger.warning("%s failed, retrying in %.1fs: %s", what, delay, err)
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 2)

    async def best_effort(self, write: Callable[[], Awaitable[Any]], *, what: str) -> None:
        """A write whose loss costs nothing (a failure, a release): a few tries, then
        the receipt's lease simply expires (a sent call then reads as ambiguous)."""
        for attempt in range(1, BEST_EFFORT_TRIES + 1):
            try:
                await write()
                return
            except PlaylineError:
                raise
            except Exception as err:
                self.latch.trip(f"{type(err).__name__}: {err}")
                if attempt == BEST_EFFORT_TRIES:
                    logger.warning("%s not recorded (the lease will expire): %s", what, err)
                    return
                await asyncio.sleep(0.1 * attempt)

    async def renew_leases(self) -> None:
        """Renew every unsettled claim (driven by the attempt's renewal task)."""
        await self.leases.renew(self.receipts, lease_id=self.lease_id, ttl_s=self.lease_ttl_s)


async def until_released(
    poll: Callable[[], Awaitable[T | None]], *, max_wait_s: float, what: str
) -> T:
    """Poll while another live owner holds a lease; its answer, or ``LeaseLost``.

    ``poll`` returns ``None`` while the other owner still holds the lease and a
    value once it is released (a completed result, or a lease of our own). The
    one wait loop shared by single calls and bulk batches.
    """
    deadline = time.monotonic() + max_wait_s
    while True:
        found = await poll()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise LeaseLost(
                f"{what} stayed held by another owner for over {max_wait_s:g}s; "
                "retrying the chunk later"
            )
        await asyncio.sleep(0.1 + random.random() * 0.2)
