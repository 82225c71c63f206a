"""One page of a run's sheet, read on the server through the sheet store's read paths.

The page is never the run: whatever a run holds, one request reads what one page
needs.

* Unfiltered and in run order, a page is one ``read_run_rows`` range (``seq`` is the
  manifest's primary key): page 2,000 of a million rows costs what page 1 does.
* Filtered (by a cell's outcome, by a column's text) or sorted by a column, the
  store picks the page in SQL (``query_run_rows``: the outcomes it recorded with each
  row, the column's value in the sheet row) and reads the page's rows only.
* A run whose rows were written before the store recorded their outcomes (a store
  migrated in place) is scanned in store pages instead, :data:`SCAN_ROWS` at a time,
  and only the page asked for is kept: memory holds one store page plus the page
  shown (sorted: the ``(value, seq)`` keys up to the page's end), never the run; such
  a view takes time in proportion to the run (see ``bench/RESULTS.md``).
"""

from __future__ import annotations

import heapq
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import total_ordering
from typing import Any

from playline.stores.sheet import RowsFilter, RowsQuery, RunInfo, RunRow, SheetStore
from playline.webview.outcomes import cell_outcome

__all__ = ["SCAN_ROWS", "SheetPage", "SheetQuery", "computed_columns", "read_page"]

#: Rows read per store page while a filtered or sorted view scans a run.
SCAN_ROWS = 5000
#: Rows read from the run's start to learn which columns are computed.
PROBE_ROWS = 500


@dataclass(frozen=True, kw_only=True)
class SheetQuery(RowsFilter):
    """What a sheet page shows: which rows (the filter), in which order, which page."""

    page: int = 0
    size: int = 50

    def rows(self, offset: int, limit: int) -> RowsQuery:
        """The store's query for ``limit`` rows from ``offset`` (a text filter without
        its column or its text filters nothing)."""
        text = bool(self.text_column and self.text)
        return RowsQuery(
            offset=offset,
            limit=limit,
            outcome=self.outcome,
            outcome_column=self.outcome_column,
            text_column=self.text_column if text else None,
            text=self.text if text else None,
            sort=self.sort,
            descending=self.descending,
        )


