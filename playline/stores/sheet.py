"""The sheet store: dataset rows and their computed cells, outside workflow history.

Three things live here:

* **sources**: immutable row sets loaded from a file (``ctx.csv``), addressed by key
  and content digest, so loading the same file twice stores it once;
* **sheet rows**: one row per (dataset, row key), holding the input columns and every
  cell computed so far; a dataset outlives a run, which is what ``net_new`` needs;
* **run manifests**: for one ``dataset.run(...)`` the ordered list of admitted row
  keys (``seq`` 0..n-1) with a status each. Chunks are ranges of ``seq``, so chunk
  activity arguments are a handful of integers, never rows.

The interface (:class:`SheetStore`) is backend-neutral;
:class:`~playline.stores.sheet_sqlite.SqliteSheetStore` is the embedded default.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from playline.contract import RunMode
from playline.errors import InvalidPlayInput

RowStatus = Literal["pending", "ok", "error"]


@dataclass(frozen=True, slots=True)
class RunInfo:
    run_ref: str
    dataset: str
    total: int  # rows in the source
    admitted: int  # rows in the manifest
    duplicates: int  # source rows whose key repeated an earlier row of the same source
    seen_before: int  # net_new: rows skipped because the dataset already had the key
    columns: list[str]  # input columns then computed columns, for export


@dataclass(frozen=True, slots=True)
class RunRow:
    seq: int
    row_key: str
    data: dict[str, Any]
    status: RowStatus
    error: str | None


@dataclass(frozen=True, slots=True)
class RowResult:
    seq: int
    row_key: str
    cells: dict[str, Any]
    status: RowStatus
    error: str | None = None


class SheetStore(Protocol):
    async def put_source(
        self, dataset_id: str, columns: Sequence[str], rows: Iterable[Sequence[str]]
    ) -> int: ...
    async def source(self, dataset_id: str) -> tuple[list[str], int] | None: ...
    async def prepare_run(
        self,
        run_ref: str,
        *,
        source_id: str,
        dataset: str,
        key_fields: Sequence[str],
        mode: RunMode,
        computed_columns: Sequence[str],
    ) -> RunInfo: ...
    async def run_info(self, run_ref: str) -> RunInfo | None: ...
    async def read_run_rows(self, run_ref: str, start: int, end: int) -> list[RunRow]: ...
    async def write_results(self, run_ref: str, results: Sequence[RowResult]) -> None: ...
    async def run_counts(self, run_ref: str) -> dict[str, int]: ...
    async def read_source_rows(
        self, dataset_id: str, offset: int, limit: int
    ) -> list[dict[str, Any]]: ...
    async def close(self) -> None: ...


def row_key_of(row: dict[str, Any], key_fields: Sequence[str], position: int) -> str:
    """The row key: the key fields' values joined, or the source position if no key."""
    if not key_fields:
        return f"#{position}"
    parts = []
    for field in key_fields:
        value = row.get(field)
        if value is None or str(value).strip() == "":
            raise InvalidPlayInput(
                f"row {position + 1} has an empty key field {field!r}; every row needs a "
                f"value in {list(key_fields)} (or run without a key)"
            )
        parts.append(str(value).strip())
    return "\x1f".join(parts)
