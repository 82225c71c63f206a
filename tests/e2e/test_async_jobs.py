"""Asynchronous provider jobs end to end: real Temporal, the provider server's FullEnrich
and Dropcontact shapes (submit, then poll or webhook), real SQLite stores.

Each row's call is a member of a job: submitted once (the job id recorded before
anything else), the row leaves its chunk while the job runs, the dataset run waits on
a durable timer (or a webhook's ``jobs_ready`` signal) and re-runs only the rows whose
jobs were pending. The provider's ledger is the judge: submits = distinct jobs, no
contact submitted twice, credits = what playline says they cost.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from playline.calls.provenance import run_spend
from playline.config import Settings
from playline.contract import PlayRunResult, RunOptions
from playline.services import Services
from playline.stores.backends import open_stores
from tests.conftest import start_worker_process
from tests.e2e.test_crash_recovery import wait_for
from tests.e2e.test_webhook_cli import receiver
from tests.plays import lead, run, write_csv

KEY = "test-fullenrich-key"
ROWS = int(os.environ.get("ASYNC_ROWS", "500"))

CATALOG = """
[providers.fullenrich]
base_url = "https://app.fullenrich.com"
base_url_env = "FULLENRICH_BASE_URL"
auth = {{ env = "FULLENRICH_API_KEY", header = "Authorization", scheme = "Bearer" }}
pacing = {{ rps = 20, burst = 5, max_concurrency = 8 }}

[providers.dropcontact]
base_url = "https://api.dropcontact.io"
base_url_env = "DROPCONTACT_BASE_URL"
auth = {{ env = "DROPCONTACT_API_KEY", header = "X-Access-Token" }}
pacing = {{ rps = 20, burst = 5, max_concurrency = 8 }}

[tools.fullenrich_contact]
provider = "fullenrich"
path = "/api/v1/contact/enrich/bulk"
input = {{ firstname = "str", lastname = "str", domain = "str?" }}
getters = {{ email = "contact.most_probable_email" }}
billing = {{ rule = "per_field", fields = {{ email = 1 }} }}

[tools.fullenrich_contact.job]
items_field = "datas"
max_items = 100
# Long enough that a loaded machine still fills a batch from a whole chunk: how many
# rows arrive within a window is timing, and the batching check below must not be.
linger_ms = 1500
id_field = "custom.playline_id"
body = {{ name = "playline-test" }}
item = {{ enrich_fields = ["contact.emails"] }}
job_id = "enrichment_id"
status_path = "/api/v1/contact/enrich/bulk/{{job_id}}"
state_field = "status"
done = ["FINISHED"]
running = ["CREATED", "IN_PROGRESS"]
failed = ["CANCELED"]
results_field = "datas"
partial = {partial}
poll_interval_s = {poll}
first_poll_s = {first_poll}
max_wait_s = {max_wait}
max_jobs_in_flight = 50
poll_pacing = {{ rps = 20, burst = 5 }}
webhook = {{ url_field = "webhook_url", signature = "hmac-sha1", \
signature_header = "X-Signature-SHA1", secret_env = "FULLENRICH_API_KEY" }}

[tools.dropcontact_contact]
provider = "dropcontact"
path = "/batch"
input = {{ first_name = "str", last_name = "str", website = "str?" }}
getters = {{ email = "email.0.email" }}
billing = {{ rule = "per_hit", hit = "email" }}

[tools.dropcontact_contact.job]
items_field = "data"
max_items = 250
linger_ms = 200
job_id = "request_id"
status_path = "/batch/{{job_id}}"
state_field = "success"
done = [true]
running = [false]
reason_field = "reason"
results_field = "data"
poll_interval_s = {poll}
first_poll_s = {first_poll}
max_wait_s = {max_wait}
poll_pacing = {{ rps = 20, burst = 5 }}
"""


def catalog(
    tmp_path: Path,
    *,
    poll: float = 1.0,
    first_poll: float = 1.0,
    max_wait: float = 300.0,
    partial: bool = True,
) -> Path:
    path = tmp_path / f"async-{uuid.uuid4().hex[:6]}.toml"
    text = CATALOG.format(
        poll=poll, first_poll=first_poll, max_wait=max_wait, partial=str(partial).lower()
    )
    path.write_text(text)
    return path


@pytest.fixture
def jobs_provider(provider, monkeypatch):  # type: ignore[no-untyped-def]
    """The provider server's job providers, fast, pointed at by the environment."""
    for vendor in ("fullenrich", "dropcontact"):
        monkeypatch.setenv(f"{vendor.upper()}_BASE_URL", f"{provider.base_url}/{vendor}")
    monkeypatch.setenv("FULLENRICH_API_KEY", KEY)
    monkeypatch.setenv("DROPCONTACT_API_KEY", "test-dropcontact-key")
    provider.configure(
        job_latency_s={"fullenrich": [0.2, 1.5], "dropcontact": [0.2, 1.5]},
        job_queue={},
        job_stuck={},
        job_stuck_last_names=[],
        webhook_drop={},
        webhook_duplicates={},
        webhook_retry_s={"fullenrich": 0.5, "dropcontact": 0.5},
    )
    yield provider
    provider.configure(job_stuck={}, webhook_drop={}, webhook_duplicates={})


