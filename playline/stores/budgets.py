"""The budget ledger: credits reserved before a paid call is sent, charged when it settles.

A budget is a limit in credits with two running totals kept on its row: ``spent``
(settled charges) and ``reserved`` (the worst case of calls reserved and not settled
yet). Before a paid call is sent, the caller :meth:`~BudgetStore.reserve` s its worst
case against every budget it draws on (the run's, the run's per provider, a named
team budget) in ONE atomic operation of the store, shared by every worker of a fleet
(PostgreSQL) or every process of one machine (SQLite): all lines are granted, or none
is and a :class:`Refusal` says which budget could not cover it. Nothing is reserved
that a budget cannot cover, so no number of workers, retries or crashes takes
``spent + reserved`` past the limit. When the call settles, :meth:`~BudgetStore.settle`
turns the reservation into the actual charge (0 for a miss on a charge-on-hit tool);
when it is not sent after all, :meth:`~BudgetStore.release` gives the credits back.

A reservation is identified by ``(key, budget)``: the call's key (its receipt key) and
the budget as the caller names it. Reserving twice under one key draws once, so a
retried or re-run attempt of the same call is not charged twice against a budget.

Budget ids are typed values (:mod:`~playline.stores.budget_ids`): a run's cap
(``run:<id>``), a provider's share of it (``run:<id>/provider:<name>``), a run's cap in
money (``run:<id>/spend``), all created by their first reservation with the limit the
run gives, a row's own budget (``row:<payer>``) and ``named:<NAME>``, a budget shared
by runs and defined with ``playline budgets set`` (:class:`NamedBudget`). A named budget
is per day or per month: the store draws on the current period's budget
(``named:NAME@2026-12-04``, ``named:NAME@2026-12``, UTC, by the store's clock), created
with the definition's limit when first used, and a reservation remembers the period it
drew on, so it settles there even after midnight. The store takes a typed id or its
stored key; what it returns names budgets by their stored key (``BudgetState.ref``
reads it back).

Scale: a line may count each credit at ``scale`` units of its budget (a money cap: the
provider's credit price). The reservation stores its scale, so the call's settlement,
release and the run's end move the same amount; reservations, charges and
:class:`RunEnd` figures stay in credits, the budget's totals are in its own unit.

This module holds the contract and the pure rules of the ledger
(:mod:`~playline.stores.budgets_ledger`, one implementation for both databases).
Amounts are floats compared with a tolerance of :data:`TOLERANCE`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, Protocol, get_args

from playline.errors import InvalidBudget, UnknownBudget
from playline.stores.budget_ids import (
    BudgetId,
    NamedBudgetId,
    RowBudgetId,
    as_budget_id,
    budget_key,
    check_name,
    parse_budget_key,
)

__all__ = [
    "PERIODS",
    "TOLERANCE",
    "BudgetLine",
    "BudgetState",
    "BudgetStore",
    "Draw",
    "NamedBudget",
    "OpenReservation",
    "Period",
    "Refusal",
    "RunEnd",
    "adjusted_limit",
    "call_end",
    "carried",
    "check_adjustment",
    "check_amount",
    "check_budget_id",
    "check_name",
    "check_period",
    "creation_limit",
    "ended",
    "first_refusal",
    "period_bounds",
    "period_budget",
    "period_end",
    "period_id",
    "period_start",
    "reservation_kind",
    "tidy",
    "unique",
    "unique_lines",
    "unknown_budget",
]

Period = Literal["day", "month"]
PERIODS: tuple[str, ...] = get_args(Period)

#: Amounts closer than this are equal: a budget covers a call when
#: ``used + credits <= limit + TOLERANCE``, and a residue of float arithmetic below it
#: is zero.
TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True)
class BudgetLine:
    """One budget a reservation draws on.

    ``limit`` creates the budget with this limit when it does not exist yet and is
    ignored when it exists (a limit changed by ``adjust`` wins). For a named budget it
    is ignored: the store draws on the named budget's current period, created with the
    definition's limit; a named budget with no definition raises ``UnknownBudget``.
    ``scale``: what one credit counts in this budget (1 for credits; a provider's
    credit price on a money cap). ``budget`` may be given as a stored key (read back
    with :func:`~playline.stores.budget_ids.parse_budget_key`).
    """

    budget: BudgetId
    limit: float | None = None
    scale: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "budget", as_budget_id(self.budget))

    @property
    def key(self) -> str:
        """The stored key of the budget."""
        return budget_key(self.budget)


@dataclass(frozen=True, slots=True)
class BudgetState:
    """A budget as stored (for a named budget: its current period), in its own unit
    (credits; money for a money cap)."""

    budget: str  # the stored key; ``ref`` reads it back
    limit: float
    spent: float  # settled charges
    reserved: float  # open reservations (worst case of calls not settled yet)

    @property
    def ref(self) -> BudgetId:
        """The budget as a typed id."""
        return parse_budget_key(self.budget)

    @property
    def used(self) -> float:
        """What is spent or promised: nothing more may be reserved past the limit."""
        return self.spent + self.reserved

    @property
    def remaining(self) -> float:
        return max(0.0, self.limit - self.used)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a reservation was refused: the first budget (in the order given) that
    could not cover it, as it stood, and what was asked of it (in its unit: credits
    times the line's scale)."""

    state: BudgetState
    needed: float


