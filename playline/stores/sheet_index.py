"""What the sheet store derives from a row's provenance as it writes it, so a reader asks
SQL rather than scanning rows: each cell's outcome, and the few figures the charts sum.

A run's provenance is JSON per manifest row; answering "which rows have a cell with no
match?" or "what did each provider spend, minute by minute?" from it means reading every
row. So :meth:`~playline.stores.sheet_ledger.SheetLedger.write_results` keeps, beside the
provenance, two small derived things, written in the same transaction (they can never
disagree with it):

* the row's **outcomes** (:func:`outcomes_text`): one short text per row naming each
  computed cell's outcome, which a ``LIKE`` pattern (:func:`outcome_pattern`) matches;
* the row's **facts** (:func:`row_facts`): one narrow row per paid provider (credits,
  when), per waterfall step tried (hit, credits) and per waterfall answer (which step,
  or none), which ``GROUP BY`` sums into the spend chart and each waterfall's funnel
  with the rules of :class:`playline.calls.provenance.SpendTally` (a test holds them
  equal).

The outcome rule (:func:`cell_outcome`) is here, below the sheet view that shows it, so
what the store records and what the page colours are one rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from playline.spend import NO_STEP

__all__ = [
    "FACT_PAID",
    "FACT_STEP",
    "FACT_WON",
    "NO_CELLS",
    "Fact",
    "Outcome",
    "cell_outcome",
    "like_escape",
    "outcome_pattern",
    "outcomes_text",
    "row_facts",
]

Outcome = Literal["hit", "no_match", "failed", "skipped_budget", "skipped", "not_run"]

#: A paid provider of a cell: ``name`` the provider, ``credits``, ``at`` fetched at.
FACT_PAID = "paid"
#: A waterfall step tried: ``name`` the tool, ``hits`` 1 for a hit, ``credits``.
FACT_STEP = "step"
#: A waterfall cell's answer: ``name`` the step that gave the value, or ``NO_STEP``.
FACT_WON = "won"

#: Separators of the outcomes text: between cells, and between a column and its
#: outcome (control characters: no column name holds them).
_CELL, _IS = "\x1f", "\x1e"
#: The outcomes of a row with provenance but no cell in it.
NO_CELLS = _CELL


def cell_outcome(status: str, provenance: Mapping[str, Any] | None, value: Any) -> Outcome:
    """The outcome of one computed cell of a row in ``status`` with ``provenance``.

    A cell without provenance is ``not_run`` while its row is pending; a finished row
    from a store that kept none is judged by its value.
    """
    if provenance is None:
        if status == "pending":
            return "not_run"
        if status == "error":
            return "failed"
        return "hit" if value not in (None, "") else "no_match"
    miss = provenance.get("miss")
    if miss is None:
        return "hit"
    text = str(miss)
    if text.startswith("error:"):
        return "failed"
    if text == "skipped_budget":
        return "skipped_budget"
    if text.startswith("skipped") or text == "not_sent":
        return "skipped"
    return "no_match"


def outcomes_text(
    status: str, provenance: Mapping[str, Any] | None, cells: Mapping[str, Any]
) -> str | None:
    """The row's outcomes as stored: ``␟column␞outcome␟...`` for every cell its
    provenance names (the sheet view's computed columns) or, for a row without
    provenance, its computed cells; :data:`NO_CELLS` for a row whose provenance
    names none, ``None`` for a row with neither (a reader judges both by the row's
    status alone)."""
    found = provenance or {}
    columns = list(found if provenance is not None else cells)
    if not columns:
        return None if provenance is None else NO_CELLS
    parts = (f"{c}{_IS}{cell_outcome(status, found.get(c), cells.get(c))}" for c in columns)
    return _CELL + _CELL.join(parts) + _CELL


def like_escape(text: str) -> str:
    """``text`` taken literally inside a ``LIKE ... ESCAPE '\\'`` pattern."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def outcome_pattern(outcome: str, column: str | None) -> str:
    """The ``LIKE`` pattern (escape ``\\``) of a row whose ``column`` (or any cell) has
    ``outcome`` in its :func:`outcomes_text`."""
    cell = f"{_CELL}{column}" if column is not None else ""
    return f"%{like_escape(cell + _IS + outcome + _CELL)}%"


class Fact(NamedTuple):
    """One derived figure of a row's cell (see the ``FACT_*`` kinds)."""

    column: str
    kind: str
    pos: int
    name: str
    hits: int
    credits: float
    at: float | None


def row_facts(provenance: Mapping[str, Any] | None) -> list[Fact]:
    """The facts of a row's provenance (``{column: cell provenance}``), counted as
    :func:`playline.calls.provenance.tally_cell` counts them."""
    facts: list[Fact] = []
    for column, cell in (provenance or {}).items():
        if not isinstance(cell, Mapping):
            continue
        at = cell.get("fetched_at")
        for pos, (provider, cost) in enumerate((cell.get("by_provider") or {}).items()):
            facts.append(
                Fact(column, FACT_PAID, pos, str(provider), 0, float(cost or 0.0), _at(at))
            )
        steps = cell.get("steps")
        if not isinstance(steps, list):
            continue
        winner = cell.get("tool") if cell.get("miss") is None else None
        facts.append(Fact(column, FACT_WON, 0, str(winner) if winner else NO_STEP, 0, 0.0, None))
        for pos, step in enumerate(steps):
            if str(step.get("outcome", "")).startswith("skipped"):
                continue
            facts.append(
                Fact(
                    column,
                    FACT_STEP,
                    pos,
                    str(step.get("tool")),
                    int(step.get("outcome") == "hit"),
                    float(step.get("credits") or 0.0),
                    None,
                )
            )
    return facts


def _at(value: Any) -> float | None:
    return None if value is None else float(value)
