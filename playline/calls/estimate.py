"""Estimating: a play's tool calls counted from receipts, never sent.

``playline estimate`` runs a play as a run would, on the run's own call path: the
row context, ``rc.tool``, the waterfall loop and the
:class:`~playline.calls.runner.ToolRunner` (input validation, receipt key in the auth
scope of the run's mode, identical calls shared) are the run's. Below it an
:class:`EstimatingDispatcher` stands in for the claims and the dispatcher (an
:class:`Estimator` puts them together): the receipt store is only *read* (``get``,
batched per event-loop tick as the runner batches its claims; an estimate never claims,
leases or writes), and nothing reaches a provider. Calls count under the column
being estimated (:func:`counting_for`). For each distinct call of a chunk:

* a completed receipt that is fresh by the claim rule (not ``force``, not older than
  ``stale_after_seconds``) is a free hit, and its real answer is returned, so the calls that
  depend on it are computed exactly;
* anything else is a call the run would pay for: counted at the tool's worst case and
  at an expected price (:class:`ToolHistory`), and answered by an
  :class:`UnpaidResult` whose getters return :class:`Unknown` values;
* a call leaving a required input blank raises ``BlankInput`` as the run's does, before
  anything else: the run never sends it, so it is not counted (it is free), and the
  column, or the waterfall's next step, goes on as in the run;
* a call whose input holds an ``Unknown`` is a *dependent call whose input is unknown*:
  it cannot be looked up, so it counts as a call to pay (``unknown_input``), expected
  at ``p`` times its price, ``p`` the smallest chance among the Unknowns of its input.

Identical calls of a chunk are counted once, as the run shares them. The figures go
to an :class:`~playline.calls.estimate_tally.EstimateTally`.

Code that branches on an ``Unknown`` runs one way only (it is truthy, and equals
nothing but itself), so the calls on the other way (a fallback such as ``if not
found.get("email"): ...``) never happen in the estimate. :func:`watching_unknowns`
records every read of and branch on an ``Unknown`` while a column is estimated, and
the chunk counts that column's declared tools it did not call as dependent calls (the
worst case); their expected figure is weighted by the chance the run takes another
way (:meth:`UnknownsMet.fallback_chance`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from playline.calls.attempt import Attempt
from playline.calls.billing import is_present
from playline.calls.catalog import Catalog, ToolSpec
from playline.calls.dispatch import ClaimedCall, Settled
from playline.calls.estimate_tally import (
    BASIS_RECEIPTS,
    BASIS_STATED,
    BASIS_WORST_CASE,
    PLAY_COLUMN,
    Basis,
    EstimateTally,
)
from playline.calls.runner import CALL_REACH, ToolResult, ToolRunner
from playline.calls.tick_batch import TickBatch
from playline.errors import BlankInput
from playline.freshness import stricter, within_age
from playline.stores.receipts import (
    ClaimOutcome,
    ClaimRequest,
    ClaimStatus,
    Receipt,
    ReceiptStore,
)

__all__ = [
    "COUNTED_COLUMN",
    "MIN_HISTORY",
    "EstimatingDispatcher",
    "Estimator",
    "ReceiptReader",
    "ToolHistory",
    "Unknown",
    "UnknownsMet",
    "UnpaidResult",
    "counting_for",
    "note_read",
    "unknown_p",
    "watching_unknowns",
]

#: Completed receipts of a tool needed before its history gives the expected figures.
MIN_HISTORY = 20
#: How many of a tool's latest completed receipts its history reads.
SAMPLE_SIZE = 1000
#: An estimate holds no lease; its attempt's TTL only bounds what nothing waits for.
ESTIMATE_LEASE_TTL_S = 60.0


@dataclass(frozen=True, slots=True, eq=False)
class Unknown:
    """What an unpaid call would answer: not known before the run pays for it.

    ``p`` is the chance it is a real (present) value; ``measured`` says whether ``p``
    comes from receipts (a tool's history) or is a guess. It is truthy, so code written
    for a found value goes that way (``if found.get("email")`` proceeds, a ``run_if``
    passes), and it equals nothing but itself (``== "valid"`` is false); indexing it
    gives itself; ``str()`` is ``<unknown>``. Anything else (string methods,
    arithmetic, ordering, iteration) raises, and the estimate then counts the
    resolver's remaining declared tools in the worst case.

    A branch on it cannot hide the other way: ``bool()``, ``==``, ``!=``, ``in`` and
    ``hash()`` (a set or dict lookup) are recorded on the column being estimated
    (:func:`watching_unknowns`), and so is every read of an unknown value; a column
    that met one has its declared tools it did not call counted (a fallback such as
    ``if not found.get("email"): ...`` or ``a or b`` is a call the run may make).
    """

    p: float = 1.0
    measured: bool = False

    def __bool__(self) -> bool:
        _branched(self, falsy=True)
        return True

    def __eq__(self, other: object) -> bool:
        _branched(self, falsy=False)
        return self is other

    def __hash__(self) -> int:
        _branched(self, falsy=False)  # a set or dict lookup is an ``==`` in disguise
        return object.__hash__(self)

    def __contains__(self, _item: Any) -> bool:
        _branched(self, falsy=False)
        return False

    def __iter__(self) -> Iterator[Any]:
        # Without it, ``__getitem__`` would make ``for x in unknown`` loop for ever.
        raise TypeError("an unpaid answer cannot be iterated: its items are not known")

    def __str__(self) -> str:
        _read()
        return "<unknown>"

    def __getitem__(self, _name: Any) -> Unknown:
        _read()
        return self

    def get(self, _name: Any, _default: Any = None) -> Unknown:
        _read()
        return self


@dataclass
class UnknownsMet:
    """What one column's ``run_if`` and resolver did with unknown values (estimated).

    ``read``: it read one (an unpaid answer's value, a row's unknown cell...).
    ``other_way``: per branch taken on an unknown (``bool``, ``==``, ``in``...), the
    chance the run goes the other way: ``1 - p`` for a truth test on a measured value
    (its miss rate), ``p`` for an equality (at most the chance it is present), 1 when
    ``p`` is a guess.
    """

    read: bool = False
    other_way: list[float] = field(default_factory=list)

    @property
    def any(self) -> bool:
        return self.read or bool(self.other_way)

    def fallback_chance(self) -> float:
        """The chance the run takes some branch the estimate did not (1 with no branch
        recorded: the value may have been tested in a way nothing sees, ``is None``)."""
        if not self.other_way:
            return 1.0
        stays = 1.0
        for chance in self.other_way:
            stays *= 1.0 - min(max(chance, 0.0), 1.0)
        return 1.0 - stays


_MET: ContextVar[UnknownsMet | None] = ContextVar("playline_estimate_unknowns_met", default=None)


@contextmanager
def watching_unknowns() -> Iterator[UnknownsMet]:
    """Record what the code run inside (one column, in this task and the tasks it
    starts) does with unknown values; a watch inside another adds its record to it."""
    met = UnknownsMet()
    token = _MET.set(met)
    try:
        yield met
    finally:
        _MET.reset(token)
        outer = _MET.get()
        if outer is not None:
            outer.read = outer.read or met.read
            outer.other_way.extend(met.other_way)


def note_read() -> None:
    """An unknown value was read by the code being watched."""
    _read()


def _read() -> None:
    met = _MET.get()
    if met is not None:
        met.read = True


def _branched(value: Unknown, *, falsy: bool) -> None:
    met = _MET.get()
    if met is None:
        return
    met.read = True
    if not value.measured:
        met.other_way.append(1.0)
    else:
        met.other_way.append(1.0 - value.p if falsy else value.p)


def unknown_p(value: Any) -> float | None:
    """The smallest ``p`` of the Unknowns in ``value`` (mappings and lists searched);
    ``None`` when it holds none."""
    if isinstance(value, Unknown):
        return value.p
    if isinstance(value, Mapping):
        items: Any = value.values()
    elif isinstance(value, list | tuple):
        items = value
    else:
        return None
    found = [p for p in (unknown_p(item) for item in items) if p is not None]
    return min(found) if found else None


class ToolHistory:
    """What a tool's latest completed receipts say about its next call.

    With at least ``min_history`` of them, ``price`` is the mean credits charged and
    ``share(...)`` the fraction of answers meeting a condition (a getter present, an
    accept rule, a verifier's verdict); with fewer, the price is the worst case and
    every share is 1, and ``basis`` says so.
    """

    def __init__(
        self,
        tool: ToolSpec,
        samples: Sequence[tuple[Any, float | None]],
        *,
        min_history: int = MIN_HISTORY,
    ) -> None:
        self.tool = tool
        self.enough = len(samples) >= max(1, min_history)
        self._answers = [ToolResult(tool, data, cached=True) for data, _ in samples]
        credits = [float(c or 0.0) for _, c in samples]
        #: the catalog's typical hit rate, used while the receipts are too few
        self.prior = None if self.enough else tool.typical_hit_rate
        if self.enough:
            self.price = sum(credits) / len(credits)
        elif self.prior is not None:
            self.price = stated_price(tool, self.prior)
        else:
            self.price = tool.max_credits
        self._shares: dict[Hashable, float] = {}

    @property
    def basis(self) -> Basis:
        if self.enough:
            return BASIS_RECEIPTS
        return BASIS_WORST_CASE if self.prior is None else BASIS_STATED

    def share(self, name: Hashable, holds: Callable[[ToolResult], bool]) -> float:
        """The fraction of answers for which ``holds`` (cached under ``name``)."""
        if not self.enough:
            return 1.0
        found = self._shares.get(name)
        if found is None:
            found = self._shares[name] = sum(1 for a in self._answers if holds(a)) / len(
                self._answers
            )
        return found

    def p(self, getter: str) -> float:
        """The chance the answer holds a present value under ``getter`` (the stated hit
        rate while the receipts are too few)."""
        if self.prior is not None:
            return self.prior
        return self.share(("present", getter), lambda answer: is_present(answer.get(getter)))


def stated_price(tool: ToolSpec, hit_rate: float) -> float:
    """A call's expected credits at ``hit_rate`` under the tool's billing rule: a
    request price is paid whatever the answer; a hit's (or its fields') only on a hit."""
    if tool.billing.rule == "per_request":
        return tool.max_credits
    return tool.max_credits * hit_rate


@dataclass(frozen=True)
class UnpaidResult(ToolResult):
    """The answer of a call the run would pay for: every value read is an ``Unknown``
    whose ``p`` comes from the tool's history (times ``scale``: the chance the call's
    own input is real)."""

    history: ToolHistory | None = field(default=None, repr=False)
    scale: float = 1.0

    def get(self, name: str, default: Any = None) -> Any:
        _read()
        if self.history is None:
            return Unknown(self.scale)
        history = self.history
        return Unknown(
            self.scale * history.p(name), measured=history.enough or history.prior is not None
        )


class ReceiptReader(Protocol):
    """The read side of a receipt store: all an estimate uses."""

    async def get(self, keys: Sequence[str]) -> dict[str, Receipt]: ...

    async def sample(self, tool_id: str, limit: int = 1000) -> list[tuple[Any, float | None]]: ...


@dataclass
class _Counted:
    """What a key was counted at, so a likelier later caller raises its expected figure."""

    line: dict[str, Any]
    reach: float
    price: float


#: The column whose calls are being counted; a play's own calls count under the play.
COUNTED_COLUMN: ContextVar[str] = ContextVar("playline_estimate_column", default=PLAY_COLUMN)


@contextmanager
def counting_for(column: str) -> Iterator[None]:
    """Count the calls made inside (in this task and the tasks it starts) under ``column``."""
    token = COUNTED_COLUMN.set(column)
    try:
        yield
    finally:
        COUNTED_COLUMN.reset(token)


class EstimatingDispatcher:
    """The claims and the dispatcher of an estimate's :class:`ToolRunner`: it reads
    receipts instead of claiming them and counts calls instead of sending them. See the
    module docstring.

    Args:
        catalog: the tools that exist.
        receipts: the receipt store, read only.
        auth_scope: the run's mode's auth scope (part of the receipt key).
        clock: epoch seconds, for ``stale_after_seconds``.
        min_history: receipts of a tool needed for expected figures.
        free: the run would be charged nothing (fixture mode replays recorded
            answers): calls are counted, their credits are 0.
        seen: the calls chunks of the same estimate counted to pay in this worker, by
            the chunk (``chunk``) that counts them: the run pays for a call once and
            its other chunks find the receipt, so they count it free (a retried
            attempt of the counting chunk counts it again: its first tally was lost).
        chunk: the chunk this dispatcher counts for (its first row).
    """

    def __init__(
        self,
        catalog: Catalog,
        receipts: ReceiptReader,
        auth_scope: Callable[[ToolSpec], str],
        *,
        clock: Callable[[], float] = time.time,
        min_history: int = MIN_HISTORY,
        free: bool = False,
        seen: dict[bytes, int] | None = None,
        chunk: int = 0,
    ) -> None:
        self.catalog = catalog
        self._seen = seen
        self._chunk = chunk
        self.free = free
        self.tally = EstimateTally()
        self._receipts = receipts
        self._scope = auth_scope
        self._clock = clock
        self._min_history = min_history
        self._counted: dict[str, _Counted] = {}
        self._histories: dict[str, asyncio.Future[ToolHistory]] = {}
        self._lookups: TickBatch[str, Receipt | None] = TickBatch(self._read)

    def auth_scope(self, tool: ToolSpec) -> str:
        return self._scope(tool)

    async def history(self, tool: ToolSpec) -> ToolHistory:
        """The tool's history, read once per attempt (concurrent askers share it)."""
        found = self._histories.get(tool.id)
        if found is None:
            found = self._histories[tool.id] = asyncio.ensure_future(self._read_history(tool))
        return await asyncio.shield(found)

    async def _read_history(self, tool: ToolSpec) -> ToolHistory:
        samples = await self._receipts.sample(tool.id, SAMPLE_SIZE)
        return ToolHistory(tool, samples, min_history=self._min_history)

    # -- the claims: a read ---------------------------------------------------------

    async def claim(self, request: ClaimRequest) -> tuple[ClaimOutcome, float]:
        """A fresh completed receipt is a hit (counted free); anything else is a call
        the run would claim and pay for (counted by :meth:`settle`)."""
        receipt = await self._lookups.submit(request.key)
        if receipt is not None and self._fresh(receipt, request):
            tool = self.catalog.tool(request.tool_id)
            self.tally.cached(COUNTED_COLUMN.get(), tool.id, tool.provider)
            hit = ClaimOutcome(
                request.key,
                ClaimStatus.HIT,
                result=receipt.result,
                completed_at=receipt.completed_at,
            )
            return hit, time.monotonic()
        return ClaimOutcome(request.key, ClaimStatus.CLAIMED), time.monotonic()

    async def unkeyed(self, tool: ToolSpec, tool_input: Mapping[str, Any]) -> ToolResult | None:
        """A dependent call whose input holds an ``Unknown``: not looked up, counted to
        pay at the chance its input is real (a blank one raises ``BlankInput``: never
        sent whatever the unknown values turn out to be)."""
        chance = unknown_p(tool_input)
        if chance is None:
            return None
        blank = tool.blank_fields(tool_input)
        if blank:
            raise BlankInput(tool.id, blank)
        return await self.count_unknown_input(
            COUNTED_COLUMN.get(), tool.id, CALL_REACH.get() * chance
        )

    def shared(self, key: str) -> None:
        """A likelier caller of a call counted to pay raises its expected figure."""
        reach = CALL_REACH.get()
        counted = self._counted.get(key)
        if counted is not None and reach > counted.reach:
            counted.line["expected_credits"] += (reach - counted.reach) * counted.price
            counted.reach = reach

    async def _read(self, keys: list[str]) -> list[Receipt | None]:
        found = await self._receipts.get(keys)
        return [found.get(key) for key in keys]

    def _fresh(self, receipt: Receipt, request: ClaimRequest) -> bool:
        """Whether the claim rule (``decide_claim``) would answer from this receipt: the
        call's age limit and the tool's freshness rule on the receipt's answer."""
        if receipt.status != "completed" or request.force:
            return False
        limit = request.stale_after_seconds
        if request.max_age is not None:
            limit = stricter(limit, request.max_age(receipt.result))
        return within_age(receipt.completed_at, limit, self._clock())

    # -- the dispatcher: a count ----------------------------------------------------

    async def settle(self, call: ClaimedCall) -> Settled:
        """Count a call the run would pay for (at the chance ``CALL_REACH`` it is made);
        its answer is unpaid: every value read of it is an ``Unknown``."""
        tool, column, reach = call.tool, COUNTED_COLUMN.get(), CALL_REACH.get()
        if self._seen is not None:
            digest = bytes.fromhex(call.key.rpartition(":")[2])
            owner = self._seen.setdefault(digest, self._chunk)
            if owner != self._chunk:
                # Another chunk of this estimate pays for it; by then its receipt answers.
                self.tally.cached(column, tool.id, tool.provider)
                history = await self.history(tool)
                return Settled(self._unpaid(tool, history, cached=True), paid=False)
        history = await self.history(tool)
        line = self._to_pay(column, history, reach)
        self._counted[call.key] = _Counted(line, reach, self._price(history))
        return Settled(self._unpaid(tool, history, cached=False), credits=0.0)

    def _unpaid(self, tool: ToolSpec, history: ToolHistory, *, cached: bool) -> UnpaidResult:
        # Fetched now, for the runner's sharing (on its clock): the run's answer is fresh.
        return UnpaidResult(
            tool, Unknown(1.0), cached=cached, history=history, fetched_at=time.time()
        )

    async def count_unknown_input(self, column: str, tool_id: str, chance: float) -> UnpaidResult:
        """A dependent call whose input is unknown (real with ``chance``): counted to pay."""
        tool = self.catalog.tool(tool_id)
        history = await self.history(tool)
        self._to_pay(column, history, chance, unknown=True)
        return UnpaidResult(tool, Unknown(chance), cached=False, history=history, scale=chance)

    def _to_pay(
        self, column: str, history: ToolHistory, chance: float, unknown: bool = False
    ) -> dict[str, Any]:
        """Count a call of ``history``'s tool to pay: in full in the worst case, at
        ``chance`` expected (``unknown``: a dependent call whose input is unknown)."""
        tool = history.tool
        worst = 0.0 if self.free else tool.max_credits
        expected = chance * self._price(history)
        return self.tally.to_pay(
            column,
            tool.id,
            tool.provider,
            worst=worst,
            expected=expected,
            basis=history.basis,
            unknown_input=unknown,
        )

    def _price(self, history: ToolHistory) -> float:
        return 0.0 if self.free else history.price

    async def aclose(self) -> None:
        pass  # nothing runs on its own

    def abort(self) -> None:
        pass


class Estimator:
    """One estimate attempt's call path: the run's :class:`ToolRunner` with an
    :class:`EstimatingDispatcher` as its claims and its dispatcher (arguments as the
    dispatcher's). Its row contexts, ``rc.tool`` and waterfalls are the run's."""

    def __init__(
        self,
        catalog: Catalog,
        receipts: ReceiptReader,
        auth_scope: Callable[[ToolSpec], str],
        **options: Any,
    ) -> None:
        self.dispatcher = EstimatingDispatcher(catalog, receipts, auth_scope, **options)
        attempt = Attempt(
            # Never claimed from nor written to: the dispatcher's claims only read.
            receipts=cast(ReceiptStore, receipts),
            owner="estimate",
            lease_id="estimate",
            lease_ttl_s=ESTIMATE_LEASE_TTL_S,
        )
        self.runner = ToolRunner(catalog, attempt, self.dispatcher, claims=self.dispatcher)

    @property
    def catalog(self) -> Catalog:
        return self.dispatcher.catalog

    @property
    def tally(self) -> EstimateTally:
        return self.dispatcher.tally
