"""The sheet store: dataset rows and their computed cells, outside workflow history.

Three things live here:

* **sources**: immutable row sets loaded from a file (``ctx.csv``), addressed by key
  and content digest, so loading the same file twice stores it once;
* **sheet rows**: one row per (dataset, row key), holding the input columns and every
  cell computed so far; a dataset outlives a run, which is what ``net_new`` needs;
* **run manifests**: for one ``dataset.run(...)`` the ordered list of admitted row
  keys (``seq`` 0..n-1) with a status each. Chunks are ranges of ``seq``, so chunk
  activity arguments are a handful of integers, never rows. Each manifest row also
  keeps the *provenance* of the cells that run computed (which tool and provider gave
  each value, whether it was paid or reused, what it cost, why a cell is empty): it
  belongs to the run (a rerun records its own) and stays out of workflow history.

A row key is the key fields' values (:func:`row_key_of`) or, for a run without a
key, the row's source and position (:func:`positional_key`): two different files
run into one dataset without a key keep their rows apart, and the same file (its
source id is its content's digest) finds its rows again.

The interface (:class:`SheetStore`) is backend-neutral;
:class:`~playline.stores.sheet_ledger.SheetLedger` implements it once, on a SQLite
file (the embedded default) or the fleet's PostgreSQL database. It streams:
``put_source`` consumes its rows page by page (a loader passes a file's rows as an
iterator), ``prepare_run`` admits rows with SQL, and readers ask for ranges, so
memory never grows with a dataset's size.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from playline.contract import RunMode
from playline.errors import InvalidPlayInput, header_summary
from playline.stores.sheet_pace import PaceSample, PaceSeries

RowStatus = Literal["pending", "ok", "error"]

#: Rows per page when a backend streams a source in or a run's keys through Python.
PAGE_ROWS = 2000
#: Repeated row keys a run reports at most (``PreparedRun.duplicate_keys``).
SHOWN_DUPLICATE_KEYS = 3


@dataclass(frozen=True, slots=True)
class RunInfo:
    run_ref: str
    dataset: str
    total: int  # rows in the source
    admitted: int  # rows in the manifest
    duplicates: int  # source rows whose key repeated an earlier row of the same source
    seen_before: int  # net_new: rows skipped because the dataset already had the key
    columns: list[str]  # input columns then computed columns, for export
    #: the first few keys that repeated, in the order they first occur (``prepare_run``
    #: fills it; ``run_info`` leaves it empty: read it with ``duplicate_keys``)
    duplicate_keys: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RunRow:
    seq: int
    row_key: str
    data: dict[str, Any]
    status: RowStatus
    error: str | None
    #: ``{column: provenance}`` of the cells this run computed, if it recorded any
    provenance: dict[str, Any] | None = None
    #: ``{column: {"at": epoch seconds, "in": digest}}``: when each computed cell of the
    #: sheet row was fetched and a digest of what its resolver read (freshness rules)
    cell_meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RowResult:
    seq: int
    row_key: str
    cells: dict[str, Any]
    status: RowStatus
    error: str | None = None
    #: ``{column: provenance}`` for the row's computed cells (JSON-able), kept with
    #: this run's manifest row
    provenance: dict[str, Any] | None = None
    #: ``{column: {"at", "in"}}`` of the cells computed now, merged into the sheet row's
    #: (a cell kept because it was fresh is not in ``cells`` and keeps its entry)
    cell_meta: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RowsFilter:
    """Which of a run's rows a reader wants, in which order (the store's query and the
    sheet view's page share it)."""

    #: only rows with a cell of this outcome (:func:`~playline.stores.sheet_index.cell_outcome`),
    #: in ``outcome_column`` or any computed column
    outcome: str | None = None
    outcome_column: str | None = None
    #: only rows whose ``text_column`` contains ``text`` (case-insensitive)
    text_column: str | None = None
    text: str | None = None
    #: by this column's value (numbers by value, then text, empty cells last), then
    #: run order; ``None``: run order
    sort: str | None = None
    descending: bool = False

    @property
    def filtered(self) -> bool:
        """Whether it leaves rows out (a text filter needs its column and its text)."""
        return bool(self.outcome) or bool(self.text_column and self.text)