@dataclass(frozen=True, slots=True)
class NamedBudget:
    """A budget runs share by name, renewed every period (UTC day or month)."""

    name: str
    period: Period
    limit: float


@dataclass(frozen=True, slots=True)
class OpenReservation:
    """A reservation not settled yet, as the ledger holds it (see ``open_reservations``).

    ``what`` is ``"row"`` for a row's worst case (key ``row:<payer>``, settled at what
    the row's own budget used) or ``"call"`` for one paid call (key ``<receipt>#<gen>``).
    """

    key: str
    budget: str  # as the caller named it
    drawn_on: str  # the budget row it counts in
    credits: float
    run: str | None
    what: Literal["row", "call"]


@dataclass(frozen=True, slots=True)
class RunEnd:
    """What ``end_run`` did with a run's open reservations (counted per key; credits
    per key too, not per budget line).

    ``settled``: calls answered and rows, settled at what they used; ``kept_worst``:
    calls that may have been charged without an answer (ambiguous, sent and unanswered,
    a submitted job not read yet), settled at their worst case; ``released``: calls
    never sent, given back.
    """

    run: str
    settled: int = 0
    settled_credits: float = 0.0
    kept_worst: int = 0
    kept_worst_credits: float = 0.0
    released: int = 0
    released_credits: float = 0.0

    def line(self) -> str:
        """One line, as ``playline budgets release`` and the run's log say it."""
        if not (self.settled or self.kept_worst or self.released):
            return f"run {self.run}: no open reservations"
        return (
            f"run {self.run}: released {self.released} reservation(s) "
            f"({self.released_credits:g} credits), settled {self.settled} at what they used "
            f"({self.settled_credits:g}), kept {self.kept_worst} at their worst case "
            f"({self.kept_worst_credits:g}: may have been charged)"
        )


def call_end(reservation: OpenReservation, sent: Mapping[str, float | None]) -> float | None:
    """The rule for a call's reservation left open when its run ends: settled at the
    charge its receipt recorded (``sent[key]`` a figure), at its worst case when it may
    have been charged without an answer (``sent[key] is None``: never under), released
    when it was not sent (key absent): ``None`` means release."""
    if reservation.key not in sent:
        return None
    charged = sent[reservation.key]
    return reservation.credits if charged is None else charged


def ended(run: str, steps: Iterable[tuple[OpenReservation, float | None, bool]]) -> RunEnd:
    """What :meth:`BudgetStore.end_run` reports from its steps (each reservation, what
    it settled at or ``None`` if released, and whether at its worst case for want of an
    answer), counted once per key."""
    seen: set[str] = set()
    end = RunEnd(run)
    settled = kept = released = 0
    settled_credits = kept_credits = released_credits = 0.0
    for reservation, amount, worst in steps:
        if reservation.key in seen:
            continue
        seen.add(reservation.key)
        if amount is None:
            released += 1
            released_credits += reservation.credits
        elif worst:
            kept += 1
            kept_credits += amount
        else:
            settled += 1
            settled_credits += amount
    return RunEnd(end.run, settled, settled_credits, kept, kept_credits, released, released_credits)


def carried(periods: Iterable[tuple[float, float, float]]) -> float:
    """What periods of a named budget's former length count in the new current period
    when its length changes: each period's ``(spent, carried, reserved)`` adds what it
    spent on its own (not what was carried into it, counted where it came from) and what
    it holds reserved (never under)."""
    return tidy(sum(max(0.0, spent - carry) + reserved for spent, carry, reserved in periods))


def reservation_kind(key: str) -> Literal["row", "call"]:
    """A row's reservation is keyed by the row's own budget; any other key is a call's."""
    try:
        return "row" if isinstance(parse_budget_key(key), RowBudgetId) else "call"
    except InvalidBudget:
        return "call"