def leads(tmp_path: Path, rows: int) -> Path:
    return write_csv(tmp_path / f"leads-{rows}.csv", [lead(n) for n in range(rows)])


def of(ledger: dict[str, Any], name: str, vendor: str = "fullenrich") -> int:
    """A per-provider figure of the ledger's job counters (``jobs_by_provider``)."""
    return int(ledger.get("jobs_by_provider", {}).get(vendor, {}).get(name, 0))


async def spend_of(home: Path, result: PlayRunResult) -> Any:
    services = await Services.open(Settings.from_env(home=home))
    try:
        return await run_spend(services.sheet, result.datasets[0].run_ref)
    finally:
        await services.close()


async def history_lengths(client: Client, task_queue: str) -> list[int]:
    """The number of events of every workflow execution on the test's queue."""
    lengths = []
    async for execution in client.list_workflows(f"TaskQueue = '{task_queue}'"):
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        history = await handle.fetch_history()
        lengths.append(len(history.events))
    return lengths


def assert_submitted_once(ledger: dict[str, Any], rows: int, vendor: str = "fullenrich") -> None:
    assert of(ledger, "job_members", vendor) == rows, ledger
    assert of(ledger, "job_submits", vendor) == of(ledger, "jobs", vendor), ledger
    assert of(ledger, "duplicate_submits", vendor) == 0, ledger


async def test_500_rows_through_async_jobs_each_submitted_once_and_billed_as_the_ledger_says(
    client, jobs_provider, worker, task_queue, home, tmp_path
) -> None:
    csv_path = leads(tmp_path, ROWS)
    async with worker(catalog_path=str(catalog(tmp_path))):
        result = await run(
            client, "t_async", {"csv_path": str(csv_path)}, task_queue=task_queue, timeout_s=240
        )
        ledger = jobs_provider.ledger()
        again = await run(
            client, "t_async", {"csv_path": str(csv_path)}, task_queue=task_queue, timeout_s=120
        )
    assert result.stats.rows_ok == 500 and result.stats.rows_failed == 0
    assert_submitted_once(ledger, 500)
    # Batched: a row leaves its chunk as soon as its call is queued, so a submit fills
    # from the whole chunk (at most 100 members), not only from the rows at once.
    assert of(ledger, "jobs") <= ROWS // 20, ledger["jobs_by_provider"]
    billed = ledger["credits_by_provider"]["fullenrich"]
    assert billed > 0
    spend = await spend_of(home, result)
    assert spend.by_provider["fullenrich"] == pytest.approx(billed)
    assert result.stats.credits == pytest.approx(billed)
    # Rows never travel through history: every execution stays small whatever waited.
    assert max(await history_lengths(client, task_queue)) < 5_000
    # A rerun is answered from receipts: nothing submitted, nothing billed.
    after = jobs_provider.ledger()
    assert of(after, "job_submits") == of(ledger, "job_submits")
    assert again.stats.rows_ok == 500 and again.stats.calls_made == 0


async def test_thousands_of_rows_pending_on_jobs_keep_every_history_small(
    client, jobs_provider, worker, task_queue, home, tmp_path
) -> None:
    # Every row waits on a job for several polls: the dataset run re-runs only those
    # rows, round after round, and its history holds ranges and timers, never rows.
    jobs_provider.configure(job_latency_s={"fullenrich": [3.0, 6.0]})
    rows = 2000
    csv_path = leads(tmp_path, rows)
    async with worker(catalog_path=str(catalog(tmp_path, poll=1.0, first_poll=2.0))):
        result = await run(
            client, "t_async", {"csv_path": str(csv_path)}, task_queue=task_queue, timeout_s=600
        )
    ledger = jobs_provider.ledger()
    assert result.stats.rows_ok == rows and result.stats.rows_failed == 0
    assert_submitted_once(ledger, rows)
    assert of(ledger, "polls") >= of(ledger, "jobs")  # every job was polled, most often
    lengths = await history_lengths(client, task_queue)
    assert max(lengths) < 10_000, lengths  # Temporal warns at 10,240 events


