"""What a sheet cell and a sheet row came to, in the words the sheet view filters by.

A cell's provenance (:mod:`playline.calls.provenance`) says which tool answered it or
why none did (``miss``); the row's status says whether the run has reached it. These
pure functions turn both into one outcome per cell (``hit``, ``no_match``, ``failed``,
``skipped_budget``, ``skipped``, ``not_run``) and one status per row, so what the page
colours, what its filter matches and what a test expects are one rule (the cell's
rule is the sheet store's, :func:`~playline.stores.sheet_index.cell_outcome`, which
records each row's outcomes as it writes them).
"""

from __future__ import annotations

from playline.stores.sheet import RunRow
from playline.stores.sheet_index import Outcome, cell_outcome

__all__ = ["OUTCOMES", "Outcome", "cell_outcome", "row_outcomes", "row_status"]

#: Every outcome with the label the page shows (and filters by), in filter order.
OUTCOMES: dict[str, str] = {
    "hit": "hit",
    "no_match": "no match",
    "failed": "failed",
    "skipped_budget": "skipped (budget)",
    "skipped": "skipped (input, condition or cancel)",
    "not_run": "not run yet",
}


def row_outcomes(row: RunRow, computed: list[str]) -> dict[str, Outcome]:
    """``{column: outcome}`` for the row's computed columns."""
    found = row.provenance or {}
    return {c: cell_outcome(row.status, found.get(c), row.data.get(c)) for c in computed}


def row_status(row: RunRow, held_for_budget: bool = False) -> tuple[str, str]:
    """``(kind, text)`` of the row's status column: ``done``, ``failed`` (with why),
    ``skipped`` (budget or cancel), ``pending`` (not started) or, while the run holds
    its rows for budget, ``held`` (nothing moves until the budget is raised)."""
    if row.status == "ok":
        return "done", "done"
    if row.status == "pending":
        return ("held", "held at budget") if held_for_budget else ("pending", "not started")
    error = row.error or ""
    if error.startswith(("skipped_budget", "not_sent")):
        return "skipped", error.split(":", 1)[0].replace("_", " ")
    return "failed", f"failed: {error}" if error else "failed"
