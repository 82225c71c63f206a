"""What the Temporal UI shows of a play and a dataset run, as short Markdown.

Two kinds of text, both built here from small models so the UI tells the story
without anyone opening a payload:

* **static** summary and details, fixed when the workflow starts (the starter of a
  play passes them, a play passes its dataset run's): what runs, on which file,
  how many rows, in which mode;
* **current details** (``workflow.set_current_details``), replaced as the run goes:
  status, rows done / failed / cached of the total, calls made and saved, credits,
  the rate in force and any wait per provider, the chunks in flight.

Pure functions of their arguments (``now`` included), so they are deterministic in
a workflow and unit-tested without a server.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from playline.contract import (
    BudgetHold,
    ChunkStats,
    ColumnSpec,
    DatasetRunState,
    IntegrationMode,
    PlayState,
    PreparedRun,
    ProviderPace,
    ProviderWait,
    RunMode,
    RunOptions,
    SyncSummary,
)
from playline.money import amount_text, money_text
from playline.spend import account_markdown, spend_lines

__all__ = [
    "budget_wait_message",
    "change_lines",
    "dataset_current_details",
    "dataset_static",
    "due_line",
    "fresh_lines",
    "job_lines",
    "play_current_details",
    "play_static",
    "waits_of",
]

#: The longest input shown in a play's static details (the rest is elided).
MAX_INPUT_CHARS = 300
#: The most in-flight row ranges listed.
MAX_RANGES = 6


def _file_name(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def _mode(integration_mode: IntegrationMode) -> str:
    return "fixture mode" if integration_mode == "fixture" else "live"


def _chunking(options: RunOptions) -> str:
    if options.chunk_size is not None:
        return f"{options.chunk_size} rows per chunk"
    return f"chunks sized to about {options.target_chunk_seconds:g} s"


def play_static(
    play: str, input: Mapping[str, Any], options: RunOptions, sheet: str | None = None
) -> tuple[str, str]:
    """A play's static summary and details: the play, its input file, its mode, and
    (``sheet``: its address in the sheet view) a link to its rows, cell by cell."""
    csv_path = input.get("csv_path")
    source = f" · {_file_name(csv_path)}" if isinstance(csv_path, str) and csv_path else ""
    summary = f"{play}{source} · {_mode(options.integration_mode)}"
    shown = json.dumps(dict(input), default=str, ensure_ascii=False)
    if len(shown) > MAX_INPUT_CHARS:
        shown = shown[: MAX_INPUT_CHARS - 1] + "…"
    lines = [f"**play** `{play}` ({_mode(options.integration_mode)})", ""]
    if isinstance(csv_path, str) and csv_path:
        lines.append(f"- input file: `{csv_path}`")
    lines.append(f"- input: `{shown}`")
    lines.append(f"- chunks: {_chunking(options)}")
    if options.integration_mode == "fixture":
        lines.append(f"- fixtures: {', '.join(_file_name(f) for f in options.fixtures)}")
    if sheet:
        lines.append(f"- sheet: [its rows, cell by cell]({sheet})")
    return summary, "\n".join(lines)


def dataset_static(
    *,
    play: str,
    name: str,
    prepared: PreparedRun,
    source_id: str,
    source_path: str | None,
    mode: RunMode,
    key_fields: Sequence[str],
    columns: Sequence[ColumnSpec],
    options: RunOptions,
) -> tuple[str, str]:
    """A dataset run's static summary and details: rows, source file, mode, columns."""
    source = _file_name(source_path) if source_path else source_id
    summary = (
        f"{name}: {prepared.admitted} rows of {source} ({mode}, {_mode(options.integration_mode)})"
    )
    skipped = []
    if prepared.duplicates:
        skipped.append(f"{prepared.duplicates} duplicate keys")
    if prepared.seen_before:
        skipped.append(f"{prepared.seen_before} seen before")
    lines = [f"**dataset run** `{name}` of play `{play}`", ""]
    if source_path:
        lines.append(f"- input file: `{source_path}` (source `{source_id}`)")
    else:
        lines.append(f"- source: `{source_id}`")
    lines.append(
        f"- rows: {prepared.admitted} admitted of {prepared.total}"
        + (f" ({', '.join(skipped)})" if skipped else "")
    )
    lines.append(
        f"- mode: {mode}, {_mode(options.integration_mode)}; key: "
        + (", ".join(key_fields) if key_fields else "row position")
    )
    lines.append(f"- columns: {', '.join(c.name for c in columns)}")
    lines.append(f"- providers: {', '.join(prepared.providers) or 'none'}")
    lines.append(f"- chunks: {_chunking(options)}")
    return summary, "\n".join(lines)


