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
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from playline.cli.devserver import DevServer, reachable
from playline.cli.render import console, out
from playline.cli.run import execute
from playline.cli.starting import Launch, run_options, upload_input_csv
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


@dataclass
class LocalStack:
    """What ``local_stack`` brought up: settings pointing at it, the fake provider, the worker."""

    settings: Settings
    provider: ProviderServerProcess | None
    worker: asyncio.Task[None]

    async def while_worker_runs(self, work: Awaitable[T]) -> T:
        """Await ``work``; if the worker dies first, stop waiting and say why."""
        job = asyncio.ensure_future(work)
        done, _ = await asyncio.wait({job, self.worker}, return_when=asyncio.FIRST_COMPLETED)
        if job in done:
            return job.result()
        job.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await job
        raise PlaylineError(f"the worker stopped: {_why(self.worker)}")


def _why(task: asyncio.Task[None]) -> str:
    if task.cancelled():
        return "it was cancelled"
    err = task.exception()
    return "it exited" if err is None else f"{type(err).__name__}: {err}"


@contextlib.asynccontextmanager
async def local_stack(args: argparse.Namespace, settings: Settings) -> AsyncIterator[LocalStack]:
    """Temporal (reused if reachable, else embedded) + provider server + a worker.

    The worker's services (catalog, stores, governor) are opened before anything
    polls, so a bad catalog or an unreachable store fails here in one line.
    """
    dev: DevServer | None = None
    provider: ProviderServerProcess | None = None
    services: Services | None = None
    try:
        import_plays(getattr(args, "plays", []) or [])
        if not await reachable(settings.temporal_address):
            port = settings.temporal_address.rpartition(":")[2]
            dev = DevServer(
                home=settings.home, host="127.0.0.1", port=int(port or 7233), ui_port=args.ui_port
            )
            console.print(f"starting the Temporal dev server on {dev.address} (UI {dev.ui_url})")
            await dev.start()
            settings = settings.with_overrides(
                temporal_address=dev.address, ui_url=settings.ui_url or dev.ui_url
            )
        keys = {k: v for k, v in DEMO_KEYS.items() if not settings.environ.get(k)}
        if not settings.environ.get("PLAYLINE_PROVIDER_URL"):
            provider = ProviderServerProcess(port=args.provider_port).start()
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
        worker = build_worker(worker_client, task_queue=args.task_queue)
        running = asyncio.ensure_future(worker.run())
        try:
            yield LocalStack(settings, provider, running)
        finally:
            if not running.done():
                await worker.shutdown()
            with contextlib.suppress(BaseException):
                await running
    finally:
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
    async with local_stack(args, settings) as stack:
        client = await connect(settings=stack.settings)
        # The demo's own leads are package data, which a worker may always read; a
        # --csv of the user's goes through the store, wherever it is on this machine.
        source = (
            await upload_input_csv(str(csv_path), stack.settings)
            if args.csv
            else str(csv_path.resolve())
        )
        started = time.monotonic()
        launch = Launch(
            client,
            stack.settings,
            "enrich_leads",
            {"csv_path": source},
            run_options(args),
            args.task_queue,
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


async def cmd_dev(args: argparse.Namespace, settings: Settings) -> int:
    async with local_stack(args, settings) as stack:
        ui = stack.settings.ui_url or f"http://127.0.0.1:{args.ui_port}"
        console.print(
            f"playline dev is up: Temporal {stack.settings.temporal_address}, UI {ui}, "
            f"worker on task queue {args.task_queue}. Ctrl-C stops it."
        )
        await stack.while_worker_runs(asyncio.Event().wait())
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
