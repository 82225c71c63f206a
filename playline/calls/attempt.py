"""What every tool call of one chunk attempt shares: its leases, its breaker, its tally.

A chunk attempt (one Temporal activity attempt) owns one :class:`Attempt`. The
runner and every dispatcher receive it and use only its public methods:

* :class:`LeaseKeeper` - the receipt keys this attempt has claimed and not yet
  settled; the chunk's heartbeat renews them all, and a renewal that finds
  another owner marks the attempt's lease as lost;
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
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from playline.errors import (
    FixtureMissing,
    LeaseLost,
    PersistenceCircuitOpen,
    PlaylineError,
    ProviderError,
)
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
    retries: int = 0
    credits: float = 0.0


class CallSpan(Protocol):
    """The trace span of one tool call; its outcome is recorded when it closes."""

    def receipt(self, status: str) -> None:
        """How the receipt store answered: ``hit``, ``miss``, ``waited`` or ``shared``."""
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
    """The receipt keys an attempt holds leases on and has not settled yet."""

    def __init__(self) -> None:
        self._held: dict[str, int] = {}  # key -> blocks holding it (a plain dict: hot path)
        self.lost: LeaseLost | None = None

    def keys(self) -> list[str]:
        return sorted(self._held)

    @contextlib.contextmanager
    def holding(self, keys: Iterable[str]) -> Iterator[None]:
        """Keep ``keys`` renewed by the heartbeat while the block runs (blocks may nest)."""
        keys = list(keys)
        held = self._held
        for key in keys:
            held[key] = held.get(key, 0) + 1
        try:
            yield
        finally:
            for key in keys:
                left = held.get(key, 0) - 1
                if left > 0:
                    held[key] = left
                else:
                    held.pop(key, None)

    async def renew(self, receipts: ReceiptStore, *, lease_id: str, ttl_s: float) -> None:
        """Renew every held key; record ``LeaseLost`` if another owner took one."""
        keys = self.keys()
        if not keys:
            return
        owned = await receipts.renew(keys, lease_id=lease_id, ttl_s=ttl_s)
        for key, still_owned in zip(keys, owned, strict=True):
            # A call that settled while the renewal was in flight no longer needs
            # its lease; only a still-held key counts as lost.
            if not still_owned and key in self._held and self.lost is None:
                self.lost = LeaseLost(
                    f"receipt {key} is now held by another owner; this chunk attempt "
                    "stops dispatching and Temporal will retry it"
                )


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
    """

    receipts: ReceiptStore
    owner: str
    lease_id: str
    lease_ttl_s: float
    metrics: CallMetrics = field(default_factory=NoMetrics)
    max_wait_s: float | None = None
    park_after_s: float | None = None
    stats: CallStats = field(default_factory=CallStats)
    latch: PersistenceLatch = field(default_factory=PersistenceLatch)
    leases: LeaseKeeper = field(default_factory=LeaseKeeper)

    def __post_init__(self) -> None:
        if self.max_wait_s is None:
            self.max_wait_s = 4 * self.lease_ttl_s

    def check_before_dispatch(self) -> None:
        """Raise instead of dispatching when the lease is lost or persistence failed."""
        if self.leases.lost is not None:
            raise self.leases.lost
        if self.latch.tripped:
            self.latch.prevented += 1
            raise self.latch.error()

    async def persist(self, write: Awaitable[T]) -> T:
        """Run a store write; a failure trips the latch so nothing more is dispatched."""
        try:
            return await write
        except PlaylineError:
            raise
        except Exception as err:
            raise self.latch.trip(f"{type(err).__name__}: {err}") from err

    async def renew_leases(self) -> None:
        """Renew every unsettled claim (driven by the chunk's heartbeat)."""
        await self.leases.renew(self.receipts, lease_id=self.lease_id, ttl_s=self.lease_ttl_s)

    async def record(self, key: str, send: Callable[[], Awaitable[Any]], *, credits: float) -> Any:
        """Obtain a claimed call's result with ``send`` and record it under the lease.

        A typed provider or fixture failure is recorded as a failed receipt (a
        later claim retries it) and re-raised; a result is recorded as completed,
        fenced by the lease, before it is returned, so a row is never reported
        done with a result that is not durable.
        """
        try:
            data = await send()
        except (ProviderError, FixtureMissing) as err:
            self.stats.failed += 1
            await self.persist(self.receipts.fail(key, lease_id=self.lease_id, error=str(err)))
            raise
        recorded = await self.persist(
            self.receipts.complete(key, lease_id=self.lease_id, result=data, credits=credits)
        )
        if not recorded:
            raise LeaseLost(f"receipt {key} was taken over before its result was recorded")
        return data


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