class BudgetStore(Protocol):
    """The budget ledger. See the module docstring."""

    async def reserve(
        self,
        key: str,
        credits: float,
        lines: Sequence[BudgetLine],
        *,
        run: str | None = None,
    ) -> Refusal | None:
        """All or nothing: for each line whose budget has no reservation under ``key``
        yet, check ``used + credits * line.scale <= limit`` (tolerance
        :data:`TOLERANCE`); if every such line can cover it, record a reservation
        ``(key, line.budget)`` of ``credits`` at the line's scale and add
        ``credits * line.scale`` to each budget's ``reserved``; else record nothing and
        return the :class:`Refusal`. A line already reserved (or settled) under ``key``
        is not drawn again. A line whose budget does not exist is created with
        ``line.limit`` (``None`` and not named: ``UnknownBudget``). ``run``: the play
        run the reservation belongs to (its ``RunBudget.run``), so :meth:`end_run` finds
        it."""
        ...

    async def open_reservations(self, run: str) -> list[OpenReservation]:
        """The run's reservations not settled yet, by key then budget."""
        ...

    async def end_run(self, run: str, sent: Mapping[str, float | None]) -> RunEnd:
        """The run ended: settle or release every open reservation it holds, in one
        step. Calls first, by :func:`call_end` (``sent``: the call keys that were sent,
        each with its recorded charge or ``None`` for "may have been charged, no
        answer"); then each row's reservation at what its own budget
        (``row:<payer>``) used. Reservations of runs recorded before runs were kept
        (no run) are not found."""
        ...

    async def settle(self, key: str, credits: float, budgets: Sequence[BudgetId | str]) -> None:
        """The call under ``key`` settled at ``credits``: each open reservation
        ``(key, b)`` for ``b`` in ``budgets`` (as given to reserve) moves from reserved
        to spent at ``credits`` times the reservation's scale; settled ones are left
        alone; a budget with no reservation under ``key`` is untouched."""
        ...

    async def release(self, key: str, budgets: Sequence[BudgetId | str]) -> None:
        """The call was not sent: its open reservations are removed and give their
        credits back, so a later attempt may reserve again."""
        ...

    async def adjust(
        self,
        budget: BudgetId | str,
        *,
        add: float | None = None,
        set_to: float | None = None,
        create_with: float | None = None,
    ) -> BudgetState:
        """Raise (``add``) or set (``set_to``) a budget's limit; a budget that does not
        exist is created with ``create_with`` first (``None``: ``UnknownBudget``). For
        ``named:NAME`` it changes the definition's limit and the current period's."""
        ...

    async def state(self, budget: BudgetId | str) -> BudgetState | None:
        """The budget as stored, ``None`` if it does not exist. ``named:NAME``: its
        current period (with nothing spent if no run drew on it yet);
        ``named:NAME@PERIOD``: that period's budget."""
        ...

    async def define(self, name: str, *, period: Period, limit: float) -> NamedBudget:
        """Create or change a named budget; also sets its current period's limit."""
        ...

    async def definitions(self) -> list[NamedBudget]:
        """Every named budget, by name."""
        ...

    async def close(self) -> None: ...


# --------------------------------------------------------------------------- ids


def check_period(period: str) -> Period:
    if period == "day":
        return "day"
    if period == "month":
        return "month"
    raise InvalidBudget(f"budget period {period!r} is not 'day' or 'month'")


def check_budget_id(budget: BudgetId | str) -> str:
    """The stored key of ``budget`` if a reservation may name it (a typed id, or a
    non-empty key that reads back), else ``InvalidBudget``."""
    return budget_key(as_budget_id(budget))


def check_amount(what: str, value: float) -> float:
    """``value`` as a float if it is a finite amount >= 0, else ``InvalidBudget``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidBudget(f"{what} must be a number, got {value!r}")
    amount = float(value)
    if not math.isfinite(amount) or amount < 0:
        raise InvalidBudget(f"{what} must be a finite number >= 0, got {value!r}")
    return amount


def unknown_budget(budget: BudgetId | str) -> UnknownBudget:
    ref = as_budget_id(budget)
    if isinstance(ref, NamedBudgetId):
        return UnknownBudget(
            f"no budget named {ref.name!r}; define it with "
            f"`playline budgets set {ref.name} --per-day N` (or --per-month N)"
        )
    return UnknownBudget(
        f"budget {budget_key(ref)!r} does not exist and no limit was given to create it"
    )


# ----------------------------------------------------------------------- periods


def _utc(now_epoch: float) -> datetime:
    return datetime.fromtimestamp(now_epoch, tz=UTC)


def period_id(name: str, period: Period, now_epoch: float) -> str:
    """The id of the named budget's period that holds ``now_epoch`` (UTC):
    ``named:NAME@YYYY-MM-DD`` per day, ``named:NAME@YYYY-MM`` per month."""
    return budget_key(period_budget(name, period, now_epoch))


def period_budget(name: str, period: Period, now_epoch: float) -> NamedBudgetId:
    """The named budget's period that holds ``now_epoch`` (UTC), as a typed id."""
    stamp = _utc(now_epoch).strftime("%Y-%m-%d" if check_period(period) == "day" else "%Y-%m")
    return NamedBudgetId(check_name(name), stamp)


