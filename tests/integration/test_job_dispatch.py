"""The job dispatcher against the provider server's FullEnrich shape, outside Temporal:
a call submits once, is pending while its job runs, and reads its result once done."""

from __future__ import annotations

import asyncio
import time
import tomllib
from pathlib import Path

import httpx
import pytest

from playline.calls.attempt import Attempt
from playline.calls.catalog import Catalog
from playline.calls.http import ProviderClient
from playline.calls.jobs import JobDispatcher
from playline.calls.live import LiveDispatcher, PacedSender
from playline.calls.runner import ToolResult, ToolRunner
from playline.errors import CallAmbiguous, JobPending
from playline.pacing.governor import Governor
from playline.stores.jobs_ledger import JobLedger
from playline.stores.receipts_ledger import ReceiptLedger
from tests.e2e.test_async_jobs import CATALOG

PEOPLE = [{"firstname": f"Fn{n}", "lastname": f"Ln{n}", "domain": "co.example"} for n in range(5)]


def job_catalog(base_url: str, **values: object) -> Catalog:
    text = CATALOG.format(
        poll=values.get("poll", 0.2),
        first_poll=values.get("first_poll", 0.2),
        max_wait=values.get("max_wait", 60),
        partial="true",
    )
    text = text.replace(
        'base_url = "https://app.fullenrich.com"', f'base_url = "{base_url}/fullenrich"'
    )
    return Catalog.model_validate(tomllib.loads(text))


async def call_all(runner: ToolRunner) -> list[object]:
    return await asyncio.gather(
        *(runner.call("fullenrich_contact", person) for person in PEOPLE), return_exceptions=True
    )


@pytest.mark.parametrize("stuck", [False, True])
async def test_calls_submit_once_wait_for_their_job_and_read_its_result(
    provider, tmp_path: Path, stuck: bool
) -> None:  # type: ignore[no-untyped-def]
    provider.configure(job_latency_s={"fullenrich": [0.1, 0.3]}, job_stuck={"fullenrich": stuck})
    catalog = job_catalog(provider.base_url, max_wait=1.5)
    receipts = ReceiptLedger.in_file(tmp_path / "receipts.db")
    jobs = JobLedger.in_file(tmp_path / "jobs.db")
    governor = Governor(catalog.pacing_policies())
    try:
        async with httpx.AsyncClient() as http:
            client = ProviderClient(catalog, http, environ={"FULLENRICH_API_KEY": "k"})

            def runner(lease: str) -> ToolRunner:
                attempt = Attempt(receipts=receipts, owner=lease, lease_id=lease, lease_ttl_s=30)
                sender = PacedSender(attempt, governor, client)
                dispatcher = LiveDispatcher(attempt, sender, JobDispatcher(attempt, sender, jobs))
                return ToolRunner(catalog, attempt, dispatcher)

            first = await call_all(runner("A"))
            assert all(isinstance(r, JobPending) for r in first), first
            deadline = time.monotonic() + 30
            rounds = 0
            while True:
                rounds += 1
                await asyncio.sleep(0.5)
                results = await call_all(runner(f"R{rounds}"))
                if not any(isinstance(r, JobPending) for r in results):
                    break
                assert time.monotonic() < deadline, results
            ledger = provider.ledger()["jobs_by_provider"]["fullenrich"]
            assert ledger["job_submits"] == 1 and ledger["job_members"] == 5
            if stuck:
                # Past max_wait_s, a poll still says it runs: given up as ambiguous (it
                # may yet finish and bill), never failed (a later run would resubmit).
                assert all(isinstance(r, CallAmbiguous) for r in results), results
                assert "did not finish within" in str(results[0])
            else:
                assert all(isinstance(r, ToolResult) for r in results), results
                assert ledger["polls"] >= 1
    finally:
        await receipts.close()
        await jobs.close()
        provider.configure(job_stuck={})
