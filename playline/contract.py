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

from datetime import datetime
from typing import Any, Generic, Literal

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypeVar

from playline.freshness import Freshness

#: An estimate's dataset runs admit rows into ``<key>~estimate``, never into ``<key>``.
ESTIMATE_DATASET_SUFFIX = "~estimate"
#: The most rows one chunk activity may hold (pinned or sized by time).
MAX_CHUNK_ROWS = 5000

IntegrationMode = Literal["live", "fixture"]
RunMode = Literal["upsert", "net_new"]
OnRowError = Literal["isolate", "fail"]
OnBudget = Literal["wait", "stop"]

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
    #: Re-send calls whose receipt is ``ambiguous`` (sent to a tool that does not
    #: de-duplicate, no definitive answer: they may have been charged). Off by default:
    #: only an explicit retry may pay for such a call again.
    retry_ambiguous: bool = False
    #: The most credits this play run may spend (every dataset run, scalar call and
    #: waterfall of it, fleet-wide): each paid call's worst case is reserved against it
    #: in the store before it is sent. None: no cap.
    max_credits: float | None = Field(default=None, gt=0)
    #: Caps per provider, reserved the same way (``{"acme": 100}``).
    max_credits_by_provider: dict[str, float] = Field(default_factory=dict)
    #: The most money this play run may spend, in the catalog's currency: a call to a
    #: provider reserves its worst case times the provider's ``credit_price`` against
    #: it (every provider the run calls must have a price, in one currency). None: no cap.
    max_spend: float | None = Field(default=None, gt=0)
    #: The currency ``max_spend`` is in (``playline run --max-spend`` sets it from the
    #: catalog's prices); None: the one currency of the catalog's priced providers.
    spend_currency: str | None = None
    #: A named budget in the store (``playline budgets set NAME``) the run also draws on.
    budget: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    #: When a budget is reached: ``wait`` (rows left pending, the run waits durably for
    #: ``playline runs budget ID --add N``) or ``stop`` (rows skipped, the play completes).
    on_budget: OnBudget = "wait"
    #: How long a budget wait may last, from the play run's start (a scheduled firing
    #: sets it to its schedule's interval, less a margin: the wait ends before the next
    #: firing). Past it the held rows are skipped as with ``on_budget="stop"`` and the
    #: run ends. None: a wait lasts until the budget is raised (or its period ends).
    budget_wait_s: float | None = Field(default=None, gt=0)
    #: When that wait ends (the play sets it from ``budget_wait_s``); leave it unset.
    budget_wait_until: datetime | None = None
    #: The play run whose budget the calls draw on: set by the play itself (its run id);
    #: leave it unset.
    budget_run: str | None = None
    #: Estimate instead of run: every call is counted from receipts and priced, none is
    #: sent, nothing is written but the run's manifest (``playline estimate``).
    estimate: bool = False
    #: Estimate first, then run: the play records how many cells are due and their worst
    #: case (a child estimate) before it pays for any (scheduled firings set this).
    estimate_first: bool = False
    #: The schedule that started this run (``playline schedule``), for its summary.
    schedule: str | None = None
    #: Who this run's provider calls count for when plays share a provider: runs of one
    #: fairness key (a team, a customer) share one weighted share, whatever their
    #: number. ``None``: the play run itself (its workflow id). Also Temporal's
    #: ``Priority.fairness_key`` of the play, its dataset runs and chunk activities.
    fairness_key: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:@/-]{1,128}$")
    #: The key's weight: a weight-2 key gets twice the provider calls of a weight-1 key
    #: while both wait for the provider (``Priority.fairness_weight``).
    fairness_weight: float = Field(default=1.0, gt=0, le=1000)
    #: Priority class, 1 (first) to 5 (last), 3 by default: a provider serves waiting
    #: calls of a lower number strictly first, fair shares within a class
    #: (``Priority.priority_key``).
    priority: int = Field(default=3, ge=1, le=5)

    @property
    def budgeted(self) -> bool:
        """Whether paid calls of this run reserve against a budget."""
        return bool(
            self.max_credits is not None
            or self.max_credits_by_provider
            or self.budget
            or self.max_spend is not None
        )


