"""``PacingPolicy``: how fast one pacing key may be called.

The catalog declares one per provider (``pacing = {...}``); the governor, the
fleet store and ``playline limits`` all speak in its terms. It lives here, not in
the catalog, so that pacing depends on nothing above it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["PacingPolicy"]


class PacingPolicy(BaseModel):
    """How fast one pacing key (a provider) may be called.

    ``rps`` is the sustained rate in requests per second, ``burst`` how many
    requests may go back to back after an idle period, ``max_concurrency`` the
    most calls in flight at once. ``min_rps`` is the floor adaptive pacing never
    goes below.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    rps: float = Field(default=10.0, gt=0)
    burst: int = Field(default=1, ge=1)
    max_concurrency: int = Field(default=8, ge=1)
    min_rps: float = Field(default=0.5, gt=0)
