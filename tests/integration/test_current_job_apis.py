"""The presets' job tools against the provider server speaking the vendors' current APIs.

Dropcontact's ``POST /v1/enrich/all`` takes a credit per record at the submit and gives
it back for each record without an email when the job finishes; FullEnrich's v2 answers
``data`` with each contact's ``contact_info``. The presets, as shipped (only their poll
and linger times shortened), run through the real job dispatcher; the provider's ledger
is the judge of what was charged, refunded and billed.
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
from playline.calls.runner import ToolResult, ToolRunner
from playline.errors import JobPending
from playline.pacing.governor import Governor
from playline.provider_server.config import DEFAULT_HIT_RATES
from playline.provider_server.jobs import DROPCONTACT_CREDITS
from playline.stores.jobs_ledger import JobLedger
from playline.stores.receipts_ledger import ReceiptLedger

QUICK = {"poll_interval_s": 0.2, "first_poll_s": 0.1, "linger_ms": 300}


def preset(name: str, tool_id: str, base_url: str) -> Catalog:
    """The preset as shipped, pointed at the provider server, polling quickly."""
    tool = load_preset(name)["tools"][tool_id]
    tool = {**tool, "job": {**tool["job"], **QUICK}}
    return Catalog.model_validate(
        {
            "include": [name],
            "providers": {
                name: {"base_url": f"{base_url}/{name}", "pacing": {"rps": 50, "burst": 10}}
            },
            "tools": {tool_id: tool},
        }
    )


async def settle_all(
    cat: Catalog, tool_id: str, people: list[dict[str, Any]], env: dict[str, str], tmp_path: Path
) -> list[object]:
    """Call every person (one submit), then again those still pending, until none is:
    each person's first outcome that is not pending (a later call would be a receipt
    hit, free)."""
    receipts = ReceiptLedger.in_file(tmp_path / "receipts.db")
    jobs = JobLedger.in_file(tmp_path / "jobs.db")
    governor = Governor(cat.pacing_policies())
    try:
        async with httpx.AsyncClient() as http:
            client = ProviderClient(cat, http, environ=env)
            deadline = time.monotonic() + 30
            outcomes: dict[int, object] = {}
            rounds = 0
            while True:
                rounds += 1
                lease = f"L{rounds}"
                attempt = Attempt(receipts=receipts, owner=lease, lease_id=lease, lease_ttl_s=30)
                sender = PacedSender(attempt, governor, client)
                dispatcher = LiveDispatcher(attempt, sender, JobDispatcher(attempt, sender, jobs))
                runner = ToolRunner(cat, attempt, dispatcher)
                pending = [n for n in range(len(people)) if n not in outcomes]
                results = await asyncio.gather(
                    *(runner.call(tool_id, people[n]) for n in pending), return_exceptions=True
                )
                for n, result in zip(pending, results, strict=True):
                    if not isinstance(result, JobPending):
                        outcomes[n] = result
                if len(outcomes) == len(people):
                    return [outcomes[n] for n in range(len(people))]
                assert time.monotonic() < deadline, results
                await asyncio.sleep(0.3)
    finally:
        await receipts.close()
        await jobs.close()


async def test_dropcontact_refunds_each_miss_and_playline_records_the_net(
    provider: Any, tmp_path: Path
) -> None:
    people = [
        {"first_name": f"Fn{n}", "last_name": f"Ln{n}", "website": "co.example"} for n in range(8)
    ]
    provider.configure(job_latency_s={"dropcontact": [0.05, 0.2]}, hit_rates={"dropcontact": 0.5})
    try:
        cat = preset("dropcontact", "dropcontact_contact", provider.base_url)
        env = {"DROPCONTACT_API_KEY": "k-dropcontact"}
        results = await settle_all(cat, "dropcontact_contact", people, env, tmp_path)
    finally:
        provider.configure(hit_rates=dict(DEFAULT_HIT_RATES))
    assert all(isinstance(r, ToolResult) for r in results), results
    found = [r for r in results if isinstance(r, ToolResult) and r.get("email")]
    assert 0 < len(found) < len(people), "the hit rate gives both hits and misses"
    ledger = provider.ledger()
    jobs = ledger["jobs_by_provider"]["dropcontact"]
    assert jobs["job_submits"] == 1 and jobs["job_members"] == len(people)
    # Charged a credit per record, refunded per miss: the net is the hits, as recorded.
    assert ledger["refunds"] == len(people) - len(found)
    assert ledger["credits_by_provider"]["dropcontact"] == len(found)
    recorded = sum(r.credits for r in results if isinstance(r, ToolResult))
    assert recorded == ledger["credits_by_provider"]["dropcontact"]
    paths = {c["path"] for c in provider.calls() if c["provider"] == "dropcontact"}
    assert paths <= {"/dropcontact/v1/enrich/all", "/dropcontact/v1/enrich/all/{job_id}"}, paths


async def test_dropcontact_takes_the_credits_at_the_submit() -> None:
    from playline.provider_server import ServerConfig, start_in_thread

    server = start_in_thread(ServerConfig(latency_ms=(0.0, 1.0)))
    try:
        server.configure(job_stuck={"dropcontact": True})
        async with httpx.AsyncClient() as http:
            submit = await http.post(
                f"{server.base_url}/dropcontact/v1/enrich/all",
                json={"data": [{"first_name": "A", "last_name": "B", "website": "x.example"}] * 3},
                headers={"X-Access-Token": "k"},
            )
            again = await http.post(
                f"{server.base_url}/dropcontact/v1/enrich/all",
                json={"data": [{"first_name": "C", "last_name": "D", "website": "x.example"}]},
                headers={"X-Access-Token": "k"},
            )
            running = await http.get(
                f"{server.base_url}/dropcontact/v1/enrich/all/{submit.json()['request_id']}",
                headers={"X-Access-Token": "k"},
            )
    finally:
        server.stop()
    assert submit.status_code == 200 and submit.json()["success"] is True
    # Each job's records were taken at its submit, before any of them finished.
    assert submit.json()["credits_left"] == DROPCONTACT_CREDITS - 3
    assert again.json()["credits_left"] == DROPCONTACT_CREDITS - 4
    assert running.json() == {
        "success": False,
        "reason": "Request not ready yet, try again in 30 seconds",
        "error": False,
    }


async def test_fullenrich_v2_answers_contact_info_read_by_the_preset(
    provider: Any, tmp_path: Path
) -> None:
    people = [
        {"first_name": f"Fn{n}", "last_name": f"Ln{n}", "domain": "co.example"} for n in range(3)
    ]
    provider.configure(job_latency_s={"fullenrich": [0.05, 0.2]}, hit_rates={"fullenrich": 1.0})
    try:
        cat = preset("fullenrich", "fullenrich_contact", provider.base_url)
        env = {"FULLENRICH_API_KEY": "k-fullenrich"}
        results = await settle_all(cat, "fullenrich_contact", people, env, tmp_path)
    finally:
        provider.configure(hit_rates=dict(DEFAULT_HIT_RATES))
    assert all(isinstance(r, ToolResult) for r in results), results
    emails = [r.get("email") for r in results if isinstance(r, ToolResult)]
    assert emails == [f"fn{n}.ln{n}@co.example" for n in range(3)]
    ledger = provider.ledger()
    assert ledger["credits_by_provider"]["fullenrich"] == 3
    assert sum(r.credits for r in results if isinstance(r, ToolResult)) == 3