class DatasetRef(BaseModel):
    """A dataset in the sheet store: its id, row count and columns. No rows."""

    id: str
    count: int
    columns: list[str]


class ColumnSpec(BaseModel):
    name: str
    resolver: str
    run_if: str | None = None
    #: how long a computed cell stays fresh (``with_column(..., fresh_for=...)``): a fresh
    #: cell is kept without running the resolver; ``None``: the cell is recomputed by
    #: every run (its tool calls still answered by fresh receipts)
    fresh_for: Freshness | None = None


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


class ProviderPace(BaseModel):
    """A provider as the governor of the worker that answered sees it: the rate in force
    and, while a ``Retry-After`` holds its calls, how long until they go again."""

    provider: str
    rate_rps: float | None = None
    paused_s: float | None = None
    #: the run's fairness key's recent calls per second to the provider on that worker,
    #: its part of all of them, the provider's recent total and how many fairness keys
    #: shared it (``None``: the worker did not say)
    share_rps: float | None = None
    share_part: float | None = None
    total_rps: float | None = None
    sharing: int | None = None
    #: how the rate in force was learnt (``catalog``, ``headers``, ``429 measurement``,
    #: ``limits set``, ``fleet store (429 measurement)``) and when (ISO 8601, UTC;
    #: ``None``: the catalog's from the start, or a worker that did not say)
    limit_source: str | None = None
    limit_since: str | None = None


class Width(BaseModel):
    """How wide to dispatch: chunks in the workflow's window, rows in flight per chunk."""

    chunks_in_flight: int
    row_concurrency: int
    #: the pace of each provider the run calls, for the run's status (not a decision input)
    paces: list[ProviderPace] = Field(default_factory=list)
    #: the rows the governor wants in flight across the run's chunks; the run keeps
    #: enough chunks for them whatever their size (``None``: take ``chunks_in_flight``
    #: as it is: the options pinned it, or a history from before this field)
    rows_in_flight: int | None = None


class PreparedRun(BaseModel):
    run_ref: str
    dataset: str
    total: int
    admitted: int
    duplicates: int
    seen_before: int
    #: the first few row keys that repeated (only when the run may show rows:
    #: ``preview_rows > 0``), so a user can find them
    duplicate_keys: list[str] = Field(default_factory=list)
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
    #: the run is cancelled and re-runs these rows only to read the provider jobs they
    #: wait on: every call that would send something new is refused (NotSentCancelled)
    reading: bool = False


class EstimatedCall(BaseModel):
    """A scalar call (``ctx.tool``, ``ctx.waterfall``) estimated: the answer when a
    receipt holds it (else ``None``) and the estimate's tally of it."""

    data: Any = None
    estimate: dict[str, Any] = Field(default_factory=dict)


class ParkedRows(BaseModel):
    """Rows a chunk left pending because a provider's quota is spent until ``until``,
    or (``jobs``) because their provider jobs are still running: looked at again then."""

    provider: str
    #: when the provider admits calls again (Unix epoch seconds, wall clock)
    until: float
    rows: int
    #: the rows wait for asynchronous jobs, not for a quota
    jobs: bool = False


class BudgetHold(BaseModel):
    """Rows a chunk left pending because a budget could not cover their next paid call."""

    budget: str
    limit: float
    #: credits spent or reserved in that budget when the call was refused
    used: float
    rows: int
    #: of ``used``, what was settled (None: all of it)
    spent: float | None = None
    #: the provider a provider cap belongs to (``runs budget --provider``)
    provider: str | None = None
    #: a named budget's period ends then (epoch seconds): the run goes on by itself
    resets_at: float | None = None
    #: the figures are money in this currency: the run's money cap (``--add-spend``)
    currency: str | None = None


