"""The workflow/activity contract: every model that crosses the boundary.

Workflows call activities by reference to their ``@activity.defn`` methods (see
:mod:`playline.activities`), so the names are written once and mypy checks each
caller's input and result types against these models. All of them are small by
construction: references, ranges and counts. Rows never appear here except the
preview rows of a result (``RunOptions.preview_rows``, five by default, none with
0) and, when the whole result fits the inline budget, the result rows themselves.

This module imports only pydantic: workflows, activities and stores all use it.
"""

from __future__ import annotations

from typing import Any, Generic, Literal

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypeVar

#: The most rows one chunk activity may hold (pinned or sized by time).
MAX_CHUNK_ROWS = 5000

IntegrationMode = Literal["live", "fixture"]
RunMode = Literal["upsert", "net_new"]
OnRowError = Literal["isolate", "fail"]

#: Rows a dataset result previews by default (``RunOptions.preview_rows``).
DEFAULT_PREVIEW_ROWS = 5
#: The most preview rows a run may ask for: previews are recorded in history.
MAX_PREVIEW_ROWS = 100

#: A play's own output model; unparametrized ``PlayRunResult`` keeps it as plain JSON.
OutputT = TypeVar("OutputT", default=Any)


class RunOptions(BaseModel):
    """How a play runs; the second workflow argument, every field defaulted.

    ``temporal workflow start --type PLAY --input '{...}'`` passes only the play
    input, so the defaults must be what a user wants by default.
    """

    model_config = ConfigDict(extra="forbid")

    integration_mode: IntegrationMode = "live"
    fixtures: list[str] = Field(default_factory=list)
    enforce_fixture_pacing: bool = False
    #: Rows per chunk activity; None sizes chunks by time (``target_chunk_seconds``).
    chunk_size: int | None = Field(default=None, ge=1, le=MAX_CHUNK_ROWS)
    target_chunk_seconds: float = Field(default=5.0, gt=0, le=600)
    max_chunks_in_flight: int = Field(default=0, ge=0)  # 0: ask the governor (up to 16)
    row_concurrency: int = Field(default=0, ge=0)  # 0: ask the governor
    heartbeat_timeout_s: float = Field(default=30.0, ge=1.0)
    # Rows stay out of history by default; a play may opt in to inline results.
    inline_rows_budget_bytes: int = Field(default=0, ge=0, le=1_000_000)
    chunks_per_workflow_run: int = Field(default=500, ge=1)
    # Rows of each dataset result shown in history (they may hold personal data):
    # 0 keeps every row out of history.
    preview_rows: int = Field(default=DEFAULT_PREVIEW_ROWS, ge=0, le=MAX_PREVIEW_ROWS)


class DatasetRef(BaseModel):
    """A dataset in the sheet store: its id, row count and columns. No rows."""

    id: str
    count: int
    columns: list[str]


class ColumnSpec(BaseModel):
    name: str
    resolver: str
    run_if: str | None = None


class LoadCsvInput(BaseModel):
    key: str
    path: str
    required_columns: list[str] = Field(default_factory=list)


class LoadRowsInput(BaseModel):
    """Rows a play passes inline (small lists only: they are recorded in history once)."""

    key: str
    rows: list[dict[str, Any]]


class PrepareRunInput(BaseModel):
    run_ref: str
    source_id: str
    dataset: str
    key_fields: list[str]
    mode: RunMode
    columns: list[ColumnSpec]
    options: RunOptions


class WidthInput(BaseModel):
    providers: list[str]
    options: RunOptions


class Width(BaseModel):
    """How wide to dispatch: chunks in the workflow's window, rows in flight per chunk."""

    chunks_in_flight: int
    row_concurrency: int


class PreparedRun(BaseModel):
    run_ref: str
    dataset: str
    total: int
    admitted: int
    duplicates: int
    seen_before: int
    already_done: int = 0
    suggested_chunks_in_flight: int = 1
    suggested_row_concurrency: int = 8
    providers: list[str] = Field(default_factory=list)


