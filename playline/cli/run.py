"""``playline run``: start a play, follow it, print its summary (or ``--json``), export it.

Every way a run can go wrong ends in one line: a play name that is a typo of a
known play, or a ``--csv`` whose header lacks a column the play declares, is refused
before anything is uploaded or started (exit 2), and a play no worker knows is
terminated within seconds with the plays that do exist; a
duplicate id names the existing run; a Temporal restart while following a play is
ridden out for ``--reconnect-timeout`` seconds, and giving up says the play may
still be running and how to follow it; a failed play prints its root cause.

Exit codes (the README's "Exit codes" says the same): 0 the play completed; 1 it
failed, or the command did (bad input, Temporal unreachable, an unknown play ended by
the workers...); 2 refused before anything started (a usage error, ``--confirm-over``,
a mistyped play name, a ``--csv`` without a column the play requires); 3 the play
completed but rows failed, see :func:`rows_failed`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any

from rich.markup import escape
from temporalio.client import (
    WorkflowFailureError,
    WorkflowHandle,
)
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from playline.cli.audit import read_audit
from playline.cli.estimate import estimate, refusal, spend_currency, within
from playline.cli.follow import follow
from playline.cli.input_columns import check_input_columns
from playline.cli.reconcile import read_reconciliation
from playline.cli.render import (
    RunDocument,
    console,
    out,
    print_json,
    print_summary,
    ui_url,
)
from playline.cli.spend import money_cap_line, store_spend
from playline.cli.starting import (
    EXIT_REFUSED,
    Launch,
    check_play_name,
    play_input,
    run_options,
    upload_input_csv,
)
from playline.client import new_workflow_id, play_start_options
from playline.config import Settings
from playline.contract import PlayRunResult
from playline.datasets import export_run
from playline.errors import PlaylineError
from playline.stores.backends import open_stores
from playline.worker import connect

#: Statuses that no amount of waiting changes; any other RPC error while following a
#: play is treated as Temporal being away (a restart shows up under several codes).
PERMANENT = {
    RPCStatusCode.NOT_FOUND,
    RPCStatusCode.INVALID_ARGUMENT,
    RPCStatusCode.PERMISSION_DENIED,
    RPCStatusCode.UNAUTHENTICATED,
    RPCStatusCode.UNIMPLEMENTED,
}


#: The play completed, but no row succeeded (or, with ``--fail-on-row-errors``, a row
#: failed): a cron job must not read it as a success.
EXIT_ROWS_FAILED = 3
#: How much of a row's error the exit line quotes.
ERROR_QUOTED = 200


#: ``--raw``'s help wherever a command exports (run, demo, runs export, runs cancel).
RAW_HELP = (
    "write cells as they are; by default a cell a spreadsheet would run as a formula "
    "(=, +, -, @ first) gets a leading '"
)


#: File endings written as JSON lines; any other ``--out`` is a CSV file.
JSONL_SUFFIXES = (".jsonl", ".ndjson")


def export_format(path: str) -> str:
    """``jsonl`` for a ``.jsonl`` or ``.ndjson`` path, else ``csv``."""
    return "jsonl" if Path(path).suffix.lower() in JSONL_SUFFIXES else "csv"


#: ``--provenance``'s help wherever a command exports (run, demo, runs export, runs cancel).
PROVENANCE_HELP = (
    "add where each computed value came from: after each computed column C, "
    "C__source (tool via provider, paid/reused/shared/waited), C__credits, "
    "C__fetched_at and C__miss (why it is empty)"
)


async def export_dataset_run(
    run_ref: str, path: str, settings: Settings, *, raw: bool = False, provenance: bool = False
) -> int:
    """Stream dataset run ``run_ref`` (a play's last) from the workers' store to a local
    ``path``, in the format its suffix names (spreadsheet formulas made inert unless
    ``raw``; each computed cell's source, cost and miss reason added with
    ``provenance``)."""
    async with await open_stores(settings, create=False) as stores:
        return await export_run(
            stores.sheet, run_ref, path, export_format(path), raw=raw, provenance=provenance
        )


def rows_failed(result: PlayRunResult, workflow_id: str, *, any_row: bool = False) -> str | None:
    """Why a completed play's exit is ``EXIT_ROWS_FAILED``, or ``None`` for 0.

    "No row succeeded" is: at least one row failed and none succeeded, over all the
    play's dataset runs (``stats.rows_ok`` counts rows answered from receipts or
    fresh cells and rows an earlier attempt finished). A play that admitted no rows,
    or whose rows were all skipped for budget (``--on-budget stop``: not failures,
    the summary says so) or not sent because it was cancelled, has nothing failed,
    so it exits 0. With ``any_row`` (``--fail-on-row-errors``) one failed row is
    enough.
    """
    s = result.stats
    if s.rows_failed <= 0 or (s.rows_ok > 0 and not any_row):
        return None
    first = ""
    if s.first_error:
        text = " ".join(s.first_error.split())
        if len(text) > ERROR_QUOTED:
            text = text[: ERROR_QUOTED - 3] + "..."
        first = f"; first error: {text}"
    see = f"; see `playline runs get {workflow_id}`"
    if s.rows_ok == 0:
        return f"no row succeeded ({s.rows_failed} failed{first}){see}"
    done = s.rows_ok + s.rows_failed
    return f"{s.rows_failed} of {done} rows failed (--fail-on-row-errors{first}){see}"


async def wait_for_result(
    handle: WorkflowHandle[Any, PlayRunResult], settings: Settings, reconnect_s: float
) -> PlayRunResult:
    """The play's result, riding out a Temporal restart for up to ``reconnect_s`` seconds."""
    lost_since: float | None = None
    while True:
        try:
            return await handle.result()
        except RPCError as err:
            if err.status in PERMANENT:
                raise
            now = time.monotonic()
            lost_since = lost_since or now
            if now - lost_since > reconnect_s:
                raise PlaylineError(
                    f"lost contact with Temporal at {settings.temporal_address} for "
                    f"{reconnect_s:g}s; the play {handle.id} may still be running: follow it "
                    f"with `playline runs get {handle.id}` or "
                    f"{ui_url(settings, handle.id, None)}"
                ) from None
            if lost_since == now:
                console.print(
                    f"[yellow]lost contact with Temporal ({err.message}); retrying for up to "
                    f"{reconnect_s:g}s[/]"
                )
            await asyncio.sleep(1.0)


