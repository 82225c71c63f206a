"""``playline ui``: the sheet view (:mod:`playline.webview`) over Temporal and the store.

The view's desk (:class:`CliDesk`) is the command line's own code: runs are listed by
the query ``playline runs list`` builds and shown by its row function, a run's state is
its ``state`` query, and each button sends what ``playline runs pause|resume|cancel|
budget`` sends, through the same functions, answering with the line they print or
refusing with the line they raise. Exports are ``playline runs export``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import uvicorn
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
)
from temporalio.service import RPCError

from playline import search_attributes as sa
from playline.cli.codec_server import allowed_hosts
from playline.cli.devserver import port_open
from playline.cli.follow import ENDED, snapshot, wait_lines
from playline.cli.render import console, ui_url
from playline.cli.run_refs import find_run
from playline.cli.runs import (
    CONTROLS,
    _row,
    change_budget,
    control,
    export_changed,
    export_done,
)
from playline.cli.runs import cancel as cancel_run
from playline.cli.setup import registered_search_attributes
from playline.cli.ui_estimate import find_estimate
from playline.client import not_found_as
from playline.config import Settings
from playline.contract import PlayState
from playline.errors import PlaylineError
from playline.money import money_text
from playline.sockets import free_port
from playline.stores.backends import open_stores
from playline.stores.budget_ids import RunBudgetId
from playline.stores.sheet import SheetStore
from playline.webview import ExportChoice, RunSummary, check_exposure, webview_app
from playline.webview.desk import Action, RunEstimate
from playline.worker import connect
from playline.workflows.context import RUN_REFS_MEMO

__all__ = [
    "DEFAULT_PORT",
    "CliDesk",
    "add_ui_parser",
    "cmd_ui",
    "serving",
    "sheet_view_running",
    "ui_app",
]

DEFAULT_PORT = 8234
#: How long a page waits for a worker to answer a run's ``state`` query.
STATE_TIMEOUT = timedelta(seconds=3)
#: Runs whose estimate a view keeps.
KEPT_ESTIMATES = 256


class CliDesk:
    """The view's desk on a Temporal client, with the CLI's functions."""

    def __init__(self, client: Client, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self._printing = asyncio.Lock()
        #: each run's estimate once found (or, for a run that ended, found missing)
        self._estimates: dict[str, RunEstimate | None] = {}

    async def _state(self, handle: WorkflowHandle[Any, Any]) -> PlayState | None:
        with contextlib.suppress(RPCError, asyncio.TimeoutError):
            state: PlayState = await handle.query(
                "state", result_type=PlayState, rpc_timeout=STATE_TIMEOUT
            )
            return state
        return None

    def _with_state(self, run: RunSummary, state: PlayState | None) -> RunSummary:
        if state is None:
            return run
        now = datetime.now(UTC)
        waits = wait_lines(state, state.current, now, run.workflow_id)
        snap = snapshot(state, state.current, waits)
        run.waits = waits
        current_wait = state.current.budget_wait if state.current is not None else None
        run.held_for_budget = bool(waits) and bool(current_wait or state.budget_wait)
        run.rows_done, run.rows_total = snap.done, snap.total
        run.rows_failed = state.rows_failed
        run.credits, run.money = snap.credits, snap.money
        run.run_refs = list(state.run_refs) or run.run_refs
        if state.current is not None:
            run.prices = dict(state.current.stats.prices)
            run.providers = _providers(state.current.stats.accounts)
            for pace in state.current.paces:
                run.providers.setdefault(pace.provider, {}).update(
                    rate_rps=pace.rate_rps, share_rps=pace.share_rps, paused_s=pace.paused_s
                )
        if state.status not in ENDED and run.running:
            run.status = state.status + (" (paused)" if state.paused else "")
        return run

    async def list_runs(self, limit: int) -> list[RunSummary]:
        registered = set(await registered_search_attributes(self.client))
        if {k.name for k in sa.LIST_KEYS} <= registered:
            query = "PlaylinePlay IS NOT NULL"
            if sa.KIND.name in registered:
                query += f" AND ({sa.KIND.name} IS NULL OR {sa.KIND.name} != 'estimate')"
        else:
            query = "WorkflowType != 'playline.DatasetRun'"
        runs: list[RunSummary] = []
        try:
            async for execution in self.client.list_workflows(query, limit=limit):
                row = _row(execution, self.settings)
                ended = execution.close_time
                runs.append(
                    RunSummary(
                        workflow_id=row["workflow_id"],
                        run_id=row["run_id"],
                        play=row["play"],
                        status=row["status"],
                        rows_done=row["rows_done"],
                        rows_total=row["rows_total"],
                        rows_failed=row["rows_failed"],
                        credits=row["credits"],
                        started=row["started"],
                        ended=ended.strftime("%Y-%m-%d %H:%M:%S UTC") if ended else None,
                        ui_url=row["ui_url"],
                        running=execution.status == WorkflowExecutionStatus.RUNNING,
                    )
                )
        except RPCError as err:
            raise PlaylineError(f"cannot list runs ({query}): {err.message}") from None
        going = [r for r in runs if r.running]
        states = await asyncio.gather(
            *(self._state(self.client.get_workflow_handle(r.workflow_id)) for r in going)
        )
        for run, state in zip(going, states, strict=True):
            self._with_state(run, state)
        return runs

    async def run(self, workflow_id: str) -> RunSummary:
        handle, desc = await find_run(self.client, workflow_id, self.settings.temporal_namespace)
        attrs = desc.typed_search_attributes
        running = desc.status == WorkflowExecutionStatus.RUNNING
        refs: list[str] = []
        with contextlib.suppress(KeyError):
            refs = await desc.memo_value(RUN_REFS_MEMO, type_hint=list[str])
        run = RunSummary(
            workflow_id=workflow_id,
            run_id=desc.run_id,
            play=attrs.get(sa.PLAY) or desc.workflow_type,
            status=attrs.get(sa.STATUS) or (desc.status.name.lower() if desc.status else "?"),
            rows_done=attrs.get(sa.ROWS_DONE),
            rows_total=attrs.get(sa.ROWS_TOTAL),
            rows_failed=attrs.get(sa.ROWS_FAILED),
            credits=attrs.get(sa.CREDITS),
            started=_when(desc.start_time),
            ended=_when(desc.close_time),
            ui_url=ui_url(self.settings, workflow_id, desc.run_id),
            run_refs=refs,
            running=running,
        )
        if desc.status == WorkflowExecutionStatus.COMPLETED:
            result = await handle.result()
            run.prices = dict(result.stats.prices)
            run.providers = _providers(result.stats.accounts)
            run.money = money_text(result.stats.spend.get("by_provider") or {}, run.prices)
            run.run_refs = [d.run_ref for d in result.datasets if d.run_ref] or run.run_refs
            return run
        return self._with_state(run, await self._state(handle))

    async def act(self, workflow_id: str, action: Action, amount: float | None) -> str:
        handle, desc = await find_run(self.client, workflow_id, self.settings.temporal_namespace)
        if desc.status != WorkflowExecutionStatus.RUNNING:
            status = desc.status.name if desc.status else "UNKNOWN"
            raise PlaylineError(f"run {workflow_id} is not running ({status})")
        args = argparse.Namespace(id=workflow_id, runs_command=action, json=False)
        if action == "budget":
            if amount is None:
                raise PlaylineError("budget refused: give the credits to add (a number)")
            args.add, args.set, args.retry, args.provider = amount, None, False, None
        # The line the command prints is the page's answer: the CLI's own words.
        async with self._printing:
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                if action in CONTROLS:
                    await control(handle, args)
                elif action == "budget":
                    await change_budget(handle, args)
                else:
                    args.no_wait, args.out = True, None
                    await cancel_run(handle, desc, args, self.settings)
        return printed.getvalue().strip()

    async def budget(self, run: RunSummary) -> float | None:
        """The run's cap from the budget ledger, read where the workers keep it (a run
        without a cap has no budget there; nothing is created to find out)."""
        if run.run_id is None:
            return None
        if not self.settings.store_is_postgres and not self.settings.budgets_path.is_file():
            return None
        try:
            async with await open_stores(self.settings, create=False) as stores:
                state = await stores.budgets.state(RunBudgetId(run.run_id))
        except (PlaylineError, OSError):
            return None
        return state.limit if state is not None else None

    async def estimate(self, run: RunSummary) -> RunEstimate | None:
        """The latest estimate of the run's play on its input made before it
        (:mod:`playline.cli.ui_estimate`); found once per run and kept."""
        if run.workflow_id in self._estimates:
            return self._estimates[run.workflow_id]
        handle = self.client.get_workflow_handle(run.workflow_id, run_id=run.run_id)
        with not_found_as(PlaylineError(f"no run with id {run.workflow_id!r}")):
            desc = await handle.describe()
        found = await find_estimate(
            self.client,
            run.play,
            handle,
            desc.start_time,
            registered=set(await registered_search_attributes(self.client)),
            ui_url=lambda wid, rid: ui_url(self.settings, wid, rid),
        )
        if found is not None or not run.running:
            if len(self._estimates) >= KEPT_ESTIMATES:
                self._estimates.pop(next(iter(self._estimates)))
            self._estimates[run.workflow_id] = found
        return found

    async def export(self, workflow_id: str, path: Path, choice: ExportChoice) -> int:
        handle, desc = await find_run(self.client, workflow_id, self.settings.temporal_namespace)
        if choice.changes:
            return await export_changed(handle, desc, str(path), self.settings)
        return await export_done(
            handle, desc, str(path), self.settings, provenance=choice.provenance
        )


def _providers(accounts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The accounts' terms per provider (a few numbers each, never a row)."""
    return {provider: dict(terms) for provider, terms in sorted(accounts.items())}


