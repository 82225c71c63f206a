"""What the ``playline`` command prints: UI links, progress bars, run summaries, JSON."""

from __future__ import annotations

import json
import sys
from typing import Any, Protocol
from urllib.parse import quote

from pydantic import BaseModel, Field
from rich.console import Console

from playline.config import Settings
from playline.contract import PlayRunResult, PlayState
from playline.errors import PlaylineError, root_cause
from playline.money import money_text
from playline.sheet_links import sheet_link
from playline.spend import account_lines, exact_accounts, spend_lines
from playline.workflows.status import change_lines, fresh_lines

#: Messages and progress go to stderr; results (summaries) go to stdout.
console = Console(stderr=True, soft_wrap=True)


def out() -> Console:
    """A console on stdout (made per call, so tests capturing stdout see it)."""
    return Console(soft_wrap=True)


#: The Temporal Cloud UI, for addresses of Temporal Cloud namespaces.
CLOUD_UI = "https://cloud.temporal.io"


def ui_base(settings: Settings) -> str:
    """The Temporal UI's base URL: ``PLAYLINE_UI_URL``, Temporal Cloud's, or the dev UI's."""
    if settings.ui_url:
        return settings.ui_url.rstrip("/")
    host = settings.temporal_address.rsplit(":", 1)[0]
    if host.endswith((".tmprl.cloud", ".api.temporal.io")):
        return CLOUD_UI
    if host in ("localhost", "0.0.0.0", ""):
        host = "127.0.0.1"
    return f"http://{host}:8233"


def ui_url(settings: Settings, workflow_id: str, run_id: str | None = None) -> str:
    """The Temporal UI page of a workflow in the configured namespace."""
    suffix = f"/{quote(run_id, safe='')}" if run_id else ""
    return (
        f"{ui_base(settings)}/namespaces/{quote(settings.temporal_namespace, safe='')}"
        f"/workflows/{quote(workflow_id, safe='')}{suffix}/history"
    )


def print_failure(err: BaseException) -> None:
    """A failed play's root cause, its type and message, on stdout."""
    cause = root_cause(err)
    kind = getattr(cause, "type", None) or type(cause).__name__
    message = getattr(cause, "message", None) or str(cause)
    out().print(f"[bold red]failed:[/] {message} [dim]({kind})[/]")


def print_summary(
    result: PlayRunResult,
    settings: Settings,
    workflow_id: str,
    run_id: str | None,
    spend: dict[str, Any] | None = None,
    changes: dict[str, Any] | None = None,
) -> None:
    """The run's summary; ``spend`` is the store's exact figure (``cli.spend``), else
    the result's own tally is shown; ``changes`` (what the run changed, read from the
    store) likewise stands in for ``stats.changes``."""
    s = result.stats
    console_out = out()
    console_out.print(
        f"[bold green]play {result.play} completed[/] ({result.integration_mode} mode)"
    )
    console_out.print(f"  Temporal UI: {ui_url(settings, workflow_id, run_id)}")
    if settings.sheets_url:
        console_out.print(f"  sheet: {sheet_link(settings.sheets_url, workflow_id)}")
    console_out.print(
        f"  rows: {s.rows_ok} ok, {s.rows_failed} failed, {s.rows_cached} cached "
        f"(no provider call needed)"
    )
    made = "answered from fixtures" if result.integration_mode == "fixture" else "made"
    console_out.print(
        f"  provider calls: {s.calls_made} {made}, {s.calls_cached} receipt hits, "
        f"{s.calls_shared} shared in-run, {s.retries} retries"
    )
    credits = spend.get("credits", s.credits) if spend is not None else s.credits
    by_provider = (spend if spend is not None else s.spend).get("by_provider") or {}
    money = money_text(by_provider, s.prices)
    console_out.print(f"  credits spent: {credits:g}" + (f" ({money})" if money else ""))
    for line in fresh_lines(s):
        console_out.print(f"  {line}", markup=False, highlight=False)
    for line in spend_lines(spend if spend is not None else s.spend):
        console_out.print(f"  {line}", markup=False, highlight=False)
    print_accounts(exact_accounts(s.accounts, spend))
    if s.calls_ambiguous:
        console_out.print(
            f"  ambiguous calls: {s.calls_ambiguous} (sent, no definitive answer: they may "
            "have been charged and were not re-sent; re-send them on purpose with "
            "--retry-ambiguous)",
            markup=False,
            highlight=False,
        )
    duplicates = sum(d.duplicates for d in result.datasets)
    if duplicates:
        console_out.print(
            f"  duplicate row keys: {duplicates}{_first_keys(result)}; each key's first row "
            "was kept",
            markup=False,
            highlight=False,
        )
    if s.rows_skipped_budget:
        console_out.print(
            f"  budget reached: {s.rows_skipped_budget} rows skipped (the export says "
            "skipped_budget for each); run again with a larger --max-credits to do them",
            markup=False,
            highlight=False,
        )
    if s.rows_not_sent:
        console_out.print(
            f"  cancelled: {s.rows_not_sent} rows kept what their jobs answered and sent "
            "nothing new (the export says not_sent for each)",
            markup=False,
            highlight=False,
        )
    if s.cells_skipped_input:
        console_out.print(
            f"  blank input: {s.cells_skipped_input} cells skipped, nothing sent for them "
            "(a required tool input was blank; the export says skipped_input for each)",
            markup=False,
            highlight=False,
        )
    if s.first_error:
        console_out.print(f"  first row error: {s.first_error}")
    print_changes(s.changes if changes is None else changes)


