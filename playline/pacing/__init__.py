"""Provider pacing: how fast each provider may be called, per worker and fleet-wide.

No Temporal and no catalog in here: the catalog hands the governor a
:class:`PacingPolicy` per pacing key, and everything else is arithmetic and
asyncio. Small types with one job each, composed:

* :mod:`~playline.pacing.policy` - ``PacingPolicy``: rps, burst, max concurrency, floor;
* :mod:`~playline.pacing.aimd` - the adaptive rate (AIMD), Little's-law width, latency EWMA;
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
from playline.pacing.pacer import Pacer, PermitOutcome
from playline.pacing.policy import PacingPolicy
from playline.pacing.unpaced import UnpacedGovernor

__all__ = ["Governor", "Pacer", "PacingPolicy", "Permit", "PermitOutcome", "UnpacedGovernor"]
