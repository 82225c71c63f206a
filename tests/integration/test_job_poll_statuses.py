"""A job's poll answered with an error status, through the real job dispatcher.

FullEnrich's status request answers 402 when the credits ran out (its body says
``CREDITS_INSUFFICIENT``): the preset's ``poll_failed_status`` ends the job as failed at
that poll, so its calls fail with the reason instead of waiting out ``max_wait_s`` (two
hours) as a poll it cannot read. A status named in ``poll_pending_status`` (Apollo's
404 ``result_pending``) is "still running" instead. The contract server answers
FullEnrich's documented submit and status answers.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx

from playline.calls.attempt import Attempt
from playline.calls.catalog import Catalog, load_preset
from playline.calls.http import ProviderClient
from playline.calls.jobs import JobDispatcher
from playline.calls.live import LiveDispatcher, PacedSender
from playline.calls.runner import ToolRunner
from playline.errors import CallAmbiguous, JobFailed, JobPending
from playline.pacing.governor import Governor
from playline.stores.jobs_ledger import JobLedger
from playline.stores.receipts_ledger import ReceiptLedger
from tests.contracts.server import KEY_PREFIX, contract_server

PERSON = {"first_name": "Marie", "last_name": "Curie", "domain": "example.com"}
QUICK = {"poll_interval_s": 0.2, "first_poll_s": 0.1, "linger_ms": 50}


def catalog(base_url: str, **job: Any) -> Catalog:
    tool = load_preset("fullenrich")["tools"]["fullenrich_contact"]
    tool = {**tool, "job": {**tool["job"], **QUICK, **job}}
    return Catalog.model_validate(
        {
            "include": ["fullenrich"],
            "providers": {"fullenrich": {"base_url": base_url}},
            "tools": {"fullenrich_contact": tool},
        }
    )


async def settle(cat: Catalog, tmp_path: Path, *, within_s: float) -> object:
    """Call until the call is no longer pending; what it came to."""
    receipts = ReceiptLedger.in_file(tmp_path / "receipts.db")
    jobs = JobLedger.in_file(tmp_path / "jobs.db")
    governor = Governor(cat.pacing_policies())
    try:
        async with httpx.AsyncClient() as http:
            environ = {"FULLENRICH_API_KEY": KEY_PREFIX + "fullenrich"}
            client = ProviderClient(cat, http, environ=environ)
            deadline = time.monotonic() + within_s
            rounds = 0
            while True:
                rounds += 1
                lease = f"L{rounds}"
                attempt = Attempt(receipts=receipts, owner=lease, lease_id=lease, lease_ttl_s=30)
                sender = PacedSender(attempt, governor, client)
                dispatcher = LiveDispatcher(attempt, sender, JobDispatcher(attempt, sender, jobs))
                runner = ToolRunner(cat, attempt, dispatcher)
                (outcome,) = await asyncio.gather(
                    runner.call("fullenrich_contact", PERSON), return_exceptions=True
                )
                if not isinstance(outcome, JobPending):
                    return outcome
                assert time.monotonic() < deadline, "the job never ended"
                await asyncio.sleep(0.2)
    finally:
        await receipts.close()
        await jobs.close()


async def test_a_poll_answering_out_of_credits_fails_the_job_at_once(tmp_path: Path) -> None:
    with contract_server() as server:
        server.answer("fullenrich_contact", "out_of_credits")
        # max_wait_s far beyond the test: only the 402 can end the job in time.
        cat = catalog(server.base_url("fullenrich"), max_wait_s=3600)
        outcome = await settle(cat, tmp_path, within_s=20)
        assert server.violations == []
    assert isinstance(outcome, JobFailed), outcome
    assert not isinstance(outcome, CallAmbiguous)
    assert "CREDITS_INSUFFICIENT" in str(outcome) and "402" in str(outcome)


async def test_a_poll_pending_status_keeps_the_job_running_until_max_wait_s(
    tmp_path: Path,
) -> None:
    # Apollo answers "not ready" with a 404; here the contract's 402 stands in for such a
    # status, named pending: the job runs on, and past max_wait_s a poll still saying so
    # gives it up as ambiguous (it may yet finish and bill: never re-sent).
    with contract_server() as server:
        server.answer("fullenrich_contact", "out_of_credits")
        cat = catalog(
            server.base_url("fullenrich"),
            max_wait_s=1.0,
            poll_failed_status=[],
            poll_pending_status=[402],
        )
        outcome = await settle(cat, tmp_path, within_s=20)
        polls = [r for r in server.requests("fullenrich") if r["method"] == "GET"]
    assert isinstance(outcome, CallAmbiguous), outcome
    assert "did not finish within" in str(outcome)
    assert polls, "the job was polled"
