"""``playline run``: start a play, follow it, print its summary (or ``--json``), export it.

Every way a run can go wrong ends in one line: a play no worker knows is
terminated within seconds with the plays that do exist; a duplicate id names the
existing run; a Temporal restart while following a play is ridden out for
``--reconnect-timeout`` seconds, and giving up says the play may still be running
and how to follow it; a failed play prints its root cause.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import re
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import (
    Client,
    WorkflowFailureError,
    WorkflowHandle,
)
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from playline.cli.audit import read_audit
from playline.cli.render import (
    RunDocument,
    console,
    out,
    print_json,
    print_summary,
    progress,
    ui_url,
)
from playline.cli.spend import store_spend
from playline.config import Settings
from playline.contract import PlayRunResult, RunOptions
from playline.datasets import export_run, store_source, upload_csv
from playline.errors import PlaylineError, format_validation_errors
from playline.stores.backends import open_stores
from playline.worker import connect
from playline.workflows.priority import temporal_priority
from playline.workflows.status import play_static

#: The SDK's message when a worker is asked to run a workflow type it lacks.
NOT_REGISTERED = "is not registered on this worker"
#: Failed workflow-task attempts of "not registered" before the run is ended: a fleet
#: whose workers disagree gets a few chances to hand the task to one that knows it.
NOT_REGISTERED_ATTEMPTS = 3
#: How long to watch a new run for the above; once a worker has run it, it is known.
WATCH_START_S = 60.0
#: Warn once when nothing polls the task queue this long after the start.
NO_WORKER_WARNING_S = 5.0
#: Statuses that no amount of waiting changes; any other RPC error while following a
#: play is treated as Temporal being away (a restart shows up under several codes).
PERMANENT = {
    RPCStatusCode.NOT_FOUND,
    RPCStatusCode.INVALID_ARGUMENT,
    RPCStatusCode.PERMISSION_DENIED,
    RPCStatusCode.UNAUTHENTICATED,
    RPCStatusCode.UNIMPLEMENTED,
}


def run_options(args: argparse.Namespace) -> RunOptions:
    """The ``RunOptions`` the run flags describe; invalid values are one clear line."""
    fields: dict[str, Any] = {}
    if getattr(args, "fixtures", None):
        fields["integration_mode"] = "fixture"
        fields["fixtures"] = [str(Path(f).resolve()) for f in args.fixtures]
        fields["enforce_fixture_pacing"] = bool(args.enforce_pacing)
    if getattr(args, "chunk_size", None) is not None:
        fields["chunk_size"] = args.chunk_size
    if getattr(args, "retry_ambiguous", False):
        fields["retry_ambiguous"] = True
    fields.update(budget_options(args))
    fields.update(priority_options(args))
    try:
        return RunOptions(**fields)
    except ValidationError as err:
        problems = format_validation_errors(err.errors())
        raise PlaylineError(f"invalid run options: {problems.replace('_', '-')}") from None


#: ``--fairness-key``'s values: ``RunOptions.fairness_key``'s pattern.
_FAIRNESS_KEY = re.compile(r"^[A-Za-z0-9_.:@/-]{1,128}$")
#: The priority classes, first to last (``RunOptions.priority``).
PRIORITIES = range(1, 6)
#: The largest ``--weight`` (Temporal clamps fairness weights to it as well).
MAX_WEIGHT = 1000.0


def add_priority_flags(p: argparse.ArgumentParser) -> None:
    """``--fairness-key``, ``--weight`` and ``--priority`` (run, demo, schedule create).

    Read as text and checked by :func:`priority_options`, so a bad value is one line
    naming the flag, not argparse's usage block.
    """
    p.add_argument(
        "--fairness-key",
        metavar="KEY",
        help="who the run's provider calls and Temporal tasks count for when plays share "
        "them (a team, a customer): runs of one key share one fair share "
        "(default: the run itself)",
    )
    p.add_argument(
        "--weight",
        metavar="W",
        help="the key's weight: a weight-2 key gets twice the share of a weight-1 key "
        f"(above 0, at most {MAX_WEIGHT:g}; default 1)",
    )
    p.add_argument(
        "--priority",
        metavar="1..5",
        help="priority class, 1 first to 5 last (default 3): lower classes are served first",
    )


def priority_options(args: argparse.Namespace) -> dict[str, Any]:
    """The fairness flags as ``RunOptions`` fields; a bad value is one ``PlaylineError``."""
    fields: dict[str, Any] = {}
    key = getattr(args, "fairness_key", None)
    if key is not None:
        if not _FAIRNESS_KEY.match(key):
            raise PlaylineError(
                f"--fairness-key {key!r}: use 1 to 128 letters, digits and _ . : @ / -"
            )
        fields["fairness_key"] = key
    weight = getattr(args, "weight", None)
    if weight is not None:
        try:
            value = float(weight)
        except ValueError:
            value = math.nan
        if not 0 < value <= MAX_WEIGHT:  # NaN and infinities fail here too
            raise PlaylineError(
                f"--weight must be a number above 0 and at most {MAX_WEIGHT:g}, not {weight!r}"
            )
        fields["fairness_weight"] = value
    priority = getattr(args, "priority", None)
    if priority is not None:
        try:
            value_class: int | None = int(str(priority).strip())
        except ValueError:
            value_class = None
        if value_class not in PRIORITIES:
            raise PlaylineError(f"--priority must be 1 (first) to 5 (last), not {priority!r}")
        fields["priority"] = value_class
    return fields


def budget_options(args: argparse.Namespace) -> dict[str, Any]:
    """The budget flags as ``RunOptions`` fields (``--max-credits-for acme=50``)."""
    fields: dict[str, Any] = {}
    if getattr(args, "max_credits", None) is not None:
        fields["max_credits"] = args.max_credits
    caps: dict[str, float] = {}
    for given in getattr(args, "max_credits_for", None) or []:
        provider, sep, amount = given.partition("=")
        try:
            caps[provider.strip()] = float(amount)
        except ValueError:
            sep = ""
        if not sep or not provider.strip():
            raise PlaylineError(f"--max-credits-for wants PROVIDER=N, not {given!r}")
    if caps:
        fields["max_credits_by_provider"] = caps
    if getattr(args, "budget", None):
        fields["budget"] = args.budget
    if getattr(args, "on_budget", None):
        fields["on_budget"] = args.on_budget
    return fields


def play_input(args: argparse.Namespace) -> dict[str, Any]:
    """The play input from ``--input`` (JSON); ``--csv`` is checked here, uploaded later."""
    try:
        data = json.loads(args.input) if args.input else {}
    except json.JSONDecodeError as err:
        raise PlaylineError(f"--input is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise PlaylineError("--input must be a JSON object")
    if args.csv and not Path(args.csv).is_file():
        raise PlaylineError(f"--csv {args.csv}: no such file")
    return data


async def upload_input_csv(path: str, settings: Settings) -> str:
    """Stream a local CSV into the workers' store; the ``store:`` reference a play reads.

    The workers need not see this machine's disk: they read the rows from the store
    (SQLite under ``PLAYLINE_HOME`` on one machine, PostgreSQL for a fleet). Uploading
    is a write the user asked for, so it may create the store (a play can be started
    before any worker has opened it); reading results back never creates one.
    """
    async with await open_stores(settings, create=True) as stores:
        ref = await upload_csv(stores.sheet, path)
    console.print(f"uploaded {ref.count} rows of {path} to the store as {ref.id}")
    return store_source(ref.id)


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


async def export_result(
    result: PlayRunResult,
    path: str,
    settings: Settings,
    *,
    raw: bool = False,
    provenance: bool = False,
) -> int:
    """Stream the play's last dataset run from the workers' store to a local ``path``
    (spreadsheet formulas made inert unless ``raw``; each computed cell's source,
    cost and miss reason added with ``provenance``)."""
    if not result.datasets:
        raise PlaylineError(f"play {result.play} produced no dataset to export")
    async with await open_stores(settings, create=False) as stores:
        return await export_run(
            stores.sheet,
            result.datasets[-1].run_ref,
            path,
            export_format(path),
            raw=raw,
            provenance=provenance,
        )


async def refuse_unknown_play(
    client: Client, handle: WorkflowHandle[Any, Any], play: str, task_queue: str
) -> None:
    """Return once a worker ran the play's first task; end the run if none knows the play.

    Temporal retries a workflow task that failed because no worker registered its
    type forever; the user would wait forever. This ends the run after
    ``NOT_REGISTERED_ATTEMPTS`` such attempts and raises a ``PlaylineError``
    naming the plays the workers do know. It also warns (once) when no worker
    polls the task queue at all.
    """
    started = time.monotonic()
    warned = False
    while time.monotonic() - started < WATCH_START_S:
        not_registered: str | None = None
        # The whole (short) history at once: an abandoned history iterator leaves an RPC
        # behind that can crash the interpreter as it exits.
        history = await handle.fetch_history()
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                return
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                message = event.workflow_task_failed_event_attributes.failure.message
                if NOT_REGISTERED in message:
                    not_registered = message
        if not_registered is not None:
            desc = await handle.describe()
            pending = desc.raw_description.pending_workflow_task
            if pending.attempt >= NOT_REGISTERED_ATTEMPTS:
                known = _registered_plays(not_registered)
                await handle.terminate(reason=f"no worker on task queue {task_queue} has {play}")
                raise PlaylineError(
                    f"no worker on task queue {task_queue!r} has play {play!r}; the workers "
                    f"there have: {', '.join(known) or 'no plays'}. Start a worker that "
                    "imports the play's module (playline worker --plays MODULE); the run "
                    f"{handle.id} was terminated"
                )
        elif not warned and time.monotonic() - started > NO_WORKER_WARNING_S:
            if not await _has_pollers(client, task_queue):
                console.print(
                    f"[yellow]warning:[/] no worker is polling task queue {task_queue!r} yet; "
                    "the play starts when one does (playline worker --task-queue "
                    f"{task_queue})"
                )
            warned = True
        await asyncio.sleep(0.5)


def _registered_plays(message: str) -> list[str]:
    """The workflow types a worker listed, without playline's own."""
    _, _, listed = message.partition("available workflows:")
    names = [n.strip() for n in listed.split(",") if n.strip()]
    return [n for n in names if not n.startswith("playline.")]


