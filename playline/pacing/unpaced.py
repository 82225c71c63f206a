"""``UnpacedGovernor``: the baseline a hand-rolled Temporal worker amounts to.

No rate limit, no adaptive pacing, no Retry-After pause: every call is dispatched
as soon as a slot of a flat width is free, and a 429 is simply retried after the
caller's backoff. It exists so benchmarks can measure the governor against what
it replaces (``PLAYLINE_PACING=off``); it is never the default. It implements
:class:`~playline.pacing.pacer.Pacer` on its own and shares no code with the
governor.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from playline.pacing.headers import RateLimitReport
from playline.pacing.pacer import PermitOutcome

__all__ = ["UnpacedGovernor"]


class _NoopPermit:
    """A permit that records nothing."""

    def observe(self, report: RateLimitReport | None) -> None:
        return None

    def record_success(self, latency_s: float) -> None:
        return None

    def record_rate_limited(self, retry_after_s: float | None) -> None:
        return None

    def record_failure(self, latency_s: float | None = None) -> None:
        return None


class UnpacedGovernor:
    """Admits everything at once and suggests the same flat width for every key.

    Args:
        keys: the pacing keys to report in :meth:`snapshot`.
        flat_width: the dispatch width suggested for every key.
    """

    def __init__(self, keys: Iterable[str] = (), *, flat_width: int = 64) -> None:
        self.keys = sorted(set(keys))
        self.flat_width = flat_width

    def permit(
        self, keys: Sequence[str], *, park_after_s: float | None = None
    ) -> AbstractAsyncContextManager[PermitOutcome]:
        return self._noop()

    def pick(self, keys: Sequence[str]) -> str:
        return keys[0]

    def blocked_until(self, key: str) -> float | None:
        return None

    @contextlib.asynccontextmanager
    async def _noop(self) -> AsyncIterator[PermitOutcome]:
        yield _NoopPermit()

    def suggested_parallelism(self, key: str) -> int:
        return self.flat_width

    def rate_in_force(self, key: str) -> float | None:
        return None

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {key: {"suggested_parallelism": self.flat_width} for key in self.keys}

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None