def merge_holds(a: BudgetHold | None, b: BudgetHold | None) -> BudgetHold | None:
    """Both holds as one: the rows add up, the fuller budget's figures win."""
    if a is None or b is None:
        return a or b
    fuller = a if a.used >= b.used else b
    return fuller.model_copy(update={"rows": a.rows + b.rows})


class ChunkStats(BaseModel):
    """What a chunk (or a whole dataset run) did; summed upward."""

    rows_ok: int = 0
    rows_failed: int = 0
    rows_resumed: int = 0  # already done by an earlier attempt; not recomputed
    rows_cached: int = 0  # ok rows whose every tool call was answered without a provider call
    #: failed rows whose call is ambiguous (may have been charged; re-send on purpose)
    rows_ambiguous: int = 0
    calls_made: int = 0
    calls_cached: int = 0
    calls_shared: int = 0
    calls_waited: int = 0
    calls_failed: int = 0
    #: calls sent without a definitive answer to a tool that does not de-duplicate
    #: (may have been charged); never re-sent automatically (``retry_ambiguous``)
    calls_ambiguous: int = 0
    retries: int = 0
    credits: float = 0.0
    #: wall seconds the chunk activities took (summed): with rows, the chunk sizer's input
    elapsed_s: float = 0.0
    first_error: str | None = None
    #: rows left pending for a parked provider (a dataset run re-runs them after the reset)
    parked: ParkedRows | None = None
    #: rows left pending because a budget was reached (``on_budget="wait"``)
    over_budget: BudgetHold | None = None
    #: rows not processed because a budget was reached (``on_budget="stop"``)
    rows_skipped_budget: int = 0
    #: rows a cancelled run re-ran to read their jobs that still needed a new call
    #: (recorded with what they had paid for; nothing new was sent)
    rows_not_sent: int = 0
    #: cells left empty because a tool call they needed left a required input blank
    #: (``skipped_input`` in their provenance): nothing was sent for them, free; their
    #: rows are ok and their other cells computed
    cells_skipped_input: int = 0
    #: what the finished rows' cells cost: credits by provider and by column, and each
    #: waterfall column's answering steps (``playline.calls.provenance.SpendTally``);
    #: a few keys per provider and column, never a row
    spend: dict[str, Any] = Field(default_factory=dict)
    #: an estimate's tally (``playline.calls.estimate_tally``): calls and credits by
    #: column, tool and provider; empty for a run
    estimate: dict[str, Any] = Field(default_factory=dict)
    #: the account with each provider, ``{provider: {term: number}}``: requests sent,
    #: calls charged, replays, receipt hits, shared, followers, credits charged and
    #: saved (the terms: ``playline.calls.accounting``)
    accounts: dict[str, Any] = Field(default_factory=dict)
    #: asynchronous provider jobs the run waits on, ``{provider: {"pending", "finished",
    #: "failed", "oldest_pending_at"}}``: the latest count (a snapshot, not a sum)
    jobs: dict[str, Any] = Field(default_factory=dict)
    #: cells the run computed (new, or past their freshness) and cells it kept because
    #: they were fresh (no resolver run, no call); an estimate counts them the same way
    cells_due: int = 0
    cells_fresh: int = 0
    #: what the run changed in a dataset enriched before, ``{column: {"changed",
    #: "appeared", "disappeared"}}`` (counts of cells against their previous values)
    changes: dict[str, Any] = Field(default_factory=dict)
    #: what a credit costs with the providers the run used, where the workers' catalog
    #: says, ``{provider: {"credit_price", "currency"}}`` (``playline.money``)
    prices: dict[str, Any] = Field(default_factory=dict)

    def add(self, other: ChunkStats) -> None:
        for name in type(self).model_fields:
            if name == "first_error":
                self.first_error = self.first_error or other.first_error
            elif name == "parked":
                self.parked = merge_parked(self.parked, other.parked)
            elif name == "over_budget":
                self.over_budget = merge_holds(self.over_budget, other.over_budget)
            elif name == "spend":
                self.spend = merge_spend(self.spend, other.spend)
            elif name == "estimate":
                self.estimate = merge_spend(self.estimate, other.estimate)
            elif name in ("accounts", "changes"):
                setattr(self, name, merge_spend(getattr(self, name), getattr(other, name)))
            elif name in ("jobs", "prices"):
                setattr(self, name, {**getattr(self, name), **getattr(other, name)})
            else:
                setattr(self, name, getattr(self, name) + getattr(other, name))


