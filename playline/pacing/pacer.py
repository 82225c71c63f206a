"""What the rest of playline needs from a pacer: permits, a width, a snapshot.

Two implementations: :class:`~playline.pacing.governor.Governor` (the default)
and :class:`~playline.pacing.unpaced.UnpacedGovernor` (the benchmark baseline).
Callers depend on these protocols, never on either class.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

__all__ = ["Pacer", "PermitOutcome"]


class PermitOutcome(Protocol):
    """Held while one provider call is in flight; record exactly one outcome."""

    def record_success(self, latency_s: float) -> None:
        """The provider answered usefully after ``latency_s`` seconds."""
        ...

    def record_rate_limited(self, retry_after_s: float | None) -> None:
        """The provider answered 429 (or another rate-limit signal)."""
        ...

    def record_failure(self) -> None:
        """Any other failure (5xx, timeout, connection error)."""
        ...


class Pacer(Protocol):
    """Admits provider calls; one per worker process, shared by every activity."""

    def permit(self, keys: Sequence[str]) -> AbstractAsyncContextManager[PermitOutcome]:
        """Wait until every pacing key admits one call; hold the permit while it runs."""
        ...

    def suggested_parallelism(self, key: str) -> int:
        """How many calls of ``key`` to keep in flight."""
        ...

    def rate_in_force(self, key: str) -> float | None:
        """Requests per second ``key`` is paced at now; ``None`` when it is not paced."""
        ...

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per pacing key, what the pacer knows (see ``Governor.snapshot``)."""
        ...

    async def start(self) -> None:
        """Start background work (fleet refresh) now rather than at the first permit."""
        ...

    async def aclose(self) -> None:
        """Stop background work."""
        ...
