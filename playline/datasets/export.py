"""Rows out of a dataset run: the export file, the preview and the inline result.

A run's rows are read from the sheet store in pages, in manifest order; a row that
failed carries its error in an ``_error`` column (present only when some row
failed). A CSV export makes spreadsheet formulas inert (a cell starting ``=``,
``+``, ``-``, ``@``, tab or CR gets a leading ``'``: uploads, provider answers and
error texts all reach cells) unless it is ``raw``; JSONL is written as it is. An
export streams: each page is written to the file before the next is
kept (the next one is read while the current one is written), so exporting a
million rows holds two pages, in a worker or in a client that opened the
workers' store (``open_stores(settings, create=False)``). The inline result is
all-or-nothing within a byte budget, projected from the rows seen so far, so a
prefix is never returned and never held.

A *change export* (:func:`export_changes`, ``runs export --changes``) writes only the
rows a re-run changed, for a CRM sync: the row key, then ``C__old`` and ``C__new`` for
each column that changed in some row (see :mod:`~playline.stores.sheet_changes`),
paged from the manifest like any export.

An export may carry each computed cell's *provenance* (``provenance=True``): in CSV
four columns after each computed column (:mod:`~playline.stores.provenance_cells`),
in JSONL a ``_provenance`` object per row. The preview and the inline result never
do: they are recorded in workflow history, where provenance does not belong.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from playline.contract import DEFAULT_PREVIEW_ROWS
from playline.datasets.csv_io import RowFile
from playline.errors import InvalidPlayInput
from playline.stores.provenance_cells import csv_columns, with_provenance_cells
from playline.stores.sheet import RunInfo, RunRow, SheetStore

__all__ = [
    "CHANGE_KEY_COLUMN",
    "RunSummary",
    "export_changes",
    "export_run",
    "row_out",
    "summarize_run",
]

#: The column of a change export naming the row (a compound key's parts joined by ``/``).
CHANGE_KEY_COLUMN = "row_key"

EXPORT_PAGE_ROWS = 1000
#: Preview rows when the caller does not say (``RunOptions.preview_rows``'s default).
PREVIEW_ROWS = DEFAULT_PREVIEW_ROWS
#: Bytes a row is assumed to occupy once decoded, per byte of its JSON, plus overhead.
ROW_MEMORY_MULTIPLIER = 2
ROW_OVERHEAD_BYTES = 64


def row_out(data: dict[str, Any], status: str, error: str | None) -> dict[str, Any]:
    """A row as exported: its data, plus ``_error`` when it failed."""
    if status == "error":
        return {**data, "_error": error}
    return data


async def _info(sheet: SheetStore, run_ref: str) -> RunInfo:
    info = await sheet.run_info(run_ref)
    if info is None:
        raise InvalidPlayInput(f"run {run_ref!r} has no manifest in the sheet store")
    return info


async def _pages(sheet: SheetStore, run_ref: str, admitted: int) -> AsyncIterator[list[RunRow]]:
    """The run's rows page by page, the next page read while the caller uses this one."""
    starts = range(0, admitted, EXPORT_PAGE_ROWS)
    ahead: asyncio.Task[list[RunRow]] | None = None
    try:
        for index, start in enumerate(starts):
            page = await (ahead or sheet.read_run_rows(run_ref, start, start + EXPORT_PAGE_ROWS))
            ahead = None
            if index + 1 < len(starts):
                nxt = starts[index + 1]
                ahead = asyncio.ensure_future(
                    sheet.read_run_rows(run_ref, nxt, nxt + EXPORT_PAGE_ROWS)
                )
            yield page
    finally:
        if ahead is not None:
            ahead.cancel()


async def export_run(
    sheet: SheetStore,
    run_ref: str,
    path: str,
    fmt: str = "csv",
    *,
    raw: bool = False,
    provenance: bool = False,
) -> int:
    """Stream a run's rows, in manifest order, to a CSV or JSONL file; the row count.

    The file appears only when complete (see :class:`~playline.datasets.csv_io.RowFile`).
    ``raw`` writes CSV cells as they are, formulas included. ``provenance`` adds each
    computed cell's provenance (see the module docstring); without it the file is
    what it always was.
    """
    info = await _info(sheet, run_ref)
    counts = await sheet.run_counts(run_ref)
    fmt_name: Literal["csv", "jsonl"] = "jsonl" if fmt == "jsonl" else "csv"
    computed = await _computed_columns(sheet, info) if provenance and fmt_name == "csv" else []
    columns = csv_columns(info.columns, computed) if computed else list(info.columns)
    columns += ["_error"] if counts["error"] else []
    out = await asyncio.to_thread(partial(RowFile, path, fmt_name, columns, raw=raw))
    with out:
        async for page in _pages(sheet, run_ref, info.admitted):
            rows = [_exported(r, fmt_name, provenance, computed) for r in page]
            await asyncio.to_thread(out.write_rows, rows)
        return await asyncio.to_thread(out.commit)