def _at(moment: datetime, now: datetime) -> str:
    """``14:05:09 UTC`` today, ``Dec 4 00:00 UTC`` on another day."""
    if moment.date() == now.date():
        return moment.strftime("%H:%M:%S UTC")
    return f"{moment:%b} {moment.day} {moment:%H:%M} UTC"


def waits_of(paces: Sequence[ProviderPace], at: datetime) -> list[ProviderWait]:
    """The ``Retry-After`` pauses among ``paces`` (measured at ``at``) as waits."""
    return [
        ProviderWait(provider=p.provider, until=at + timedelta(seconds=p.paused_s))
        for p in paces
        if p.paused_s
    ]


def _progress(status: str, what: str, done: int, total: int, failed: int, cached: int) -> str:
    extra = f" ({failed} failed, {cached} cached)" if failed or cached else ""
    return f"**{status}** {what} · {done} of {total} rows done{extra}"


def _calls(stats: ChunkStats, calls_made: int | None = None) -> list[str]:
    made = stats.calls_made if calls_made is None else calls_made
    saved = stats.calls_cached + stats.calls_shared
    return [
        f"- calls: {made} made, {saved} saved ({stats.calls_cached} receipt hits, "
        f"{stats.calls_shared} shared)",
        f"- credits: {stats.credits:g}" + _money(stats),
        *(f"- {line}" for line in fresh_lines(stats)),
        *(f"- {line}" for line in spend_lines(stats.spend)),
    ]


def _money(stats: ChunkStats) -> str:
    """`` (≈ 12.34 USD)`` for the finished rows' credits where the catalog prices them."""
    money = money_text(stats.spend.get("by_provider") or {}, stats.prices)
    return f" ({money} for the finished rows)" if money else ""


def fresh_lines(stats: ChunkStats) -> list[str]:
    """The cells a run computed and those it kept because they were fresh (none when
    no cell was kept: then every cell was computed, as without freshness rules)."""
    if not stats.cells_fresh:
        return []
    return [f"cells: {stats.cells_due} computed, {stats.cells_fresh} kept fresh (no call made)"]


def _accounts(stats: ChunkStats) -> list[str]:
    """The account with each provider after the list, set apart by a blank line: one
    item per provider (the terms: ``playline.calls.accounting``)."""
    accounts = account_markdown(stats.accounts)
    return ["", *accounts] if accounts else []


def job_lines(stats: ChunkStats, now: datetime) -> list[str]:
    """One line per asynchronous provider the run waits on: its jobs by state."""
    lines = []
    for provider, c in sorted(stats.jobs.items()):
        pending = int(c.get("pending", 0))
        oldest = c.get("oldest_pending_at")
        age = ""
        if pending and isinstance(oldest, int | float):
            age = f" (oldest {max(0, int(now.timestamp() - oldest))} s)"
        lines.append(
            f"- {provider} jobs: {pending} pending{age}, {int(c.get('finished', 0))} "
            f"finished, {int(c.get('failed', 0))} failed"
        )
    return lines


#: The kinds of change a run's report counts, in the order they are shown.
CHANGE_KINDS = ("changed", "appeared", "disappeared")


def change_lines(changes: Mapping[str, Any]) -> list[str]:
    """What a run changed in a dataset enriched before (``ChunkStats.changes``), as one
    line; none when the run had nothing to compare with (every column was new)."""
    parts = []
    for column, counts in sorted(changes.items()):
        if not isinstance(counts, Mapping):
            continue
        shown = ", ".join(f"{int(counts.get(kind, 0))} {kind}" for kind in CHANGE_KINDS)
        parts.append(f"{column} {shown}")
    return [f"changed since the previous run: {'; '.join(parts)}"] if parts else []