async def execute(
    launch: Launch,
    *,
    workflow_id: str | None,
    watch: bool,
    out_path: str | None,
    reconnect_s: float = 60.0,
    json_out: bool = False,
    raw: bool = False,
    provenance: bool = False,
) -> PlayRunResult:
    """Start a play, follow it (optionally with a progress bar), print its summary
    (or, with ``json_out``, one JSON document on stdout: the result or the failure),
    then export it to ``out_path`` (formulas inert unless ``raw``; with each computed
    cell's provenance if ``provenance``)."""
    client, settings, play = launch.client, launch.settings, launch.play
    input, options = launch.input, launch.options
    workflow_id = workflow_id or new_workflow_id(play)
    try:
        handle = await client.start_workflow(
            play,
            args=[input, options],
            id=workflow_id,
            task_queue=launch.task_queue,
            result_type=PlayRunResult,
            # An id names one run: `runs get|export ID` must not become ambiguous.
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            **play_start_options(play, input, options, workflow_id, sheets_url=settings.sheets_url),
        )
    except WorkflowAlreadyStartedError:
        raise PlaylineError(
            f"a run with id {workflow_id!r} already exists (running or finished); choose "
            f"another --id, or look at it with `playline runs get {workflow_id}`"
        ) from None
    await launch.started(handle, workflow_id, "started")
    # Every wait is announced on stderr whatever ``watch`` says; the bar only with it.
    watcher = asyncio.ensure_future(follow(launch.client, handle, console, bar=watch))
    document = RunDocument(
        workflow_id=workflow_id,
        run_id=handle.result_run_id,
        play=play,
        status="RUNNING",
        ui_url=ui_url(settings, workflow_id, handle.result_run_id),
    )
    try:
        result = await wait_for_result(handle, settings, reconnect_s)
    except WorkflowFailureError as err:
        if json_out:
            print_json(document.failed(err))
        raise
    finally:
        if not watcher.done():
            await asyncio.sleep(0.4)  # the bar's last update: the rows all done
        watcher.cancel()
        # Following is a view: whatever ended it must not change how the run ends.
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
    document = document.completed(result)
    document.spend = await store_spend(settings, [d.run_ref for d in result.datasets])
    report = await read_audit(handle, await handle.describe(), settings)
    document.audit = report.as_dict() if report is not None else None
    reconciled = await read_reconciliation(await handle.describe(), settings, document.spend)
    document.reconciliation = reconciled.as_dict() if reconciled is not None else None
    if not json_out:
        print_summary(result, settings, workflow_id, handle.result_run_id, document.spend)
        if options.max_spend is not None and handle.result_run_id is not None:
            capped = await money_cap_line(settings, handle.result_run_id, options.spend_currency)
            if capped is not None:
                out().print(f"  {capped}", markup=False, highlight=False)
        for line in report.lines() if report is not None else []:
            out().print(f"  {line}", markup=False, highlight=False)
        if reconciled is not None and reconciled.balances_read:
            for line in reconciled.lines():
                out().print(f"  {line}", markup=False, highlight=False)
    if out_path:
        if not result.datasets:
            raise PlaylineError(f"play {result.play} produced no dataset to export")
        count = await export_dataset_run(
            result.datasets[-1].run_ref, out_path, settings, raw=raw, provenance=provenance
        )
        document.exported = {"path": out_path, "rows": count}
        if not json_out:
            out().print(f"  wrote {count} rows to {out_path}")
    if json_out:
        print_json(document)
    return result


