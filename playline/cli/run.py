"""``playline run`` and ``playline runs get|export|stop``: start, follow and inspect plays."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.service import RPCError

from playline.cli.render import console, out, print_summary, progress, ui_url
from playline.config import Settings
from playline.contract import PlayRunResult, PlayState, RunOptions
from playline.errors import PlaylineError
from playline.services import Services
from playline.stores.export import export_run
from playline.worker import connect


def run_options(args: argparse.Namespace) -> RunOptions:
    """The ``RunOptions`` the run flags describe."""
    fields: dict[str, Any] = {}
    if getattr(args, "fixtures", None):
        fields["integration_mode"] = "fixture"
        fields["fixtures"] = [str(Path(f).resolve()) for f in args.fixtures]
        fields["enforce_fixture_pacing"] = bool(args.enforce_pacing)
    if getattr(args, "chunk_size", None):
        fields["chunk_size"] = args.chunk_size
    return RunOptions(**fields)


def play_input(args: argparse.Namespace) -> dict[str, Any]:
    """The play input from ``--input`` (JSON) and ``--csv`` (as ``csv_path``)."""
    try:
        data = json.loads(args.input) if args.input else {}
    except json.JSONDecodeError as err:
        raise PlaylineError(f"--input is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise PlaylineError("--input must be a JSON object")
    if args.csv:
        path = Path(args.csv)
        if not path.exists():
            raise PlaylineError(f"--csv {path}: no such file")
        data["csv_path"] = str(path.resolve())
    return data


async def export_result(result: PlayRunResult, path: str, settings: Settings) -> int:
    """Export the play's last dataset run from the sheet store to ``path``."""
    if not result.datasets:
        raise PlaylineError(f"play {result.play} produced no dataset to export")
    services = await Services.open(settings)
    try:
        return await export_run(services.sheet, result.datasets[-1].run_ref, path)
    finally:
        await services.close()


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
) -> PlayRunResult:
    """Start a play, follow it (optionally with a progress bar), print its summary."""
    workflow_id = workflow_id or f"{play}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    handle = await client.start_workflow(
        play,
        args=[input, options],
        id=workflow_id,
        task_queue=task_queue,
        result_type=PlayRunResult,
    )
    console.print(f"started {play} as {workflow_id}")
    console.print(f"  Temporal UI: {ui_url(settings, workflow_id, handle.result_run_id)}")
    watcher = asyncio.ensure_future(progress(client, handle, play)) if watch else None
    try:
        result: PlayRunResult = await handle.result()
    finally:
        if watcher is not None:
            await asyncio.sleep(0.4)
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
    print_summary(result, settings, workflow_id, handle.result_run_id)
    if out_path:
        count = await export_result(result, out_path, settings)
        out().print(f"  wrote {count} rows to {out_path}")
    return result


async def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    client = await connect(settings=settings)
    await execute(
        client,
        settings,
        play=args.play,
        input=play_input(args),
        options=run_options(args),
        task_queue=args.task_queue,
        workflow_id=args.id,
        watch=args.watch,
        out_path=args.out,
    )
    return 0


async def cmd_runs(args: argparse.Namespace, settings: Settings) -> int:
    client = await connect(settings=settings)
    handle = client.get_workflow_handle(args.id, result_type=PlayRunResult)
    if args.runs_command == "stop":
        await handle.cancel()
        out().print(f"cancellation requested for {args.id}")
        return 0
    desc = await handle.describe()
    if args.runs_command == "get":
        out().print(f"{args.id}: {desc.workflow_type} {desc.status.name if desc.status else '?'}")
        with contextlib.suppress(RPCError):
            state = await handle.query("state", result_type=PlayState)
            out().print_json(state.model_dump_json())
        if desc.status and desc.status.name == "COMPLETED":
            result = await handle.result()
            print_summary(result, settings, args.id, desc.run_id)
        return 0
    result = await handle.result()
    count = await export_result(result, args.out, settings)
    out().print(f"wrote {count} rows to {args.out}")
    return 0
