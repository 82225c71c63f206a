"""The money features crossed pairwise, each run ending with the run-end invariants.

Three factors, every pair of their levels met at least once (12 cases, a covering
array: for each event, the budgets and the call shapes form a Latin square):

- the budget: a run cap that waits (raised from outside when it holds), a run cap that
  stops, a named monthly budget that waits (redefined and retried);
- the calls: an asynchronous job tool, a waterfall whose first step is that job tool,
  a sync provider whose quota runs out (rows park until it resets);
- what happens to the run: paused and resumed, cancelled, its worker SIGKILLed, started
  by a schedule.

Each case alternates SQLite and PostgreSQL stores and ends by checking, against the
provider server's own ledger: no reservation of the run is open; the credits the
cells show equal what the provider billed; no answer billed and left unread (no job
running or finished unread, no ambiguous call); nothing charged or submitted twice.
Job latencies and the quota window are short; nothing asserts a timing.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle

from playline.audit import audit_run
from playline.config import Settings
from playline.contract import BudgetChange, BudgetReport, PlayRunResult, PlayState, RunOptions
from playline.schedules import create_schedule
from playline.stores.backends import open_stores
from playline.stores.budget_ids import RunBudgetId
from playline.workflows.context import RUN_REFS_MEMO
from tests.conftest import start_worker_process
from tests.e2e.test_async_jobs import KEY, catalog, jobs_provider  # noqa: F401 (fixture)
from tests.pg import pg_schema
from tests.plays import lead, write_csv
from tests.plays_matrix import MatrixInput

ROWS = 24
#: a cap that binds: the jobs shape's worst case is 1 credit a row, the waterfall's 2
CAP = 10.0
QUOTA, QUOTA_WINDOW_S = 8, 6

SYNC_PART = """
[providers.acme]
base_url = "http://127.0.0.1:8787"
base_url_env = "PLAYLINE_PROVIDER_URL"
auth = { env = "ACME_API_KEY", header = "X-Api-Key" }
idempotency = "key"
pacing = { rps = 50, burst = 5, max_concurrency = 8 }

[tools.email_finder]
provider = "acme"
path = "/acme/v1/email/find"
input = { first_name = "str", last_name = "str", domain = "str" }
getters = { email = "email", confidence = "confidence" }
credits = 1.0

