"""Dataset activities: load, prepare a run, finalize, peek, export.

Everything here either validates (so bad input fails before a provider call is
dispatched) or moves rows between files and the sheet store, streaming, so a
worker's memory does not grow with a dataset. Workflow history only ever sees
references and counts, plus the bounded preview, inline rows and repeated keys
(the last two only when the run shows rows: ``preview_rows > 0``).

A play names what the worker reads, so the worker decides what it may read
(:mod:`playline.datasets.access`): local files under its data directories, URLs only
when allowed and only to public hosts.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from temporalio import activity

from playline import resolvers
from playline.activities.width import dispatch_width
from playline.contract import (
    ESTIMATE_DATASET_SUFFIX,
    ChunkStats,
    DatasetRef,
    DatasetResult,
    ExportInput,
    FinalizeInput,
    LoadCsvInput,
    LoadRowsInput,
    PeekInput,
    PreparedRun,
    PrepareRunInput,
)
from playline.datasets import (
    cell_text,
    check_worker_path,
    download_csv,
    export_run,
    find_source,
    is_url,
    row_out,
    shown_url,
    store_source_id,
    summarize_run,
    upload_csv,
)
from playline.errors import SHOWN_NAME_CHARS, InvalidPlayInput
from playline.services import HolderActivities


class DatasetActivities(HolderActivities):
    """Loads, run preparation and results: everything around the chunks."""

    @activity.defn(name="playline.load_csv")
    async def load_csv(self, input: LoadCsvInput) -> DatasetRef:
        """The play's CSV into the sheet store: a ``store:<id>`` already there (checked,
        nothing read), an ``http(s)://`` URL (downloaded here, if this worker loads URLs)
        or a path on this worker (under its data directories)."""
        services = self._holder.services
        settings = services.settings
        required = input.required_columns
        dataset_id = store_source_id(input.path)
        if dataset_id is not None:
            return await find_source(services.sheet, dataset_id, required)
        if is_url(input.path):
            downloads = settings.home / "downloads"
            async with download_csv(settings, input.path, directory=downloads) as local:
                return await upload_csv(
                    services.sheet,
                    local,
                    key=input.key,
                    required_columns=required,
                    name=shown_url(input.path),
                )
        local = check_worker_path(settings, input.path)
        return await upload_csv(
            services.sheet, local, key=input.key, required_columns=required, name=input.path
        )

    @activity.defn(name="playline.load_rows")
    async def load_rows(self, input: LoadRowsInput) -> DatasetRef:
        """Store inline rows as a source dataset, addressed by their content."""
        if not input.rows:
            raise InvalidPlayInput(f"dataset {input.key!r}: the row list is empty")
        columns: list[str] = []
        for row in input.rows:
            columns.extend(c for c in row if c not in columns)
        values = [[cell_text(row.get(c)) for c in columns] for row in input.rows]
        _refuse_nul(input.key, columns, values)
        digest = hashlib.sha256(json.dumps([columns, values]).encode()).hexdigest()
        dataset_id = f"{input.key}@{digest[:16]}"
        count = await self._holder.services.sheet.put_source(dataset_id, columns, values)
        return DatasetRef(id=dataset_id, count=count, columns=columns)

    @activity.defn(name="playline.prepare_run")
    async def prepare_run(self, input: PrepareRunInput) -> PreparedRun:
        """Check everything a run needs, then write its manifest. Nothing is dispatched."""
        services = self._holder.services
        providers: set[str] = set()
        for column in input.columns:
            resolvers.lookup(column.resolver)
            if column.run_if:
                resolvers.lookup(column.run_if)
            for tool_id in resolvers.declared_tools(column.resolver):
                tool = services.catalog.tool(tool_id)
                providers.add(tool.provider)
                # An estimate sends nothing, so it needs no key: a team prices a play
                # before anyone has an account with its providers.
                if input.options.integration_mode == "live" and not input.options.estimate:
                    services.provider.check_auth(tool)
        if input.options.integration_mode == "fixture":
            if not input.options.fixtures:
                raise InvalidPlayInput(
                    "fixture mode needs at least one fixture file (fixtures=[...])"
                )
            await services.open_fixture_book(input.options.fixtures)
        info = await services.sheet.prepare_run(
            input.run_ref,
            source_id=input.source_id,
            dataset=input.dataset,
            key_fields=input.key_fields,
            mode=input.mode,
            computed_columns=[c.name for c in input.columns],
        )
        counts = await services.sheet.run_counts(input.run_ref)
        width = dispatch_width(services.governor, sorted(providers), input.options)
        shows_rows = input.options.preview_rows > 0  # row keys may be personal data
        return PreparedRun(
            run_ref=info.run_ref,
            dataset=info.dataset,
            total=info.total,
            admitted=info.admitted,
            duplicates=info.duplicates,
            seen_before=info.seen_before,
            duplicate_keys=list(info.duplicate_keys) if shows_rows else [],
            already_done=counts["ok"] + counts["error"],
            suggested_chunks_in_flight=width.chunks_in_flight,
            suggested_row_concurrency=width.row_concurrency,
            providers=sorted(providers),
        )

    @activity.defn(name="playline.finalize_run")
    async def finalize_run(self, input: FinalizeInput) -> DatasetResult:
        """Counts, ``preview_rows`` preview rows, (all-or-nothing) the inline rows,
        when rows may be shown, the first repeated row keys, and what the run changed
        in cells the dataset had before (``stats.changes``: counted in the store, and
        carried by this result rather than a new activity, so recorded histories
        replay)."""
        sheet = self._holder.services.sheet
        summary = await summarize_run(
            sheet, input.run_ref, input.inline_rows_budget_bytes, input.preview_rows
        )
        info = summary.info
        # An estimate's scratch dataset changes nothing anyone syncs.
        estimated = info.dataset.endswith(ESTIMATE_DATASET_SUFFIX)
        changes = {} if estimated else await sheet.run_changes(input.run_ref)
        repeated: list[str] = []
        if info.duplicates and input.preview_rows > 0:
            repeated = await sheet.duplicate_keys(input.run_ref)
        return DatasetResult(
            ref=DatasetRef(id=info.dataset, count=info.admitted, columns=info.columns),
            run_ref=info.run_ref,
            stats=ChunkStats(
                rows_ok=summary.rows_ok,
                rows_failed=summary.rows_failed,
                changes=changes,
            ),
            total=info.total,
            admitted=info.admitted,
            duplicates=info.duplicates,
            seen_before=info.seen_before,
            duplicate_keys=repeated,
            preview=summary.preview,
            rows=summary.rows,
        )

    @activity.defn(name="playline.peek")
    async def peek(self, input: PeekInput) -> list[dict[str, Any]]:
        sheet = self._holder.services.sheet
        limit = max(0, min(input.limit, 100))
        if input.run_ref:
            rows = await sheet.read_run_rows(input.run_ref, input.offset, input.offset + limit)
            return [row_out(r.data, r.status, r.error) for r in rows]
        if input.source_id:
            return await sheet.read_source_rows(input.source_id, input.offset, limit)
        raise InvalidPlayInput("peek needs a run_ref or a source_id")

    @activity.defn(name="playline.export")
    async def export(self, input: ExportInput) -> int:
        """A run's rows to a file on this worker, under its data directories (a play
        may not write wherever it likes); CSV formulas inert unless ``raw``."""
        services = self._holder.services
        target = check_worker_path(services.settings, input.path, kind="export")
        return await export_run(
            services.sheet, input.run_ref, str(target), input.format, raw=input.raw
        )


def _refuse_nul(key: str, columns: list[str], values: list[list[str]]) -> None:
    """Refuse inline rows holding a NUL character (no store keeps one), naming the row
    and column but not the value."""
    for index, column in enumerate(columns):
        if "\x00" in column:
            raise InvalidPlayInput(
                f"dataset {key!r}: column name {index + 1} holds a NUL character, which no "
                "store can keep; remove it"
            )
    for number, row in enumerate(values, start=1):
        for column, text in zip(columns, row, strict=True):
            if "\x00" in text:
                raise InvalidPlayInput(
                    f"dataset {key!r}: row {number}, column {column[:SHOWN_NAME_CHARS]!r}: the "
                    "value holds a NUL character, which no store can keep; remove it"
                )