@dataclass(frozen=True, slots=True, kw_only=True)
class RowsQuery(RowsFilter):
    """One page of a run's rows a reader wants: a filter, from ``offset``."""

    offset: int = 0
    limit: int = 50


@dataclass(frozen=True, slots=True)
class RowsPage:
    rows: list[RunRow]
    #: rows matching the query's filters, all pages together
    matching: int


@dataclass(frozen=True, slots=True)
class SpendPoint:
    """Credits one provider was paid in one time bucket of a run."""

    provider: str
    bucket: int
    credits: float


@dataclass(frozen=True, slots=True)
class StepFigures:
    """One waterfall step of one column over a run (as ``SpendTally`` counts it)."""

    column: str
    tool: str
    answered: int  # rows whose value this step gave
    calls: int
    hits: int
    credits: float


@dataclass(frozen=True, slots=True)
class RunFigures:
    """What a run's charts draw, summed by the store."""

    #: the first and last time a paid cell was fetched (``None``: nothing paid yet)
    start: float | None
    end: float | None
    #: ``start..end`` cut into ``buckets`` equal spans
    spend: list[SpendPoint]
    #: per waterfall column, its steps in waterfall order
    steps: dict[str, list[StepFigures]]
    #: per waterfall column, the rows no step answered
    unanswered: dict[str, int]


