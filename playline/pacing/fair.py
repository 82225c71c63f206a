"""Weighted fair shares of one provider between the plays waiting for it.

A provider's limit is one pool for every play that calls it. First come, first
served lets a 50,000-row backfill hold a provider while a rep's 30-row list waits;
sharing per run lets a team that starts three plays take three times the share of a
team that starts one. So each pacing key orders its waiting calls:

1. by **priority class** (1 first, 5 last): a lower class is served strictly first;
2. within a class, by **weighted fair queuing between fairness keys** (a run by
   default, a team or customer when the run names one): each key has a virtual
   finish time that advances by ``1 / weight`` per call served, and the waiting key
   with the earliest one goes next; a key that was idle restarts at the queue's
   virtual time, so idling earns no burst. A key alone gets every call
   (work-conserving); two backlogged keys of weights 2 and 1 get 2/3 and 1/3;
3. within a key, oldest work first (``WORK_STARTED``), then first come.

:class:`FairOrder` is that order, as a :class:`~playline.pacing.gate.ResizableGate`'s
waiter order: the governor puts one in front of each key's concurrency slots (what
a concurrency-capped provider waits for) and one in front of its rate tokens (a
one-wide gate, the key's *turn*: what a rate-limited provider waits for). Which share
a call counts for is the task's :data:`SHARE` (the chunk sets it from the run's
options); a weight can be overridden while runs go (``playline limits share``).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_PRIORITY", "SHARE", "FairOrder", "Share"]

#: The class of a call that names none (Temporal's default ``priority_key``).
DEFAULT_PRIORITY = 3
#: Seconds over which a key's recent rate is measured (``FairQueue.snapshot``).
RATE_WINDOW_S = 10.0
#: A fairness key unseen this long is forgotten (its virtual time no longer matters).
FORGET_AFTER_S = 600.0


@dataclass(frozen=True, slots=True)
class Share:
    """Who a call counts for: a fairness key, its weight and its priority class."""

    key: str = ""
    weight: float = 1.0
    priority: int = DEFAULT_PRIORITY


#: The share the calls of the current task count for (``None``: an anonymous one).
SHARE: ContextVar[Share | None] = ContextVar("playline_share", default=None)


@dataclass(eq=False)
class _Flow:
    """One fairness key's place in one order."""

    key: str
    weight: float
    priority: int
    finish: float = 0.0
    #: waiting callers: (oldest work, arrival, future)
    waiting: list[tuple[float, int, asyncio.Future[None]]] = field(default_factory=list)
    served: int = 0
    #: when its recent calls were served (monotonic), for its rate
    recent: deque[float] = field(default_factory=deque)
    seen_at: float = 0.0


