"""The job ledger's contract, on SQLite and on PostgreSQL (``stores`` fixture).

A job is recorded once per key with its members (insert-if-absent), steps through
its states and never leaves a finished one, is found by member, by provider job id
and by token; waiters and webhook deliveries are de-duplicated; counts are per
provider. Real SQLite files (shared by processes), real PostgreSQL.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from playline.config import Settings
from playline.errors import UnknownJob
from playline.stores.backends import Stores, open_stores
from playline.stores.jobs import Job, JobCounts, JobStore, member_ref
from playline.stores.jobs_ledger import JobLedger
from tests.integration.conftest import Clock
from tests.pg import pg_schema

REQUEST = {"method": "POST", "path": "/v1/jobs", "body": {"rows": [{"d": "acme.com"}]}}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A fresh, empty store location of each backend (PostgreSQL: marked ``postgres``)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store'}"
        return
    async with pg_schema() as url:
        yield url


@pytest.fixture
async def stores(store_url: str, clock: Clock) -> AsyncIterator[Stores]:
    opened = await open_stores(Settings(store_url=store_url), create=True, clock=clock)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def jobs(stores: Stores) -> JobStore:
    return stores.jobs


def _job(
    key: str = "acme.find#job:1",
    members: list[str] | None = None,
    *,
    provider: str = "acme",
    **fields: Any,
) -> Job:
    fields.setdefault("request", REQUEST)
    return Job(
        key=key,
        tool_id=key.partition("#")[0],
        provider=provider,
        members=["r:1", "r:2"] if members is None else members,
        **fields,
    )


async def _stored(jobs: JobStore, key: str) -> Job:
    job = await jobs.get(key)
    assert job is not None, key
    return job


# -------------------------------------------------------------------- opening


async def test_open_records_the_job_with_the_stores_clock_and_a_token(
    jobs: JobStore, clock: Clock
) -> None:
    clock.now = 1_234.5
    job = await jobs.open(_job(members=["r:2", "r:1"]))

    assert (job.state, job.opened_at, job.job_id) == ("opened", 1_234.5, None)
    assert job.token and len(job.token) >= 20
    assert job.members == ["r:2", "r:1"]  # in submit order
    assert job.request == REQUEST
    assert await _stored(jobs, job.key) == job
    assert await jobs.get("acme.find#job:other") is None


async def test_a_second_open_of_one_key_returns_the_first_job_unchanged(
    jobs: JobStore, clock: Clock
) -> None:
    first = await jobs.open(_job(members=["r:1", "r:2"], token="t-first"))
    clock.now += 10
    again = await jobs.open(
        _job(members=["r:3"], token="t-second", request={"method": "GET", "path": "/x"})
    )

    assert again == first
    assert (again.token, again.members, again.opened_at) == ("t-first", ["r:1", "r:2"], 1_000.0)
    found = await jobs.jobs_of(["r:1", "r:2", "r:3"])
    assert set(found) == {"r:1", "r:2"}  # the second open indexed nothing
    assert await jobs.by_token("t-second") is None


async def test_opens_of_one_key_at_once_record_one_job(stores: Stores, store_url: str) -> None:
    async with await open_stores(Settings(store_url=store_url), create=True) as other:
        opened = await asyncio.gather(
            *(
                (stores if n % 2 else other).jobs.open(_job(members=[f"r:{n}"], token=f"t{n}"))
                for n in range(8)
            )
        )
    assert all(job == opened[0] for job in opened)
    assert list(await stores.jobs.jobs_of([f"r:{n}" for n in range(8)])) == opened[0].members


async def test_an_explicit_opened_at_and_status_are_kept_through_json(jobs: JobStore) -> None:
    status = {"état": "queued", "n": [1, 2.5, None, True], "nul": "a\u0000b"}
    job = await jobs.open(_job(opened_at=42.0, status=status, waiters=["wf-1", "wf-1"]))

    assert job.opened_at == 42.0
    assert job.status == status
    assert job.waiters == ["wf-1"]
    stored = await jobs.record_status(job.key, state="running", status=status)
    assert stored.status == status


# --------------------------------------------------------------------- states


async def test_a_job_steps_from_opened_to_done(jobs: JobStore, clock: Clock) -> None:
    job = await jobs.open(_job())

    clock.now = 1_001.0
    await jobs.mark_submitting(job.key)
    assert (await _stored(jobs, job.key)).state == "sending"

    clock.now = 1_002.0
    running = await jobs.submitted(job.key, "prov-77")
    assert (running.state, running.job_id, running.submitted_at) == ("running", "prov-77", 1_002.0)
    assert await _stored(jobs, job.key) == running

    clock.now = 1_003.0
    polled = await jobs.record_status(job.key, state="running", status={"progress": 0.5})
    assert (polled.state, polled.polled_at, polled.finished_at) == ("running", 1_003.0, None)
    assert polled.status == {"progress": 0.5}

    clock.now = 1_004.0
    done = await jobs.record_status(job.key, state="done", status={"results": [1, 2]})
    assert (done.state, done.polled_at, done.finished_at) == ("done", 1_004.0, 1_004.0)
    assert done.status == {"results": [1, 2]}
    assert done.submitted_at == 1_002.0 and done.job_id == "prov-77"
    assert await _stored(jobs, job.key) == done


async def test_submit_steps_are_idempotent(jobs: JobStore, clock: Clock) -> None:
    job = await jobs.open(_job())
    await jobs.mark_submitting(job.key)
    first = await jobs.submitted(job.key, "prov-1")
    clock.now += 5
    await jobs.mark_submitting(job.key)  # running: left as it is
    again = await jobs.submitted(job.key, "prov-2")

    assert again == first
    assert (again.state, again.job_id, again.submitted_at) == ("running", "prov-1", 1_000.0)


async def test_a_finished_job_is_never_reopened(jobs: JobStore, clock: Clock) -> None:
    job = await jobs.open(_job())
    await jobs.submitted(job.key, "prov-1")
    clock.now = 1_010.0
    done = await jobs.record_status(job.key, state="done", status={"ok": True})

    clock.now = 1_020.0
    for state in ("opened", "sending", "running", "failed", "ambiguous"):
        late = await jobs.record_status(job.key, state=state, status={"late": state}, error="x")
        assert late == done
    await jobs.mark_submitting(job.key)
    assert await jobs.submitted(job.key, "prov-2") == done
    assert await _stored(jobs, job.key) == done


async def test_a_failed_job_takes_a_late_done_but_keeps_its_finished_at(
    jobs: JobStore, clock: Clock
) -> None:
    job = await jobs.open(_job())
    await jobs.mark_submitting(job.key)
    clock.now = 1_010.0
    ambiguous = await jobs.record_status(
        job.key, state="ambiguous", status=None, error="no job id came back"
    )
    assert (ambiguous.state, ambiguous.finished_at, ambiguous.error) == (
        "ambiguous",
        1_010.0,
        "no job id came back",
    )
    # Sent without a job id: a late job id is kept, the job stays finished.
    late_id = await jobs.submitted(job.key, "prov-9")
    assert (late_id.state, late_id.job_id) == ("ambiguous", "prov-9")

    clock.now = 1_020.0
    assert (await jobs.record_status(job.key, state="running", status={})).state == "ambiguous"
    done = await jobs.record_status(job.key, state="done", status={"results": []})
    assert (done.state, done.error, done.finished_at, done.polled_at) == (
        "done",
        None,
        1_010.0,
        1_020.0,
    )


async def test_unknown_jobs_and_states_are_refused(jobs: JobStore) -> None:
    with pytest.raises(UnknownJob, match="no job 'nope'"):
        await jobs.mark_submitting("nope")
    with pytest.raises(UnknownJob):
        await jobs.submitted("nope", "prov-1")
    with pytest.raises(UnknownJob):
        await jobs.record_status("nope", state="done", status={})
    job = await jobs.open(_job())
    with pytest.raises(ValueError, match="job state 'finished'"):
        await jobs.record_status(job.key, state="finished", status={})  # type: ignore[arg-type]
    assert (await _stored(jobs, job.key)).state == "opened"


# --------------------------------------------------------------------- lookups


async def test_jobs_of_gives_each_members_latest_job(jobs: JobStore, clock: Clock) -> None:
    first = await jobs.open(_job("t#job:1", ["r:1", "r:2"]))
    await jobs.record_status(first.key, state="failed", status=None, error="timed out")
    clock.now += 1
    retry = await jobs.open(_job("t#job:2", [member_ref("r:1", 1), "r:1"]))
    # Opened at the same time as the retry: the later recorded is the latest.
    same_time = await jobs.open(_job("t#job:3", ["r:2"]))

    found = await jobs.jobs_of(["r:1", "r:2", member_ref("r:1", 1), "r:9", "r:1"])

    assert {member: job.key for member, job in found.items()} == {
        "r:1": retry.key,
        "r:2": same_time.key,
        "r:1#1": retry.key,
    }
    assert found["r:1"] == retry
    assert await jobs.jobs_of([]) == {}


async def test_jobs_of_many_members(jobs: JobStore) -> None:
    members = [f"r:{n}" for n in range(1_200)]
    await jobs.open(_job("t#job:big", members))
    found = await jobs.jobs_of(members)
    assert len(found) == 1_200 and {job.key for job in found.values()} == {"t#job:big"}


async def test_a_job_is_found_by_its_provider_job_id_and_by_its_token(jobs: JobStore) -> None:
    job = await jobs.open(_job(token="secret-1"))
    other = await jobs.open(_job("firmo.x#job:1", provider="firmo", token="secret-2"))
    await jobs.submitted(job.key, "J-1")
    await jobs.submitted(other.key, "J-1")

    by_id = await jobs.by_job_id("acme", "J-1")
    assert by_id is not None and by_id.key == job.key
    by_id = await jobs.by_job_id("firmo", "J-1")
    assert by_id is not None and by_id.key == other.key
    assert await jobs.by_job_id("acme", "J-2") is None
    assert await jobs.by_job_id("mailfox", "J-1") is None

    by_token = await jobs.by_token("secret-2")
    assert by_token is not None and by_token.key == other.key
    assert await jobs.by_token("secret-3") is None
    assert await jobs.by_token("") is None


# ----------------------------------------------------------- waiters, deliveries


async def test_add_waiter_is_idempotent(jobs: JobStore) -> None:
    a = await jobs.open(_job("t#job:a"))
    b = await jobs.open(_job("t#job:b", ["r:3"]))

    await jobs.add_waiter([a.key, b.key, "t#job:missing"], "wf-1")
    await jobs.add_waiter([a.key, a.key], "wf-1")
    await jobs.add_waiter([a.key], "wf-2")
    await jobs.add_waiter([], "wf-3")

    assert (await _stored(jobs, a.key)).waiters == ["wf-1", "wf-2"]
    assert (await _stored(jobs, b.key)).waiters == ["wf-1"]
    assert await jobs.get("t#job:missing") is None
    assert [c.pending for c in await jobs.counts("wf-1")] == [2]


async def test_a_delivery_is_recorded_once(jobs: JobStore) -> None:
    job = await jobs.open(_job())
    assert await jobs.record_delivery(job.key, "d1") is True
    assert await jobs.record_delivery(job.key, "d1") is False
    assert await jobs.record_delivery(job.key, "d2") is True
    assert await jobs.record_delivery("t#job:other", "d1") is True


# --------------------------------------------------------------------- counts


async def test_live_counts_the_providers_jobs_in_flight(jobs: JobStore) -> None:
    assert await jobs.live("acme") == 0
    keys = [(await jobs.open(_job(f"t#job:{n}", [f"r:{n}"]))).key for n in range(5)]
    await jobs.open(_job("f#job:1", ["r:f"], provider="firmo"))
    await jobs.mark_submitting(keys[1])
    await jobs.submitted(keys[2], "J-2")
    await jobs.record_status(keys[3], state="done", status={})
    await jobs.record_status(keys[4], state="ambiguous", status=None, error="lost")

    assert await jobs.live("acme") == 3
    assert await jobs.live("firmo") == 1
    assert await jobs.live("mailfox") == 0


async def test_live_leaves_out_jobs_older_than_the_longest_wait(
    jobs: JobStore, clock: Clock
) -> None:
    """G8: with ``max_age_s``, live jobs opened longer ago than that (orphans of ended
    runs) are not counted against the provider's jobs in flight."""
    clock.now = 1_000.0
    old = [(await jobs.open(_job(f"t#job:old{n}", [f"r:old{n}"]))).key for n in range(3)]
    await jobs.submitted(old[0], "J-old")
    clock.now = 9_000.0
    await jobs.open(_job("t#job:new", ["r:new"]))
    clock.now = 9_050.0
    assert await jobs.live("acme") == 4
    assert await jobs.live("acme", max_age_s=100.0) == 1
    assert await jobs.live("acme", max_age_s=10_000.0) == 4