class SheetStore(Protocol):
    """What datasets, chunks and exports need from a sheet backend."""

    async def put_source(
        self, dataset_id: str, columns: Sequence[str], rows: Iterable[Sequence[str]]
    ) -> int:
        """Store a source's rows (one value per column each); its row count.

        All or nothing: the rows are consumed page by page in one transaction, and
        an exception from the iterator (a malformed line) stores nothing. A source
        already stored under ``dataset_id`` is kept and its rows are not read.
        """
        ...

    async def source(self, dataset_id: str) -> tuple[list[str], int] | None:
        """A stored source's columns and row count, or ``None``."""
        ...

    async def prepare_run(
        self,
        run_ref: str,
        *,
        source_id: str,
        dataset: str,
        key_fields: Sequence[str],
        mode: RunMode,
        computed_columns: Sequence[str],
    ) -> RunInfo:
        """Admit a source's rows into ``dataset`` and write the run's manifest.

        The first row of each key is admitted (later ones count as duplicates);
        ``net_new`` also skips keys the dataset already has. Admitted rows are
        merged into their sheet rows (source columns win) and numbered 0..n-1 in
        source order. Idempotent per ``run_ref``. The result's ``duplicate_keys``
        holds the first :data:`SHOWN_DUPLICATE_KEYS` repeated keys, in the order
        they first occur.
        """
        ...

    async def duplicate_keys(self, run_ref: str) -> list[str]:
        """The repeated keys ``prepare_run`` found (kept with the run's manifest);
        ``[]`` for a run without duplicates or an unknown run."""
        ...

    async def run_info(self, run_ref: str) -> RunInfo | None:
        """A run's manifest header, or ``None``."""
        ...

    async def read_run_rows(self, run_ref: str, start: int, end: int) -> list[RunRow]:
        """The run's rows with ``start <= seq < end``, in order (one chunk, one page)."""
        ...

    async def write_results(self, run_ref: str, results: Sequence[RowResult]) -> None:
        """Merge computed cells into their sheet rows and set the rows' statuses (and
        provenance, on the run's manifest rows: a result without any leaves the
        row's as it was). Each result's ``cell_meta`` merges into its sheet row's column
        by column, and what the cells changed is recorded on the manifest row
        (:func:`~playline.stores.sheet_changes.merge_changes`: writing a row twice
        records what the first write saw)."""
        ...

    async def read_provenance(
        self, run_ref: str, start: int, end: int
    ) -> list[tuple[int, dict[str, Any]]]:
        """``(seq, provenance)`` of the run's rows with ``start <= seq < end`` that have
        provenance, in ``seq`` order (one page: callers page through a run)."""
        ...

    async def read_cells(
        self, dataset: str, row_keys: Sequence[str]
    ) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
        """``{row_key: (data, cell_meta)}`` of the dataset's sheet rows among
        ``row_keys`` (one page: an estimate reads the real rows behind its scratch ones);
        a key the dataset does not have is left out."""
        ...

    async def run_counts(self, run_ref: str) -> dict[str, int]:
        """Rows of the run by status: ``pending``, ``ok``, ``error``."""
        ...

    async def run_changes(self, run_ref: str) -> dict[str, dict[str, int]]:
        """What the run changed in cells the dataset had before (see
        :mod:`~playline.stores.sheet_changes`): ``{column: {"changed", "appeared",
        "disappeared"}}`` counted in the store (memory does not grow with the run); a
        column the rows had before but the run did not change counts zeros, a column
        new to every row is left out (``{}``: nothing was enriched before)."""
        ...

    async def read_changes(
        self, run_ref: str, start: int, end: int
    ) -> list[tuple[int, str, dict[str, Any]]]:
        """``(seq, row_key, {column: {"old", "new"}})`` of the run's rows with ``start <=
        seq < end`` that changed, in ``seq`` order (one page: an export pages through)."""
        ...

    async def read_source_rows(
        self, dataset_id: str, offset: int, limit: int
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` source rows from position ``offset``, in order."""
        ...

    async def query_run_rows(self, run_ref: str, query: RowsQuery) -> RowsPage | None:
        """One page of the run's rows, filtered and ordered in the store (the sheet
        view's read path: the page's rows are read, never the run's). ``None`` when the
        store cannot answer in SQL: its rows were written before it recorded their
        outcomes (a reader falls back to reading the run in pages), or no such run."""
        ...

    async def run_figures(self, run_ref: str, buckets: int) -> RunFigures | None:
        """The run's spend per provider over ``buckets`` time spans and each
        waterfall's steps, summed in the store; ``None`` as for :meth:`query_run_rows`."""
        ...

    async def write_pace(self, samples: Sequence[PaceSample]) -> None:
        """Append a worker's pace samples (of any runs) in one write
        (:mod:`~playline.stores.sheet_pace`)."""
        ...

    async def pace_series(self, run_ref: str, buckets: int, least_s: float) -> PaceSeries | None:
        """The run's pace per provider over at most ``buckets`` time buckets of at least
        ``least_s`` seconds, summed over workers in the store; ``None`` when no worker
        sampled the run (or the store is older than its pace table)."""
        ...

    async def close(self) -> None: ...


def positional_key(source_id: str, position: int) -> str:
    """The row key of a run without a key: ``#<source dataset id>:<position>``."""
    return f"#{source_id}:{position}"


def row_key_of(
    row: dict[str, Any],
    key_fields: Sequence[str],
    position: int,
    source_id: str | None = None,
) -> str:
    """The row key: the key fields' values joined, or (no key) the row's source and
    position (:func:`positional_key`; the stores number keyless rows in SQL by the
    same rule). Without ``source_id`` a keyless key is the position alone, which is
    unique within one source only."""
    if not key_fields:
        return f"#{position}" if source_id is None else positional_key(source_id, position)
    parts = []
    for key_field in key_fields:
        value = row.get(key_field)
        if value is None or str(value).strip() == "":
            raise InvalidPlayInput(
                f"row {position + 1} has an empty key field {key_field!r}; every row needs a "
                f"value in {list(key_fields)} (or run without a key)"
            )
        parts.append(str(value).strip())
    return "\x1f".join(parts)


def missing_key_fields(
    source_id: str, source_columns: Sequence[str], key_fields: Sequence[str]
) -> None:
    """Raise if a run's row key names a column its source does not have."""
    missing = [f for f in key_fields if f not in source_columns]
    if missing:
        raise InvalidPlayInput(
            f"row key field(s) {missing} are not columns of {source_id!r} "
            f"({header_summary(source_columns)})"
        )


def run_columns(source_columns: Sequence[str], computed_columns: Sequence[str]) -> list[str]:
    """A run's export columns: the source's, then the computed ones it does not have."""
    return list(source_columns) + [c for c in computed_columns if c not in source_columns]