@dataclass
class SheetPage:
    info: RunInfo
    rows: list[RunRow]
    columns: list[str]
    computed: list[str]
    #: rows matching the filters (the run's rows when unfiltered)
    matching: int
    query: SheetQuery
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def pages(self) -> int:
        return max(1, -(-self.matching // self.query.size))


async def computed_columns(sheet: SheetStore, run_ref: str, rows: list[RunRow]) -> list[str]:
    """The run's computed columns, in the run's column order: those its rows' provenance
    names (the page's rows and the run's first rows; none yet before a row finished)."""
    info = await sheet.run_info(run_ref)
    named: set[str] = set()
    for row in rows:
        named.update(row.provenance or {})
    for _, provenance in await sheet.read_provenance(run_ref, 0, PROBE_ROWS):
        named.update(provenance)
    order = info.columns if info is not None else []
    return [c for c in order if c in named] + sorted(named - set(order))


async def _scan_pages(
    sheet: SheetStore, run_ref: str, admitted: int
) -> AsyncIterator[list[RunRow]]:
    for start in range(0, admitted, SCAN_ROWS):
        yield await sheet.read_run_rows(run_ref, start, start + SCAN_ROWS)


async def _scan(sheet: SheetStore, run_ref: str, admitted: int) -> AsyncIterator[RunRow]:
    async for page in _scan_pages(sheet, run_ref, admitted):
        for row in page:
            yield row


async def _scan_outcomes(
    sheet: SheetStore, run_ref: str, admitted: int
) -> AsyncIterator[tuple[int, dict[str, Any] | None]]:
    """``(seq, provenance)`` of every row in run order, ``None`` for a row without any
    (not finished: its cells are not run yet)."""
    for start in range(0, admitted, SCAN_ROWS):
        end = min(admitted, start + SCAN_ROWS)
        found = dict(await sheet.read_provenance(run_ref, start, end))
        for seq in range(start, end):
            yield seq, found.get(seq)


def _outcome_matches(
    provenance: dict[str, Any] | None, query: SheetQuery, computed: list[str]
) -> bool:
    """Whether a row with ``provenance`` has a cell of the outcome asked for (a cell
    without provenance is not run yet)."""
    found = provenance or {}
    columns = [query.outcome_column] if query.outcome_column else computed
    return any(cell_outcome("pending", found.get(c), None) == query.outcome for c in columns)


def _matches(row: RunRow, query: SheetQuery, computed: list[str]) -> bool:
    if query.text_column and query.text:
        value = row.data.get(query.text_column)
        if value is None or query.text.casefold() not in str(value).casefold():
            return False
    if query.outcome:
        columns = [query.outcome_column] if query.outcome_column else computed
        provenance = row.provenance or {}
        if not any(
            cell_outcome(row.status, provenance.get(c), row.data.get(c)) == query.outcome
            for c in columns
        ):
            return False
    return True


def _sort_key(value: Any) -> tuple[int, float, str]:
    """Numbers by value, then text; empty cells last whichever way the page sorts."""
    if value is None or value == "":
        return (2, 0.0, "")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, str(value).casefold())


async def read_page(sheet: SheetStore, run_ref: str, query: SheetQuery) -> SheetPage | None:
    """The page ``query`` asks for, or ``None`` for a run the store does not have."""
    info = await sheet.run_info(run_ref)
    if info is None:
        return None
    size = max(1, query.size)
    start = max(0, query.page) * size
    if not query.filtered and not query.sort:
        rows = await sheet.read_run_rows(run_ref, start, start + size)
        computed = await computed_columns(sheet, run_ref, rows)
        return SheetPage(info, rows, _columns(info, computed), computed, info.admitted, query)
    found = await sheet.query_run_rows(
        run_ref,
        query.rows(start, size),
    )
    if found is not None:
        computed = await computed_columns(sheet, run_ref, found.rows)
        columns = _columns(info, computed)
        return SheetPage(info, found.rows, columns, computed, found.matching, query)
    # A run written before the store recorded outcomes: read it in store pages.
    computed = await computed_columns(sheet, run_ref, [])
    matching = 0
    if not query.sort and not query.text_column:
        # By outcome only: the provenance alone tells (no row data read), then the
        # page's rows by seq.
        wanted: list[int] = []
        async for seq, provenance in _scan_outcomes(sheet, run_ref, info.admitted):
            if _outcome_matches(provenance, query, computed):
                if start <= matching < start + size:
                    wanted.append(seq)
                matching += 1
        rows = [r for seq in wanted for r in await sheet.read_run_rows(run_ref, seq, seq + 1)]
        return SheetPage(info, rows, _columns(info, computed), computed, matching, query)
    if not query.sort:
        rows = []
        async for row in _scan(sheet, run_ref, info.admitted):
            if _matches(row, query, computed):
                if start <= matching < start + size:
                    rows.append(row)
                matching += 1
        return SheetPage(info, rows, _columns(info, computed), computed, matching, query)
    # Sorted: keep the (start + size) first keys only, then read those rows by seq.
    keep = start + size
    best: list[tuple[Any, ...]] = []
    async for page in _scan_pages(sheet, run_ref, info.admitted):
        keys = [
            _order(row.data.get(query.sort), row.seq, query.descending)
            for row in page
            if _matches(row, query, computed)
        ]
        matching += len(keys)
        best = heapq.nsmallest(keep, [*best, *keys])
    rows = []
    for key in best[start:keep]:
        seq = int(key[-1])
        rows.extend(await sheet.read_run_rows(run_ref, seq, seq + 1))
    return SheetPage(info, rows, _columns(info, computed), computed, matching, query)


def _order(value: Any, seq: int, descending: bool) -> tuple[Any, ...]:
    """A row's place: empty cells last either way, ties in run order."""
    rank, number, text = _sort_key(value)
    if descending:
        return (rank, -number, _Desc(text), seq)
    return (rank, number, text, seq)


@total_ordering
class _Desc:
    """Text compared backwards (descending text within one rank)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __lt__(self, other: _Desc) -> bool:
        return self.text > other.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and self.text == other.text

    __hash__ = None  # type: ignore[assignment]


def _columns(info: RunInfo, computed: list[str]) -> list[str]:
    return list(info.columns) + [c for c in computed if c not in info.columns]
