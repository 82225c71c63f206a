"""Whether a run keeps a row's earlier cell or computes it again.

A column with a freshness rule (``with_column(..., fresh_for=...)``) keeps a cell an
earlier run computed while it is fresh: its resolver does not run, so it costs no
call and no receipt lookup. A cell is kept only if what its resolver read is
unchanged (a digest of the row's input columns and the columns computed before it,
recorded with the cell): a changed input is computed again whatever its age. A cell
that is due because it aged is recomputed with its calls refusing receipts older
than the rule allows (``REFRESH_OLDER_THAN``): otherwise the receipt that made the
old value would answer again and nothing would be refreshed.

The chunk and the estimate chunk both plan a column with :func:`plan_column`, so an
estimate counts exactly the cells the run will pay for.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from playline.calls.provenance import ColumnCalls
from playline.contract import ColumnSpec
from playline.freshness import PreviousCell, outcome_of, within_age

__all__ = [
    "ColumnPlan",
    "cell_meta",
    "fetch_dates",
    "kept_provenance",
    "later_columns",
    "plan_column",
]


@dataclass(frozen=True, slots=True)
class ColumnPlan:
    """What to do with one column of one row."""

    #: the earlier cell is fresh: it stands, nothing runs
    keep: bool
    #: the earlier cell, if the sheet row has one (``rc.previous``)
    previous: PreviousCell | None
    #: due because it aged: its calls refuse receipts older than this (seconds)
    refresh_older_than: float | None
    #: the digest of what the resolver reads, recorded with the computed cell
    digest: str


def later_columns(columns: Sequence[ColumnSpec]) -> list[frozenset[str]]:
    """For each column, itself and the columns after it: what its resolver's input
    digest leaves out (their values are older than the cell, or about to change)."""
    names = [c.name for c in columns]
    return [frozenset(names[i:]) for i in range(len(names))]


def inputs_digest(row: Mapping[str, Any], skip: Collection[str]) -> str:
    """A digest of the row's values except ``skip``. The sheet holds JSON values only;
    an estimate's row may hold an unknown (an answer not paid for), named by its type:
    a digest with one never matches a stored one, so the cell counts as due."""
    seen = {k: v for k, v in row.items() if k not in skip}
    text = json.dumps(
        seen,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=lambda v: f"<{type(v).__name__}>",
    )
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def plan_column(
    spec: ColumnSpec,
    skip: Collection[str],
    row: Mapping[str, Any],
    meta: Mapping[str, Any],
    now: float,
) -> ColumnPlan:
    """Keep the earlier cell (fresh, same inputs), or compute it (and how).

    ``meta`` is the sheet row's cell metadata (``RunRow.cell_meta``); a rule's
    function (``Freshness.rule``) is called here, so an error in it fails the row.
    """
    digest = inputs_digest(row, skip)
    entry = meta.get(spec.name)
    rule = spec.fresh_for
    if not isinstance(entry, Mapping) or spec.name not in row:
        return ColumnPlan(False, None, None, digest)
    value = row[spec.name]
    at = entry.get("at")
    fetched_at = float(at) if isinstance(at, int | float) else None
    previous = PreviousCell(value, fetched_at, outcome_of(value, rule.hit if rule else None))
    if rule is None:
        return ColumnPlan(False, previous, None, digest)
    if entry.get("in") != digest:
        return ColumnPlan(False, previous, None, digest)  # new inputs: a new call anyway
    limit = rule.max_age(value)
    if fetched_at is not None and within_age(fetched_at, limit, now):
        return ColumnPlan(True, previous, None, digest)
    return ColumnPlan(False, previous, limit, digest)


def cell_meta(digest: str, fetched: Sequence[float | None], now: float) -> dict[str, Any]:
    """The metadata of a computed cell: fetched when its oldest answer was (a receipt
    reused from last month makes a month-old cell), and what its resolver read."""
    dates = [f for f in fetched if f is not None]
    return {"at": min(dates) if dates else now, "in": digest}


def fetch_dates(made: ColumnCalls) -> list[float | None]:
    """When each answer a column's resolver used was fetched (calls and waterfalls)."""
    dates = [call.fetched_at for call in made.calls]
    dates += [w.result.fetched_at for w in made.waterfalls if w.result is not None]
    return dates


def kept_provenance(previous: PreviousCell | None) -> dict[str, Any]:
    """The provenance of a cell kept because it was fresh: nothing called, nothing paid,
    the value as old as it was."""
    cell: dict[str, Any] = {"tool": None, "credits": 0.0, "miss": None, "kept": "fresh"}
    if previous is not None and previous.fetched_at is not None:
        cell["fetched_at"] = previous.fetched_at
    return cell
