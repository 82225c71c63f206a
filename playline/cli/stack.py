"""``playline demo``, ``playline dev`` and ``playline worker``: the processes that do the work.

``demo`` and ``dev`` bring up the embedded stack in one process: a Temporal dev
server (reused when one answers at the configured address), the local provider
server and a worker. ``worker`` runs a worker against an existing Temporal.

The embedded stack serves the user who started it, on their machine, so when
``PLAYLINE_DATA_DIRS`` is unset its worker may read files under the current
directory (and says so); a ``worker`` reads only what ``PLAYLINE_DATA_DIRS`` names.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from playline.cli.devserver import DevServer, port_open, reachable
from playline.cli.render import console, out
from playline.cli.run import execute
from playline.cli.stack_record import StackRecord, stop_process
from playline.cli.starting import Launch, run_options, upload_input_csv
from playline.cli.ui import sheet_view_running
from playline.config import Settings
from playline.demo import LEADS_CSV
from playline.errors import PlaylineError
from playline.provider_server.process import ProviderServerProcess
from playline.services import Services
from playline.worker import build_worker, connect, import_plays, run_worker

T = TypeVar("T")

#: Keys the local provider server accepts; used only when the environment has none.
DEMO_KEYS = {
    "ACME_API_KEY": "local-demo-acme-key",
    "FIRMO_API_KEY": "local-demo-firmo-key",
    "MAILFOX_API_KEY": "local-demo-mailfox-key",
    "PROSPECTR_API_KEY": "local-demo-prospectr-key",
    "VERIFLY_API_KEY": "local-demo-verifly-key",
}


#: Signals that stop a stack as Ctrl-C does: its servers are stopped, nothing is left.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(PlaylineError):
    """The stack was asked to stop (SIGTERM, SIGHUP)."""


@dataclass
class LocalStack:
    """What ``local_stack`` brought up: settings pointing at it, the fake provider, the
    worker, the task queue it listens on, and the stop signal's event."""

    settings: Settings
    provider: ProviderServerProcess | None
    worker: asyncio.Task[None]
    task_queue: str
    stop: asyncio.Event

    async def while_worker_runs(self, work: Awaitable[T]) -> T:
        """Await ``work``; if the worker dies first, or a stop signal comes, stop
        waiting and say why."""
        job = asyncio.ensure_future(work)
        stopping = asyncio.ensure_future(self.stop.wait())
        try:
            done, _ = await asyncio.wait(
                {job, self.worker, stopping}, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopping.cancel()
        if job in done:
            return job.result()
        job.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await job
        if self.stop.is_set():
            raise Stopped("stopped by a signal")
        raise PlaylineError(f"the worker stopped: {_why(self.worker)}")


def _why(task: asyncio.Task[None]) -> str:
    if task.cancelled():
        return "it was cancelled"
    err = task.exception()
    return "it exited" if err is None else f"{type(err).__name__}: {err}"


def stop_left_behind(home: Path) -> None:
    """Stop, naming them, the servers an earlier ``playline dev`` in ``home`` started and
    could not stop (it was killed): they are not reused as if they were anyone's."""
    record = StackRecord.read(home)
    if record is None:
        return
    for what, pid in record.left_behind():
        console.print(
            f"[yellow]a {what} (pid {pid}) left running by an earlier `playline dev` "
            f"(pid {record.pid}, gone) in {home}; stopping it[/]"
        )
        stop_process(pid)
    # Asked again: what was stopped above is no longer left behind, and a record that
    # names nothing alive any more is removed (one that still does is kept, to be named).
    if not record.left_behind() and record.pid != os.getpid():
        StackRecord.remove(home, record.pid)


def stack_task_queue(args: argparse.Namespace, kind: str, *, shared: bool) -> str:
    """The task queue a stack's worker listens on: the one given (``--task-queue``,
    ``$PLAYLINE_TASK_QUEUE``); else the demo's own, so no other worker on the same
    Temporal takes its tasks; else (``dev``) ``playline`` on a Temporal of its own, and a
    queue named after its home when it shares one with other stacks."""
    if getattr(args, "task_queue_given", True):
        return str(args.task_queue)
    if kind == "demo":
        return f"playline-demo-{uuid.uuid4().hex[:8]}"
    if not shared:
        return str(args.task_queue)
    digest = hashlib.sha256(str(Path.cwd().resolve()).encode()).hexdigest()[:8]
    return f"playline-dev-{digest}"


@contextlib.asynccontextmanager
async def local_stack(
    args: argparse.Namespace, settings: Settings, kind: str = "dev"
) -> AsyncIterator[LocalStack]:
    """Temporal (reused if reachable, and said so; else embedded) + provider server + a
    worker, on a task queue of its own unless one is given (:func:`stack_task_queue`).

    The worker's services (catalog, stores, governor) are opened before anything
    polls, so a bad catalog or an unreachable store fails here in one line. SIGTERM and
    SIGHUP stop it as Ctrl-C does; a ``dev`` records itself in its home
    (:mod:`~playline.cli.stack_record`) while it runs.
    """
    dev: DevServer | None = None
    provider: ProviderServerProcess | None = None
    services: Services | None = None
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        import_plays(getattr(args, "plays", []) or [])
        stop_left_behind(settings.home)
        if await reachable(settings.temporal_address):
            console.print(
                f"reusing the Temporal server already running at {settings.temporal_address} "
                "(this command did not start it and leaves it running)"
            )
        else:
            port = settings.temporal_address.rpartition(":")[2]
            dev = DevServer(
                home=settings.home, host="127.0.0.1", port=int(port or 7233), ui_port=args.ui_port
            )
            console.print(f"starting the Temporal dev server on {dev.address} (UI {dev.ui_url})")
            await dev.start()
            settings = settings.with_overrides(
                temporal_address=dev.address, ui_url=settings.ui_url or dev.ui_url
            )
        task_queue = stack_task_queue(args, kind, shared=dev is None)
        keys = {k: v for k, v in DEMO_KEYS.items() if not settings.environ.get(k)}
        if not settings.environ.get("PLAYLINE_PROVIDER_URL"):
            provider_port: int = args.provider_port
            if provider_port and port_open("127.0.0.1", provider_port):
                console.print(
                    f"port {provider_port} is taken (another stack?); the provider server "
                    "takes a free one"
                )
                provider_port = 0
            provider = ProviderServerProcess(port=provider_port, die_with_parent=True).start()
            keys["PLAYLINE_PROVIDER_URL"] = provider.base_url
            console.print(f"local provider server on {provider.base_url}")
        settings = settings.with_environ(**keys)
        if not settings.data_dirs:
            cwd = Path.cwd()
            settings = settings.with_overrides(data_dirs=(cwd,))
            console.print(
                f"plays may read CSV and fixture files under {cwd} (PLAYLINE_DATA_DIRS is "
                "unset; set it to choose the directories)"
            )
        services = await Services.open(settings)
        worker_client = await connect(settings=settings, services=services)
        worker = build_worker(worker_client, task_queue=task_queue)
        running = asyncio.ensure_future(worker.run())
        if kind == "dev":
            StackRecord(
                pid=os.getpid(),
                task_queue=task_queue,
                temporal_address=settings.temporal_address,
                temporal_pid=dev.pid if dev is not None else None,
                provider_pid=provider.pid if provider is not None else None,
            ).write(settings.home)
        try:
            yield LocalStack(settings, provider, running, task_queue, stop)
        finally:
            if not running.done():
                await worker.shutdown()
            with contextlib.suppress(BaseException):
                await running
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
        StackRecord.remove(settings.home, os.getpid())
        if services is not None:
            await services.close()
        if provider is not None:
            provider.stop()
        if dev is not None:
            dev.stop()
            console.print(
                f"stopped the embedded Temporal server; its history is kept in "
                f"{dev.home / 'temporal.db'}: run `playline dev` to browse it in the UI"
            )


async def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    csv_path = Path(args.csv) if args.csv else LEADS_CSV
    if not csv_path.is_file():
        raise PlaylineError(f"--csv {csv_path}: no such file")
    async with (
        local_stack(args, settings, "demo") as stack,
        sheet_view_beside(stack, args.sheet_port) as stack_settings,
    ):
        client = await connect(settings=stack_settings)
        # The demo's own leads are package data, which a worker may always read; a
        # --csv of the user's goes through the store, wherever it is on this machine.
        source = (
            await upload_input_csv(str(csv_path), stack_settings)
            if args.csv
            else str(csv_path.resolve())
        )
        started = time.monotonic()
        launch = Launch(
            client,
            stack_settings,
            "enrich_leads",
            {"csv_path": source},
            run_options(args),
            stack.task_queue,
        )
        work = execute(
            launch,
            workflow_id=None,
            watch=True,
            out_path=args.out,
            raw=args.raw,
            provenance=args.provenance,
        )
        result = await stack.while_worker_runs(work)
        elapsed = time.monotonic() - started
        rows = result.stats.rows_ok + result.stats.rows_failed
        out().print(f"  {rows} rows in {elapsed:.1f}s ({rows / elapsed:.0f} rows/s)")
        if stack.provider is not None:
            ledger = stack.provider.ledger()
            out().print(
                f"  provider ledger: {ledger['charged']} calls charged, "
                f"{ledger['double_charged']} charged twice, {ledger['credits']:g} credits billed"
            )
    return 0


@contextlib.asynccontextmanager
async def sheet_view_beside(stack: LocalStack, port: int) -> AsyncIterator[Settings]:
    """The sheet view (``playline ui``) on loopback beside the stack while the block
    runs, its URL said; yields the stack's settings with ``sheets_url`` set to it
    (unless ``PLAYLINE_SHEETS_URL`` names another), so runs link to their sheet."""
    async with sheet_view_running(stack.settings, port) as url:
        console.print(f"sheet view on {url} (every run, cell by cell)")
        yield stack.settings.with_overrides(sheets_url=stack.settings.sheets_url or url)


async def cmd_dev(args: argparse.Namespace, settings: Settings) -> int:
    async with (
        local_stack(args, settings, "dev") as stack,
        sheet_view_beside(stack, args.sheet_port) as stack_settings,
    ):
        ui = stack.settings.ui_url or f"http://127.0.0.1:{args.ui_port}"
        console.print(
            f"playline dev is up: Temporal {stack.settings.temporal_address}, UI {ui}, "
            f"sheet view {stack_settings.sheets_url}, worker on task queue "
            f"{stack.task_queue}. Ctrl-C stops it."
        )
        if stack.task_queue != args.task_queue:
            console.print(
                f"commands run in {Path.cwd()} use task queue {stack.task_queue}; elsewhere "
                f"pass --task-queue {stack.task_queue}"
            )
        try:
            await stack.while_worker_runs(asyncio.Event().wait())
        except Stopped:
            console.print("stopping: a stop signal came")
    return 0


async def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    console.print(f"playline worker on {settings.temporal_address}, task queue {args.task_queue}")
    await run_worker(
        task_queue=args.task_queue,
        plays=args.plays,
        settings=settings,
        metrics_port=args.metrics_port,
    )
    return 0