async def test_a_batch_provider_answering_not_ready_with_a_200_is_polled_to_the_end(
    client, jobs_provider, worker, task_queue, home, tmp_path
) -> None:
    csv_path = leads(tmp_path, 40)
    async with worker(catalog_path=str(catalog(tmp_path))):
        result = await run(
            client,
            "t_async",
            {"csv_path": str(csv_path), "dropcontact": True},
            task_queue=task_queue,
            timeout_s=180,
        )
    ledger = jobs_provider.ledger()
    assert result.stats.rows_ok == 40 and result.stats.rows_failed == 0
    assert_submitted_once(ledger, 40, "dropcontact")
    assert of(ledger, "polls", "dropcontact") >= 1
    spend = await spend_of(home, result)
    for vendor in ("fullenrich", "dropcontact"):
        billed = ledger["credits_by_provider"].get(vendor, 0.0)
        assert spend.by_provider.get(vendor, 0.0) == pytest.approx(billed), vendor


async def test_a_job_that_never_finishes_fails_its_rows_with_the_reason_after_the_longest_wait(
    client, jobs_provider, worker, task_queue, tmp_path
) -> None:
    jobs_provider.configure(job_stuck={"fullenrich": True})
    csv_path = leads(tmp_path, 12)
    async with worker(catalog_path=str(catalog(tmp_path, max_wait=4.0))):
        result = await run(
            client, "t_async", {"csv_path": str(csv_path)}, task_queue=task_queue, timeout_s=120
        )
    ledger = jobs_provider.ledger()
    assert result.stats.rows_ok == 0 and result.stats.rows_failed == 12
    assert result.stats.first_error is not None
    assert "did not finish within max_wait_s = 4 s" in result.stats.first_error
    assert_submitted_once(ledger, 12)
    assert ledger["credits_by_provider"].get("fullenrich", 0.0) == 0


async def create_stores(home: Path) -> None:
    """The stores a worker would create (the receiver opens them, never creates them)."""
    stores = await open_stores(Settings.from_env(home=home), create=True)
    await stores.close()


@asynccontextmanager
async def webhook_receiver(home: Path, catalog_path: Path, address: str) -> AsyncIterator[str]:
    """``playline webhook`` on the test's Temporal, store and catalog; its base URL."""
    args = ("--catalog", str(catalog_path), "--address", address)
    async with receiver(*args, home=home, FULLENRICH_API_KEY=KEY) as (base, _):
        yield base


async def test_webhooks_complete_jobs_and_a_duplicated_delivery_changes_nothing(
    client, jobs_provider, worker, task_queue, home, tmp_path, temporal_address
) -> None:
    # Polls are a minute apart: a run that ends sooner was completed by the webhooks.
    path = catalog(tmp_path, poll=60.0, first_poll=60.0)
    jobs_provider.configure(webhook_duplicates={"fullenrich": 2})
    csv_path = leads(tmp_path, 30)
    await create_stores(home)
    async with (
        webhook_receiver(home, path, temporal_address) as base,
        worker(catalog_path=str(path), webhook_url=base),
    ):
        result = await run(
            client, "t_async", {"csv_path": str(csv_path)}, task_queue=task_queue, timeout_s=50
        )
    ledger = jobs_provider.ledger()
    assert result.stats.rows_ok == 30 and result.stats.rows_failed == 0
    assert_submitted_once(ledger, 30)
    assert of(ledger, "polls") == 0
    assert of(ledger, "webhooks_delivered") >= 2 * of(ledger, "jobs")
    spend = await spend_of(home, result)
    assert spend.by_provider["fullenrich"] == pytest.approx(
        ledger["credits_by_provider"]["fullenrich"]
    )