def _exported(
    row: RunRow, fmt: Literal["csv", "jsonl"], provenance: bool, computed: list[str]
) -> dict[str, Any]:
    """One row as the file has it: :func:`row_out`, plus its provenance if asked."""
    data = row_out(row.data, row.status, row.error)
    if not provenance:
        return data
    if fmt == "jsonl":
        return {**data, "_provenance": row.provenance or {}}
    return with_provenance_cells(data, computed, row.provenance)


async def _computed_columns(sheet: SheetStore, info: RunInfo) -> list[str]:
    """The run's columns that have provenance in some row, in the run's column order.

    A CSV header is written once, before the first row, so the run's provenance is
    read through first (the provenance column only, page by page; only the column
    names are kept) rather than guessed from the first page.
    """
    found: set[str] = set()
    for start in range(0, info.admitted, EXPORT_PAGE_ROWS):
        for _, cells in await sheet.read_provenance(
            run_ref=info.run_ref, start=start, end=start + EXPORT_PAGE_ROWS
        ):
            found.update(cells)
    return [c for c in info.columns if c in found]


async def export_changes(
    sheet: SheetStore, run_ref: str, path: str, fmt: str = "csv", *, raw: bool = False
) -> int:
    """Stream the rows the run changed, in manifest order, to a CSV or JSONL file: the
    row key, then ``C__old`` and ``C__new`` per changed column; the row count.

    A CSV's header is written first, so the run's changes are read through once for
    their column names (only the names are kept); formulas are made inert unless
    ``raw``, as in :func:`export_run`. A JSONL line holds the row's own columns only.
    """
    info = await _info(sheet, run_ref)
    fmt_name: Literal["csv", "jsonl"] = "jsonl" if fmt == "jsonl" else "csv"
    columns = [CHANGE_KEY_COLUMN]
    if fmt_name == "csv":
        changed = await _changed_columns(sheet, info)
        columns += [f"{c}__{side}" for c in changed for side in ("old", "new")]
    out = await asyncio.to_thread(partial(RowFile, path, fmt_name, columns, raw=raw))
    with out:
        for start in range(0, info.admitted, EXPORT_PAGE_ROWS):
            page = await sheet.read_changes(run_ref, start, start + EXPORT_PAGE_ROWS)
            rows = [_changed_row(key, changes) for _, key, changes in page]
            await asyncio.to_thread(out.write_rows, rows)
        return await asyncio.to_thread(out.commit)


def _changed_row(row_key: str, changes: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {CHANGE_KEY_COLUMN: row_key.replace("\x1f", "/")}
    for column, change in changes.items():
        row[f"{column}__old"] = change.get("old")
        row[f"{column}__new"] = change.get("new")
    return row


async def _changed_columns(sheet: SheetStore, info: RunInfo) -> list[str]:
    """The columns that changed in some row of the run, in the run's column order."""
    found: set[str] = set()
    for start in range(0, info.admitted, EXPORT_PAGE_ROWS):
        for _, _, changes in await sheet.read_changes(
            info.run_ref, start, start + EXPORT_PAGE_ROWS
        ):
            found.update(changes)
    return [c for c in info.columns if c in found] + sorted(found - set(info.columns))


@dataclass(frozen=True)
class RunSummary:
    """What a finished run reports to the workflow: counts, a preview, maybe all rows."""

    info: RunInfo
    rows_ok: int
    rows_failed: int
    preview: list[dict[str, Any]]
    #: every row, only when all of them fit the inline budget
    rows: list[dict[str, Any]] | None


async def summarize_run(
    sheet: SheetStore, run_ref: str, inline_budget_bytes: int, preview_rows: int = PREVIEW_ROWS
) -> RunSummary:
    """Counts, the first ``preview_rows`` rows as a preview and (all-or-nothing) the inline rows.

    ``preview_rows=0`` previews nothing: the preview is recorded in workflow
    history, where personal data may not be wanted.
    """
    info = await _info(sheet, run_ref)
    counts = await sheet.run_counts(run_ref)
    preview: list[dict[str, Any]] = []
    inline: list[dict[str, Any]] | None = []
    resident = 0
    for start in range(0, info.admitted, EXPORT_PAGE_ROWS):
        page = await sheet.read_run_rows(run_ref, start, start + EXPORT_PAGE_ROWS)
        for row in page:
            out = row_out(row.data, row.status, row.error)
            if len(preview) < preview_rows:
                preview.append(out)
            if inline is None:
                continue
            resident += len(json.dumps(out)) * ROW_MEMORY_MULTIPLIER + ROW_OVERHEAD_BYTES
            seen = len(inline) + 1
            # Project the whole result from the rows seen so far and give up
            # early: a prefix is never returned, so holding one is waste.
            if resident / seen * info.admitted > inline_budget_bytes:
                inline = None
                if len(preview) >= preview_rows:
                    break
            else:
                inline.append(out)
        if inline is None and len(preview) >= preview_rows:
            break
    return RunSummary(info, counts["ok"], counts["error"], preview, inline)
