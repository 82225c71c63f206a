"""Provider jobs and money, outside Temporal, against the provider server's FullEnrich
shape: a job is read before it may expire (G3), orphaned jobs do not wedge the queue
(G8), a job that ends part way completes the members it billed (G11), a submit is sent
by one caller only (G13), polls share the account's limit (G15). The provider's ledger
is the judge: submits, duplicate submits and credits."""

from __future__ import annotations

import asyncio
import time
import tomllib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from playline import presets
from playline.calls.attempt import Attempt
from playline.calls.catalog import Catalog
from playline.calls.http import ProviderClient
from playline.calls.jobs import JobDispatcher
from playline.calls.live import LiveDispatcher, PacedSender
from playline.calls.runner import ToolResult, ToolRunner
from playline.errors import CallAmbiguous, JobFailed, JobPending
from playline.pacing.governor import Governor
from playline.provider_server.config import DEFAULT_HIT_RATES
from playline.stores.jobs import Job, JobStore
from playline.stores.jobs_ledger import JobLedger
from playline.stores.receipts_ledger import ReceiptLedger
from tests.integration.test_job_dispatch import PEOPLE, job_catalog

KEY = "k-fullenrich"


@dataclass
class Harness:
    catalog: Catalog
    receipts: ReceiptLedger
    jobs: JobLedger
    governor: Governor
    client: ProviderClient

    def runner(self, lease: str, run: str = "run-1", **options: Any) -> ToolRunner:
        attempt = Attempt(
            receipts=self.receipts,
            owner=lease,
            lease_id=lease,
            lease_ttl_s=30,
            force_token=run,
            **options,
        )
        sender = PacedSender(attempt, self.governor, self.client)
        jobs = JobDispatcher(attempt, sender, self.jobs)
        return ToolRunner(self.catalog, attempt, LiveDispatcher(attempt, sender, jobs))

    def dispatcher(self, lease: str, run: str = "run-1") -> JobDispatcher:
        attempt = Attempt(
            receipts=self.receipts, owner=lease, lease_id=lease, lease_ttl_s=30, force_token=run
        )
        return JobDispatcher(attempt, PacedSender(attempt, self.governor, self.client), self.jobs)


@asynccontextmanager
async def harness(tmp_path: Path, catalog: Catalog) -> AsyncIterator[Harness]:
    receipts = ReceiptLedger.in_file(tmp_path / "receipts.db")
    jobs = JobLedger.in_file(tmp_path / "jobs.db")
    try:
        async with httpx.AsyncClient() as http:
            client = ProviderClient(catalog, http, environ={"FULLENRICH_API_KEY": KEY})
            yield Harness(catalog, receipts, jobs, Governor(catalog.pacing_policies()), client)
    finally:
        await receipts.close()
        await jobs.close()


async def call_all(runner: ToolRunner, people: list[dict[str, str]] = PEOPLE) -> list[object]:
    return await asyncio.gather(
        *(runner.call("fullenrich_contact", person) for person in people),
        return_exceptions=True,
    )


#: The preset's API v2 request and answer fields, and the v1 ones the provider server speaks.
V1_SHAPE = (
    ('path = "/api/v2/contact/enrich/bulk"', 'path = "/api/v1/contact/enrich/bulk"'),
    ('"/api/v2/contact/enrich/bulk/{job_id}"', '"/api/v1/contact/enrich/bulk/{job_id}"'),
    ('first_name = "str", last_name = "str"', 'firstname = "str", lastname = "str"'),
    ('items_field = "data"', 'items_field = "datas"'),
    ('results_field = "data"', 'results_field = "datas"'),
    ('"contact_info.most_probable_work_email.email"', '"contact.most_probable_email"'),
    ('["contact.work_emails"]', '["contact.emails"]'),
)