def _when(moment: datetime | None) -> str | None:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment else None


def ui_app(
    client: Client,
    settings: Settings,
    *,
    token: str | None = None,
    host: str = "127.0.0.1",
    extra_hosts: Sequence[str] = (),
) -> Any:
    """The sheet view over ``client`` and the workers' store ``settings`` names; it
    answers requests naming loopback, ``host`` or ``extra_hosts`` (DNS rebinding)."""

    @contextlib.asynccontextmanager
    async def open_sheet() -> AsyncIterator[SheetStore]:
        async with await open_stores(settings, create=False) as stores:
            yield stores.sheet

    return webview_app(
        CliDesk(client, settings), open_sheet, token=token, hosts=allowed_hosts(host, extra_hosts)
    )


@contextlib.asynccontextmanager
async def serving(app: Any, host: str, port: int) -> AsyncIterator[None]:
    """``app`` on ``host:port`` (uvicorn in this event loop, no access log) while the
    block runs; one line if it cannot start."""
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    )
    running = asyncio.ensure_future(server.serve())
    for _ in range(500):  # ten seconds at most
        if server.started or running.done():
            break
        await asyncio.sleep(0.02)
    if not server.started:
        server.should_exit = True
        with contextlib.suppress(BaseException):
            await running
        raise PlaylineError(f"the sheet view did not start on {host}:{port}")
    try:
        yield
    finally:
        server.should_exit = True
        with contextlib.suppress(BaseException):
            await running


