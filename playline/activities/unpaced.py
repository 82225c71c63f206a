"""``UnpacedGovernor``: the baseline a hand-rolled Temporal worker amounts to.

No rate limit, no adaptive pacing, no Retry-After pause: every call is dispatched
as soon as a slot of a flat width is free, and a 429 is simply retried after the
caller's backoff. It exists so benchmarks can measure the governor against what
it replaces (``PLAYLINE_PACING=off``); it is never the default.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from playline.activities.catalog import Catalog, PacingPolicy
from playline.activities.governor import Governor, Permit


class _NoopPermit(Permit):
    def __init__(self) -> None:  # a permit that records nothing
        pass

    def record_success(self, latency_s: float) -> None:
        return None

    def record_rate_limited(self, retry_after_s: float | None) -> None:
        return None

    def record_failure(self) -> None:
        return None


class UnpacedGovernor(Governor):
    """A governor that admits everything at a flat dispatch width."""

    def __init__(self, policies: Mapping[str, PacingPolicy], *, flat_width: int = 64) -> None:
        super().__init__(policies)
        self.flat_width = flat_width

    @classmethod
    def from_catalog(cls, catalog: Catalog, **kwargs: Any) -> UnpacedGovernor:
        return cls({name: spec.pacing for name, spec in catalog.providers.items()}, **kwargs)

    def permit(self, keys: Sequence[str]) -> AbstractAsyncContextManager[Permit]:
        return self._noop()

    @contextlib.asynccontextmanager
    async def _noop(self) -> AsyncIterator[Permit]:
        yield _NoopPermit()

    def suggested_parallelism(self, key: str) -> int:
        return self.flat_width
