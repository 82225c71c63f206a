"""What the rest of playline needs from a pacer: permits, a width, a snapshot.

Two implementations: :class:`~playline.pacing.governor.Governor` (the default)
and :class:`~playline.pacing.unpaced.UnpacedGovernor` (the benchmark baseline).
Callers depend on these protocols, never on either class.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from playline.pacing.headers import RateLimitReport

__all__ = ["KeyBlocked", "Pacer", "PermitOutcome"]


class KeyBlocked(Exception):
    """A pacing key cannot admit a call before ``until`` (monotonic) / ``until_wall``.

    Raised by ``Pacer.permit`` instead of waiting when the wait would be
    longer than the caller's ``park_after_s``. Nothing was consumed.
    """

    def __init__(self, key: str, until: float, until_wall: float) -> None:
        super().__init__(f"pacing key {key} is blocked for {until_wall - time.time():.0f} s")
        self.key = key
        self.until = until
        self.until_wall = until_wall


class PermitOutcome(Protocol):
    """Held while one provider call is in flight; record exactly one outcome."""

    def observe(self, report: RateLimitReport | None) -> None:
        """What the response said about the provider's limits (may precede the outcome)."""
        ...

    def record_success(self, latency_s: float) -> None:
        """The provider answered usefully after ``latency_s`` seconds."""
        ...

    def record_rate_limited(self, retry_after_s: float | None) -> None:
        """The provider answered 429 (or another rate-limit signal)."""
        ...

    def record_failure(self, latency_s: float | None = None) -> None:
        """Any other failure (5xx, timeout, connection error), after ``latency_s``."""
        ...


class Pacer(Protocol):
    """Admits provider calls; one per worker process, shared by every activity."""

    def permit(
        self, keys: Sequence[str], *, park_after_s: float | None = None
    ) -> AbstractAsyncContextManager[PermitOutcome]:
        """Wait until every pacing key admits one call; hold the permit while it runs.

        With ``park_after_s``, a key blocked longer than that raises
        :class:`KeyBlocked` instead of waiting.
        """
        ...

    def pick(self, keys: Sequence[str]) -> str:
        """Of interchangeable keys (a provider's API keys), the one to use next."""
        ...

    def blocked_until(self, key: str) -> float | None:
        """Unix epoch seconds when ``key`` can admit again, ``None`` when it can now."""
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