def show_progress(args: argparse.Namespace) -> bool:
    """A progress line by default on a terminal; never in a pipe, with ``--json`` or
    ``--no-progress``; ``--watch`` asks for it anywhere."""
    if getattr(args, "no_progress", False) or args.json:
        return False
    return bool(args.watch) or console.is_terminal


async def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    options = run_options(args)
    input = play_input(args)
    client = await connect(settings=settings)
    checked = None
    if not getattr(args, "no_play_check", False):
        # Before anything is uploaded or started: a mistyped name leaves nothing behind.
        checked = await check_play_name(client, args.play, args.task_queue)
        if checked.refusal is not None:
            console.print(f"[red]error:[/] {escape(checked.refusal)}", highlight=False)
            return EXIT_REFUSED
        if checked.warning is not None:
            console.print(f"[yellow]warning:[/] {escape(checked.warning)}", highlight=False)
    if args.csv:
        # So is a file without the columns the play requires: its header, read here.
        refused = await check_input_columns(
            client,
            args.play,
            args.task_queue,
            args.csv,
            checked.published if checked else None,
            asked=checked is not None,
        )
        if refused is not None:
            console.print(f"[red]error:[/] {escape(refused)}", highlight=False)
            return EXIT_REFUSED
        input["csv_path"] = await upload_input_csv(args.csv, settings)
    launch = Launch(client, settings, args.play, input, options, args.task_queue)
    found = None
    if getattr(args, "confirm_over", None) is not None and not args.yes:
        found = await estimate(launch, quiet=True)
        refused = refusal(found, args.confirm_over)
        if refused is not None:
            console.print(refused, markup=False, highlight=False)
            return EXIT_REFUSED
        console.print(within(found, args.confirm_over), markup=False, highlight=False)
    if options.max_spend is not None:
        # The providers the run may call, and their prices, are the workers' (the
        # catalog): the estimate says both, before anything is paid for.
        found = found or await estimate(launch, quiet=True)
        currency, refused = spend_currency(found, options.max_spend)
        if refused is not None:
            console.print(f"[red]error:[/] {escape(refused)}", highlight=False)
            return EXIT_REFUSED
        options = options.model_copy(update={"spend_currency": currency})
        launch = dataclasses.replace(launch, options=options)
    workflow_id = args.id or new_workflow_id(args.play)
    result = await execute(
        launch,
        workflow_id=workflow_id,
        watch=show_progress(args),
        out_path=args.out,
        reconnect_s=args.reconnect_timeout,
        json_out=args.json,
        raw=args.raw,
        # The flag is declared with the run flags; a parser without it exports as before.
        provenance=getattr(args, "provenance", False),
    )
    failed = rows_failed(result, workflow_id, any_row=getattr(args, "fail_on_row_errors", False))
    if failed is not None:
        # After the summary (or the JSON document, still printed whole on stdout).
        console.print(f"[red]error:[/] {escape(failed)}", highlight=False)
        return EXIT_ROWS_FAILED
    return 0
