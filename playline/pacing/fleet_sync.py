"""``FleetSync``: how one worker's governor follows the fleet's shared pacing state.

A :class:`~playline.pacing.fleet_store.FleetPacer` keeps the fleet's state in
PostgreSQL; this class is the governor's side of it:

* **tickets** - before a call is dispatched, one GCRA ticket per pacing key,
  coalesced per key into blocks (one round trip for every caller waiting at that
  moment), so N workers together stay inside one budget;
* **refresh** - at least once a second it reads every key's configured limits
  (``playline limits set``) and shared adapted rate, and applies them to the
  governor through its public methods (``set_limit``, ``adopt_rate``);
* **reports** - the governor's own cuts and increases are written back, in the
  background, so the rest of the fleet follows within a refresh;
* **shares** - with each refresh it says which fairness keys wait on this worker for
  each pacing key, reads what every worker said, and paces each key at the part of
  its rate this worker's waiting keys are owed (:func:`fleet_parts`): weighted fair
  shares hold across workers, and a worker alone with a key gets all of it. Weights
  set with ``playline limits share`` apply from the same read.

The governor calls :meth:`wait_for_tickets`, :meth:`report_cut`,
:meth:`report_increase` and :meth:`key_created`; this class calls the governor
only through :class:`FleetFollower`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from playline.pacing.fleet_store import (
    FleetKeyState,
    FleetPacer,
    FleetRate,
    FleetShare,
    LearnedLimit,
)
from playline.pacing.policy import Limits, PacingPolicy

__all__ = [
    "Allotment",
    "FleetFollower",
    "FleetSync",
    "fleet_allotments",
    "fleet_owed",
    "fleet_parts",
]

#: A worker's report of who waits on it is read while younger than this.
SHARE_MAX_AGE_S = 3.0
#: A fairness key that queued a call this recently still counts as waiting (a run
#: between two rows has an empty queue for a moment); short, because a key that is
#: done keeps the others below their rate for this long.
RECENTLY_WAITING_S = 0.75

log = logging.getLogger("playline.governor")


class FleetFollower(Protocol):
    """What fleet synchronisation may do to a governor (its public methods)."""

    def policy(self, key: str) -> PacingPolicy: ...

    def has_key(self, key: str) -> bool: ...

    def set_limit(self, key: str, limits: Limits) -> None: ...

    def adopt_rate(self, key: str, rps: float) -> bool: ...

    def pacing_keys(self) -> list[str]: ...

    def waiting_shares(
        self, key: str, within_s: float = 0.0
    ) -> dict[str, tuple[float, int, int]]: ...

    def set_share_weight(self, fairness_key: str, weight: float | None) -> None: ...

    def set_fleet_part(
        self, key: str, part: float | None, weights: dict[str, float] | None = None
    ) -> None: ...

    def seed_learned(self, key: str, learned: LearnedLimit) -> bool: ...


@dataclass(frozen=True, slots=True)
class Allotment:
    """What one worker is owed of one pacing key, fleet-wide.

    ``part`` is the share of the key's rate its waiting fairness keys are owed
    (``None``: all of it: nobody else waits, or it has nothing waiting yet, so a new
    key starts at once and is weighed at the next refresh). ``weights`` are the
    weights its own fair order should use for them: each key's fleet allotment on
    this worker, so the worker splits its part as the fleet would.
    """

    part: float | None
    weights: dict[str, float] = field(default_factory=dict)


def _served_weights(
    rows: Sequence[FleetShare], weights: dict[str, float]
) -> tuple[list[FleetShare], dict[str, float]]:
    """One pacing key's waiting rows in the highest class waiting anywhere (strict
    priority across the fleet), and each of their fairness keys' weight in force (a
    weight set with ``playline limits share`` wins over the runs')."""
    top = min(row.priority for row in rows)
    served = [row for row in rows if row.priority == top]
    weight: dict[str, float] = {}
    for row in served:
        given = weights.get(row.fairness_key, row.weight)
        weight[row.fairness_key] = max(weight.get(row.fairness_key, 0.0), given)
    return served, weight


def _waiting_by_key(shares: Sequence[FleetShare]) -> dict[str, list[FleetShare]]:
    by_key: dict[str, list[FleetShare]] = {}
    for share in shares:
        if share.waiting > 0:
            by_key.setdefault(share.key, []).append(share)
    return by_key


