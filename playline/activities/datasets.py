"""Dataset activities: load, prepare a run, finalize, peek, export; plus scalar tools and steps.

Everything here either validates (so bad input fails before a provider call is
dispatched) or moves rows between files and the sheet store. Workflow history only
ever sees references and counts, plus the bounded preview and inline rows.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
from typing import Any

from temporalio import activity

from playline.activities import resolvers
from playline.activities.boundary import translate_errors
from playline.activities.chunk import make_runner
from playline.activities.csv_io import read_csv, write_csv, write_jsonl
from playline.activities.governor import Governor
from playline.activities.services import ServicesHolder
from playline.errors import InvalidPlayInput
from playline.workflows.models import (
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
    RunOptions,
    StepInput,
    ToolCallInput,
    Width,
    WidthInput,
)

EXPORT_PAGE_ROWS = 1000
#: Bytes a row is assumed to occupy once decoded, per byte of its JSON, plus overhead.
ROW_MEMORY_MULTIPLIER = 2
ROW_OVERHEAD_BYTES = 64


def _text(value: Any) -> str:
    """Source cells are text, as if read from a CSV."""
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _row_out(data: dict[str, Any], status: str, error: str | None) -> dict[str, Any]:
    if status == "error":
        return {**data, "_error": error}
    return data


class DatasetActivities:
    def __init__(self, holder: ServicesHolder) -> None:
        self._holder = holder

    @activity.defn(name="playline.load_csv")
    @translate_errors
    async def load_csv(self, input: LoadCsvInput) -> DatasetRef:
        columns, rows, digest = await asyncio.to_thread(
            read_csv, input.path, input.required_columns
        )
        dataset_id = f"{input.key}@{digest[:16]}"
        count = await self._holder.services.sheet.put_source(dataset_id, columns, rows)
        return DatasetRef(id=dataset_id, count=count, columns=columns)

    @activity.defn(name="playline.load_rows")
    @translate_errors
    async def load_rows(self, input: LoadRowsInput) -> DatasetRef:
        """Store inline rows as a source dataset, addressed by their content."""
        if not input.rows:
            raise InvalidPlayInput(f"dataset {input.key!r}: the row list is empty")
        columns: list[str] = []
        for row in input.rows:
            columns.extend(c for c in row if c not in columns)
        values = [[_text(row.get(c)) for c in columns] for row in input.rows]
        digest = hashlib.sha256(json.dumps([columns, values]).encode()).hexdigest()
        dataset_id = f"{input.key}@{digest[:16]}"
        count = await self._holder.services.sheet.put_source(dataset_id, columns, values)
        return DatasetRef(id=dataset_id, count=count, columns=columns)

    @activity.defn(name="playline.prepare_run")
    @translate_errors
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
                if input.options.integration_mode == "live":
                    services.provider.check_auth(tool)
        if input.options.integration_mode == "fixture":
            if not input.options.fixtures:
                raise InvalidPlayInput(
                    "fixture mode needs at least one fixture file (fixtures=[...])"
                )
            services.fixture_book(input.options.fixtures)
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
        return PreparedRun(
            run_ref=info.run_ref,
            dataset=info.dataset,
            total=info.total,
            admitted=info.admitted,
            duplicates=info.duplicates,
            seen_before=info.seen_before,
            already_done=counts["ok"] + counts["error"],
            suggested_chunks_in_flight=width.chunks_in_flight,
            suggested_row_concurrency=width.row_concurrency,
            providers=sorted(providers),
        )

    @activity.defn(name="playline.suggest_width")
    async def suggest_width(self, input: WidthInput) -> Width:
        """The governor's current dispatch width (a local activity: its answer is recorded)."""
        return dispatch_width(self._holder.services.governor, input.providers, input.options)

    @activity.defn(name="playline.finalize_run")
    @translate_errors
    async def finalize_run(self, input: FinalizeInput) -> DatasetResult:
        """Counts, five preview rows and (all-or-nothing) the inline rows."""
        sheet = self._holder.services.sheet
        info = await sheet.run_info(input.run_ref)
        if info is None:
            raise InvalidPlayInput(f"run {input.run_ref!r} has no manifest")
        counts = await sheet.run_counts(input.run_ref)
        preview: list[dict[str, Any]] = []
        inline: list[dict[str, Any]] | None = []
        resident = 0
        for start in range(0, info.admitted, EXPORT_PAGE_ROWS):
            page = await sheet.read_run_rows(input.run_ref, start, start + EXPORT_PAGE_ROWS)
            for row in page:
                out = _row_out(row.data, row.status, row.error)
                if len(preview) < 5:
                    preview.append(out)
                if inline is None:
                    continue
                resident += len(json.dumps(out)) * ROW_MEMORY_MULTIPLIER + ROW_OVERHEAD_BYTES
                seen = len(inline) + 1
                # Project the whole result from the rows seen so far and give up
                # early: a prefix is never returned, so holding one is waste.
                projected = resident / seen * info.admitted
                if projected > input.inline_rows_budget_bytes:
                    inline = None
                    if len(preview) >= 5:
                        break
                else:
                    inline.append(out)
            if inline is None and len(preview) >= 5:
                break
        stats = ChunkStats(rows_ok=counts["ok"], rows_failed=counts["error"])
        return DatasetResult(
            ref=DatasetRef(id=info.dataset, count=info.admitted, columns=info.columns),
            run_ref=info.run_ref,
            stats=stats,
            total=info.total,
            admitted=info.admitted,
            duplicates=info.duplicates,
            seen_before=info.seen_before,
            preview=preview,
            rows=inline,
        )

    @activity.defn(name="playline.peek")
    @translate_errors
    async def peek(self, input: PeekInput) -> list[dict[str, Any]]:
        sheet = self._holder.services.sheet
        limit = max(0, min(input.limit, 100))
        if input.run_ref:
            rows = await sheet.read_run_rows(input.run_ref, input.offset, input.offset + limit)
            return [_row_out(r.data, r.status, r.error) for r in rows]
        if input.source_id:
            return await sheet.read_source_rows(input.source_id, input.offset, limit)
        raise InvalidPlayInput("peek needs a run_ref or a source_id")

    @activity.defn(name="playline.export")
    @translate_errors
    async def export(self, input: ExportInput) -> int:
        return await export_run(self._holder, input.run_ref, input.path, input.format)

    @activity.defn(name="playline.call_tool")
    @translate_errors
    async def call_tool(self, input: ToolCallInput) -> Any:
        services = self._holder.services
        runner = make_runner(services, input.options, lease_ttl_s=input.options.heartbeat_timeout_s)
        result = await runner.call(
            input.tool_id,
            input.input,
            force=input.force,
            stale_after_s=input.stale_after_seconds,
        )
        return result.data

    @activity.defn(name="playline.run_step")
    @translate_errors
    async def run_step(self, input: StepInput) -> Any:
        fn = resolvers.lookup(input.fn)
        value = fn(*input.args)
        if inspect.isawaitable(value):
            value = await value
        return value


