"""Dataset handles and the ``dataset(...).with_column(...).run(...)`` builder.

Both are workflow-side objects holding references only. A handle's rows are read
through activities (``peek``, ``export``, ``iterate``); ``rows`` is set only when the
whole result fitted the inline budget, never a prefix.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Literal, Protocol

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from playline.activities.datasets import DatasetActivities
    from playline.contract import (
        ColumnSpec,
        DatasetRef,
        DatasetResult,
        ExportInput,
        OnRowError,
        PeekInput,
        RunMode,
    )
    from playline.errors import InvalidPlayInput
    from playline.freshness import freshness_of
    from playline.resolvers import registered_name

SHORT_ACTIVITY = timedelta(minutes=10)
#: The patch id of refusing ``net_new`` without a row key.
NET_NEW_NEEDS_A_KEY = "net-new-needs-a-key"


class DatasetRunner(Protocol):
    """Runs a described dataset (``PlayContext`` does): what ``DatasetBuilder.run`` needs."""

    async def run_dataset(
        self,
        builder: DatasetBuilder,
        key_fields: list[str],
        mode: RunMode,
        on_row_error: OnRowError,
    ) -> DatasetHandle: ...


@dataclass(frozen=True)
class DatasetHandle:
    """A dataset (a loaded source or a run's result) as the play sees it."""

    ref: DatasetRef
    result: DatasetResult | None = None
    #: set by an estimate (the play's log): exports write nothing and say so through it
    skip_writes: Callable[[str], None] | None = field(default=None, repr=False, compare=False)

    @property
    def count(self) -> int:
        return self.ref.count

    @property
    def columns(self) -> list[str]:
        return self.ref.columns

    @property
    def rows(self) -> list[dict[str, Any]] | None:
        """All rows, if the whole result fitted the inline budget; otherwise None."""
        return self.result.rows if self.result else None

    @property
    def preview(self) -> list[dict[str, Any]]:
        return self.result.preview if self.result else []

    def _peek_input(self, offset: int, limit: int) -> PeekInput:
        if self.result is not None:
            return PeekInput(run_ref=self.result.run_ref, offset=offset, limit=limit)
        return PeekInput(source_id=self.ref.id, offset=offset, limit=limit)

    async def peek(self, n: int = 5) -> list[dict[str, Any]]:
        """The first ``n`` rows (at most 100), read by an activity."""
        if n <= 0:
            return []
        if self.rows is not None:
            return self.rows[:n]
        if self.result is not None and n <= len(self.result.preview):
            return self.result.preview[:n]
        return await workflow.execute_activity_method(
            DatasetActivities.peek, self._peek_input(0, n), start_to_close_timeout=SHORT_ACTIVITY
        )

    async def iterate(self, page_size: int = 50) -> AsyncIterator[dict[str, Any]]:
        """Every row, a page per activity. Each page enters history: keep pages small
        and prefer ``export`` or another ``dataset(...).run(...)`` for large data."""
        offset = 0
        while offset < self.count:
            if self.rows is not None:
                page = self.rows[offset : offset + page_size]
            else:
                page = await workflow.execute_activity_method(
                    DatasetActivities.peek,
                    self._peek_input(offset, min(page_size, 100)),
                    start_to_close_timeout=SHORT_ACTIVITY,
                )
            if not page:
                return
            for row in page:
                yield row
            offset += len(page)

    async def export(
        self, path: str, *, format: Literal["csv", "jsonl"] = "csv", raw: bool = False
    ) -> int:
        """Write the result's rows to a file on the worker (under its data directories);
        returns the row count.

        Args:
            path: the file to write.
            format: ``"csv"`` or ``"jsonl"``.
            raw: CSV only: write cells as they are. By default a cell a spreadsheet
                would run as a formula (``=...``, ``+...``, ``-...``, ``@...``) is
                prefixed with ``'``, so opening the export runs nothing.
        """
        if self.result is None:
            raise InvalidPlayInput("only a dataset run's result can be exported")
        if self.skip_writes is not None:
            self.skip_writes(f"estimate: export of {self.ref.id} to {path} skipped")
            return 0
        return await workflow.execute_activity_method(
            DatasetActivities.export,
            ExportInput(run_ref=self.result.run_ref, path=path, format=format, raw=raw),
            start_to_close_timeout=SHORT_ACTIVITY,
        )


@dataclass(frozen=True)
class DatasetBuilder:
    """Columns to add to a dataset; ``run`` executes them. Immutable: each call returns a copy."""

    runner: DatasetRunner = field(repr=False)
    key: str
    source: DatasetRef | None
    columns: tuple[ColumnSpec, ...] = ()
    inline_rows: tuple[dict[str, Any], ...] = ()

    def with_column(
        self,
        name: str,
        resolver: Callable[..., Any],
        *,
        run_if: Callable[..., Any] | None = None,
        fresh_for: Any = None,
    ) -> DatasetBuilder:
        """Add a column computed by a registered resolver (``@playline.resolver``).

        Args:
            run_if: a registered predicate: the column is computed for rows it accepts.
            fresh_for: how long a computed cell stays fresh: a duration (``"30d"``,
                seconds, a ``timedelta``), a :class:`~playline.Freshness` (by outcome and
                value: ``Freshness(found="90d", no_match="14d")``) or a function
                registered with ``@playline.resolver`` taking ``(value, outcome)`` and
                returning a duration. A fresh cell is kept by later runs without running
                the resolver; a due one is computed again with its calls refusing
                receipts older than the rule. ``None``: every run runs the resolver (its
                calls answered by fresh receipts, so an unchanged input costs nothing).
        """
        if any(c.name == name for c in self.columns):
            raise InvalidPlayInput(f"dataset {self.key!r} already has a column {name!r}")
        try:
            freshness = freshness_of(fresh_for)
        except ValueError as err:
            raise InvalidPlayInput(f"column {name!r}: fresh_for: {err}") from None
        spec = ColumnSpec(
            name=name,
            resolver=registered_name(resolver),
            run_if=registered_name(run_if) if run_if is not None else None,
            fresh_for=freshness,
        )
        return replace(self, columns=(*self.columns, spec))

    async def run(
        self,
        *,
        key: str | Sequence[str] | None = None,
        mode: RunMode = "upsert",
        on_row_error: OnRowError = "isolate",
    ) -> DatasetHandle:
        """Compute the columns for every admitted row.

        Args:
            key: the row key field(s); rows with equal keys are one row. ``None``
                keys rows by their source and position: rows of different files
                never merge, and a run over the same file finds its rows again.
            mode: ``"upsert"`` processes every row; ``"net_new"`` only rows whose key
                this dataset has never seen, and reports only those (it needs a key:
                without one every file's rows are new).
            on_row_error: ``"isolate"`` records a failing row's error and goes on;
                ``"fail"`` fails the play on the first failing row.
        """
        if mode not in ("upsert", "net_new"):
            raise InvalidPlayInput(f"mode must be 'upsert' or 'net_new', not {mode!r}")
        if on_row_error not in ("isolate", "fail"):
            raise InvalidPlayInput(
                f"on_row_error must be 'isolate' or 'fail', not {on_row_error!r}"
            )
        key_fields = [key] if isinstance(key, str) else list(key or [])
        # Behind a patch: a play started before this check keeps running as it did.
        if mode == "net_new" and not key_fields and workflow.patched(NET_NEW_NEEDS_A_KEY):
            raise InvalidPlayInput(
                f"dataset {self.key!r}: mode='net_new' needs a row key (it admits rows whose "
                "key the dataset has not seen); pass key=... naming the field(s) that "
                "identify a row"
            )
        return await self.runner.run_dataset(self, key_fields, mode, on_row_error)