async def test_a_lost_webhook_is_recovered_by_polling(
    client, jobs_provider, worker, task_queue, home, tmp_path, temporal_address
) -> None:
    path = catalog(tmp_path, poll=2.0, first_poll=3.0)
    jobs_provider.configure(webhook_drop={"fullenrich": 1000})
    csv_path = leads(tmp_path, 20)
    await create_stores(home)
    async with (
        webhook_receiver(home, path, temporal_address) as base,
        worker(catalog_path=str(path), webhook_url=base),
    ):
        result = await run(
            client, "t_async", {"csv_path": str(csv_path)}, task_queue=task_queue, timeout_s=120
        )
    ledger = jobs_provider.ledger()
    assert result.stats.rows_ok == 20
    assert of(ledger, "webhooks_delivered") == 0 and of(ledger, "polls") >= 1
    assert_submitted_once(ledger, 20)


async def test_a_worker_sigkilled_while_jobs_are_pending_resumes_them_without_a_second_submit(
    client, jobs_provider, task_queue, home, tmp_path, temporal_address
) -> None:
    jobs_provider.configure(job_latency_s={"fullenrich": [4.0, 8.0]})
    path = catalog(tmp_path, poll=1.0, first_poll=2.0)
    rows = 200
    csv_path = leads(tmp_path, rows)
    env = {
        "PLAYLINE_CATALOG": str(path),
        "FULLENRICH_BASE_URL": os.environ["FULLENRICH_BASE_URL"],
        "FULLENRICH_API_KEY": KEY,
    }
    log = tmp_path / "worker.log"
    first = start_worker_process(temporal_address, task_queue, home, log, env)
    second: subprocess.Popen[bytes] | None = None
    try:
        handle = await client.start_workflow(
            "t_async",
            args=[{"csv_path": str(csv_path)}, RunOptions()],
            id=f"t_async-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
            result_type=PlayRunResult,
        )
        await wait_for(
            lambda: of(jobs_provider.ledger(), "job_members") >= rows, 90, "every row submitted"
        )
        await asyncio.sleep(0.5)  # the last job ids recorded
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert of(jobs_provider.ledger(), "jobs_finished") < of(jobs_provider.ledger(), "jobs")
        second = start_worker_process(temporal_address, task_queue, home, log, env)
        result = await asyncio.wait_for(handle.result(), 180)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
    ledger = jobs_provider.ledger()
    assert result.stats.rows_ok == rows and result.stats.rows_failed == 0, log.read_text()[-3000:]
    assert_submitted_once(ledger, rows)
    spend = await spend_of(home, result)
    assert spend.by_provider["fullenrich"] == pytest.approx(
        ledger["credits_by_provider"]["fullenrich"]
    )


async def test_a_budget_caps_async_jobs_and_the_spend_is_the_providers_bill(
    client, jobs_provider, worker, task_queue, home, tmp_path
) -> None:
    # A submitted call keeps its reservation while its job runs (its charge comes when
    # the job finishes), so rows past the cap are never submitted.
    csv_path = leads(tmp_path, 60)
    options = RunOptions(max_credits=20, on_budget="stop")
    async with worker(catalog_path=str(catalog(tmp_path))):
        result = await run(
            client,
            "t_async",
            {"csv_path": str(csv_path)},
            task_queue=task_queue,
            options=options,
            timeout_s=180,
        )
    ledger = jobs_provider.ledger()
    billed = ledger["credits_by_provider"].get("fullenrich", 0.0)
    assert 0 < billed <= 20
    assert result.stats.rows_skipped_budget > 0
    assert result.stats.rows_ok + result.stats.rows_skipped_budget == 60
    assert of(ledger, "job_members") <= 20  # never more submitted than the cap covers
    assert of(ledger, "duplicate_submits") == 0
    spend = await spend_of(home, result)
    assert spend.by_provider["fullenrich"] == pytest.approx(billed)


async def _budget_waiting(handle: Any, timeout_s: float) -> Any:
    """The play's state once its dataset run waits for budget (None: it completed)."""
    from playline.contract import PlayState

    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        state = await handle.query("state", result_type=PlayState)
        if state.budget_wait and state.status == "waiting":
            return state
        if state.status in ("completed", "failed", "cancelled"):
            return None
        await asyncio.sleep(0.5)
    raise AssertionError(f"neither completed nor waiting for budget: {state}")