[waterfalls.matrix_email]
steps = ["fullenrich_contact", "email_finder"]
value = "email"
"""

BUDGETS = ("cap_wait", "cap_stop", "named_wait")
SHAPES = ("jobs", "waterfall", "quota")
EVENTS = ("pause_resume", "cancel", "sigkill", "schedule")


@dataclass(frozen=True)
class Case:
    budget: str
    shape: str
    event: str
    backend: str

    @property
    def id(self) -> str:
        return f"{self.budget}-{self.shape}-{self.event}-{self.backend}"


def cases() -> list[Case]:
    """Every pair of levels at least once: per event, a Latin square of budget x shape."""
    found = []
    for e, event in enumerate(EVENTS):
        for b, budget in enumerate(BUDGETS):
            shape = SHAPES[(b + e) % len(SHAPES)]
            backend = ("sqlite", "postgresql")[(b + e) % 2]
            found.append(Case(budget, shape, event, backend))
    return found


def test_the_matrix_covers_every_pair() -> None:
    found = cases()
    for pairs in (
        {(c.budget, c.shape) for c in found},
        {(c.budget, c.event) for c in found},
        {(c.shape, c.event) for c in found},
    ):
        assert len(pairs) == len({p[0] for p in pairs}) * len({p[1] for p in pairs})
    assert {c.backend for c in found} == {"sqlite", "postgresql"}


def matrix_catalog(tmp_path: Path) -> Path:
    base = catalog(tmp_path, poll=0.5, first_poll=0.5, max_wait=120.0)
    path = tmp_path / f"matrix-{uuid.uuid4().hex[:6]}.toml"
    path.write_text(base.read_text() + SYNC_PART)
    return path


@asynccontextmanager
async def store_url(backend: str, tmp_path: Path) -> Any:
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'matrix-store'}"
        return
    async with pg_schema() as url:
        yield url


def options_for(case: Case, budget_name: str) -> RunOptions:
    if case.budget == "cap_wait":
        return RunOptions(max_credits=CAP)
    if case.budget == "cap_stop":
        return RunOptions(max_credits=CAP, on_budget="stop")
    return RunOptions(budget=budget_name)


def worker_process(
    address: str, task_queue: str, env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    home = Path(env["PLAYLINE_HOME"])
    return start_worker_process(address, task_queue, home, log, env, plays="tests.plays_matrix")


async def play_state(handle: WorkflowHandle[Any, Any]) -> PlayState | None:
    try:
        return await handle.query("state", result_type=PlayState)
    except Exception:
        return None


async def lift_budget(
    handle: WorkflowHandle[Any, Any], case: Case, settings: Settings, budget_name: str
) -> None:
    """What a user does at a budget wait: raise the cap, or redefine the named budget
    and ask the held rows to go on."""
    if case.budget == "named_wait":
        async with await open_stores(settings, create=True) as stores:
            await stores.budgets.define(budget_name, period="month", limit=1000.0)
        change = BudgetChange(retry=True)
    else:
        change = BudgetChange(add=1000.0)
    await handle.execute_update("budget", change, result_type=BudgetReport)


async def drive(
    handle: WorkflowHandle[Any, Any],
    case: Case,
    settings: Settings,
    budget_name: str,
    provider: Any,
    on_sent: Any,
    timeout_s: float = 240.0,
) -> str:
    """Run the case's event and lift budget waits until the run ends; its status."""
    deadline = time.monotonic() + timeout_s
    acted = lifted = False
    while time.monotonic() < deadline:
        desc = await handle.describe()
        if desc.status != WorkflowExecutionStatus.RUNNING:
            return desc.status.name if desc.status else "UNKNOWN"
        state = await play_state(handle)
        sent = provider.ledger()["received"] > 0
        if not acted and sent:
            acted = True
            await on_sent()
        waiting = state is not None and (
            state.budget_wait or (state.current is not None and state.current.budget_wait)
        )
        if waiting and not lifted and case.event != "cancel":
            lifted = True
            await lift_budget(handle, case, settings, budget_name)
        await asyncio.sleep(0.3)
    raise AssertionError(f"{case.id}: the run did not end within {timeout_s:g} s")


async def check_invariants(
    client: Client, workflow_id: str, settings: Settings, provider: Any, case: Case
) -> None:
    handle = client.get_workflow_handle(workflow_id)
    desc = await handle.describe()
    refs = await desc.memo_value(RUN_REFS_MEMO, type_hint=list[str])
    ledger = provider.ledger()
    async with await open_stores(settings, create=False) as stores:
        waiters = [f"{workflow_id}/dataset/t_money"]
        audit = await audit_run(
            stores, workflow_id, refs, ended=True, waiters=waiters, budget_run=desc.run_id
        )
        budget = await stores.budgets.state(RunBudgetId(desc.run_id).key)
        named = await stores.budgets.state(f"named:m{case.id.replace('_', '')[:40]}")
    report = "\n".join(audit.lines())
    # 1. nothing reserved is left open, in the store's own totals too
    assert audit.check("reservations").ok, report
    for state in (budget, named):
        assert state is None or state.reserved == pytest.approx(0.0), (state, report)
    # 2. the cells' credits are the provider's bill
    cells = audit.figures["cells_credits"]
    assert cells == pytest.approx(ledger["credits"]), (case.id, ledger, report)
    assert audit.check("credits").ok, report
    # 3. no answer billed and left unread
    assert audit.check("unread").ok, report
    jobs = ledger.get("jobs_by_provider", {}).get("fullenrich", {})
    # 4. nothing charged or submitted twice
    assert ledger["double_charged"] == 0, ledger
    assert int(jobs.get("duplicate_submits", 0)) == 0, jobs
    assert audit.check("sent_twice").ok, report
    assert audit.ok, report


