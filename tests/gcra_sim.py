"""A deterministic simulation of the governor against a strict GCRA provider.

The real :class:`~playline.pacing.governor.Governor` (its search, limiter, spacing and
pauses, unchanged) runs on an event loop whose clock is virtual: when every task
waits, the loop jumps to the next timer instead of sleeping. So a minute of calls at
60/s simulates in a fraction of a second of CPU, and the same seed gives the same run
(nothing depends on the machine's load). Unit tests and tuning use it; the benchmark
(``bench/governor.py``) measures the real thing.

The provider is a strict GCRA (ITU-T virtual scheduling, no slack, as the benchmark's
``StrictLimits``): ``rate`` per second, ``burst`` back to back, a refusal answered at
once with ``Retry-After`` in whole seconds (at least 1). Between the governor and it:
a send delay in two parts, the provider's latency for admitted calls (uniform), a
quick answer for refused ones. The first part of the delay is the worker's (its event
loop: a small jitter, now and then a late call, a stall); at its end the call path
stamps the send (``playline.pacing.sending.note_sending``, as the HTTP client does
just before writing the request; ``stamp=False`` leaves it out). The second part
happens after the stamp, where the worker cannot see it (the network, the provider's
own event loop): a small jitter and, for ``wire_late_share`` of the calls, 2-10 ms
more.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import selectors
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from playline.pacing.governor import Governor
from playline.pacing.policy import PacingPolicy
from playline.pacing.sending import note_sending

__all__ = ["SimProvider", "SimResult", "simulate"]


class _VirtualSelector(selectors.DefaultSelector):
    """Polls without blocking; a wait with nothing ready moves the virtual clock.

    Every pass of the loop also takes a microsecond, as a real one does: a timer due
    within float noise of now (aiolimiter computes some) then still comes due.
    """

    def __init__(self, clock: list[float]) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if not ready and timeout is None:
            raise RuntimeError("simulation deadlock: every task waits and no timer is set")
        self._clock[0] += 1e-6 if ready or timeout is None else max(timeout, 1e-6)
        return ready


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` is virtual and whose idle waits take no time."""

    def __init__(self) -> None:
        self._virtual = [1000.0]
        super().__init__(selector=_VirtualSelector(self._virtual))

    def time(self) -> float:
        return self._virtual[0]


@dataclass
class SimProvider:
    """A strict GCRA with the benchmark's answers (see the module docstring)."""

    rate: float
    burst: int
    latency_s: tuple[float, float] = (0.02, 0.08)
    refusal_s: float = 0.002
    tat: float | None = None
    #: (arrival, status) of every call, on the virtual clock
    calls: list[tuple[float, int]] = field(default_factory=list)

    def admit(self, now: float) -> float | None:
        """``None`` if admitted, else the whole seconds of ``Retry-After``."""
        interval = 1.0 / self.rate
        tat = now if self.tat is None else self.tat
        earliest = tat - (self.burst - 1) * interval
        if now < earliest:
            self.calls.append((now, 429))
            return float(max(1, math.ceil(earliest - now)))
        self.tat = max(now, tat) + interval
        self.calls.append((now, 200))
        return None


@dataclass
class SimResult:
    """What the provider saw, and the governor's snapshot at the end."""

    calls: list[tuple[float, int]]
    rate: float
    snapshot: dict[str, Any]
    governor: Governor

    @property
    def admitted(self) -> list[float]:
        return [t for t, status in self.calls if status != 429]

    @property
    def refused(self) -> int:
        return sum(1 for _, status in self.calls if status == 429)

    @property
    def share_429(self) -> float:
        return self.refused / max(1, len(self.calls))

    @property
    def utilization(self) -> float:
        """Calls admitted per second / the rate, first to last arrival (the benchmark's)."""
        ok = self.admitted
        if len(ok) < 2:
            return 0.0
        return (len(ok) - 1) / (ok[-1] - ok[0]) / self.rate

    def first_gaps(self, n: int) -> list[float]:
        """The gaps between the first ``n + 1`` calls' arrivals."""
        times = [t for t, _ in self.calls[: n + 1]]
        return [b - a for a, b in itertools.pairwise(times)]