async def test_rows_parked_on_jobs_are_read_before_a_budget_wait_and_it_waits_only_when_spent(
    client, jobs_provider, worker, task_queue, home, tmp_path
) -> None:
    # 20 rows reserve the cap and submit; the other 40 meet a budget full of the parked
    # rows' reservations. The run reads the jobs first (settling them), re-runs the held
    # rows, and waits for a raise only once what is spent leaves no room.
    import re

    from playline.contract import BudgetChange

    csv_path = leads(tmp_path, 60)
    play_id = f"t_async-budget-{uuid.uuid4().hex[:8]}"
    async with worker(catalog_path=str(catalog(tmp_path))):
        handle = await client.start_workflow(
            "t_async",
            args=[{"csv_path": str(csv_path)}, RunOptions(max_credits=20)],
            id=play_id,
            task_queue=task_queue,
            result_type=PlayRunResult,
        )
        state = await _budget_waiting(handle, 300)
        if state is not None:
            said = re.match(r"budget: ([\d.]+) of 20 credits spent", state.budget_wait)
            assert said, state.budget_wait
            # Honest: what is spent leaves no room for one more row (worst case 1).
            assert float(said.group(1)) + 1 > 20 + 1e-9, state.budget_wait
            ledger = jobs_provider.ledger()
            assert ledger["credits_by_provider"]["fullenrich"] == pytest.approx(
                float(said.group(1))
            )
            await handle.execute_update("budget", BudgetChange(add=100))
        result = await asyncio.wait_for(handle.result(), 240)
    ledger = jobs_provider.ledger()
    # Every row read its job's answer: none left unread, nothing submitted twice.
    assert result.stats.rows_ok == 60 and result.stats.rows_failed == 0
    assert_submitted_once(ledger, 60)
    billed = ledger["credits_by_provider"]["fullenrich"]
    assert result.stats.credits == pytest.approx(billed)
    spend = await spend_of(home, result)
    assert spend.by_provider["fullenrich"] == pytest.approx(billed)


async def test_a_job_step_in_a_waterfall_parks_the_row_and_the_next_step_pays_only_for_misses(
    client, jobs_provider, worker, task_queue, home, tmp_path
) -> None:
    from tests.e2e.test_waterfalls import _provenance

    csv_path = leads(tmp_path, 20)
    async with worker(catalog_path=str(catalog(tmp_path))):
        result = await run(
            client,
            "t_async_waterfall",
            {"csv_path": str(csv_path)},
            task_queue=task_queue,
            timeout_s=180,
        )
    ledger = jobs_provider.ledger()
    assert result.stats.rows_ok == 20 and result.stats.rows_failed == 0
    rows, spend = await _provenance(home, result.datasets[0].run_ref)
    first = [row["email"]["steps"][0] for row in rows]
    # The job step answered from its job (read, not skipped as "unavailable")...
    assert {step["outcome"] for step in first} <= {"hit", "no_match"}, first
    assert all(step["tool"] == "fullenrich_contact" for step in first)
    assert_submitted_once(ledger, 20)
    # ...and the second provider was asked only for the rows the first missed.
    missed = sum(step["outcome"] == "no_match" for step in first)
    assert of(ledger, "job_members", "dropcontact") == missed, ledger
    for row in rows:
        steps = row["email"]["steps"]
        assert len(steps) == (2 if steps[0]["outcome"] == "no_match" else 1), steps
    billed = ledger["credits_by_provider"]
    assert sum(step["credits"] for step in first) == pytest.approx(billed["fullenrich"])
    for vendor in ("fullenrich", "dropcontact"):
        assert spend.by_provider.get(vendor, 0.0) == pytest.approx(billed.get(vendor, 0.0))
    assert result.stats.credits == pytest.approx(sum(billed.values()))


async def test_ctx_tool_on_a_job_tool_waits_for_the_job_and_returns_its_answer(
    client, jobs_provider, worker, task_queue, tmp_path
) -> None:
    # The job runs for longer than the scalar call's retries last (1+2+4+8 s): the play
    # waits on durable timers and calls again until the job's answer is read.
    jobs_provider.configure(job_latency_s={"fullenrich": [18.0, 20.0]})
    async with worker(catalog_path=str(catalog(tmp_path, poll=2.0, first_poll=2.0))):
        result = await run(
            client, "t_async_scalar", {"csv_path": "-"}, task_queue=task_queue, timeout_s=120
        )
    ledger = jobs_provider.ledger()
    found = result.output["found"]
    assert isinstance(found, dict) and "contact" in found, found
    assert_submitted_once(ledger, 1)
    assert of(ledger, "jobs_finished") == 1
    # Polled at the job's pace, not in a loop: about one poll per 2 s of the job's run.
    assert 1 <= of(ledger, "polls") <= 20, ledger
    assert ledger["credits_by_provider"].get("fullenrich", 0.0) <= 1.0