@pytest.mark.parametrize("case", cases(), ids=lambda case: case.id)
async def test_money_features_compose(
    case: Case,
    client: Client,
    jobs_provider: Any,  # noqa: F811
    temporal_address: str,
    task_queue: str,
    tmp_path: Path,
    worker: Any,
) -> None:
    provider = jobs_provider
    provider.configure(job_latency_s={"fullenrich": [0.5, 2.0]})
    if case.shape == "quota":
        provider.configure(
            limiters={"acme": [{"kind": "quota", "limit": QUOTA, "window_s": QUOTA_WINDOW_S}]},
            retry_after="ceil",
        )
    csv_path = write_csv(tmp_path / "leads.csv", [lead(n) for n in range(ROWS)])
    path = matrix_catalog(tmp_path)
    budget_name = f"m{case.id.replace('_', '')[:40]}"
    play_input = MatrixInput(csv_path=str(csv_path), shape=case.shape)  # type: ignore[arg-type]
    async with AsyncExitStack() as stack:
        url = await stack.enter_async_context(store_url(case.backend, tmp_path))
        home = tmp_path / "home"
        settings = Settings.from_env(home=home, store_url=url, catalog_path=str(path))
        async with await open_stores(settings, create=True) as stores:
            await stores.budgets.define(budget_name, period="month", limit=CAP)
        options = options_for(case, budget_name)
        env = {
            "PLAYLINE_CATALOG": str(path),
            "PLAYLINE_STORE_URL": url,
            "PLAYLINE_HOME": str(home),
            "FULLENRICH_BASE_URL": os.environ["FULLENRICH_BASE_URL"],
            "FULLENRICH_API_KEY": KEY,
        }
        procs: list[subprocess.Popen[bytes]] = []
        log = tmp_path / "worker.log"
        if case.event == "sigkill":
            procs.append(worker_process(temporal_address, task_queue, env, log))
        else:
            await stack.enter_async_context(
                worker(catalog_path=str(path), store_url=url, home=home)
            )
        try:
            workflow_id = await start(client, case, play_input, options, task_queue)
            handle = client.get_workflow_handle(workflow_id, result_type=PlayRunResult)

            async def on_sent() -> None:
                if case.event == "pause_resume":
                    await handle.execute_update("pause")
                    await asyncio.sleep(1.5)
                    await handle.execute_update("resume")
                elif case.event == "cancel":
                    await asyncio.sleep(0.5)
                    await handle.cancel()
                elif case.event == "sigkill":
                    await asyncio.sleep(0.8)
                    procs[0].send_signal(signal.SIGKILL)
                    procs[0].wait(10)
                    procs.append(worker_process(temporal_address, task_queue, env, log))

            status = await drive(handle, case, settings, budget_name, provider, on_sent)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
        expected = "CANCELED" if case.event == "cancel" else "COMPLETED"
        detail = log.read_text()[-3000:] if log.exists() else ""
        if status != expected:
            try:
                await handle.result()
            except WorkflowFailureError as err:
                detail += f"\n{err.cause!r}"
        assert status == expected, (case.id, status, detail)
        if expected == "COMPLETED":
            result = await handle.result()
            if case.budget == "cap_stop":
                assert result.stats.rows_ok + result.stats.rows_skipped_budget >= ROWS - 1
            else:
                assert result.stats.rows_failed == 0, result.stats.first_error
        await check_invariants(client, workflow_id, settings, provider, case)


async def start(
    client: Client, case: Case, play_input: MatrixInput, options: RunOptions, task_queue: str
) -> str:
    """Start the case's run (directly, or as a schedule's firing); its workflow id."""
    if case.event != "schedule":
        workflow_id = f"m-{case.id}-{uuid.uuid4().hex[:6]}"
        await client.start_workflow(
            "t_money",
            args=[play_input, options],
            id=workflow_id,
            task_queue=task_queue,
            execution_timeout=timedelta(minutes=6),
        )
        return workflow_id
    name = f"msched-{uuid.uuid4().hex[:8]}"
    schedule = await create_schedule(
        client, name, "t_money", play_input, every="1h", options=options, task_queue=task_queue
    )
    await schedule.trigger()
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            info = (await schedule.describe()).info
            # running: the started workflows themselves; recent: results holding them
            actions = [*info.running_actions, *(r.action for r in info.recent_actions)]
            firings = [a.workflow_id for a in actions if hasattr(a, "workflow_id")]
            if firings:
                return str(firings[0])
            await asyncio.sleep(0.3)
    finally:
        await schedule.pause(note="the test drives the one firing it triggered")
    raise AssertionError("the schedule did not fire")
