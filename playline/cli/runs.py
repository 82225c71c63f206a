"""``playline runs get|export|list|pause|resume|window|budget|cancel|stop|audit|reconcile``.

Controls are the play's Temporal updates (``pause``, ``resume``, ``set_window``): a
request the play's validators reject (resume a play that is not paused, a window
of 0) fails here in one line and never enters the play's history. ``cancel`` is
Temporal's cancellation, which the play handles gracefully: no new chunk starts,
the chunks in flight settle, and the play ends cancelled; ``--out`` then exports
what was done. ``list`` searches by playline's search attributes. ``get`` says what
the run changed in a dataset enriched before, and ``export --changes`` writes only the
changed rows (old and new values), for a CRM sync.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError
from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.service import RPCError

from playline import search_attributes as sa
from playline.cli.audit import read_audit
from playline.cli.follow import wait_lines
from playline.cli.reconcile import read_reconciliation, reconcile_command
from playline.cli.render import (
    RunDocument,
    console,
    out,
    print_accounts,
    print_changes,
    print_failure,
    print_json,
    print_store_report,
    print_summary,
    ui_url,
)
from playline.cli.run import (
    PROVENANCE_HELP,
    RAW_HELP,
    export_dataset_run,
    export_format,
)
from playline.cli.run_refs import find_run, last_run_ref, memo_run_refs
from playline.cli.setup import registered_search_attributes
from playline.cli.spend import store_changes, store_spend
from playline.client import not_found_as
from playline.config import Settings
from playline.contract import (
    BudgetChange,
    BudgetReport,
    ControlState,
    PlayRunResult,
    PlayState,
)
from playline.datasets import export_changes
from playline.errors import PlaylineError, format_validation_errors
from playline.money import amount_text
from playline.spend import spend_lines
from playline.stores.backends import open_stores
from playline.worker import connect
from playline.workflows.status import due_line, job_lines, sync_line

#: What each control command asks of the play (its update) and says when done.
CONTROLS = {
    "pause": ("pause", "paused {id}: chunks in flight finish, no new ones start"),
    "resume": ("resume", "resumed {id}"),
    "window": ("set_window", "{id} keeps at most {window} chunks in flight"),
}
#: How long ``runs get`` waits for a worker to answer the ``state`` query.
QUERY_TIMEOUT = timedelta(seconds=10)
#: ``runs export --changes``'s help.
CHANGES_HELP = (
    "write only the rows the run changed in cells the dataset had before (for a CRM "
    "sync): the row key, then C__old and C__new for each changed column C"
)

#: ``--status`` values of ``runs list`` (PlaylineStatus)
STATUSES = ("running", "paused", "waiting", "cancelling", "completed", "failed", "cancelled")


def add_runs_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    common: Any,
) -> None:
    runs = sub.add_parser("runs", help="inspect, control, export or list runs")
    runs_sub = runs.add_subparsers(dest="runs_command", required=True)
    for name, text in (
        ("get", "status, progress, summary or failure"),
        ("export", "write the rows (of a finished, failed or cancelled run: what was done)"),
        ("pause", "stop starting chunks; those in flight finish"),
        ("resume", "start chunks again"),
        ("window", "change how many chunks may be in flight"),
        ("cancel", "cancel gracefully: settle the chunks in flight, end cancelled"),
        ("stop", "request cancellation without waiting (or --terminate at once)"),
        ("budget", "raise or set the run's credit or money cap: held rows go on"),
        ("audit", "check the run's money invariants against the stores (exit 1 if one fails)"),
        (
            "reconcile",
            "compare what the run paid with its providers' balances (exit 1 if one differs)",
        ),
    ):
        p = runs_sub.add_parser(name, help=text)
        common(p)
        p.add_argument("id", help="workflow id")
        if name == "export":
            p.add_argument(
                "--out", required=True, help="file to write: CSV, or JSON lines if .jsonl"
            )
            p.add_argument("--changes", action="store_true", help=CHANGES_HELP)
        if name in ("export", "cancel"):
            p.add_argument("--raw", action="store_true", help=RAW_HELP)
            p.add_argument("--provenance", action="store_true", help=PROVENANCE_HELP)
        if name == "window":
            p.add_argument("chunks", type=int, help="chunks in flight at most (1 to 64)")
        if name == "cancel":
            p.add_argument("--out", help="then write the rows done to this file (CSV, or .jsonl)")
            p.add_argument(
                "--no-wait", action="store_true", help="return once cancellation is requested"
            )
        if name == "stop":
            p.add_argument(
                "--terminate",
                action="store_true",
                help="end it at once instead of requesting cancellation",
            )
        if name == "budget":
            change = p.add_mutually_exclusive_group(required=True)
            change.add_argument("--add", type=float, metavar="N", help="raise the cap by N")
            change.add_argument("--set", type=float, metavar="N", help="set the cap to N")
            change.add_argument(
                "--retry",
                action="store_true",
                help="try the held rows again (after raising a named budget)",
            )
            change.add_argument(
                "--add-spend",
                type=float,
                metavar="N",
                help="raise the run's money cap (--max-spend) by N, in the catalog's currency",
            )
            change.add_argument(
                "--set-spend", type=float, metavar="N", help="set the run's money cap to N"
            )
            p.add_argument("--provider", help="the capped provider (--max-credits-for)")
        if name in ("get", "cancel", "pause", "resume", "window", "budget", "audit", "reconcile"):
            p.add_argument("--json", action="store_true", help="print one JSON document")
        if name == "get":
            p.add_argument(
                "--state", action="store_true", help="also print the run's raw state (JSON)"
            )
    listing = runs_sub.add_parser("list", help="list plays, newest first")
    common(listing)
    listing.add_argument("--play", help="only this play")
    listing.add_argument("--status", choices=STATUSES, help="only runs in this status")
    listing.add_argument("--query", help="a Temporal list query, ANDed with the above")
    listing.add_argument("--limit", type=int, default=20, help="at most this many (default 20)")
    listing.add_argument(
        "--estimates",
        action="store_true",
        help="include estimates (`playline estimate`), left out by default",
    )
    listing.add_argument("--json", action="store_true", help="print one JSON document")


async def cmd_runs(args: argparse.Namespace, settings: Settings) -> int:
    client = await connect(settings=settings)
    if args.runs_command == "list":
        return await list_runs(client, args, settings)
    handle, desc = await find_run(client, args.id, settings.temporal_namespace)
    command = args.runs_command
    if command == "get":
        return await get_run(handle, desc, args, settings)
    if command == "audit":
        return await audit(handle, desc, args, settings)
    if command == "reconcile":
        return await reconcile_command(desc, settings, json_out=args.json)
    if command == "export":
        if args.changes:
            if args.provenance:
                raise PlaylineError("--changes writes old and new values, not --provenance")
            count = await export_changed(handle, desc, args.out, settings, raw=args.raw)
            out().print(f"wrote {count} changed rows to {args.out}")
            return 0
        count = await export_done(
            handle, desc, args.out, settings, raw=args.raw, provenance=args.provenance
        )
        out().print(f"wrote {count} rows to {args.out}")
        return 0
    if desc.status != WorkflowExecutionStatus.RUNNING:
        raise PlaylineError(f"run {args.id} is not running ({_status(desc.status)})")
    if command in CONTROLS:
        return await control(handle, args)
    if command == "budget":
        return await change_budget(handle, args)
    if command == "cancel":
        return await cancel(handle, desc, args, settings)
    if args.terminate:
        await handle.terminate(reason="playline runs stop --terminate")
        out().print(f"terminated {args.id}")
    else:
        await handle.cancel()
        out().print(f"cancellation requested for {args.id}")
    return 0


@contextlib.contextmanager
def _update_refusals(update: str, run_id: str) -> Iterator[None]:
    """An update the play rejected, or a run that ended meanwhile, as one line."""
    try:
        with not_found_as(PlaylineError(f"run {run_id} is not running any more")):
            yield
    except WorkflowUpdateFailedError as err:
        reason = getattr(err.cause, "message", None) or str(err.cause)
        raise PlaylineError(f"{update} refused: {reason}") from None


async def control(handle: WorkflowHandle[Any, Any], args: argparse.Namespace) -> int:
    """Send one control update; a rejection is one line (and nothing entered history)."""
    update, done = CONTROLS[args.runs_command]
    update_args = [args.chunks] if update == "set_window" else []
    with _update_refusals(args.runs_command, args.id):
        state = await handle.execute_update(update, args=update_args, result_type=ControlState)
    if args.json:
        print_json(state)
    else:
        out().print(done.format(id=args.id, window=getattr(args, "chunks", "")))
    return 0


async def change_budget(handle: WorkflowHandle[Any, Any], args: argparse.Namespace) -> int:
    """The ``budget`` update; a rejection is one line (and nothing entered history)."""
    add_spend, set_spend = getattr(args, "add_spend", None), getattr(args, "set_spend", None)
    spend = add_spend is not None or set_spend is not None
    try:
        change = BudgetChange(
            add=add_spend if spend else args.add,
            set=set_spend if spend else args.set,
            retry=args.retry,
            provider=args.provider,
            spend=spend,
        )
    except ValidationError as err:
        problems = format_validation_errors(err.errors())
        raise PlaylineError(f"budget refused: {problems}") from None
    # Only the fields given: a worker from before money caps knows no ``spend``.
    sent = change.model_dump(exclude_defaults=True)
    with _update_refusals("budget", args.id):
        report = await handle.execute_update("budget", sent, result_type=BudgetReport)
    if args.json:
        print_json(report)
    elif spend:
        out().print(
            f"{args.id}: money cap {amount_text(report.limit)}, {amount_text(report.spent)} "
            f"spent, {amount_text(report.reserved)} reserved (the catalog's currency); rows "
            "held for budget go on"
        )
    else:
        out().print(
            f"{args.id}: budget {report.limit:g} credits, {report.spent:g} spent, "
            f"{report.reserved:g} reserved; rows held for budget go on"
        )
    return 0


async def cancel(
    handle: WorkflowHandle[Any, PlayRunResult],
    desc: WorkflowExecutionDescription,
    args: argparse.Namespace,
    settings: Settings,
) -> int:
    """Request cancellation; unless ``--no-wait``, wait for the play to settle and say
    how far it got (and export what was done with ``--out``)."""
    await handle.cancel()
    if args.no_wait:
        out().print(f"cancellation requested for {args.id}")
        return 0
    console.print(f"cancelling {args.id}: no new chunk starts, those in flight settle")
    document = _document(args, desc, settings, status="RUNNING")
    document = await _settled(document, handle)  # it finished meanwhile
    document.state = await _state(handle)
    if args.out:
        count = await export_done(
            handle,
            await handle.describe(),
            args.out,
            settings,
            raw=args.raw,
            provenance=args.provenance,
        )
        document.exported = {"path": args.out, "rows": count}
    if args.json:
        print_json(document)
        return 0
    state = document.state
    progress = f"{state.rows_done} of {state.rows_total} rows done" if state else "see its state"
    out().print(f"{document.status.lower()} {args.id}: {progress}")
    if document.exported:
        out().print(f"  wrote {document.exported['rows']} rows to {args.out}")
    return 0


async def get_run(
    handle: WorkflowHandle[Any, PlayRunResult],
    desc: WorkflowExecutionDescription,
    args: argparse.Namespace,
    settings: Settings,
) -> int:
    state = await _state(handle)
    refs = await memo_run_refs(desc)
    spend = await store_spend(settings, refs)
    changes = await store_changes(settings, refs)
    if args.json:
        document = _document(
            args,
            desc,
            settings,
            status=_status(desc.status),
            state=state,
            search_attributes=_attributes(desc),
            spend=spend,
            changes=changes,
        )
        if desc.status in _SETTLED:
            document = await _settled(document, handle)
        if desc.status != WorkflowExecutionStatus.RUNNING:
            reconciled = await read_reconciliation(desc, settings, spend)
            document.reconciliation = reconciled.as_dict() if reconciled is not None else None
        print_json(document)
        return 0
    failure: WorkflowFailureError | None = None
    if desc.status == WorkflowExecutionStatus.FAILED:
        try:
            await handle.result()
        except WorkflowFailureError as err:
            failure = err
    # First what a person asks: how is it, why, what now; then the figures.
    out().print(f"{args.id}: {desc.workflow_type} {_status(desc.status)}")
    if failure is not None:
        print_failure(failure)
    for line in next_steps(args.id, desc.status, state):
        out().print(f"  {line}", markup=False, highlight=False)
    for line in due_line(state.due if state is not None else None):
        out().print(line, markup=False, highlight=False)
    if state is not None and state.current is not None:
        for line in job_lines(state.current.stats, datetime.now(UTC)):
            out().print(line, markup=False, highlight=False)
    if desc.status == WorkflowExecutionStatus.COMPLETED:
        print_summary(await handle.result(), settings, args.id, desc.run_id, spend, changes)
    else:
        for line in credit_lines(state, spend):
            out().print(f"  {line}", markup=False, highlight=False)
        print_changes(changes or {})
        for line in spend_lines(spend or {}):
            out().print(f"  {line}", markup=False, highlight=False)
        if state is not None and state.current is not None:
            # The current dataset run's last report: the play's totals come with its result.
            print_accounts(state.current.stats.accounts)
    for summary in state.syncs if state is not None else []:
        out().print(f"  {sync_line(summary)}", markup=False, highlight=False)
    if desc.status != WorkflowExecutionStatus.RUNNING:
        report = await read_audit(handle, desc, settings)
        for line in report.lines() if report is not None else []:
            out().print(f"  {line}", markup=False, highlight=False)
        reconciled = await read_reconciliation(desc, settings, spend)
        if reconciled is not None and reconciled.balances_read:
            for line in reconciled.lines():
                out().print(f"  {line}", markup=False, highlight=False)
    if getattr(args, "state", False) and state is not None:
        out().print_json(state.model_dump_json())
    return 0


def next_steps(run_id: str, status: WorkflowExecutionStatus | None, state: Any) -> list[str]:
    """What the run is doing or waiting for, and the command that moves it on."""
    if status == WorkflowExecutionStatus.FAILED:
        return [f"what it did: `playline runs export {run_id} --out FILE`"]
    if status != WorkflowExecutionStatus.RUNNING or state is None:
        return []
    current = state.current
    lines = [
        f"{state.phase}: {state.rows_done} of {state.rows_total} rows done"
        + (f", {state.rows_failed} failed" if state.rows_failed else "")
    ]
    waits = wait_lines(state, current, datetime.now(UTC), run_id)
    lines += waits
    if not waits:
        lines.append(
            f"`playline runs pause {run_id}` holds it, `playline runs cancel {run_id}` ends it"
        )
    return lines


def credit_lines(state: Any, spend: dict[str, Any] | None) -> list[str]:
    """One credits figure, the bill so far; and, where the cells of finished rows add up
    to less (rows held or in flight have paid for calls), which figure the tables are."""
    if state is None:
        return []
    billed = float(state.credits)
    if state.current is not None:
        billed = max(billed, float(state.current.stats.credits))
    cells = float((spend or {}).get("credits", 0.0) or 0.0)
    lines = [f"credits spent so far: {billed:g}"]
    if spend and abs(cells - billed) > 1e-9:
        lines.append(
            f"(the tables below add up the cells of finished rows: {cells:g}; the rest "
            "was paid by rows still in flight or held)"
        )
    return lines


async def audit(
    handle: WorkflowHandle[Any, Any],
    desc: WorkflowExecutionDescription,
    args: argparse.Namespace,
    settings: Settings,
) -> int:
    """``runs audit``: the four invariants; exit 1 when one does not hold."""
    report = await read_audit(handle, desc, settings)
    return print_store_report(report, f"audit {args.id}", json_out=args.json)


async def export_done(
    handle: WorkflowHandle[Any, PlayRunResult],
    desc: WorkflowExecutionDescription,
    path: str,
    settings: Settings,
    *,
    raw: bool = False,
    provenance: bool = False,
) -> int:
    """Export a completed play's result, or what a failed or cancelled play had done
    (its last dataset run, named in the memo); formulas inert unless ``raw``, each
    computed cell's provenance added with ``provenance``."""
    run_ref = await last_run_ref(handle, desc)
    if run_ref is None:
        raise PlaylineError(
            f"run {handle.id} ({_status(desc.status)}) has no dataset run to export yet"
        )
    return await export_dataset_run(run_ref, path, settings, raw=raw, provenance=provenance)