async def test_mark_submitting_is_a_compare_and_set(jobs: JobStore) -> None:
    """G13: of callers racing to mark one opened job ``sending``, exactly one wins."""
    job = await jobs.open(_job())
    won = await asyncio.gather(*(jobs.mark_submitting(job.key) for _ in range(6)))
    assert sorted(won) == [False] * 5 + [True]
    assert (await _stored(jobs, job.key)).state == "sending"
    assert await jobs.mark_submitting(job.key) is False  # sending: nobody else wins
    await jobs.submitted(job.key, "J-1")
    assert await jobs.mark_submitting(job.key) is False  # running: left as it is


async def test_counts_per_provider_with_a_waiter_filter(jobs: JobStore, clock: Clock) -> None:
    assert await jobs.counts() == []
    clock.now = 100.0
    a1 = await jobs.open(_job("a#job:1", ["r:1"]))
    clock.now = 200.0
    a2 = await jobs.open(_job("a#job:2", ["r:2"]))
    a3 = await jobs.open(_job("a#job:3", ["r:3"]))
    a4 = await jobs.open(_job("a#job:4", ["r:4"]))
    clock.now = 300.0
    f1 = await jobs.open(_job("f#job:1", ["r:5"], provider="firmo"))
    await jobs.record_status(a1.key, state="done", status={})
    await jobs.record_status(a3.key, state="failed", status=None, error="x")
    await jobs.record_status(a4.key, state="ambiguous", status=None, error="y")
    await jobs.add_waiter([a1.key, a2.key, f1.key], "wf-1")
    await jobs.add_waiter([a3.key], "wf-2")

    assert await jobs.counts() == [
        JobCounts("acme", pending=1, finished=1, failed=2, oldest_pending_at=200.0),
        JobCounts("firmo", pending=1, finished=0, failed=0, oldest_pending_at=300.0),
    ]
    assert await jobs.counts("wf-1") == [
        JobCounts("acme", pending=1, finished=1, failed=0, oldest_pending_at=200.0),
        JobCounts("firmo", pending=1, finished=0, failed=0, oldest_pending_at=300.0),
    ]
    assert await jobs.counts("wf-2") == [
        JobCounts("acme", pending=0, finished=0, failed=1, oldest_pending_at=None)
    ]
    assert await jobs.counts("wf-none") == []