def fullenrich_preset(base_url: str, pacing: str | None = None) -> Catalog:
    """The FullEnrich preset as shipped (its states, fields, billing), pointed at the
    provider server; its pacing line replaced by ``pacing`` (default: fast enough for
    a test), its poll and linger times made short."""
    text = (Path(presets.__file__).parent / "fullenrich.toml").read_text()
    # The provider server's /fullenrich copy speaks FullEnrich's API v1; the preset, v2.
    for v2, v1 in V1_SHAPE:
        assert v2 in text, v2
        text = text.replace(v2, v1)
    text = text.replace(
        'base_url = "https://app.fullenrich.com"', f'base_url = "{base_url}/fullenrich"'
    ).replace('base_url_env = "FULLENRICH_BASE_URL"\n', "")
    old = "pacing = { rps = 1, burst = 1, per_minute = 60, max_concurrency = 4 }"
    assert old in text
    text = text.replace(old, pacing or "pacing = { rps = 50, burst = 10, max_concurrency = 4 }")
    for slow in ("poll_interval_s = 30", "first_poll_s = 45"):
        assert slow in text
        text = text.replace(slow, slow.split(" = ")[0] + " = 0.2")
    return Catalog.model_validate(tomllib.loads(text))


def fullenrich_ledger(provider: Any) -> dict[str, Any]:
    ledger = provider.ledger()
    jobs = ledger["jobs_by_provider"].get("fullenrich", {})
    return {**jobs, "credits": ledger["credits_by_provider"].get("fullenrich", 0.0)}


def kinds(results: list[object]) -> list[str]:
    return [type(r).__name__ for r in results]


async def until_settled(
    make: Callable[[int], ToolRunner],
    people: list[dict[str, str]] = PEOPLE,
    deadline_s: float = 60,
) -> list[object]:
    """Re-run the calls (a new attempt each time, as a re-run row is) until none pends."""
    deadline = time.monotonic() + deadline_s
    rounds = 0
    while True:
        rounds += 1
        await asyncio.sleep(0.3)
        results = await call_all(make(rounds), people)
        if not any(isinstance(r, JobPending) for r in results):
            return results
        assert time.monotonic() < deadline, results


def credits_of(results: list[object]) -> float:
    return sum(r.credits for r in results if isinstance(r, ToolResult))


# ---------------------------------------------------------------------------- G3


async def test_a_finished_job_looked_at_after_max_wait_is_read_not_expired(
    provider: Any, tmp_path: Path
) -> None:
    """G3: the job finishes (and is billed) at once; its rows look at it only after
    ``max_wait_s``: a poll made then reads it, every member completes, once."""
    provider.configure(job_latency_s={"fullenrich": [0.05, 0.2]})
    catalog = job_catalog(provider.base_url, max_wait=1.0)
    async with harness(tmp_path, catalog) as h:
        first = await call_all(h.runner("A"))
        assert all(isinstance(r, JobPending) for r in first), first
        await asyncio.to_thread(
            provider.wait_ledger,
            lambda lg: lg["jobs_by_provider"].get("fullenrich", {}).get("jobs_finished", 0) >= 1,
        )
        await asyncio.sleep(2.0)  # nobody looks until the job is past max_wait_s
        late = await call_all(h.runner("B"))
        assert all(isinstance(r, ToolResult) for r in late), late
        again = await call_all(h.runner("C", run="run-2"))  # a later run: receipts
        assert all(isinstance(r, ToolResult) for r in again), again
    ledger = fullenrich_ledger(provider)
    assert ledger["job_submits"] == 1 and ledger.get("duplicate_submits", 0) == 0
    assert ledger["polls"] >= 1
    assert credits_of(late) == ledger["credits"]