def fleet_owed(
    shares: Sequence[FleetShare], weights: dict[str, float] | None = None
) -> dict[str, dict[str, float]]:
    """Per pacing key, the part of it each waiting fairness key is owed fleet-wide: its
    weight's part of the highest class waiting; keys of lower classes are owed 0."""
    owed: dict[str, dict[str, float]] = {}
    for key, rows in _waiting_by_key(shares).items():
        _served, weight = _served_weights(rows, weights or {})
        total = sum(weight.values())
        owed[key] = {row.fairness_key: 0.0 for row in rows}
        owed[key].update({f: w / total for f, w in weight.items()})
    return owed


def fleet_allotments(
    shares: Sequence[FleetShare], worker: str, weights: dict[str, float] | None = None
) -> dict[str, Allotment]:
    """Per pacing key, what ``worker`` is owed (see :class:`Allotment`).

    Each waiting fairness key is owed its part (:func:`fleet_owed`); a fairness key
    waiting on several workers splits its part between them by how many calls wait on
    each. A worker with nothing in the class served is owed 0 (the governor keeps a
    trickle).
    """
    out: dict[str, Allotment] = {}
    for key, rows in _waiting_by_key(shares).items():
        workers = {row.worker for row in rows}
        if worker not in workers or workers == {worker}:
            out[key] = Allotment(None)
            continue
        served, weight = _served_weights(rows, weights or {})
        waiting: dict[str, int] = {}
        for row in served:
            waiting[row.fairness_key] = waiting.get(row.fairness_key, 0) + row.waiting
        total = sum(weight.values())
        mine = {
            row.fairness_key: weight[row.fairness_key] * row.waiting / waiting[row.fairness_key]
            for row in served
            if row.worker == worker
        }
        out[key] = Allotment(sum(mine.values()) / total if total > 0 else None, mine)
    return out


def fleet_parts(
    shares: Sequence[FleetShare], worker: str, weights: dict[str, float] | None = None
) -> dict[str, float | None]:
    """Per pacing key, the part of its rate ``worker`` is owed (``None``: all of it)."""
    return {key: a.part for key, a in fleet_allotments(shares, worker, weights).items()}


