"""Provider pacing: how fast each provider may be called, per worker and fleet-wide.

No Temporal and no catalog in here: the catalog hands the governor a
:class:`PacingPolicy` per pacing key, and everything else is arithmetic and
asyncio. Small types with one job each, composed:

* :mod:`~playline.pacing.policy` - ``PacingPolicy``: rps, burst, quota windows,
  max concurrency, floor;
* :mod:`~playline.pacing.search` - the rate in force, searched between the bounds 429s
  and clean windows give;
* :mod:`~playline.pacing.headers` - what a provider reports: rate-limit headers, Retry-After;
* :mod:`~playline.pacing.budget` - quota windows and reported quotas as hard budgets;
* :mod:`~playline.pacing.measure` - time in flight, Little's-law width, dispatch logs;
* :mod:`~playline.pacing.gcra` - GCRA tickets, the arithmetic of fleet pacing;
* :mod:`~playline.pacing.limiter` - a rate bucket whose rate changes in place;
* :mod:`~playline.pacing.gate` - a concurrency gate whose limit changes in place;
* :mod:`~playline.pacing.governor` - the per-process governor composing all of them;
* :mod:`~playline.pacing.fleet_store` / :mod:`~playline.pacing.fleet_sync` - the
  PostgreSQL fleet state, and how a governor follows it;
* :mod:`~playline.pacing.unpaced` - the unpaced baseline for benchmarks;
* :mod:`~playline.pacing.pacer` - the protocol callers depend on.
"""

from playline.pacing.governor import Governor, Permit
from playline.pacing.pacer import KeyBlocked, Pacer, PermitOutcome
from playline.pacing.policy import PacingPolicy
from playline.pacing.unpaced import UnpacedGovernor

__all__ = [
    "Governor",
    "KeyBlocked",
    "Pacer",
    "PacingPolicy",
    "Permit",
    "PermitOutcome",
    "UnpacedGovernor",
]