def period_bounds(budget: NamedBudgetId) -> tuple[Period, float] | None:
    """A named budget's period (``NAME@2026-12-04`` or ``NAME@2026-12``): its length and
    when it ends (epoch seconds); ``None`` for the current one (no period named)."""
    if budget.period is None:
        return None
    period: Period = "day" if budget.period.count("-") == 2 else "month"
    stamp = budget.period if period == "day" else f"{budget.period}-01"
    start = datetime.strptime(stamp, "%Y-%m-%d").replace(tzinfo=UTC).timestamp()
    return period, period_end(period, start)


def period_start(period: Period, now_epoch: float) -> float:
    """When the period holding ``now_epoch`` started (epoch seconds, UTC)."""
    moment = _utc(now_epoch).replace(hour=0, minute=0, second=0, microsecond=0)
    if check_period(period) == "month":
        moment = moment.replace(day=1)
    return moment.timestamp()


def period_end(period: Period, now_epoch: float) -> float:
    """When the period holding ``now_epoch`` ends (epoch seconds): the next UTC midnight,
    or the first of the next month, 00:00 UTC. A fresh period starts there."""
    moment = _utc(now_epoch)
    if check_period(period) == "day":
        start = moment.replace(hour=0, minute=0, second=0, microsecond=0)
        return (start + timedelta(days=1)).timestamp()
    year, month = (moment.year + 1, 1) if moment.month == 12 else (moment.year, moment.month + 1)
    return datetime(year, month, 1, tzinfo=UTC).timestamp()


# -------------------------------------------------------------- reservation rule


@dataclass(frozen=True, slots=True)
class Draw:
    """One line of a reservation about to be granted: the budget as the caller names
    it, the stored budget it draws on (a named budget's period), that budget as it
    stands (a budget not created yet: its limit, nothing used), and whether it must be
    created."""

    budget: str
    drawn_on: str
    state: BudgetState
    new: bool = False
    #: what one credit counts in this budget (the line's scale)
    scale: float = 1.0


def first_refusal(draws: Iterable[Draw], credits: float) -> Refusal | None:
    """The refusal of the first draw whose budget cannot cover ``credits`` (times the
    draw's scale), else ``None``."""
    for draw in draws:
        needed = credits * draw.scale
        if draw.state.used + needed > draw.state.limit + TOLERANCE:
            return Refusal(draw.state, needed)
    return None


def unique(budgets: Iterable[str]) -> list[str]:
    """``budgets`` without repeats, in order (a budget named twice is drawn once)."""
    return list(dict.fromkeys(budgets))


def unique_lines(lines: Iterable[BudgetLine]) -> list[BudgetLine]:
    """``lines`` checked, the first of each budget kept, in order."""
    kept: dict[str, BudgetLine] = {}
    for line in lines:
        check_amount(f"the scale of {line.key}", line.scale)
        kept.setdefault(check_budget_id(line.budget), line)
    return list(kept.values())


def creation_limit(line: BudgetLine) -> float | None:
    """The limit a plain line creates its budget with (checked), ``None`` if it has none."""
    return None if line.limit is None else check_amount(f"the limit of {line.key}", line.limit)


def tidy(amount: float) -> float:
    """``amount`` with a float residue below :data:`TOLERANCE` (or a negative) made 0."""
    return 0.0 if amount < TOLERANCE else amount


def check_adjustment(add: float | None, set_to: float | None) -> None:
    """Exactly one of ``add`` (any finite number) and ``set_to`` (a limit >= 0)."""
    if (add is None) == (set_to is None):
        raise InvalidBudget("give exactly one of add and set_to to adjust a budget")
    if add is not None and (
        isinstance(add, bool) or not isinstance(add, int | float) or not math.isfinite(add)
    ):
        raise InvalidBudget(f"add must be a finite number, got {add!r}")
    if set_to is not None:
        check_amount("the budget's new limit", set_to)


def adjusted_limit(
    budget: BudgetId | str, limit: float, *, add: float | None, set_to: float | None
) -> float:
    """The limit ``adjust`` leaves: ``limit + add`` or ``set_to``, never below 0."""
    new = float(set_to) if set_to is not None else limit + float(add or 0.0)
    if new < -TOLERANCE:
        raise InvalidBudget(
            f"budget {check_budget_id(budget)}: its limit {limit:g} cannot be lowered "
            f"by {-float(add or 0):g}"
        )
    return max(0.0, new)
