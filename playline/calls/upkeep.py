"""Keeping an attempt alive: heartbeats (Temporal's, passed in) and lease renewals.

Both run as tasks of their own, every third of the heartbeat timeout, and nothing
else runs in them: a slow sheet flush or a busy store can delay neither. A renewal
that fails is logged and tried again at the next tick; the attempt meanwhile stops
sending calls whose leases are about to lapse (see
:meth:`Attempt.check_before_dispatch <playline.calls.attempt.Attempt.check_before_dispatch>`),
and a renewal that finds another owner marks the lease lost (no new call starts;
calls in flight finish and record).

A worker that dies stops heartbeating and renewing at the same moment: Temporal
retries the activity elsewhere as its leases expire, and the new attempt reclaims them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from playline.calls.attempt import Attempt

__all__ = ["AttemptUpkeep"]

logger = logging.getLogger("playline.calls")


class AttemptUpkeep:
    """``async with AttemptUpkeep(attempt, beat=activity.heartbeat)``: beats and renewals.

    Args:
        attempt: the attempt whose leases are renewed (its TTL sets the period).
        beat: sends one heartbeat (``temporalio.activity.heartbeat`` in an activity),
            called with ``progress()`` when that is given.
        progress: what each heartbeat carries (called at every beat).
    """

    def __init__(
        self,
        attempt: Attempt,
        *,
        beat: Callable[..., None],
        progress: Callable[[], Any] | None = None,
    ) -> None:
        self._attempt = attempt
        self._beat_fn = beat
        self._progress = progress
        self.interval_s = max(0.2, attempt.lease_ttl_s / 3)
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> AttemptUpkeep:
        self._tasks = [
            asyncio.create_task(self._beat(), name="playline-heartbeat"),
            asyncio.create_task(self._renew(), name="playline-lease-renewal"),
        ]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self._beat_fn(*(() if self._progress is None else (self._progress(),)))

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self._attempt.renew_leases()
            except Exception as err:  # a store hiccup: try again at the next tick
                logger.warning("lease renewal failed, retrying: %s", err)