async def test_a_job_still_running_past_max_wait_is_ambiguous_and_never_resubmitted(
    provider: Any, tmp_path: Path
) -> None:
    """G3: a job a fresh poll still finds running past ``max_wait_s`` is given up as
    ambiguous (it may still bill); a later run does not submit its members again
    unless asked to retry ambiguous calls."""
    provider.configure(job_latency_s={"fullenrich": [0.05, 0.2]}, job_stuck={"fullenrich": True})
    catalog = job_catalog(provider.base_url, max_wait=1.0)
    try:
        async with harness(tmp_path, catalog) as h:
            first = await call_all(h.runner("A"))
            assert all(isinstance(r, JobPending) for r in first), first
            given_up = await until_settled(lambda n: h.runner(f"R{n}"))
            assert all(isinstance(r, CallAmbiguous) for r in given_up), given_up
            assert "did not finish within max_wait_s" in str(given_up[0])
            polls = fullenrich_ledger(provider)["polls"]
            assert polls >= 1
            later = await call_all(h.runner("L", run="run-2"))
            assert all(isinstance(r, CallAmbiguous) for r in later), later
            # The job then finishes (and bills) at the provider; a run asked to retry
            # ambiguous calls reads it first instead of paying for the batch again.
            provider.configure(job_stuck={})
            await asyncio.to_thread(
                provider.wait_ledger,
                lambda lg: lg["jobs_by_provider"]["fullenrich"].get("jobs_finished", 0) >= 1,
            )
            retried = await call_all(h.runner("T", run="run-3", retry_ambiguous=True))
            assert all(isinstance(r, ToolResult) for r in retried), retried
        ledger = fullenrich_ledger(provider)
        assert ledger["job_submits"] == 1 and ledger.get("duplicate_submits", 0) == 0
        assert credits_of(retried) == ledger["credits"]
    finally:
        provider.configure(job_stuck={})


# ---------------------------------------------------------------------------- G8


async def test_orphaned_live_jobs_do_not_hold_the_queue(provider: Any, tmp_path: Path) -> None:
    """G8: ``max_jobs_in_flight`` live jobs of ended runs (never looked at again, long
    past any wait) fill the ledger's count: a later submit still goes."""
    provider.configure(job_latency_s={"fullenrich": [0.05, 0.2]})
    catalog = job_catalog(provider.base_url, max_wait=1.0)
    spec = catalog.tools["fullenrich_contact"].job
    assert spec is not None and spec.max_jobs_in_flight is not None
    long_ago = time.time() - 3600
    async with harness(tmp_path, catalog) as h:
        for n in range(spec.max_jobs_in_flight):  # the orphans: opened an hour ago
            key = f"fullenrich_contact#job:orphan{n}"
            await h.jobs.open(
                Job(
                    key=key,
                    tool_id="fullenrich_contact",
                    provider="fullenrich",
                    request={"method": "POST", "path": "/x", "body": {}},
                    members=[f"orphan-member-{n}"],
                    opened_at=long_ago,
                )
            )
            await h.jobs.submitted(key, f"gone-{n}")
        assert await h.jobs.live("fullenrich") == spec.max_jobs_in_flight
        results = await until_settled(lambda n: h.runner(f"R{n}"), deadline_s=20)
        assert all(isinstance(r, ToolResult) for r in results), results
    ledger = fullenrich_ledger(provider)
    assert ledger["job_submits"] == 1 and ledger["job_members"] == len(PEOPLE)


# --------------------------------------------------------------------------- G11


