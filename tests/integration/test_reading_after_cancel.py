"""A cancelled run reads the provider jobs it submitted and sends nothing new: the
``ReadingDispatcher`` against the provider server's FullEnrich shape, outside Temporal.
The provider's ledger is the judge: one submit, the credits the answers say."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from playline.calls.attempt import Attempt
from playline.calls.jobs import JobDispatcher
from playline.calls.live import LiveDispatcher, PacedSender
from playline.calls.reading import ReadingDispatcher
from playline.calls.runner import ToolResult, ToolRunner
from playline.errors import JobPending, NotSentCancelled
from tests.integration.test_job_dispatch import PEOPLE, job_catalog
from tests.integration.test_job_money import (
    Harness,
    call_all,
    credits_of,
    fullenrich_ledger,
    harness,
    kinds,
)


def reading_runner(h: Harness, lease: str, run: str = "run-1") -> ToolRunner:
    """A runner as a cancelled run's reading chunk builds it."""
    attempt = Attempt(
        receipts=h.receipts, owner=lease, lease_id=lease, lease_ttl_s=30, force_token=run
    )
    sender = PacedSender(attempt, h.governor, h.client)
    live = LiveDispatcher(attempt, sender, JobDispatcher(attempt, sender, h.jobs))
    return ToolRunner(h.catalog, attempt, ReadingDispatcher(live, attempt, h.jobs))


async def test_reading_reads_submitted_jobs_and_refuses_every_new_call(
    provider: Any, tmp_path: Path
) -> None:
    provider.configure(job_latency_s={"fullenrich": [0.3, 0.6]})
    catalog = job_catalog(provider.base_url)
    submitted, never = PEOPLE[:3], PEOPLE[3:]
    async with harness(tmp_path, catalog) as h:
        first = await call_all(h.runner("A"), submitted)
        assert kinds(first) == ["JobPending"] * 3
        await asyncio.to_thread(
            provider.wait_ledger,
            lambda lg: lg["jobs_by_provider"].get("fullenrich", {}).get("job_submits", 0) >= 1,
        )
        # Cancelled: the rows re-run to read; the two never submitted are refused.
        deadline = time.monotonic() + 60
        rounds = 0
        while True:
            rounds += 1
            results = await call_all(reading_runner(h, f"R{rounds}"), [*submitted, *never])
            assert all(isinstance(r, NotSentCancelled) for r in results[3:]), results
            if not any(isinstance(r, JobPending) for r in results[:3]):
                break
            assert time.monotonic() < deadline, results
            await asyncio.sleep(0.3)
        assert all(isinstance(r, ToolResult) for r in results[:3]), results
        assert "not sent: the run was cancelled" in str(results[3])
        read = fullenrich_ledger(provider)
        assert read["job_submits"] == 1 and read.get("duplicate_submits", 0) == 0
        assert credits_of(results[:3]) == read["credits"]
        # The refused calls' receipts were released: a later run sends them as usual.
        later = await call_all(h.runner("L", run="run-2"), never)
        assert kinds(later) == ["JobPending"] * 2