# --------------------------------------------------------- sharing, the clock


async def test_two_stores_on_one_location_see_each_others_writes(
    stores: Stores, store_url: str
) -> None:
    async with await open_stores(Settings(store_url=store_url), create=False) as client:
        job = await stores.jobs.open(_job())
        assert await client.jobs.get(job.key) == job
        await client.jobs.submitted(job.key, "J-1")
        found = await stores.jobs.by_job_id("acme", "J-1")
        assert found is not None and found.state == "running"
        assert await client.jobs.record_delivery(job.key, "d") is True
        assert await stores.jobs.record_delivery(job.key, "d") is False


def _in_another_process(path: str, key: str) -> tuple[str, str]:
    """Run in a child process: read ``key``, open a job of its own, mark it sent."""

    async def run() -> tuple[str, str]:
        store = JobLedger.in_file(path)
        try:
            seen = await store.get(key)
            mine = await store.open(_job("child#job:1", ["r:child"], token="child-token"))
            await store.submitted(mine.key, "J-child")
            return ("missing" if seen is None else seen.state, mine.key)
        finally:
            await store.close()

    return asyncio.run(run())


async def test_processes_share_one_sqlite_ledger(tmp_path: Path) -> None:
    settings = Settings(store_url=f"sqlite:///{tmp_path}")
    async with await open_stores(settings, create=True) as stores:
        job = await stores.jobs.open(_job())
        await stores.jobs.mark_submitting(job.key)
        context = multiprocessing.get_context("spawn")
        with context.Pool(1) as pool:
            seen, key = await asyncio.to_thread(
                pool.apply, _in_another_process, (str(settings.jobs_path), job.key)
            )
        assert seen == "sending"
        child = await stores.jobs.by_token("child-token")
        assert child is not None and child.key == key
        assert (child.state, child.job_id) == ("running", "J-child")
        assert list(await stores.jobs.jobs_of(["r:child"])) == ["r:child"]


