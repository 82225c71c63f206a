"""The ``playline`` command: dev stack, worker, running and inspecting plays.

Errors are rendered here, once: a ``PlaylineError`` or a failed play prints its
message and exits 1; nothing prints a traceback a user did not ask for.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.service import RPCError

from playline.activities.services import Services, Settings
from playline.devserver import DevServer, reachable
from playline.errors import PlaylineError
from playline.workflows.dataset_run import root_cause
from playline.workflows.models import DatasetRunState, PlayRunResult, PlayState, RunOptions

console = Console(stderr=True, soft_wrap=True)
REPO_EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DEMO_KEYS = {"ACME_API_KEY": "local-demo-acme-key", "FIRMO_API_KEY": "local-demo-firmo-key"}


# -- shared helpers -----------------------------------------------------------


def _address(args: argparse.Namespace) -> str:
    return str(args.address or os.environ.get("TEMPORAL_ADDRESS", "localhost:7233"))


def _ui_url(address: str, workflow_id: str, run_id: str | None = None) -> str:
    host = address.rsplit(":", 1)[0]
    if host in ("localhost", "0.0.0.0"):
        host = "127.0.0.1"
    ui = os.environ.get("PLAYLINE_UI_URL", f"http://{host}:8233")
    suffix = f"/{run_id}" if run_id else ""
    return f"{ui}/namespaces/default/workflows/{workflow_id}{suffix}/history"


def _options(args: argparse.Namespace) -> RunOptions:
    fields: dict[str, Any] = {}
    if getattr(args, "fixtures", None):
        fields["integration_mode"] = "fixture"
        fields["fixtures"] = [str(Path(f).resolve()) for f in args.fixtures]
        fields["enforce_fixture_pacing"] = bool(args.enforce_pacing)
    if getattr(args, "chunk_size", None):
        fields["chunk_size"] = args.chunk_size
    return RunOptions(**fields)


def _play_input(args: argparse.Namespace) -> dict[str, Any]:
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


async def _progress(client: Client, handle: WorkflowHandle[Any, Any], play: str) -> None:
    """A progress bar fed by the play's and its dataset run's ``state`` queries."""
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("rows"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task(play, total=None)
        while True:
            try:
                state: PlayState = await handle.query("state", result_type=PlayState)
                done, total = state.rows_done, state.rows_total
                if state.current_child_id:
                    child = client.get_workflow_handle(state.current_child_id)
                    with contextlib.suppress(RPCError):
                        cs: DatasetRunState = await child.query(
                            "state", result_type=DatasetRunState
                        )
                        done = state.rows_done + cs.rows_done
                bar.update(task, completed=done, total=total or None, description=state.phase)
                if state.phase == "completed":
                    return
            except RPCError:
                pass
            await asyncio.sleep(0.3)


def _print_summary(
    result: PlayRunResult, address: str, workflow_id: str, run_id: str | None
) -> None:
    s = result.stats
    out = Console(soft_wrap=True)
    out.print(f"[bold green]play {result.play} completed[/] ({result.integration_mode} mode)")
    out.print(f"  Temporal UI: {_ui_url(address, workflow_id, run_id)}")
    out.print(
        f"  rows: {s.rows_ok} ok, {s.rows_failed} failed, {s.rows_cached} cached "
        f"(no provider call needed)"
    )
    made = "answered from fixtures" if result.integration_mode == "fixture" else "made"
    out.print(
        f"  provider calls: {s.calls_made} {made}, {s.calls_cached} receipt hits, "
        f"{s.calls_shared} shared in-run, {s.retries} retries"
    )
    out.print(f"  credits spent: {s.credits:g}")
    if s.first_error:
        out.print(f"  first row error: {s.first_error}")


async def _export(result: PlayRunResult, out: str, settings: Settings) -> int:
    if not result.datasets:
        raise PlaylineError(f"play {result.play} produced no dataset to export")
    from playline.activities.datasets import export_run
    from playline.activities.services import ServicesHolder

    services = await Services.open(settings)
    try:
        return await export_run(ServicesHolder(services), result.datasets[-1].run_ref, out)
    finally:
        await services.close()


async def _execute(
    client: Client,
    *,
    address: str,
    play: str,
    play_input: dict[str, Any],
    options: RunOptions,
    task_queue: str,
    workflow_id: str | None,
    watch: bool,
    out: str | None,
    settings: Settings,
) -> PlayRunResult:
    workflow_id = workflow_id or f"{play}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    handle = await client.start_workflow(
        play,
        args=[play_input, options],
        id=workflow_id,
        task_queue=task_queue,
        result_type=PlayRunResult,
    )
    console.print(f"started {play} as {workflow_id}")
    console.print(f"  Temporal UI: {_ui_url(address, workflow_id, handle.result_run_id)}")
    watcher = asyncio.ensure_future(_progress(client, handle, play)) if watch else None
    try:
        result: PlayRunResult = await handle.result()
    finally:
        if watcher is not None:
            await asyncio.sleep(0.4)
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
    _print_summary(result, address, workflow_id, handle.result_run_id)
    if out:
        count = await _export(result, out, settings)
        Console().print(f"  wrote {count} rows to {out}")
    return result


# -- commands -----------------------------------------------------------------


async def cmd_run(args: argparse.Namespace) -> int:
    from playline.worker import connect

    address = _address(args)
    client = await connect(address)
    await _execute(
        client,
        address=address,
        play=args.play,
        play_input=_play_input(args),
        options=_options(args),
        task_queue=args.task_queue,
        workflow_id=args.id,
        watch=args.watch,
        out=args.out,
        settings=Settings(),
    )
    return 0


async def cmd_worker(args: argparse.Namespace) -> int:
    from playline.worker import run_worker

    settings = Settings(home=Path(args.home)) if args.home else Settings()
    console.print(f"playline worker on {_address(args)}, task queue {args.task_queue}")
    await run_worker(
        address=_address(args),
        task_queue=args.task_queue,
        plays=args.plays,
        settings=settings,
        metrics_port=args.metrics_port,
    )
    return 0


@contextlib.asynccontextmanager
async def _local_stack(
    args: argparse.Namespace, *, need_server: bool
) -> AsyncIterator[tuple[str, Any]]:
    """Temporal (reused if reachable, else embedded) + provider server + a worker."""
    from playline.provider_server.process import ProviderServerProcess
    from playline.worker import build_worker, connect, import_plays

    settings = Settings()
    address = _address(args)
    dev: DevServer | None = None
    if not await reachable(address):
        if not need_server:
            raise PlaylineError(f"no Temporal server at {address}; start one with `playline dev`")
        port = address.rpartition(":")[2]
        dev = DevServer(home=settings.home, host="127.0.0.1", port=int(port or 7233))
        console.print(f"starting the Temporal dev server on {dev.address} (UI {dev.ui_url})")
        await dev.start()
        address = dev.address
    for key, value in DEMO_KEYS.items():
        os.environ.setdefault(key, value)
    provider: ProviderServerProcess | None = None
    if not os.environ.get("PLAYLINE_PROVIDER_URL"):
        provider = ProviderServerProcess(port=args.provider_port).start()
        os.environ["PLAYLINE_PROVIDER_URL"] = provider.base_url
        console.print(f"local provider server on {provider.base_url}")
    try:
        import_plays(getattr(args, "plays", []) or [])
        worker_client = await connect(address, settings=settings)
        async with build_worker(worker_client, task_queue=args.task_queue):
            yield address, provider
    finally:
        if provider is not None:
            provider.stop()
            os.environ.pop("PLAYLINE_PROVIDER_URL", None)
        if dev is not None:
            dev.stop()
            console.print(
                f"stopped the embedded Temporal server; its history is kept in "
                f"{dev.home / 'temporal.db'}: run `playline dev` to browse it in the UI"
            )


async def cmd_demo(args: argparse.Namespace) -> int:
    from playline.worker import connect

    csv_path = Path(args.csv) if args.csv else REPO_EXAMPLES / "leads.csv"
    async with _local_stack(args, need_server=True) as (address, provider):
        client = await connect(address)
        started = time.monotonic()
        result = await _execute(
            client,
            address=address,
            play="enrich_leads",
            play_input={"csv_path": str(csv_path.resolve())},
            options=_options(args),
            task_queue=args.task_queue,
            workflow_id=None,
            watch=True,
            out=args.out,
            settings=Settings(),
        )
        elapsed = time.monotonic() - started
        rows = result.stats.rows_ok + result.stats.rows_failed
        Console().print(f"  {rows} rows in {elapsed:.1f}s ({rows / elapsed:.0f} rows/s)")
        if provider is not None:
            ledger = provider.ledger()
            Console().print(
                f"  provider ledger: {ledger['charged']} calls charged, "
                f"{ledger['double_charged']} charged twice"
            )
    return 0


async def cmd_dev(args: argparse.Namespace) -> int:
    async with _local_stack(args, need_server=True) as (address, _):
        console.print(
            f"playline dev is up: Temporal {address}, UI http://127.0.0.1:8233, "
            f"worker on task queue {args.task_queue}. Ctrl-C stops it."
        )
        await asyncio.Event().wait()
    return 0


async def cmd_runs(args: argparse.Namespace) -> int:
    from playline.worker import connect

    client = await connect(_address(args))
    handle = client.get_workflow_handle(args.id, result_type=PlayRunResult)
    if args.runs_command == "stop":
        await handle.cancel()
        Console().print(f"cancellation requested for {args.id}")
        return 0
    desc = await handle.describe()
    if args.runs_command == "get":
        Console().print(
            f"{args.id}: {desc.workflow_type} {desc.status.name if desc.status else '?'}"
        )
        with contextlib.suppress(RPCError):
            state = await handle.query("state", result_type=PlayState)
            Console().print_json(state.model_dump_json())
        if desc.status and desc.status.name == "COMPLETED":
            result = await handle.result()
            _print_summary(result, _address(args), args.id, desc.run_id)
        return 0
    result = await handle.result()
    count = await _export(result, args.out, Settings())
    Console().print(f"wrote {count} rows to {args.out}")
    return 0


def cmd_provider_server(argv: Sequence[str]) -> int:
    from playline.provider_server.__main__ import main as provider_main

    return provider_main(list(argv))


# -- parser -------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from playline.limits_cli import add_limits_parser

    parser = argparse.ArgumentParser(
        prog="playline", description="Durable data-enrichment plays on Temporal."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--address", help="Temporal frontend (default $TEMPORAL_ADDRESS or localhost:7233)"
        )
        p.add_argument("--task-queue", default="playline", help="task queue (default playline)")

    def run_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--out", help="write the result rows to this CSV file")
        p.add_argument(
            "--fixtures", nargs="+", help="fixture mode: answer tools from these JSONL files"
        )
        p.add_argument(
            "--enforce-pacing", action="store_true", help="pace fixture calls as if live"
        )
        p.add_argument("--chunk-size", type=int, help="rows per chunk activity (default 25)")

    demo = sub.add_parser("demo", help="run enrich_leads over examples/leads.csv end to end")
    common(demo)
    run_flags(demo)
    demo.add_argument("--csv", help="leads CSV (default examples/leads.csv)")
    demo.add_argument("--provider-port", type=int, default=0, help="local provider server port")
    demo.set_defaults(out="enriched.csv")

    dev = sub.add_parser("dev", help="Temporal dev server + UI, local provider server and a worker")
    common(dev)
    dev.add_argument("--plays", nargs="*", default=[], help="modules declaring plays")
    dev.add_argument("--provider-port", type=int, default=8787, help="local provider server port")

    worker = sub.add_parser("worker", help="run a worker")
    common(worker)
    worker.add_argument("--plays", nargs="*", default=[], help="modules declaring plays")
    worker.add_argument("--home", help="state directory (default $PLAYLINE_HOME or .playline)")
    worker.add_argument(
        "--metrics-port", type=int, help="serve Prometheus metrics on 127.0.0.1:PORT/metrics"
    )

    run = sub.add_parser("run", help="start a play and wait for it")
    common(run)
    run_flags(run)
    run.add_argument("play", help="play name (its workflow type)")
    run.add_argument("--csv", help="CSV file, passed as the input's csv_path")
    run.add_argument("--input", help="play input as a JSON object")
    run.add_argument("--id", help="workflow id (default PLAY-timestamp-random)")
    run.add_argument("--watch", action="store_true", help="show a progress bar")

    runs = sub.add_parser("runs", help="inspect, export or stop a run")
    runs_sub = runs.add_subparsers(dest="runs_command", required=True)
    for name, text in (("get", "status and summary"), ("export", "write rows"), ("stop", "cancel")):
        p = runs_sub.add_parser(name, help=text)
        common(p)
        p.add_argument("id", help="workflow id")
        if name == "export":
            p.add_argument("--out", required=True, help="CSV file to write")

    sub.add_parser("provider-server", help="run the local provider server", add_help=False)
    add_limits_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "provider-server":
        return cmd_provider_server(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    commands = {
        "demo": cmd_demo,
        "dev": cmd_dev,
        "worker": cmd_worker,
        "run": cmd_run,
        "runs": cmd_runs,
    }
    try:
        if args.command == "limits":
            from playline.limits_cli import run_limits

            return run_limits(args)
        return asyncio.run(commands[args.command](args))
    except KeyboardInterrupt:
        return 130
    except PlaylineError as err:
        console.print(f"[red]error:[/] {err}")
        return 1
    except WorkflowFailureError as err:
        console.print(
            f"[red]play failed:[/] {getattr(root_cause(err), 'message', root_cause(err))}"
        )
        return 1
    except RPCError as err:
        console.print(f"[red]Temporal error:[/] {err.message}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