@contextlib.asynccontextmanager
async def sheet_view_running(
    settings: Settings, port: int = DEFAULT_PORT, *, client: Client | None = None
) -> AsyncIterator[str]:
    """The sheet view on loopback while the block runs (for ``playline dev`` and
    ``demo``: their stack's Temporal and store); yields its URL. A taken port gives
    way to a free one."""
    if port_open("127.0.0.1", port):
        port = free_port()
    client = client or await connect(settings=settings)
    async with serving(ui_app(client, settings), "127.0.0.1", port):
        yield f"http://127.0.0.1:{port}"


def add_ui_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from playline.cli.flags import add_temporal_flags

    p = sub.add_parser("ui", help="serve the sheet view: every run, cell by cell, in a browser")
    add_temporal_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument(
        "--token",
        help="asked of every request from beyond this machine (required to bind another "
        "address than loopback; default $PLAYLINE_UI_TOKEN); a browser opens /?token=TOKEN once",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests naming this host (repeatable); loopback and the bound "
        "host always are",
    )


async def cmd_ui(args: argparse.Namespace, settings: Settings) -> int:
    args.token = args.token or settings.ui_token
    check_exposure(args.host, args.token)
    client = await connect(settings=settings)
    async with await open_stores(settings, create=False):
        pass  # no store here: one line now, not a broken page later
    config = uvicorn.Config(
        ui_app(client, settings, token=args.token, host=args.host, extra_hosts=args.allowed_host),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,  # URLs carry no row, but nothing of the pages goes to a log
    )
    shown = args.host if ":" not in args.host else f"[{args.host}]"
    console.print(
        f"sheet view on http://{shown}:{args.port} "
        f"({'token required beyond this machine' if args.token else 'this machine only'})"
    )
    await uvicorn.Server(config).serve()
    return 0