class FleetSync:
    """Tickets, refresh and reports between one governor and the fleet store.

    Args:
        store: the PostgreSQL fleet pacer (not owned: the caller closes it).
        governor: the governor to keep in step with the fleet.
        refresh_s: how often limits and the shared rate are read, at most 1 s
            so that a limit change applies within a second.
        margin: tickets are spaced at the shared rate times this.
        burst: maps the shared burst to the tolerance tickets use.
    """

    def __init__(
        self,
        store: FleetPacer,
        governor: FleetFollower,
        *,
        refresh_s: float,
        margin: float = 1.0,
        burst: Callable[[int], int] | None = None,
    ) -> None:
        if not 0 < refresh_s <= 1.0:
            raise ValueError("fleet_refresh_s must be in (0, 1]")
        self._store = store
        self._governor = governor
        self._refresh_s = refresh_s
        self._margin = margin
        self._burst = burst
        self._view: dict[str, FleetKeyState] = {}
        #: per key, the limits last applied from the limits table
        self._limits_applied: dict[str, dict[str, float | int]] = {}
        #: per key, the (epoch, rps) of the shared adapted rate last seen or written
        self._seen: dict[str, tuple[int, float]] = {}
        self._batchers: dict[str, _TicketBatcher] = {}
        self._refresh_task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._closed = False
        #: this worker in the shares table (a process: workers share no identity)
        self.worker = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        #: the weights last applied from ``playline limits share``
        self._weights: dict[str, float] = {}
        self._nudged = asyncio.Event()
        #: the limits learnt by earlier runs (read once, at the first refresh), and the
        #: keys already seeded from them
        self._learned: dict[str, LearnedLimit] | None = None
        self._seeded: set[str] = set()
        #: per key, the learnt rate last written (a rate is written when it moves)
        self._recorded: dict[str, float] = {}

    # ------------------------------------------------------------------ tickets

    async def wait_for_tickets(self, keys: Sequence[str]) -> None:
        """Take one fleet ticket per key and sleep until the last of them is due.

        A key with quota windows first gets a slot in every fleet-wide window
        (waiting while one is full), then its rate ticket.
        """
        for key in keys:
            windows = self._governor.policy(key).windows()
            while windows:
                wait = await self._store.take_window_slot(key, windows)
                if wait <= 0:
                    break
                await asyncio.sleep(min(wait, 60.0))
        loop = asyncio.get_running_loop()
        due = loop.time()
        for key in keys:
            batcher = self._batchers.get(key)
            if batcher is None:
                batcher = self._batchers[key] = _TicketBatcher(
                    self._store, key, self._governor, self._margin, self._burst
                )
            due = max(due, loop.time() + await batcher.ticket())
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)

    # ------------------------------------------------------------------ refresh

    def ensure_running(self) -> None:
        """Start the background refresh if it is not running (needs a running loop)."""
        if self._closed or self._refresh_task is not None:
            return
        self._refresh_task = asyncio.get_running_loop().create_task(
            self._refresh_loop(), name="playline-governor-fleet-refresh"
        )

    async def refresh_once(self) -> None:
        """Read the fleet's state and apply it to every key the governor knows."""
        view = await self._store.read_state()
        self._view = view
        if self._learned is None:
            self._learned = await self._store.read_learned()
        for key in self._learned:
            if self._governor.has_key(key):
                self._seed(key)
        for key, key_view in view.items():
            if self._governor.has_key(key):
                self._apply(key, key_view)
        await self._sync_shares()

    async def _sync_shares(self) -> None:
        """Publish who waits here, read who waits everywhere, pace each key at this
        worker's part, and apply the weights set while runs go."""
        governor = self._governor
        mine = [
            FleetShare(key, fkey, weight, priority, max(1, waiting))
            for key in governor.pacing_keys()
            for fkey, (weight, priority, waiting) in governor.waiting_shares(
                key, RECENTLY_WAITING_S
            ).items()
        ]
        await self._store.publish_shares(self.worker, mine)
        weights = await self._store.read_share_weights()
        for fkey in self._weights.keys() - weights.keys():
            governor.set_share_weight(fkey, None)
        for fkey, weight in weights.items():
            governor.set_share_weight(fkey, weight)
        self._weights = weights
        # Others' reports from the table, this worker's as it just said them.
        fleet = [
            s for s in await self._store.read_shares(SHARE_MAX_AGE_S) if s.worker != self.worker
        ]
        fleet += [replace(m, worker=self.worker) for m in mine]
        allotted = fleet_allotments(fleet, self.worker, weights)
        for key in governor.pacing_keys():
            found = allotted.get(key)
            governor.set_fleet_part(
                key, found.part if found else None, found.weights if found else None
            )

    def key_created(self, key: str) -> None:
        """The governor just created ``key``: apply what the fleet already says of it."""
        self._seed(key)  # first: the shared rate adopted next is a bound, not a start
        view = self._view.get(key)
        if view is not None:
            self._apply(key, view)

    def _seed(self, key: str) -> None:
        """Start ``key`` at the limit an earlier run learnt, once."""
        learned = (self._learned or {}).get(key)
        if learned is None or key in self._seeded:
            return
        self._seeded.add(key)
        self._recorded[key] = learned.rps
        self._governor.seed_learned(key, learned)

    def nudge(self) -> None:
        """Refresh now rather than at the next tick (a fairness key started waiting
        here: the fleet should weigh it within a round trip, not a refresh)."""
        self._nudged.set()

    async def _refresh_loop(self) -> None:
        while True:
            self._nudged.clear()
            try:
                await self.refresh_once()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # keep pacing on local limits; retry next tick
                log.warning("fleet pacing refresh failed (%s); retrying", err)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._nudged.wait(), self._refresh_s)

    def _apply(self, key: str, view: FleetKeyState) -> None:
        """Apply the fleet's limits, then its shared adapted rate, to one key."""
        limits = view.limits
        if limits is not None:
            wanted = limits.given()
            if wanted != self._limits_applied.get(key):
                self._limits_applied[key] = wanted
                policy = self._governor.policy(key).model_dump()
                if any(policy.get(name) != value for name, value in wanted.items()):
                    log.info("pacing key %s: applying fleet limits %s", key, wanted)
                    self._governor.set_limit(key, limits)
        if view.rate is not None:
            self._adopt(key, view.rate)

    def _adopt(self, key: str, rate: FleetRate) -> None:
        """Follow the shared rate when it is newer than what this worker saw.

        Cuts bump the row's epoch; increases only raise ``rps`` within an
        epoch. So a row is newer if its epoch is higher, or equal with a
        higher rate; anything else is a stale read racing our own write.
        """
        seen = self._seen.get(key)
        if seen is not None and (rate.epoch, rate.rps) <= seen:
            return
        self._seen[key] = (rate.epoch, rate.rps)
        self._governor.adopt_rate(key, rate.rps)

    # ------------------------------------------------------------------ reports

    def report_cut(self, key: str, rate: float, floor: float, pause_s: float) -> None:
        """This worker cut ``key`` to ``rate``: lower the shared rate and pause the fleet."""
        store = self._store

        async def report() -> None:
            shared = await store.report_cut(key, rate, min_rps=floor, pause_s=pause_s)
            self._adopt(key, shared)

        self._spawn(report(), f"report a rate cut of {key}")

    def report_increase(self, key: str, rate: float, ceiling: float) -> None:
        """This worker raised ``key`` to ``rate``: raise the shared rate if nobody cut since."""
        seen = self._seen.get(key)
        if seen is None:
            return  # not synchronised with the fleet yet: the next refresh decides
        store, epoch = self._store, seen[0]

        async def report() -> None:
            shared = await store.report_increase(key, rate, ceiling_rps=ceiling, epoch=epoch)
            if shared is not None:
                self._adopt(key, shared)

        self._spawn(report(), f"report a rate increase of {key}")

    def report_learned(self, key: str, rate: float, ceiling: float, source: str) -> None:
        """This worker learnt ``key``'s limit: remember it for the fleet's next run
        (written when it moved by more than 1 % since the last write)."""
        last = self._recorded.get(key)
        if last is not None and abs(rate - last) <= 0.01 * last:
            return
        self._recorded[key] = rate
        store = self._store

        async def report() -> None:
            await store.record_learned(key, rate, ceiling_rps=ceiling, source=source)

        self._spawn(report(), f"remember the learnt limit of {key}")

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:  # no loop: nothing in flight to report for
            coro.close()
            return
        self._background.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._background.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.warning("fleet pacing: could not %s: %s", what, t.exception())

        task.add_done_callback(done)

    async def aclose(self) -> None:
        """Stop the refresh and wait briefly for outstanding reports."""
        self._closed = True
        task, self._refresh_task = self._refresh_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        pending = [t for t in self._background if not t.done()]
        if pending:
            _, late = await asyncio.wait(pending, timeout=2.0)
            for t in late:
                t.cancel()
            await asyncio.gather(*late, return_exceptions=True)