async def test_a_cancelled_run_reads_the_jobs_it_submitted_before_it_ends(
    client, jobs_provider, worker, task_queue, home, tmp_path
) -> None:
    # Cancelled while its rows wait on submitted jobs (paid for when they finish), the
    # run re-runs only those rows until their jobs are read, then ends cancelled: every
    # member the provider billed has its answer in the sheet, and a later run submits
    # none of them again.
    from temporalio.client import WorkflowFailureError

    from playline.contract import PlayState
    from tests.e2e.test_crash_recovery import wait_for

    jobs_provider.configure(job_latency_s={"fullenrich": [3.0, 5.0]})
    rows = 60
    csv_path = leads(tmp_path, rows)
    path = catalog(tmp_path, poll=1.0, first_poll=1.0)
    async with worker(catalog_path=str(path)):
        handle = await client.start_workflow(
            "t_async",
            args=[{"csv_path": str(csv_path)}, RunOptions()],
            id=f"t_async-cancel-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
            result_type=PlayRunResult,
        )
        await wait_for(
            lambda: of(jobs_provider.ledger(), "job_submits") >= 1, 60, "a submitted job"
        )
        await handle.cancel()
        child = client.get_workflow_handle(f"{handle.id}/dataset/t_async")
        notes: set[str] = set()
        for _ in range(100):
            try:
                said = await child.query("state")
            except Exception:  # ended
                break
            if said.get("status") != "cancelling":
                await asyncio.sleep(0.1)
                continue
            if said.get("note"):
                notes.add(said["note"])
                break
            await asyncio.sleep(0.1)
        assert any(note.startswith("cancelling: reading ") for note in notes), notes
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), 120)
        state = await handle.query("state", result_type=PlayState)
        run_ref = state.run_refs[0]
        ledger = jobs_provider.ledger()
        # Nothing still running at the provider that the run did not read.
        assert of(ledger, "jobs_finished") == of(ledger, "jobs"), ledger
        services = await Services.open(Settings.from_env(home=home))
        try:
            sheet_rows = await services.sheet.read_run_rows(run_ref, 0, rows)
            spend = await run_spend(services.sheet, run_ref)
        finally:
            await services.close()
        answered = [row for row in sheet_rows if row.status != "pending"]
        assert len(answered) == of(ledger, "job_members"), ledger
        assert answered
        billed = ledger["credits_by_provider"]["fullenrich"]
        assert spend.by_provider["fullenrich"] == pytest.approx(billed)
        # The same rows again: what was submitted is answered from receipts.
        again = await run(
            client, "t_async", {"csv_path": str(csv_path)}, task_queue=task_queue, timeout_s=180
        )
    after = jobs_provider.ledger()
    assert again.stats.rows_ok == rows
    assert_submitted_once(after, rows)


async def test_with_a_named_budget_rows_parked_on_jobs_are_read_before_the_period_wait(
    client, jobs_provider, worker, task_queue, home, tmp_path
) -> None:
    # As with a run cap: the run never waits for the period's end while only its own
    # parked rows reserve the budget; it waits once what is spent leaves no room.
    import re

    from playline.contract import BudgetChange

    name = f"team-{uuid.uuid4().hex[:6]}"
    services = await Services.open(Settings.from_env(home=home))
    try:
        await services.budgets.define(name, period="month", limit=20)
    finally:
        await services.close()
    csv_path = leads(tmp_path, 60)
    async with worker(catalog_path=str(catalog(tmp_path))):
        handle = await client.start_workflow(
            "t_async",
            args=[{"csv_path": str(csv_path)}, RunOptions(budget=name)],
            id=f"t_async-named-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
            result_type=PlayRunResult,
        )
        state = await _budget_waiting(handle, 300)
        if state is not None:
            said = re.match(
                rf"budget {name} \(\S+\): ([\d.]+) of 20 credits spent", state.budget_wait
            )
            assert said, state.budget_wait
            assert float(said.group(1)) + 1 > 20 + 1e-9, state.budget_wait
            services = await Services.open(Settings.from_env(home=home))
            try:
                await services.budgets.define(name, period="month", limit=500)
            finally:
                await services.close()
            await handle.execute_update("budget", BudgetChange(retry=True))
        result = await asyncio.wait_for(handle.result(), 240)
    ledger = jobs_provider.ledger()
    assert result.stats.rows_ok == 60 and result.stats.rows_failed == 0
    assert_submitted_once(ledger, 60)
    billed = ledger["credits_by_provider"]["fullenrich"]
    assert result.stats.credits == pytest.approx(billed)