def _send_delay(rng: random.Random, late_share: float) -> float:
    """The worker's event loop: under a millisecond, now and then 4-20 ms late.

    Shaped on the benchmark machine's loopback: a bare client spacing calls 52 ms apart
    saw server-side gaps of 50.8 ms at the 1 % quantile and 48.9 ms at the 0.1 %.
    """
    delay = 0.0003 + rng.expovariate(1 / 0.0002)
    if rng.random() < late_share:
        delay += rng.uniform(0.004, 0.020)
    return delay


def _wire_delay(rng: random.Random, late_share: float) -> float:
    """After the stamp (the network, the provider's event loop): unseen by the worker."""
    delay = 0.0002 + rng.expovariate(1 / 0.0001)
    if rng.random() < late_share:
        delay += rng.uniform(0.002, 0.010)
    return delay


def simulate(
    *,
    rate: float,
    burst: int,
    catalog_rps: float,
    catalog_burst: int | None = None,
    seconds: float = 60.0,
    lanes: int = 24,
    seed: int = 1,
    late_share: float = 0.005,
    stall_share: float = 0.0,
    wire_late_share: float = 0.002,
    stamp: bool = True,
    path_s: float = 0.0,
    governor: Callable[[Callable[[], float]], Governor] | None = None,
    provider: SimProvider | None = None,
) -> SimResult:
    """Run ``rate x seconds`` calls through a governor whose catalog says ``catalog_rps``.

    ``stall_share``: the share of calls after which the worker's event loop stalls for
    20-60 ms (a busy machine): every call due meanwhile leaves when it ends, together.
    ``wire_late_share``: the share of calls delayed 2-10 ms after they left (unseen by
    the worker); ``stamp``: whether the call path stamps its sends; ``path_s``: how long
    every call takes from its permit to the wire besides (a receipt written first,
    the request built).
    ``governor`` builds the governor from the loop's clock (default: one key, ``acme``,
    paced as the catalog says); ``provider`` may be passed to keep its state between
    runs (a second run against the same provider).
    """
    loop = VirtualLoop()
    rng = random.Random(seed)
    sim = provider or SimProvider(rate, burst)
    policy = PacingPolicy(
        rps=catalog_rps, burst=catalog_burst or burst, min_rps=1, max_concurrency=64
    )
    gov = governor(loop.time) if governor else Governor({"acme": policy}, clock=loop.time)
    rows = round(rate * seconds)
    left = [rows]
    stalled_until = [0.0]

    async def call() -> bool:
        """One call; whether the provider admitted it."""
        async with gov.permit(["acme"]) as permit:
            delay = path_s + _send_delay(rng, late_share)
            delay = max(delay, stalled_until[0] - loop.time() + delay / 10)
            if stall_share and rng.random() < stall_share:
                stalled_until[0] = loop.time() + rng.uniform(0.02, 0.06)
            await asyncio.sleep(delay)
            if stamp:
                note_sending()
            await asyncio.sleep(_wire_delay(rng, wire_late_share))
            sent = loop.time()
            retry_after = sim.admit(sent)
            if retry_after is not None:
                await asyncio.sleep(sim.refusal_s)
                permit.record_rate_limited(retry_after)
                return False
            await asyncio.sleep(rng.uniform(*sim.latency_s))
            permit.record_success(loop.time() - sent)
            return True

    async def lane() -> None:
        while left[0] > 0:
            left[0] -= 1
            while not await call():  # a refused row is retried, as the runtime does
                pass

    async def main() -> None:
        await asyncio.gather(*(lane() for _ in range(lanes)))
        await gov.aclose()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    return SimResult(list(sim.calls), rate, gov.snapshot().get("acme", {}), gov)
