"""``PacingPolicy``: how fast one pacing key may be called.

The catalog declares one per provider (``pacing = {...}``) and, for providers
with several API keys, one per key (``key_pacing = {...}``); the governor, the
fleet store and ``playline limits`` all speak in its terms. It lives here, not in
the catalog, so that pacing depends on nothing above it.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from playline.spec_model import SpecModel

__all__ = ["LIMIT_FIELDS", "WINDOW_FIELDS", "Limits", "PacingPolicy"]

#: The quota windows a policy can declare, and their length in seconds.
WINDOW_FIELDS: dict[str, float] = {"per_minute": 60.0, "per_hour": 3600.0, "per_day": 86400.0}
#: The limits a key has, in the order ``playline limits`` shows them.
LIMIT_FIELDS = ("rps", "burst", "max_concurrency", "per_minute", "per_hour", "per_day", "min_rps")


class PacingPolicy(SpecModel):
    """How fast one pacing key (a provider, or one API key of it) may be called.

    Every limit declared is enforced together.
    """

    rps: Annotated[float, Field(gt=0)] = 10.0
    """the sustained rate in requests per second: the ceiling adaptive pacing never goes above"""
    burst: Annotated[int, Field(ge=1)] = 1
    """how many requests may go back to back after an idle spell"""
    per_minute: Annotated[int | None, Field(ge=1)] = None
    """at most this many calls in any 60 s (a sliding window, which also keeps every fixed window
    the provider may count in; unset: no such quota)"""
    per_hour: Annotated[int | None, Field(ge=1)] = None
    """at most this many calls in any hour (a sliding window; unset: no quota)"""
    per_day: Annotated[int | None, Field(ge=1)] = None
    """at most this many calls in any 24 h (a sliding window; unset: no quota)"""
    max_concurrency: Annotated[int, Field(ge=1)] = 8
    """the most calls in flight at once"""
    min_rps: Annotated[float, Field(gt=0)] = 0.5
    """the floor adaptive pacing never goes below"""

    @model_validator(mode="after")
    def _check_rates(self) -> PacingPolicy:
        if self.rps == float("inf"):
            raise ValueError("rps must be finite")
        return self

    def windows(self) -> dict[float, int]:
        """The declared quota windows: window length in seconds -> calls allowed in it."""
        out: dict[float, int] = {}
        for name, seconds in WINDOW_FIELDS.items():
            limit = getattr(self, name)
            if limit is not None:
                out[seconds] = limit
        return out

    def sustained_rps(self) -> float:
        """The long-run rate every limit together allows: ``rps`` or a quota, the lowest."""
        return min([self.rps, *(limit / seconds for seconds, limit in self.windows().items())])


class Limits(SpecModel):
    """Some of a pacing key's limits: a change to the policy in force.

    The one shape every limit change takes: ``Governor.set_limit`` in a process,
    ``playline limits set`` fleet-wide (``FleetPacer.set_limits``, which stores it), and
    fleet sync applying what the fleet stored. A field left ``None`` is not given: the
    policy in force (the catalog's) keeps its value. Each field means what the
    :class:`PacingPolicy` field of the same name means, and is checked the same way.
    """

    rps: Annotated[float | None, Field(gt=0, allow_inf_nan=False)] = None
    burst: Annotated[int | None, Field(ge=1)] = None
    max_concurrency: Annotated[int | None, Field(ge=1)] = None
    per_minute: Annotated[int | None, Field(ge=1)] = None
    per_hour: Annotated[int | None, Field(ge=1)] = None
    per_day: Annotated[int | None, Field(ge=1)] = None
    min_rps: Annotated[float | None, Field(gt=0, allow_inf_nan=False)] = None

    def given(self) -> dict[str, float | int]:
        """The limits set, by name, in :data:`LIMIT_FIELDS` order."""
        return {
            name: getattr(self, name) for name in LIMIT_FIELDS if getattr(self, name) is not None
        }

    def applied_to(self, policy: PacingPolicy) -> PacingPolicy:
        """``policy`` with these limits in place of its own (the others kept), checked."""
        return PacingPolicy.model_validate({**policy.model_dump(), **self.given()})