@dataclass(eq=False)
class _TicketBatcher:
    """Coalesces concurrent fleet-ticket requests of one key into blocks.

    A block is taken with one database round trip and covers exactly the
    callers waiting at that moment, each of which has already passed every
    local check and dispatches as soon as its ticket is due. Callers that
    arrive while a block is being fetched go into the next block. A caller
    cancelled before its block was fetched is left out of it.
    """

    _store: FleetPacer
    _key: str
    _governor: FleetFollower
    _margin: float
    _burst: Callable[[int], int] | None
    _pending: list[asyncio.Future[float]] = field(default_factory=list, init=False)
    _drainer: asyncio.Task[None] | None = field(default=None, init=False)

    async def ticket(self) -> float:
        """Seconds from now until this caller's ticket is due."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[float] = loop.create_future()
        self._pending.append(fut)
        if self._drainer is None:
            self._drainer = loop.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        try:
            while self._pending:
                block = [fut for fut in self._pending if not fut.done()]
                self._pending = []
                if not block:
                    continue
                policy = self._governor.policy(self._key)
                try:
                    delays = await self._store.take_many(
                        self._key,
                        len(block),
                        rps=policy.rps,
                        burst=policy.burst,
                        margin=self._margin,
                        local_burst=self._burst,
                    )
                except Exception as err:
                    for fut in block:
                        if not fut.done():
                            fut.set_exception(err)
                    continue
                # The delays count from when the database ran the statement; using
                # them from now (a half round trip later) errs on the slow side.
                for fut, delay in zip(block, delays, strict=True):
                    if not fut.done():
                        fut.set_result(delay)
        finally:
            self._drainer = None