class ChunkInput(BaseModel):
    run_ref: str
    start: int
    end: int
    columns: list[ColumnSpec]
    on_row_error: OnRowError
    options: RunOptions
    row_concurrency: int = 8


class ChunkStats(BaseModel):
    """What a chunk (or a whole dataset run) did; summed upward."""

    rows_ok: int = 0
    rows_failed: int = 0
    rows_resumed: int = 0  # already done by an earlier attempt; not recomputed
    rows_cached: int = 0  # ok rows whose every tool call was answered without a provider call
    calls_made: int = 0
    calls_cached: int = 0
    calls_shared: int = 0
    calls_waited: int = 0
    calls_failed: int = 0
    retries: int = 0
    credits: float = 0.0
    #: wall seconds the chunk activities took (summed): with rows, the chunk sizer's input
    elapsed_s: float = 0.0
    first_error: str | None = None

    def add(self, other: ChunkStats) -> None:
        for name in type(self).model_fields:
            if name == "first_error":
                self.first_error = self.first_error or other.first_error
            else:
                setattr(self, name, getattr(self, name) + getattr(other, name))


class DatasetRunInput(BaseModel):
    """Input of the ``playline.DatasetRun`` child workflow; carries state across continue-as-new."""

    prepared: PreparedRun
    columns: list[ColumnSpec]
    on_row_error: OnRowError
    options: RunOptions
    offset: int = 0  # rows [0, offset) are done
    stats: ChunkStats = Field(default_factory=ChunkStats)
    #: the time-sized chunk length learnt so far (None: not learnt yet, or pinned)
    chunk_rows: int | None = None


class FinalizeInput(BaseModel):
    run_ref: str
    inline_rows_budget_bytes: int
    preview_rows: int = DEFAULT_PREVIEW_ROWS


class DatasetResult(BaseModel):
    """The result of ``dataset(...).run(...)``: a reference, counts, a preview."""

    ref: DatasetRef
    run_ref: str
    stats: ChunkStats
    total: int
    admitted: int
    duplicates: int
    seen_before: int
    preview: list[dict[str, Any]] = Field(default_factory=list)
    rows: list[dict[str, Any]] | None = None  # all rows, only if they fit the budget


class PeekInput(BaseModel):
    run_ref: str | None = None
    source_id: str | None = None
    offset: int = 0
    limit: int = 5


class ExportInput(BaseModel):
    run_ref: str
    path: str
    format: Literal["csv", "jsonl"] = "csv"


class ToolCallInput(BaseModel):
    tool_id: str
    input: dict[str, Any]
    force: bool = False
    stale_after_seconds: float | None = None
    options: RunOptions


class StepInput(BaseModel):
    name: str
    fn: str
    args: list[Any] = Field(default_factory=list)


class PlayState(BaseModel):
    """The ``state`` query: a small progress snapshot for the CLI and the UI."""

    play: str
    phase: str = "starting"
    rows_total: int = 0
    rows_done: int = 0
    rows_failed: int = 0
    calls_made: int = 0
    calls_cached: int = 0
    credits: float = 0.0
    current_dataset: str | None = None
    current_child_id: str | None = None
    log: list[str] = Field(default_factory=list)


class DatasetRunState(BaseModel):
    dataset: str
    rows_total: int
    rows_done: int
    chunks_in_flight: int
    stats: ChunkStats


class PlayRunResult(BaseModel, Generic[OutputT]):
    """What every play workflow returns: the play's own output plus the run's accounting.

    ``PlayRunResult[EnrichLeadsOutput]`` decodes ``output`` into the play's output
    model (``playline.start_play`` asks for exactly that); the bare class keeps it
    as the JSON object the workflow recorded.
    """

    play: str
    output: OutputT | None = None
    datasets: list[DatasetResult] = Field(default_factory=list)
    stats: ChunkStats = Field(default_factory=ChunkStats)
    integration_mode: IntegrationMode = "live"
