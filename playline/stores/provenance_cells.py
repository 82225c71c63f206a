"""Provenance as export cells: where each computed value came from, what it cost.

A run keeps, per row, ``{column: provenance}`` for the cells it computed (see
:mod:`playline.stores.sheet`). An export asked for provenance turns it into
columns a spreadsheet user can read next to each computed column ``C``:

* ``C__source``: ``"<tool> via <provider>, <receipt>"`` (a reused answer adds the
  date its receipt was paid: ``mailfox_email via mailfox, reused 2026-12-04``);
  empty when no tool gave the value;
* ``C__credits``: the credits this run's calls for ``C`` charged, a plain number;
* ``C__fetched_at``: when the value was fetched, ISO 8601 UTC;
* ``C__miss``: why there is no value, when there is none.

These functions are pure (no store, no I/O) so the format is stated and tested
in one place; the CSV writer makes the cells formula-inert like any other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

__all__ = [
    "PROVENANCE_SUFFIXES",
    "credits_text",
    "csv_columns",
    "date_utc",
    "iso_utc",
    "provenance_cells",
    "source_text",
    "with_provenance_cells",
]

#: The columns that follow each computed column ``C`` in a CSV with provenance.
PROVENANCE_SUFFIXES = ("__source", "__credits", "__fetched_at", "__miss")


def csv_columns(run_columns: Sequence[str], computed: Sequence[str]) -> list[str]:
    """The CSV header with provenance: the run's other (input) columns in their
    order, then each computed column followed by its provenance columns.

    ``computed`` keeps the order it has in ``run_columns``, so the header is stable
    whatever order the columns were found in.
    """
    chosen = set(computed)
    inputs = [c for c in run_columns if c not in chosen]
    ordered = [c for c in run_columns if c in chosen]
    ordered += [c for c in computed if c not in set(run_columns)]
    header = list(inputs)
    for column in ordered:
        header.append(column)
        header.extend(column + suffix for suffix in PROVENANCE_SUFFIXES)
    return header


def iso_utc(epoch: float | None) -> str:
    """``2026-12-04T10:00:00Z`` (seconds, UTC), or ``""`` without a time."""
    if epoch is None:
        return ""
    return datetime.fromtimestamp(float(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def date_utc(epoch: float | None) -> str:
    """``2026-12-04`` (UTC), or ``""`` without a time."""
    if epoch is None:
        return ""
    return datetime.fromtimestamp(float(epoch), UTC).strftime("%Y-%m-%d")


def credits_text(value: Any) -> str:
    """A credits figure as a plain number: ``1.5``, ``0``, ``2`` (never ``2.0`` or
    an exponent, which a spreadsheet or a reader may misread); ``""`` if unknown."""
    if value is None or isinstance(value, bool):
        return ""
    try:
        number = Decimal(repr(float(value)))
    except (TypeError, ValueError):
        return str(value)
    if not number.is_finite():
        return str(value)
    if number == number.to_integral_value():
        return str(int(number))
    return format(number.normalize(), "f")


def source_text(provenance: Mapping[str, Any]) -> str:
    """``"<tool> via <provider>, <receipt>[ <date>]"``; ``""`` when no tool gave it.

    The date (when the receipt was paid) is shown for a ``reused`` answer, where it
    tells how old the value may be; the parts that are missing are left out.
    """
    tool = provenance.get("tool")
    if provenance.get("kept") == "fresh":
        # A fresh cell an earlier run computed: this run called nothing for it.
        fetched = date_utc(provenance.get("fetched_at"))
        return f"kept (fresh since {fetched})" if fetched else "kept (fresh)"
    if not tool:
        return ""
    text = str(tool)
    provider = provenance.get("provider")
    if provider:
        text += f" via {provider}"
    receipt = provenance.get("receipt")
    if receipt:
        text += f", {receipt}"
        paid = date_utc(provenance.get("receipt_at") or provenance.get("fetched_at"))
        if receipt == "reused" and paid:
            text += f" {paid}"
    return text


def provenance_cells(column: str, provenance: Mapping[str, Any] | None) -> dict[str, str]:
    """The provenance columns of ``column`` for one row (all empty without any)."""
    if not provenance:
        return {column + suffix: "" for suffix in PROVENANCE_SUFFIXES}
    return {
        f"{column}__source": source_text(provenance),
        f"{column}__credits": credits_text(provenance.get("credits")),
        f"{column}__fetched_at": iso_utc(provenance.get("fetched_at")),
        f"{column}__miss": str(provenance.get("miss") or ""),
    }


def with_provenance_cells(
    data: Mapping[str, Any],
    computed: Sequence[str],
    provenance: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """A CSV row with its computed columns' provenance cells added."""
    row = dict(data)
    found = provenance or {}
    for column in computed:
        row.update(provenance_cells(column, found.get(column)))
    return row