def print_changes(changes: dict[str, Any]) -> None:
    """What the run changed in a dataset enriched before, one line (nothing for a
    first run); ``runs export ID --changes`` writes the rows."""
    for line in change_lines(changes):
        out().print(f"  {line}", markup=False, highlight=False)


def print_accounts(accounts: dict[str, Any]) -> None:
    """The run's account with each provider, as a table (the terms:
    ``playline.calls.accounting``); nothing when no provider was involved."""
    lines = account_lines(accounts)
    if not lines:
        return
    console_out = out()
    console_out.print("  accounts by provider:")
    for line in lines:
        console_out.print(f"    {line}", markup=False, highlight=False)


def _first_keys(result: PlayRunResult) -> str:
    """`` (first: 'a', 'b', 'c')`` from the datasets' reported keys (none: ``""``; a run
    with ``preview_rows=0`` reports none). A compound key's parts are shown ``a/b``."""
    keys = [k for d in result.datasets for k in d.duplicate_keys][:3]
    if not keys:
        return ""
    return " (first: " + ", ".join(repr(k.replace("\x1f", "/")) for k in keys) + ")"


class RunDocument(BaseModel):
    """What ``--json`` prints for one run (``run``, ``runs get``, ``runs cancel``)."""

    workflow_id: str
    run_id: str | None = None
    play: str
    #: Temporal's execution status: RUNNING, COMPLETED, FAILED, CANCELED, TERMINATED...
    status: str
    ui_url: str
    #: the ``state`` query, when a worker answered it
    state: PlayState | None = None
    result: PlayRunResult | None = None
    #: the root cause of a failure: its ``type`` and ``message``
    failure: dict[str, str] | None = None
    search_attributes: dict[str, Any] = Field(default_factory=dict)
    #: ``{"path": ..., "rows": ...}`` when rows were exported
    exported: dict[str, Any] | None = None
    #: what the cells cost (credits by provider and column, waterfall steps), summed
    #: from the workers' store when this client can open it
    spend: dict[str, Any] | None = None
    #: what the dataset runs changed in cells the dataset had before, ``{column:
    #: {"changed", "appeared", "disappeared"}}``, from the workers' store when this
    #: client can open it
    changes: dict[str, Any] | None = None
    #: the run's money invariants (``playline runs audit``), when the store is reachable
    audit: dict[str, Any] | None = None
    #: what the run paid against what its providers' balances say they took
    #: (``playline runs reconcile``), when the store is reachable
    reconciliation: dict[str, Any] | None = None

    def completed(self, result: PlayRunResult) -> RunDocument:
        return self.model_copy(update={"status": "COMPLETED", "result": result})

    def failed(self, err: BaseException) -> RunDocument:
        cause = root_cause(err)
        kind = getattr(cause, "type", None) or type(cause).__name__
        message = getattr(cause, "message", None) or str(cause)
        status = "CANCELED" if kind == "CancelledError" else "FAILED"
        return self.model_copy(
            update={"status": status, "failure": {"type": kind, "message": message}}
        )


def print_json(document: BaseModel | list[Any] | dict[str, Any]) -> None:
    """One JSON document on stdout, nothing else (for scripts and ``jq``)."""
    if isinstance(document, BaseModel):
        text = document.model_dump_json(indent=2)
    else:
        text = json.dumps(document, indent=2, default=str)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


class StoreReport(Protocol):
    """A check read from the workers' store (``runs audit``, ``runs reconcile``)."""

    @property
    def ok(self) -> bool: ...

    def lines(self) -> list[str]: ...

    def as_dict(self) -> dict[str, Any]: ...


def print_store_report(report: StoreReport | None, doing: str, *, json_out: bool) -> int:
    """Print ``report`` (JSON with ``json_out``, else its lines) and give the exit status:
    1 when it does not hold. ``None`` (the store cannot be opened from here) is an error
    saying what could not be done (``doing``: "audit RUN") and how to reach the store."""
    if report is None:
        raise PlaylineError(
            f"cannot {doing}: the workers' store is not reachable from here "
            "(set PLAYLINE_STORE_URL or PLAYLINE_HOME as the workers have it)"
        )
    if json_out:
        print_json(report.as_dict())
    else:
        for line in report.lines():
            out().print(line, markup=False, highlight=False)
    return 0 if report.ok else 1
