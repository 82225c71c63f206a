"""GCRA (the generic cell rate algorithm) as pure arithmetic: tickets that reserve, not reject.

The fleet pacer (:mod:`playline.pacing.fleet_store`) runs the same step inside one
PostgreSQL statement; this module is its definition and its unit-tested twin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from playline.pacing.measure import EPSILON_S, check_rate

__all__ = ["GcraResult", "gcra_take"]


@dataclass(frozen=True, slots=True)
class GcraResult:
    """The outcome of taking a block of GCRA tickets.

    Attributes:
        tat: the new theoretical arrival time to store.
        delays: per ticket, in order, how long after ``now`` it may be used
            (``0.0`` = dispatch immediately).
    """

    tat: float
    delays: tuple[float, ...]


def gcra_take(
    tat: float,
    now: float,
    rps: float,
    burst: int,
    n: int = 1,
    *,
    paused_until: float = -math.inf,
) -> GcraResult:
    """Reserve ``n`` tickets under the generic cell rate algorithm.

    GCRA keeps one number per key, the theoretical arrival time ``tat``: the
    moment the bucket would be empty again if every reserved call went at
    exactly ``1/rps`` spacing. Reserving a ticket pushes ``tat`` by ``1/rps``
    from ``max(tat, now)``; ticket ``i`` may be used once it is at most
    ``burst`` emission intervals ahead, i.e. at ``tat_i - burst/rps``.
    Consequence: from idle, ``burst`` tickets are usable immediately and
    further ones are spaced at ``1/rps``; in any window of ``w`` seconds at
    most ``burst + rps x w`` tickets become usable.

    This variant *reserves* rather than rejects (the caller sleeps the
    returned delay), so no caller retries and no ticket is lost to polling.
    ``paused_until`` models a provider's ``Retry-After``: no ticket becomes
    usable before it, and the bucket is treated as empty at that instant, so
    after the pause at most ``burst`` calls go at once.

    Args:
        tat: the stored theoretical arrival time (use ``-inf`` or ``0`` for a
            fresh key).
        now: the current time, on the same scale as ``tat``.
        rps: the rate in force, > 0.
        burst: how many tickets may be usable at the same instant, >= 1.
        n: how many tickets to reserve, >= 1.
        paused_until: no ticket is usable before this.
    """
    check_rate(rps, "rps")
    if burst < 1 or n < 1:
        raise ValueError("burst and n must be >= 1")
    interval = 1.0 / rps
    tolerance = burst * interval
    start = max(tat, now, paused_until)
    delays = []
    for i in range(1, n + 1):
        delay = max(start + i * interval - tolerance, paused_until, now) - now
        # Sub-nanosecond remainders are float noise of summing intervals, not waits.
        delays.append(delay if delay > EPSILON_S else 0.0)
    return GcraResult(tat=start + n * interval, delays=tuple(delays))
