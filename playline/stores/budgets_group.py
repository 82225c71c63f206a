"""A group of reservations, settlements and releases applied in order, in memory.

The ledger (:mod:`~playline.stores.budgets_ledger`, on SQLite and PostgreSQL alike)
commits the budget calls of a process in groups: one transaction locks every budget
row the group touches and reads the reservations of its keys, then
:class:`GroupLedger` applies the calls one after another, exactly as separate
transactions would in that order (a later call sees an earlier one's reservation),
and says what to write back. Pure: no I/O, so
the same rules are unit-testable and a transaction retried after a deadlock simply
starts a new ``GroupLedger``.

It works on the stored form: budgets by their stored keys
(:func:`~playline.stores.budget_ids.budget_key`), reservations by ``(key, budget key)``.
A reservation holds its credits and its line's scale; the budget row moves by their
product when it is reserved, settled (at the charge times the same scale) or released.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Literal

from playline.stores.budgets import (
    BudgetLine,
    BudgetState,
    Draw,
    Refusal,
    first_refusal,
    tidy,
    unknown_budget,
)

__all__ = ["GroupLedger", "Held", "LedgerOp", "Pair"]

#: A reservation's identity: (key, budget as the caller names it).
Pair = tuple[str, str]


@dataclass(frozen=True, slots=True)
class LedgerOp:
    """One ``reserve`` (``lines``), ``settle`` or ``release`` (``budgets``) call,
    checked (amounts, ids, repeats removed) before it joins a group."""

    kind: Literal["reserve", "settle", "release"]
    key: str
    credits: float = 0.0
    lines: tuple[BudgetLine, ...] = ()
    budgets: tuple[str, ...] = ()
    #: reserve: the play run the reservation belongs to
    run: str | None = None

    def pairs(self) -> list[Pair]:
        names = [line.key for line in self.lines] if self.kind == "reserve" else self.budgets
        return [(self.key, budget) for budget in names]


@dataclass(frozen=True, slots=True)
class Held:
    """A reservation as stored: the budget row it counts in, its worst case (credits),
    and once settled what was charged (credits); ``scale``: what one credit counts in
    that budget."""

    drawn_on: str
    credits: float
    status: Literal["open", "settled"]
    created_at: float
    charged: float | None = None
    settled_at: float | None = None
    run: str | None = None
    scale: float = 1.0

    @property
    def amount(self) -> float:
        """What the reservation holds in its budget's unit."""
        return self.credits * self.scale


class GroupLedger:
    """The locked budget rows and the group's reservations, changed call by call.

    Args:
        states: the budget rows the group may change, locked by the caller.
        held: the stored reservations of the group's pairs.
        now: the group's time (for reservations' timestamps).
    """

    def __init__(self, states: dict[str, BudgetState], held: dict[Pair, Held], now: float) -> None:
        self._states = dict(states)
        self._held = dict(held)
        self._stored = set(held)
        self._now = now
        self._changed_states: set[str] = set()
        self._touched: set[Pair] = set()

    def reserve(self, op: LedgerOp, targets: dict[str, str]) -> Refusal | None:
        """Apply a reservation; ``targets`` maps each line's budget (its stored key) to
        the row it draws on (a named budget's period). A line already held under the key
        is skipped."""
        draws: list[Draw] = []
        for line in op.lines:
            if (op.key, line.key) in self._held:
                continue
            drawn_on = targets[line.key]
            state = self._states.get(drawn_on)
            if state is None:
                raise unknown_budget(line.budget)
            draws.append(Draw(line.key, drawn_on, state, scale=line.scale))
        refusal = first_refusal(draws, op.credits)
        if refusal is not None:
            return refusal
        for draw in draws:
            state = self._states[draw.drawn_on]
            self._put_state(replace(state, reserved=state.reserved + op.credits * draw.scale))
            self._put_held(
                (op.key, draw.budget),
                Held(draw.drawn_on, op.credits, "open", self._now, run=op.run, scale=draw.scale),
            )
        return None

    def settle(self, op: LedgerOp) -> None:
        """Move each open reservation of ``op.budgets`` to spent at ``op.credits``
        (times the reservation's scale)."""
        for pair, held, state in self._open_holds(op):
            self._put_state(
                replace(
                    state,
                    reserved=tidy(state.reserved - held.amount),
                    spent=state.spent + op.credits * held.scale,
                )
            )
            self._put_held(
                pair, replace(held, status="settled", charged=op.credits, settled_at=self._now)
            )

    def release(self, op: LedgerOp) -> None:
        """Remove each open reservation of ``op.budgets`` and give its credits back."""
        for pair, held, state in self._open_holds(op):
            self._put_state(replace(state, reserved=tidy(state.reserved - held.amount)))
            del self._held[pair]
            self._touched.add(pair)

    def state(self, budget: str) -> BudgetState | None:
        """A budget row this group holds, as the calls so far left it."""
        return self._states.get(budget)

    def _open_holds(self, op: LedgerOp) -> Iterator[tuple[Pair, Held, BudgetState]]:
        """Each pair of ``op`` with an open reservation on a row this group holds, that
        reservation, and its row as the pairs before it left it (read one at a time)."""
        for pair in op.pairs():
            held = self._held.get(pair)
            if held is None or held.status != "open" or held.drawn_on not in self._states:
                continue
            yield pair, held, self._states[held.drawn_on]

    def _put_state(self, state: BudgetState) -> None:
        self._states[state.budget] = state
        self._changed_states.add(state.budget)

    def _put_held(self, pair: Pair, held: Held) -> None:
        self._held[pair] = held
        self._touched.add(pair)

    # ------------------------------------------------------------ what to write

    def changed_states(self) -> list[BudgetState]:
        """The budget rows to write back (absolute values: the rows are locked), by id."""
        return [self._states[budget] for budget in sorted(self._changed_states)]

    def stale_pairs(self) -> list[Pair]:
        """Stored reservations this group changed or removed: delete them first ..."""
        return sorted(self._touched & self._stored)

    def new_rows(self) -> list[tuple[Pair, Held]]:
        """... then insert what the group leaves of every pair it touched."""
        return [(pair, self._held[pair]) for pair in sorted(self._touched) if pair in self._held]