#: Chunks a dataset run keeps in flight at most when the options leave it to the governor.
MAX_CHUNKS_IN_FLIGHT = 16
#: Rows in flight when no declared tool tells which providers a run calls.
DEFAULT_ROW_WIDTH = 8


def dispatch_width(governor: Governor, providers: list[str], options: RunOptions) -> Width:
    """Little's-law width from the governor, split into chunks and rows per chunk.

    Rows call their columns' tools one after another, so keeping ``sum of the
    providers' suggested widths`` rows in flight keeps every provider busy
    without queueing a burst at the governor. One extra chunk overlaps the next
    chunk's start with the previous chunk's tail.
    """
    rows = sum(governor.suggested_parallelism(p) for p in providers) or DEFAULT_ROW_WIDTH
    per_chunk = max(1, min(options.row_concurrency or rows, options.chunk_size))
    chunks = options.max_chunks_in_flight or min(MAX_CHUNKS_IN_FLIGHT, -(-rows // per_chunk) + 1)
    return Width(chunks_in_flight=max(1, chunks), row_concurrency=per_chunk)


async def export_run(holder: ServicesHolder, run_ref: str, path: str, fmt: str = "csv") -> int:
    """Write a run's rows, in manifest order, to a CSV or JSONL file."""
    sheet = holder.services.sheet
    info = await sheet.run_info(run_ref)
    if info is None:
        raise InvalidPlayInput(f"run {run_ref!r} has no manifest; nothing to export")
    counts = await sheet.run_counts(run_ref)
    rows: list[dict[str, Any]] = []
    for start in range(0, info.admitted, EXPORT_PAGE_ROWS):
        page = await sheet.read_run_rows(run_ref, start, start + EXPORT_PAGE_ROWS)
        rows.extend(_row_out(r.data, r.status, r.error) for r in page)
    columns = info.columns + (["_error"] if counts["error"] else [])
    if fmt == "jsonl":
        return await asyncio.to_thread(write_jsonl, path, rows)
    return await asyncio.to_thread(write_csv, path, columns, rows)