async def test_a_job_out_of_credits_part_way_completes_the_members_it_billed(
    provider: Any, tmp_path: Path
) -> None:
    """G11, with the FullEnrich preset: two of four contacts are enriched and billed,
    then the job reads ``CREDITS_INSUFFICIENT`` (its status body holding those two
    results). The two complete with their results at what the provider billed; only
    the other two fail, and only they are submitted again by the next run."""
    people = [
        {"firstname": f"Fn{n}", "lastname": f"Ln{n}", "domain": "co.example"} for n in range(4)
    ]
    stuck = ["Ln2", "Ln3"]
    provider.configure(
        job_latency_s={"fullenrich": [0.05, 0.2]},
        job_stuck_last_names=stuck,
        hit_rates={"fullenrich": 1.0},
    )
    catalog = fullenrich_preset(provider.base_url)
    try:
        async with harness(tmp_path, catalog) as h:
            first = await call_all(h.runner("A"), people)
            assert all(isinstance(r, JobPending) for r in first), first
            ledger = await asyncio.to_thread(
                provider.wait_ledger, lambda lg: lg["charged_by_provider"].get("fullenrich", 0) >= 2
            )
            billed = ledger["credits_by_provider"]["fullenrich"]
            assert billed > 0
            # The provider now ends the job: out of credits, the two finished in the body.
            job = next(iter(await h.jobs.counts()))
            assert job.pending == 1
            stored = await _only_job(h.jobs)
            assert stored.job_id is not None
            async with httpx.AsyncClient() as http:
                answer = await http.get(
                    f"{provider.base_url}/fullenrich/api/v1/contact/enrich/bulk/{stored.job_id}",
                    headers={"Authorization": f"Bearer {KEY}"},
                )
            body = {**answer.json(), "status": "CREDITS_INSUFFICIENT"}
            assert len(body["datas"]) == 2
            await h.jobs.record_status(
                stored.key, state="failed", status=body, error="job state 'CREDITS_INSUFFICIENT'"
            )
            read = await call_all(h.runner("B"), people)
            assert kinds(read) == ["ToolResult", "ToolResult", "JobFailed", "JobFailed"], read
            assert credits_of(read) == billed
            assert isinstance(read[2], JobFailed) and "CREDITS_INSUFFICIENT" in str(read[2])
            # After a top-up, the next run submits the two that failed, not the two paid.
            provider.configure(job_stuck_last_names=[])
            later = await until_settled(lambda n: h.runner(f"L{n}", run="run-2"), people)
            assert all(isinstance(r, ToolResult) for r in later), later
        ledger = fullenrich_ledger(provider)
        assert ledger["job_submits"] == 2, (ledger, provider.calls())
        assert ledger["job_members"] == 4 + 2
        assert ledger["duplicate_submits"] == 2  # only the two that never finished
    finally:
        provider.configure(job_stuck_last_names=[], hit_rates=dict(DEFAULT_HIT_RATES))


async def _only_job(jobs: JobStore) -> Job:
    assert isinstance(jobs, JobLedger)
    db = await jobs._ready()
    keys = await db.read(lambda conn: [r[0] for r in conn.all("SELECT key FROM playline_jobs")])
    assert len(keys) == 1, keys
    job = await jobs.get(keys[0])
    assert job is not None
    return job


# --------------------------------------------------------------------------- G13


async def test_two_callers_racing_on_an_opened_job_send_its_submit_once(
    provider: Any, tmp_path: Path
) -> None:
    """G13: two attempts find the same ``opened`` job (its first sender parked, or
    crashed before marking it) and look at it at once: exactly one sends."""
    provider.configure(job_latency_s={"fullenrich": [0.05, 0.2]})
    catalog = job_catalog(provider.base_url)
    tool = catalog.tools["fullenrich_contact"]
    async with harness(tmp_path, catalog) as h:
        body = {
            "name": "playline-test",
            "datas": [
                {**p, "enrich_fields": ["contact.emails"], "custom": {"playline_id": str(n)}}
                for n, p in enumerate(PEOPLE)
            ],
        }
        job = await h.jobs.open(
            Job(
                key="fullenrich_contact#job:raced",
                tool_id=tool.id,
                provider=tool.provider,
                request={"method": "POST", "path": tool.path, "body": body, "run": "run-1"},
                members=[f"m{n}" for n in range(len(PEOPLE))],
            )
        )
        one, two = h.dispatcher("A"), h.dispatcher("B")
        looked = await asyncio.gather(one._look(tool, job), two._look(tool, job))
        stored = await h.jobs.get(job.key)
    assert stored is not None and stored.state == "running" and stored.job_id is not None
    assert sorted(j.state for j in looked) in (["running", "running"], ["running", "sending"])
    ledger = fullenrich_ledger(provider)
    assert ledger["job_submits"] == 1 and ledger.get("duplicate_submits", 0) == 0