async def _has_pollers(client: Client, task_queue: str) -> bool:
    response = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    return bool(response.pollers)


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
    client: Client,
    settings: Settings,
    *,
    play: str,
    input: dict[str, Any],
    options: RunOptions,
    task_queue: str,
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
    workflow_id = workflow_id or f"{play}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    summary, details = play_static(play, input, options)
    try:
        handle = await client.start_workflow(
            play,
            args=[input, options],
            id=workflow_id,
            task_queue=task_queue,
            result_type=PlayRunResult,
            static_summary=summary,
            static_details=details,
            # An id names one run: `runs get|export ID` must not become ambiguous.
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            # The key the play names its dataset runs and chunks by (this id if unset).
            priority=temporal_priority(options, workflow_id),
        )
    except WorkflowAlreadyStartedError:
        raise PlaylineError(
            f"a run with id {workflow_id!r} already exists (running or finished); choose "
            f"another --id, or look at it with `playline runs get {workflow_id}`"
        ) from None
    console.print(f"started {play} as {workflow_id}")
    console.print(f"  Temporal UI: {ui_url(settings, workflow_id, handle.result_run_id)}")
    await refuse_unknown_play(client, handle, play, task_queue)
    watcher = asyncio.ensure_future(progress(client, handle, play)) if watch else None
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
        if watcher is not None:
            await asyncio.sleep(0.4)
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
    document = document.completed(result)
    document.spend = await store_spend(settings, [d.run_ref for d in result.datasets])
    report = await read_audit(handle, await handle.describe(), settings)
    document.audit = report.as_dict() if report is not None else None
    if not json_out:
        print_summary(result, settings, workflow_id, handle.result_run_id, document.spend)
        for line in report.lines() if report is not None else []:
            out().print(f"  {line}", markup=False, highlight=False)
    if out_path:
        count = await export_result(result, out_path, settings, raw=raw, provenance=provenance)
        document.exported = {"path": out_path, "rows": count}
        if not json_out:
            out().print(f"  wrote {count} rows to {out_path}")
    if json_out:
        print_json(document)
    return result


async def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    options = run_options(args)
    input = play_input(args)
    client = await connect(settings=settings)
    if args.csv:
        input["csv_path"] = await upload_input_csv(args.csv, settings)
    if getattr(args, "confirm_over", None) is not None and not args.yes:
        from playline.cli.estimate import estimate, refusal, within  # it builds on this one

        found = await estimate(
            client,
            settings,
            play=args.play,
            input=input,
            options=options,
            task_queue=args.task_queue,
            quiet=True,
        )
        refused = refusal(found, args.confirm_over)
        if refused is not None:
            console.print(refused, markup=False, highlight=False)
            return 2
        console.print(within(found, args.confirm_over), markup=False, highlight=False)
    await execute(
        client,
        settings,
        play=args.play,
        input=input,
        options=options,
        task_queue=args.task_queue,
        workflow_id=args.id,
        watch=args.watch,
        out_path=args.out,
        reconnect_s=args.reconnect_timeout,
        json_out=args.json,
        raw=args.raw,
        # The flag is declared with the run flags; a parser without it exports as before.
        provenance=getattr(args, "provenance", False),
    )
    return 0