async def test_without_a_clock_times_come_from_the_real_clock(store_url: str) -> None:
    async with await open_stores(Settings(store_url=store_url), create=True) as stores:
        before = time.time()
        job = await stores.jobs.open(_job())
        done = await stores.jobs.record_status(job.key, state="done", status={})
    # SQLite: this machine's clock; PostgreSQL: the server's (the same machine here).
    assert before - 5 <= job.opened_at <= time.time() + 5
    assert done.finished_at is not None and done.finished_at >= job.opened_at - 1


# -------------------------------------------------------------- opening, closing


async def test_the_stores_open_the_job_ledger_and_close_it(tmp_path: Path, clock: Clock) -> None:
    settings = Settings(store_url=f"sqlite:///{tmp_path}")
    async with await open_stores(settings, create=True, clock=clock) as stores:
        assert isinstance(stores.jobs, JobLedger)
        assert stores.jobs.where == str(settings.jobs_path) == str(tmp_path / "jobs.db")
        assert not settings.jobs_path.exists()  # created by its first use only
        assert (await stores.jobs.open(_job())).opened_at == clock.now
        assert settings.jobs_path.is_file()
        jobs = stores.jobs
    assert not jobs._ready.opened  # closed with the stores
    async with await open_stores(settings, create=False) as client:
        assert await client.jobs.get(_job().key) is not None


async def test_a_client_that_never_uses_jobs_creates_no_ledger(tmp_path: Path) -> None:
    settings = Settings(store_url=f"sqlite:///{tmp_path}")
    async with await open_stores(settings, create=True):
        pass
    async with await open_stores(settings, create=False):
        pass
    assert not settings.jobs_path.exists()


@pytest.mark.postgres
async def test_postgres_stores_open_the_job_ledger() -> None:
    async with pg_schema() as url:
        async with await open_stores(Settings(store_url=url), create=True) as stores:
            assert isinstance(stores.jobs, JobLedger)
            await stores.jobs.open(_job())
        async with await open_stores(Settings(store_url=url), create=False) as client:
            assert await client.jobs.get(_job().key) is not None