def due_line(due: Mapping[str, Any] | None) -> list[str]:
    """What a scheduled firing found due before it paid for anything (``PlayState.due``)."""
    if not due:
        return []
    worst = due.get("worst_case", 0) or 0
    return [
        f"due before paying: {int(due.get('cells_due', 0) or 0)} cells "
        f"({int(due.get('cells_fresh', 0) or 0)} fresh), worst case {float(worst):g} credits"
    ]


def _providers(
    paces: Sequence[ProviderPace], waits: Sequence[ProviderWait], now: datetime
) -> list[str]:
    lines = []
    waiting = {w.provider: w for w in waits if w.until > now}
    for pace in paces:
        rate = f"{pace.rate_rps:.3g} rps in force" if pace.rate_rps is not None else "not paced"
        if pace.rate_rps is not None and pace.limit_source:
            # How the limit was learnt (catalog, headers, 429 measurement...) and since when.
            since = f" since {pace.limit_since}" if pace.limit_since else ""
            rate += f" (limit from {pace.limit_source}{since})"
        wait = waiting.pop(pace.provider, None)
        suffix = f", waiting for {wait.reason} until {_at(wait.until, now)}" if wait else ""
        lines.append(f"- {pace.provider}: {rate}{suffix}{share_text(pace)}")
    for wait in waiting.values():
        lines.append(f"- {wait.provider}: waiting for {wait.reason} until {_at(wait.until, now)}")
    return lines


def share_text(pace: ProviderPace) -> str:
    """``; this run 25.1 rps (66 %) of 38 rps, shared by 2`` when plays share the
    provider (nothing when the run has it alone or the worker did not say)."""
    if not pace.sharing or pace.sharing < 2 or pace.share_rps is None:
        return ""
    part = f" ({pace.share_part:.0%})" if pace.share_part is not None else ""
    total = f" of {pace.total_rps:.3g} rps" if pace.total_rps is not None else ""
    return f"; this run {pace.share_rps:.3g} rps{part}{total}, shared by {pace.sharing}"


def _ranges(ranges: Sequence[tuple[int, int]]) -> str:
    shown = ", ".join(f"{start}-{end - 1}" for start, end in ranges[:MAX_RANGES])
    more = f" and {len(ranges) - MAX_RANGES} more" if len(ranges) > MAX_RANGES else ""
    return f"rows {shown}{more}"


#: Statuses of a run that has ended: nothing is in flight any more.
ENDED = ("completed", "failed", "cancelled")


def _window(state: DatasetRunState) -> list[str]:
    if state.status in ENDED:
        return []
    flight = f"{state.chunks_in_flight} of {state.window} chunks in flight"
    if state.ranges:
        flight += f" ({_ranges(state.ranges)})"
    return [f"- {flight}"]


def dataset_current_details(state: DatasetRunState, now: datetime) -> str:
    """A dataset run's current details."""
    s = state.stats
    lines = [
        _progress(
            state.status,
            state.dataset,
            state.rows_done,
            state.rows_total,
            s.rows_failed,
            s.rows_cached,
        ),
        "",
        *_window(state),
        *_calls(s),
        *_providers(state.paces, state.waits, now),
        *job_lines(s, now),
    ]
    if state.paused and state.status not in ENDED:
        lines.append("- dispatch paused: chunks in flight finish, no new ones start (resume)")
    if state.budget_wait:
        lines.append(f"- {state.budget_wait}")
    if state.note:
        lines.append(f"- {state.note}")
    lines += _outcome_lines(s, now)
    return "\n".join(lines)


