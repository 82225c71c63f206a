"""What a sheet cell and a sheet row came to, in the words the sheet view filters by.

A cell's provenance (:mod:`playline.calls.provenance`) says which tool answered it or
why none did (``miss``); the row's status says whether the run has reached it. These
pure functions turn both into one outcome per cell (``hit``, ``no_match``, ``failed``,
``skipped_budget``, ``skipped``, ``not_run``) and one status per row, so what the page
colours, what its filter matches and what a test expects are one rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from playline.stores.sheet import RunRow

__all__ = ["OUTCOMES", "Outcome", "cell_outcome", "row_outcomes", "row_status"]

Outcome = Literal["hit", "no_match", "failed", "skipped_budget", "skipped", "not_run"]

#: Every outcome with the label the page shows (and filters by), in filter order.
OUTCOMES: dict[str, str] = {
    "hit": "hit",
    "no_match": "no match",
    "failed": "failed",
    "skipped_budget": "skipped (budget)",
    "skipped": "skipped (input, condition or cancel)",
    "not_run": "not run yet",
}


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