async def export_changed(
    handle: WorkflowHandle[Any, PlayRunResult],
    desc: WorkflowExecutionDescription,
    path: str,
    settings: Settings,
    *,
    raw: bool = False,
) -> int:
    """Export the rows the play's last dataset run changed (``--changes``)."""
    run_ref = await last_run_ref(handle, desc)
    if run_ref is None:
        raise PlaylineError(f"run {handle.id} ({_status(desc.status)}) has no dataset run")
    async with await open_stores(settings, create=False) as stores:
        return await export_changes(stores.sheet, run_ref, path, export_format(path), raw=raw)


async def list_runs(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    registered = set(await registered_search_attributes(client))
    searchable = {k.name for k in sa.LIST_KEYS} <= registered
    clauses = []
    if searchable:
        clauses.append("PlaylinePlay IS NOT NULL")
        if sa.KIND.name in registered and not getattr(args, "estimates", False):
            clauses.append(f"({sa.KIND.name} IS NULL OR {sa.KIND.name} != 'estimate')")
        if args.play:
            clauses.append(f"PlaylinePlay = {_quoted(args.play)}")
        if args.status:
            clauses.append(f"PlaylineStatus = {_quoted(args.status)}")
    else:
        console.print(
            "[yellow]warning:[/] playline's search attributes are not registered in "
            f"namespace {settings.temporal_namespace}; listing by workflow type only "
            "(register them with `playline setup`)"
        )
        clauses.append("WorkflowType != 'playline.DatasetRun'")
        if args.play:
            clauses.append(f"WorkflowType = {_quoted(args.play)}")
        if args.status:
            clauses.append(f"ExecutionStatus = {_quoted(_EXECUTION.get(args.status, 'Running'))}")
    if args.query:
        clauses.append(f"({args.query})")
    query = " AND ".join(clauses)
    rows = []
    try:
        async for execution in client.list_workflows(query, limit=max(1, args.limit)):
            rows.append(_row(execution, settings))
    except RPCError as err:
        raise PlaylineError(f"cannot list runs ({query}): {err.message}") from None
    if args.json:
        print_json({"query": query, "runs": rows})
        return 0
    if not rows:
        out().print(f"no runs match {query}")
        return 0
    header = ("ID", "PLAY", "STATUS", "ROWS", "FAILED", "CREDITS", "STARTED")
    lines = [header]
    for row in rows:
        done, total = row["rows_done"], row["rows_total"]
        lines.append(
            (
                row["workflow_id"],
                row["play"],
                row["status"],
                f"{done}/{total}" if total is not None else "-",
                str(row["rows_failed"]) if row["rows_failed"] is not None else "-",
                f"{row['credits']:g}" if row["credits"] is not None else "-",
                row["started"] or "-",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        text = "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        out().print(text.rstrip(), highlight=False, markup=False)
    return 0


#: PlaylineStatus to Temporal's ExecutionStatus, when the attributes are not registered.
_EXECUTION = {
    "running": "Running",
    "paused": "Running",
    "waiting": "Running",
    "cancelling": "Running",
    "completed": "Completed",
    "failed": "Failed",
    "cancelled": "Canceled",
}
_CLOSED_BY_TEMPORAL = {
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.TIMED_OUT: "timed out",
    WorkflowExecutionStatus.CONTINUED_AS_NEW: "continued as new",
}


def _row(execution: WorkflowExecution, settings: Settings) -> dict[str, Any]:
    attrs = execution.typed_search_attributes
    status = attrs.get(sa.STATUS) or _status(execution.status).lower()
    if execution.status in _CLOSED_BY_TEMPORAL:  # ended without a chance to say so
        status = _CLOSED_BY_TEMPORAL[execution.status]
    started: datetime | None = execution.start_time
    return {
        "workflow_id": execution.id,
        "run_id": execution.run_id,
        "play": attrs.get(sa.PLAY) or execution.workflow_type,
        "status": status,
        "rows_total": attrs.get(sa.ROWS_TOTAL),
        "rows_done": attrs.get(sa.ROWS_DONE),
        "rows_failed": attrs.get(sa.ROWS_FAILED),
        "credits": attrs.get(sa.CREDITS),
        "started": started.strftime("%Y-%m-%d %H:%M:%S UTC") if started else None,
        "ui_url": ui_url(settings, execution.id, execution.run_id),
    }


def _attributes(desc: WorkflowExecutionDescription) -> dict[str, Any]:
    attrs = desc.typed_search_attributes
    return {key.name: attrs.get(key) for key in sa.ALL_KEYS if attrs.get(key) is not None}


#: the ends a run's JSON document reports with its result or its failure
_SETTLED = (
    WorkflowExecutionStatus.COMPLETED,
    WorkflowExecutionStatus.FAILED,
    WorkflowExecutionStatus.CANCELED,
)


def _document(
    args: argparse.Namespace,
    desc: WorkflowExecutionDescription,
    settings: Settings,
    **fields: Any,
) -> RunDocument:
    """The JSON document of run ``args.id``: its ids, play and UI link, and ``fields``."""
    return RunDocument(
        workflow_id=args.id,
        run_id=desc.run_id,
        play=desc.workflow_type,
        ui_url=ui_url(settings, args.id, desc.run_id),
        **fields,
    )


async def _settled(
    document: RunDocument, handle: WorkflowHandle[Any, PlayRunResult]
) -> RunDocument:
    """``document`` with the play's result, or its failure when it failed or was
    cancelled; waits for a play still running."""
    try:
        return document.completed(await handle.result())
    except WorkflowFailureError as err:
        return document.failed(err)


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


async def _state(handle: WorkflowHandle[Any, Any]) -> PlayState | None:
    """The play's ``state`` query, if a worker answers it."""
    with contextlib.suppress(RPCError):
        state: PlayState = await handle.query(
            "state", result_type=PlayState, rpc_timeout=QUERY_TIMEOUT
        )
        return state
    return None


def _status(status: WorkflowExecutionStatus | None) -> str:
    return status.name if status else "UNKNOWN"