def play_current_details(
    state: PlayState, totals: ChunkStats, now: datetime, failure: str | None = None
) -> str:
    """A play's current details: its status, its rows and calls so far, its providers."""
    what = state.current_dataset or state.play
    lines = [
        _progress(
            state.status,
            what,
            state.rows_done,
            state.rows_total,
            state.rows_failed,
            state.rows_cached,
        ),
        "",
        f"- phase: {state.phase}",
    ]
    if failure:
        lines.append(f"- failed: {failure}")
    lines += [f"- {line}" for line in due_line(state.due)]
    current = state.current
    if current is not None and state.status not in ENDED:
        lines += _window(current)
    lines += _calls(totals, state.calls_made)
    lines += job_lines(totals, now)
    if state.status not in ENDED:
        if current is not None:
            lines += _providers(current.paces, current.waits, now)
        if current is not None and current.budget_wait:
            lines.append(f"- {current.budget_wait}")
        if state.paused:
            lines.append("- dispatch paused: chunks in flight finish, no new ones start (resume)")
        elif state.window is not None:
            lines.append(f"- window: at most {state.window} chunks in flight (set_window)")
    lines += _outcome_lines(totals, now)
    if state.syncs:
        lines += ["", "**written back**", ""]
        lines += [f"- {sync_line(summary)}" for summary in state.syncs]
    if state.reconciliation:
        lines += ["", "**reconciliation with the providers' balances**", ""]
        lines += state.reconciliation
    return "\n".join(lines)


def _outcome_lines(s: ChunkStats, now: datetime) -> list[str]:
    """The closing lines a dataset's and a play's details share: the rows that were
    skipped or stopped, the first error, what changed, when, and the accounts."""
    counted = (
        (s.rows_skipped_budget, "rows skipped: budget reached"),
        (s.rows_not_sent, "rows not finished: cancelled (their jobs were read)"),
        (s.cells_skipped_input, "cells skipped: a required input was blank"),
    )
    lines = [f"- {count} {said}" for count, said in counted if count]
    if s.first_error:
        lines.append(f"- first row error: {s.first_error}")
    lines += [f"- {line}" for line in change_lines(s.changes)]
    lines.append(f"- updated {_at(now, now)}")
    lines += _accounts(s)
    return lines


def budget_wait_message(hold: BudgetHold, play_id: str, until: datetime | None = None) -> str:
    """What a run waiting for budget says, and the command that lets it go on; with
    ``until`` (a scheduled firing's bound), when the wait ends by itself."""
    said = _budget_wait_message(hold, play_id)
    if until is None:
        return said
    return (
        f"{said}; waiting for budget until {until.strftime('%Y-%m-%d %H:%M:%S UTC')} "
        "(the next firing), then the rows left are skipped"
    )


def _budget_wait_message(hold: BudgetHold, play_id: str) -> str:
    settled = hold.used if hold.spent is None else hold.spent
    reserved = hold.used - settled
    if hold.currency is not None:  # the run's money cap
        spent = f"{amount_text(settled)} of {amount_text(hold.limit)} {hold.currency} spent"
        if reserved > 1e-9:
            spent += f", {amount_text(reserved)} reserved by calls in flight"
        return f"budget: {spent}; `playline runs budget {play_id} --add-spend N` to go on"
    spent = f"{settled:g} of {hold.limit:g} credits spent"
    if reserved > 1e-9:
        spent += f", {reserved:g} reserved by calls and rows in flight"
    if hold.resets_at is not None:
        resets = datetime.fromtimestamp(hold.resets_at, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
        name = hold.budget.split(" ")[0]
        return (
            f"budget {hold.budget}: {spent}; {hold.rows} rows wait until {resets}, or raise it "
            f"(`playline budgets set {name} ...`) and `playline runs budget {play_id} --retry`"
        )
    if hold.provider is not None:
        return (
            f"budget for {hold.provider}: {spent}; `playline runs budget {play_id} "
            f"--provider {hold.provider} --add N` to go on"
        )
    return f"budget: {spent}; `playline runs budget {play_id} --add N` to go on"


def sync_line(summary: SyncSummary) -> str:
    """One ``ctx.sync``'s counts, as the play's log, details and ``runs get`` say them."""
    line = (
        f"sync to {summary.sink}: {summary.created} created, {summary.updated} updated, "
        f"{summary.unchanged} unchanged, {summary.skipped_by_policy} skipped by policy, "
        f"{summary.rejected} rejected"
    )
    if summary.not_written:
        line += f", {summary.not_written} rows not written"
    if summary.parked:
        line += f"; parked ({summary.parked}), {summary.left} left"
    return line