class FairOrder:
    """A gate's waiter order by class, weighted fair share, then oldest work.

    Args:
        weight_of: the weight in force for a fairness key (an override), or ``None``
            to take the one its calls carry.
        clock: monotonic seconds (for rates and forgetting idle keys).
    """

    def __init__(
        self,
        weight_of: Callable[[str], float | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._weight_of = weight_of or (lambda _key: None)
        self._clock = clock
        #: weights the fleet allots this worker's keys (``set_fleet_weights``)
        self._fleet_weights: dict[str, float] = {}
        self._flows: dict[str, _Flow] = {}
        #: per class: the virtual time (start tag of the call served last)
        self._virtual: dict[int, float] = {}
        self._order = itertools.count()

    # -- the gate's WaiterOrder ------------------------------------------------

    def push(self, fut: asyncio.Future[None], priority: float, share: Any) -> object:
        flow = self._flow(share if isinstance(share, Share) else ANONYMOUS)
        entry = (priority, next(self._order), fut)
        heapq.heappush(flow.waiting, entry)
        return flow, entry

    def pop(self) -> asyncio.Future[None] | None:
        while True:
            flow = self._next_flow()
            if flow is None:
                return None
            _started, _arrival, fut = heapq.heappop(flow.waiting)
            if fut.done():  # cancelled while waiting: not served
                continue
            self._charge(flow)
            return fut

    def remove(self, handle: object) -> None:
        assert isinstance(handle, tuple)
        flow: _Flow = handle[0]
        entry: tuple[float, int, asyncio.Future[None]] = handle[1]
        with contextlib.suppress(ValueError):
            flow.waiting.remove(entry)
            heapq.heapify(flow.waiting)

    def admitted(self, share: Any) -> None:
        """A caller the gate let straight through (nobody waiting): served all the same."""
        self._charge(self._flow(share if isinstance(share, Share) else ANONYMOUS))

    def __len__(self) -> int:
        return sum(len(flow.waiting) for flow in self._flows.values())

    # -- the order ---------------------------------------------------------------

    def _flow(self, share: Share) -> _Flow:
        now = self._clock()
        flow = self._flows.get(share.key)
        if flow is None:
            self._forget_idle(now)
            flow = self._flows[share.key] = _Flow(share.key, share.weight, share.priority)
            flow.finish = self._virtual.get(share.priority, 0.0)
        flow.weight = share.weight  # as its calls say; an override wins (_weight)
        flow.priority = share.priority
        flow.seen_at = now
        return flow

    def _charge(self, flow: _Flow) -> None:
        """Serve one call of ``flow``: advance its finish and the class's virtual time."""
        virtual = self._virtual.get(flow.priority, 0.0)
        start = max(virtual, flow.finish)
        flow.finish = start + 1.0 / max(self._weight(flow), 1e-9)
        self._virtual[flow.priority] = start
        flow.served += 1
        now = self._clock()
        flow.recent.append(now)
        while flow.recent and flow.recent[0] < now - RATE_WINDOW_S:
            flow.recent.popleft()

    def set_fleet_weights(self, weights: dict[str, float]) -> None:
        """Weigh this worker's keys by what the fleet allots each here (a key with
        runs on two workers is owed part of its weight on each)."""
        self._fleet_weights = {k: w for k, w in weights.items() if w > 0}

    def _weight(self, flow: _Flow) -> float:
        """The weight in force: the fleet's allotment here, else an override set while
        runs go, else the calls' own."""
        return self._fleet_weights.get(flow.key) or self._weight_of(flow.key) or flow.weight

    def _next_flow(self) -> _Flow | None:
        """The waiting flow to serve: the lowest class, then the earliest start, then
        the one whose head has the oldest work."""
        best: _Flow | None = None
        best_at: tuple[int, float, float] | None = None
        for flow in self._flows.values():
            if not flow.waiting:
                continue
            virtual = self._virtual.get(flow.priority, 0.0)
            at = (flow.priority, max(virtual, flow.finish), flow.waiting[0][0])
            if best_at is None or at < best_at:
                best, best_at = flow, at
        return best

    def _forget_idle(self, now: float) -> None:
        for key in [
            k for k, f in self._flows.items() if not f.waiting and f.seen_at < now - FORGET_AFTER_S
        ]:
            del self._flows[key]

    # -- what it shows -------------------------------------------------------------

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per fairness key seen lately: weight, class, calls waiting, served in all,
        its recent rate (calls per second over ``RATE_WINDOW_S``) and its part of the
        recent calls."""
        now = self._clock()
        rates: dict[str, float] = {}
        for key, flow in self._flows.items():
            while flow.recent and flow.recent[0] < now - RATE_WINDOW_S:
                flow.recent.popleft()
            rates[key] = len(flow.recent) / RATE_WINDOW_S
        total = sum(rates.values())
        return {
            key: {
                "weight": self._weight(flow),
                "priority": flow.priority,
                "waiting": len(flow.waiting),
                "served": flow.served,
                "rate_rps": rates[key],
                "part": rates[key] / total if total else 0.0,
            }
            for key, flow in sorted(self._flows.items())
            if flow.waiting or rates[key] > 0
        }


#: The share of a call whose task names none (one fairness key for all of them).
ANONYMOUS = Share()