def merge_spend(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two spend tallies as one (numbers add up, nested tables key by key)."""
    if not b:
        return a
    merged: dict[str, Any] = dict(a)
    for key, value in b.items():
        mine = merged.get(key)
        if isinstance(value, dict):
            merged[key] = merge_spend(mine if isinstance(mine, dict) else {}, value)
        elif isinstance(value, list) and isinstance(mine, list) and len(mine) == len(value):
            merged[key] = [a + b for a, b in zip(mine, value, strict=True)]
        elif isinstance(value, int | float) and not isinstance(value, bool):
            merged[key] = (mine if isinstance(mine, int | float) else 0) + value
        else:
            merged[key] = value
    return merged


def merge_parked(a: ParkedRows | None, b: ParkedRows | None) -> ParkedRows | None:
    """Both parkings as one: the rows add up, the later reset wins."""
    if a is None or b is None:
        return a or b
    later = a if a.until >= b.until else b
    return ParkedRows(
        provider=later.provider, until=later.until, rows=a.rows + b.rows, jobs=later.jobs
    )


#: The most chunks a run may be told to keep in flight (``set_window``).
MAX_WINDOW = 64


class DispatchControl(BaseModel):
    """What the play's controls ask of a dataset run's dispatch (the ``playline.control``
    signal, and the state a new or continued run starts from)."""

    paused: bool = False
    #: chunks in flight at most; None leaves it to the options and the governor
    window: int | None = Field(default=None, ge=1, le=MAX_WINDOW)
    #: bumped each time the play's budget is raised: rows held for budget run again
    budget_epoch: int = 0


class ProviderWait(BaseModel):
    """A provider the run is waiting for, and until when (a ``Retry-After``, a quota)."""

    provider: str
    until: datetime
    reason: str = "rate limited"


class RowRange(BaseModel):
    """Rows ``[start, end)`` of a run, ``rows`` of them still to do (the rest are done)."""

    start: int
    end: int
    rows: int
    #: every row still to do waits on a provider job (none on a quota or a budget):
    #: a cancelled run still reads them, its jobs are paid for
    jobs: bool = False
    #: when those jobs are looked at again (epoch seconds)
    until: float | None = None
    #: some rows wait on provider jobs (others may be held for budget): a cancelled run
    #: reads those jobs, re-running the range so that it sends nothing new
    some_jobs: bool = False


class Outstanding(BaseModel):
    """A dataset run's work still to do, as one set: what a run carries across
    continue-as-new, and what must be empty before it completes.

    Rows ``[next_start, admitted)`` were never started; ``redo`` are ranges whose
    parked rows may run again now (their provider's reset passed); ``parked`` are
    ranges whose rows wait for ``parking``'s reset. ``rows_done`` counts every row
    finished so far (ok or failed).
    """

    next_start: int = 0
    redo: list[RowRange] = Field(default_factory=list)
    parked: list[RowRange] = Field(default_factory=list)
    parking: ParkedRows | None = None
    #: ranges whose rows wait for more budget (``holding`` says which, how full)
    held: list[RowRange] = Field(default_factory=list)
    holding: BudgetHold | None = None
    rows_done: int = 0

    def empty(self, total: int) -> bool:
        return self.next_start >= total and not self.redo and not self.parked and not self.held


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
    #: pause and window as the play's controls left them
    control: DispatchControl = Field(default_factory=DispatchControl)
    #: when the first run of this dataset run started (progress reports space out with age)
    started_at: datetime | None = None
    #: the source file, for the run's status (None: inline rows or an earlier result)
    source_path: str | None = None
    #: the work still to do, carried across continue-as-new (None: ``[offset, admitted)``)
    outstanding: Outstanding | None = None
    #: progress reports sent so far (their ``seq`` goes on across continue-as-new)
    reports_sent: int = 0


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
    #: the first few row keys that repeated (see ``PreparedRun.duplicate_keys``)
    duplicate_keys: list[str] = Field(default_factory=list)
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
    #: CSV: write cells as they are, without neutralising spreadsheet formulas
    raw: bool = False


class ToolCallInput(BaseModel):
    tool_id: str
    input: dict[str, Any]
    force: bool = False
    stale_after_seconds: float | None = None
    options: RunOptions
    #: the call this one looks at again after its job was pending (``JobPending``'s
    #: details say it): the first call's force token, so its job counts as this run's
    call_token: str | None = None


class WaterfallCallInput(BaseModel):
    """``ctx.waterfall``: one of the catalog's named waterfalls, run once for the play."""

    name: str
    input: dict[str, Any]
    options: RunOptions
    #: as ``ToolCallInput.call_token``
    call_token: str | None = None


#: The type of the error a scalar call (``ctx.tool``, ``ctx.waterfall``) fails with while
#: its provider job runs; its details are one :class:`JobPendingDetails`.
JOB_PENDING_ERROR = "JobPending"


class JobPendingDetails(BaseModel):
    """What a scalar call's ``JobPending`` failure tells its workflow: when to call again
    (epoch seconds) and the token that makes the next call the same call."""

    resume_at: float
    call_token: str
    provider: str = ""
    job_id: str | None = None


class StepInput(BaseModel):
    name: str
    fn: str
    args: list[Any] = Field(default_factory=list)


#: Where a play or dataset run is; ``PlaylineStatus`` holds the same word.
RunStatus = Literal[
    "starting", "running", "paused", "waiting", "cancelling", "completed", "failed", "cancelled"
]


class DatasetRunState(BaseModel):
    """A dataset run's ``state`` query, and the progress report it signals its play."""

    dataset: str
    rows_total: int
    rows_done: int
    chunks_in_flight: int
    stats: ChunkStats
    status: RunStatus = "running"
    #: chunks in flight at most right now (the control's window, else the governor's)
    window: int = 0
    paused: bool = False
    paces: list[ProviderPace] = Field(default_factory=list)
    waits: list[ProviderWait] = Field(default_factory=list)
    #: row ranges of the chunks in flight, ``[start, end)``
    ranges: list[tuple[int, int]] = Field(default_factory=list)
    #: while rows wait for budget: what the UI and ``runs get`` say about it
    budget_wait: str | None = None
    #: what a cancelling run still does ("cancelling: reading N submitted jobs")
    note: str | None = None
    #: the report's number within the run (a play keeps the latest)
    seq: int = 0


class BudgetChange(BaseModel):
    """The ``budget`` update: raise (``add``) or set (``set``) the run's credit cap, or
    a provider's (``provider``), or its money cap (``spend``: the amounts are money)."""

    model_config = ConfigDict(extra="forbid")

    add: float | None = Field(default=None, gt=0)
    set: float | None = Field(default=None, gt=0)
    provider: str | None = None
    #: neither: try the held rows again (a named budget was raised in the store)
    retry: bool = False
    #: the change is to the run's money cap (``max_spend``): ``add``/``set`` are money
    spend: bool = False


class AdjustBudgetInput(BaseModel):
    """The activity that changes a budget's limit in the store: the run's cap, a
    provider's cap of the run, or (only read) a named budget."""

    run: str
    provider: str | None = None
    named: str | None = None
    add: float | None = None
    set_to: float | None = None
    #: the limit a budget no call has touched yet starts from
    create_with: float | None = None
    #: the run's money cap (``max_spend``), not its credit cap
    spend: bool = False


class BudgetReport(BaseModel):
    """A budget as the store holds it: its cap, what is spent and what is reserved."""

    budget: str
    limit: float
    spent: float
    reserved: float


class ControlState(BaseModel):
    """What an update (``pause``, ``resume``, ``set_window``) left in force."""

    status: RunStatus
    paused: bool
    window: int | None
    dataset: str | None = None


class PlayState(BaseModel):
    """The ``state`` query: a small progress snapshot for the CLI and the UI.

    ``rows_done`` and the counts include the current dataset run's last progress
    report (``current``); ``phase`` says in words what the play is doing.
    """

    play: str
    phase: str = "starting"
    status: RunStatus = "starting"
    rows_total: int = 0
    rows_done: int = 0
    rows_failed: int = 0
    rows_cached: int = 0
    calls_made: int = 0
    calls_cached: int = 0
    calls_shared: int = 0
    credits: float = 0.0
    paused: bool = False
    window: int | None = None
    current_dataset: str | None = None
    current_child_id: str | None = None
    #: the current dataset run's last progress report
    current: DatasetRunState | None = None
    #: while the current dataset run waits for budget: what to do about it
    budget_wait: str | None = None
    #: run references of every dataset run started, in order (``runs export`` reads the last)
    run_refs: list[str] = Field(default_factory=list)
    #: playline's search attributes this namespace has registered (the play upserts these)
    search_attributes: list[str] = Field(default_factory=list)
    #: ``estimate_first`` (a scheduled firing): what was due before it paid for anything,
    #: ``{"cells_due", "cells_fresh", "calls", "worst_case", "estimate_id"}``
    due: dict[str, Any] | None = None
    log: list[str] = Field(default_factory=list)
    #: after the run: its reconciliation with the providers' balances, in Markdown
    #: (``playline runs reconcile`` prints it in full)
    reconciliation: list[str] = Field(default_factory=list)
    #: what each ``ctx.sync`` wrote back, in counts, in the order they ran
    syncs: list[SyncSummary] = Field(default_factory=list)


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
    #: a budget was reached and rows were skipped (``on_budget="stop"``;
    #: ``stats.rows_skipped_budget`` counts them)
    budget_exhausted: bool = False


class SyncInput(BaseModel):
    """``ctx.sync(...)``: one dataset run's rows written to a catalog sink (see
    :mod:`playline.sinks`). Column names and policies only: no row travels here."""

    run_ref: str
    sink: str
    map: dict[str, str] = Field(default_factory=dict)
    id_column: str | None = None
    policies: dict[str, str] = Field(default_factory=dict)
    #: how long 429s are waited out before the step parks
    patience_s: float = 300.0
    #: a batch's lease: how soon another attempt takes over a dead worker's batch
    lease_ttl_s: float = Field(default=60.0, gt=0)


class SyncSummary(BaseModel):
    """What a sync did, in counts (record ids and the destination's reasons stay out
    of history: ``playline sync RUN_ID --sink NAME --dry-run`` shows them)."""

    sink: str
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    skipped_by_policy: int = 0
    rejected: int = 0
    #: rows that make no record: failed, not done, without an id, a repeated id
    not_written: int = 0
    #: fields sent (``if_blank`` ones the destination kept are not counted)
    fields_written: int = 0
    #: HTTP requests (a CRM) or transactions (PostgreSQL) sent by this sync
    requests: int = 0
    #: why the destination parked the sync (its daily limit), ``None`` when it did not
    parked: str | None = None
    #: records left when it parked
    left: int = 0
    #: epoch seconds the destination can take more (when it said)
    retry_at: float | None = None
