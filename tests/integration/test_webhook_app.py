"""The webhook receiver's app over a real SQLite job ledger and a recording ``notify``:
what a delivery stores, whom it wakes, and what it refuses (and that a refusal stores
nothing and echoes no secret)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from playline.calls.catalog import Catalog
from playline.stores.jobs import Job, JobStore
from playline.stores.jobs_ledger import JobLedger
from playline.webhook import sign, webhook_app
from tests.webhooks import (
    SECRET,
    SECRET_ENV,
    SIGNATURE_HEADER,
    body_bytes,
    catalog,
    finished,
    open_job,
    signed,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        self.now += 1.0  # every reading later than the last: a rewrite shows in polled_at
        return self.now


class Notified:
    """A recording ``notify``; ``gone`` workflow ids fail as a finished run's signal does."""

    def __init__(self, gone: tuple[str, ...] = ()) -> None:
        self.calls: list[str] = []
        self.gone = gone

    async def __call__(self, workflow_id: str) -> None:
        self.calls.append(workflow_id)
        if workflow_id in self.gone:
            raise RuntimeError(f"workflow {workflow_id} not found")


@pytest.fixture
async def jobs(tmp_path: Path) -> AsyncIterator[JobLedger]:
    store = JobLedger.in_file(tmp_path / "jobs.db", clock=Clock())
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
def notified() -> Notified:
    return Notified()


def http(
    jobs: JobStore, notify: Notified, environ: dict[str, str] | None = None, **options: Any
) -> httpx.AsyncClient:
    env = {SECRET_ENV: SECRET} if environ is None else environ
    app = webhook_app(jobs, catalog(), notify, env, **options)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://hooks")


async def post(
    client: httpx.AsyncClient,
    job: Job,
    body: Any,
    *,
    provider: str | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    raw = body if isinstance(body, bytes) else body_bytes(body)
    return await client.post(
        f"/hooks/{provider or job.provider}/{job.token}",
        content=raw,
        headers=signed(raw) if headers is None else headers,
    )


async def test_a_valid_delivery_stores_the_status_and_wakes_each_waiter(
    jobs: JobLedger, notified: Notified
) -> None:
    job = await open_job(jobs, waiters=("run-a", "run-b"))
    async with http(jobs, notified) as client:
        answer = await post(client, job, finished())
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"ok": True}
    stored = await jobs.get(job.key)
    assert stored is not None
    assert stored.state == "done"
    assert stored.status == finished()
    assert stored.error is None
    assert stored.finished_at is not None
    assert sorted(notified.calls) == ["run-a", "run-b"]


async def test_a_duplicate_delivery_changes_nothing_and_wakes_nobody(
    jobs: JobLedger, notified: Notified
) -> None:
    job = await open_job(jobs, waiters=("run-a",))
    running = {"status": "IN_PROGRESS", "datas": [{"custom": {"row": 0}, "email": "a@x.co"}]}
    async with http(jobs, notified) as client:
        assert (await post(client, job, running)).json() == {"ok": True}
        before = await jobs.get(job.key)
        notified.calls.clear()
        # The provider retries with the same content, serialised differently: still a duplicate.
        again = await post(
            client, job, b'{"datas":[{"email":"a@x.co","custom":{"row":0}}],"status":"IN_PROGRESS"}'
        )
    assert again.status_code == 200
    assert again.json() == {"duplicate": True}
    assert await jobs.get(job.key) == before  # not even polled_at moved
    assert notified.calls == []


async def test_a_bad_or_missing_signature_is_401_and_stores_nothing(
    jobs: JobLedger, notified: Notified
) -> None:
    job = await open_job(jobs, waiters=("run-a",))
    raw = body_bytes(finished())
    forged = signed(raw, secret="not-the-secret")
    async with http(jobs, notified) as client:
        wrong = await post(client, job, raw, headers=forged)
        missing = await post(client, job, raw, headers={"content-type": "application/json"})
        tampered = await post(client, job, raw + b" ", headers=signed(raw))
        for answer in (wrong, missing, tampered):
            assert answer.status_code == 401
            assert answer.json() == {
                "error": f"missing or wrong signature in header {SIGNATURE_HEADER}"
            }
        stored = await jobs.get(job.key)
        assert stored is not None
        assert (stored.state, stored.status, stored.polled_at) == ("running", None, None)
        assert notified.calls == []
        # No delivery was recorded either: the genuine one is not a "duplicate".
        assert (await post(client, job, raw)).json() == {"ok": True}


async def test_an_unknown_token_or_another_providers_job_is_404_without_the_token(
    jobs: JobLedger, notified: Notified
) -> None:
    job = await open_job(jobs)
    raw = body_bytes(finished())
    async with http(jobs, notified) as client:
        unknown = await client.post("/hooks/lateco/not-a-token", content=raw, headers=signed(raw))
        wrong_provider = await post(client, job, raw, provider="plainco")
    for answer in (unknown, wrong_provider):
        assert answer.status_code == 404
        assert answer.json() == {"error": "no such job for this provider"}
        assert job.token not in answer.text
    stored = await jobs.get(job.key)
    assert stored is not None
    assert stored.state == "running"
    assert notified.calls == []


async def test_a_body_that_is_not_json_is_400(jobs: JobLedger, notified: Notified) -> None:
    job = await open_job(jobs, waiters=("run-a",))
    async with http(jobs, notified) as client:
        for raw in (b"status=FINISHED", b"", b'{"status": NaN}', b"\xff\xfe"):
            answer = await post(client, job, raw)  # correctly signed, still refused
            assert answer.status_code == 400, raw
            assert answer.json() == {"error": "the body is not JSON"}
    stored = await jobs.get(job.key)
    assert stored is not None
    assert stored.status is None
    assert notified.calls == []


async def test_a_running_delivery_with_partial_results_is_stored_as_running(
    jobs: JobLedger, notified: Notified
) -> None:
    job = await open_job(jobs, waiters=("run-a",))
    partial = {
        "status": "IN_PROGRESS",
        "datas": [{"custom": {"row": 1}, "contact": {"email": "p1@x.co"}}],
    }
    async with http(jobs, notified) as client:
        assert (await post(client, job, partial)).json() == {"ok": True}
        stored = await jobs.get(job.key)
        assert stored is not None
        assert (stored.state, stored.status, stored.finished_at) == ("running", partial, None)
        assert (await post(client, job, finished())).json() == {"ok": True}
    stored = await jobs.get(job.key)
    assert stored is not None
    assert (stored.state, stored.status) == ("done", finished())
    assert notified.calls == ["run-a", "run-a"]  # woken by each distinct delivery


async def test_a_failed_state_is_stored_with_its_reason(
    jobs: JobLedger, notified: Notified
) -> None:
    job = await open_job(jobs, waiters=("run-a",))
    body = {"status": "CREDITS_INSUFFICIENT", "error": "not enough credits left"}
    async with http(jobs, notified) as client:
        assert (await post(client, job, body)).json() == {"ok": True}
    stored = await jobs.get(job.key)
    assert stored is not None
    assert stored.state == "failed"
    assert stored.status == body
    assert stored.error == "job state 'CREDITS_INSUFFICIENT': not enough credits left"
    assert notified.calls == ["run-a"]


async def test_an_unsigned_tool_takes_deliveries_by_its_token_alone(
    jobs: JobLedger, notified: Notified
) -> None:
    job = await open_job(jobs, tool_id="plain_enrich", provider="plainco", waiters=("run-p",))
    async with http(jobs, notified, environ={}) as client:
        answer = await post(
            client, job, {"success": True, "data": [{"email": "a@x.co"}]}, headers={}
        )
    assert answer.json() == {"ok": True}
    stored = await jobs.get(job.key)
    assert stored is not None
    assert stored.state == "done"
    assert notified.calls == ["run-p"]


async def test_a_tool_without_webhooks_refuses_deliveries(
    jobs: JobLedger, notified: Notified
) -> None:
    job = await open_job(jobs, tool_id="poll_enrich", provider="pollco")
    async with http(jobs, notified) as client:
        answer = await post(client, job, {"state": "done", "result": {}}, headers={})
    assert answer.status_code == 404
    assert answer.json() == {"error": "this job's tool takes no webhooks"}
    stored = await jobs.get(job.key)
    assert stored is not None
    assert stored.state == "running"


async def test_an_unset_secret_is_500_naming_the_variable(
    jobs: JobLedger, notified: Notified
) -> None:
    job = await open_job(jobs)
    async with http(jobs, notified, environ={}) as client:
        answer = await post(client, job, finished())
    assert answer.status_code == 500
    assert f"${SECRET_ENV}" in answer.json()["error"]
    stored = await jobs.get(job.key)
    assert stored is not None
    assert stored.status is None


async def test_a_body_over_the_limit_is_413(jobs: JobLedger, notified: Notified) -> None:
    job = await open_job(jobs)
    raw = body_bytes({"status": "FINISHED", "datas": ["x" * 2000]})
    async with http(jobs, notified, max_body_bytes=1000) as client:
        answer = await post(client, job, raw)

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: read until the limit
            for _ in range(5):
                yield b" " * 400

        streamed = await client.post(f"/hooks/lateco/{job.token}", content=chunks())
    assert (answer.status_code, streamed.status_code) == (413, 413)
    stored = await jobs.get(job.key)
    assert stored is not None
    assert stored.status is None


async def test_a_run_that_is_gone_does_not_stop_the_others_being_woken(
    jobs: JobLedger,
) -> None:
    notify = Notified(gone=("run-gone",))
    job = await open_job(jobs, waiters=("run-gone", "run-here"))
    await jobs.add_waiter([job.key], "run-late")  # added after the lookup's snapshot too
    async with http(jobs, notify) as client:
        answer = await post(client, job, finished())
    assert answer.json() == {"ok": True}
    assert sorted(notify.calls) == ["run-gone", "run-here", "run-late"]
    stored = await jobs.get(job.key)
    assert stored is not None
    assert stored.state == "done"


class BrokenStore:
    """A job store whose calls named in ``broken`` fail as a locked or lost database does."""

    def __init__(self, inner: JobStore, *broken: str) -> None:
        self.inner = inner
        self.broken = broken

    def __getattr__(self, name: str) -> Any:
        if name in self.broken:

            async def fail(*args: Any, **kwargs: Any) -> Any:
                raise OSError("database is locked")

            return fail
        return getattr(self.inner, name)


@pytest.mark.parametrize("broken", ["by_token", "record_delivery", "record_status"])
async def test_a_store_error_is_503_so_the_provider_delivers_again(
    jobs: JobLedger, notified: Notified, broken: str
) -> None:
    job = await open_job(jobs, waiters=("run-a",))
    async with http(BrokenStore(jobs, broken), notified) as client:
        answer = await post(client, job, finished())
    assert answer.status_code == 503
    assert answer.json() == {"error": "the job store is unavailable; deliver again later"}
    assert notified.calls == []


async def test_health_and_logs_that_hold_no_secret(
    jobs: JobLedger, notified: Notified, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    job = await open_job(jobs, waiters=("run-a",))
    marker = "body-marker-7f3a"
    body = {**finished(), "note": marker}
    raw = body_bytes(body)
    async with http(jobs, notified) as client:
        assert (await client.get("/healthz")).status_code == 200
        await post(client, job, raw, headers=signed(raw, secret="wrong"))
        await post(client, job, raw)
        await post(client, job, raw)  # duplicate
        await client.post(f"/hooks/lateco/{job.token}x", content=raw)
    async with http(jobs, notified, environ={}) as client:
        await post(client, job, raw)
    # (the test's own HTTP client logs the URLs it calls: only the receiver's logs count)
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("playline"))
    assert job.key in logged
    for secret in (job.token, SECRET, signed(raw)[SIGNATURE_HEADER], marker):
        assert secret not in logged


# ------------------------------------------------- G16: the body must be the URL's job


def _fullenrich_body(job_id: str, email: str) -> dict[str, Any]:
    """A FullEnrich finished job's webhook body, in the provider's shape (``id``)."""
    return {
        "id": job_id,
        "name": "playline",
        "status": "FINISHED",
        "datas": [
            {"custom": {"playline_id": "0"}, "contact": {"most_probable_email": email}},
        ],
        "cost": {"credits": 1},
    }


async def test_a_signed_fullenrich_body_of_another_job_is_refused_and_nothing_recorded(
    jobs: JobLedger, notified: Notified
) -> None:
    """G16: job A's body, validly signed with the account's key (FullEnrich signs with
    the API key), posted to job B's URL is refused; B's own body then lands."""
    key = "fullenrich-account-key"
    preset = Catalog.model_validate({"include": ["fullenrich"]})
    job_a = await open_job(
        jobs, tool_id="fullenrich_contact", provider="fullenrich", members=1, job_id="E-A"
    )
    job_b = await open_job(
        jobs,
        tool_id="fullenrich_contact",
        provider="fullenrich",
        members=1,
        job_id="E-B",
        waiters=("run-b",),
    )
    app = webhook_app(jobs, preset, notified, {"FULLENRICH_API_KEY": key})

    def fullenrich_signed(raw: bytes) -> dict[str, str]:
        return {"X-Signature-SHA1": sign("hmac-sha1", key.encode(), raw)}

    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://hooks"
    ) as client:
        raw_a = body_bytes(_fullenrich_body("E-A", "someone.else@a.example"))
        crossed = await post(client, job_b, raw_a, headers=fullenrich_signed(raw_a))
        no_id = {k: v for k, v in _fullenrich_body("E-B", "b@b.example").items() if k != "id"}
        raw_none = body_bytes(no_id)
        unnamed = await post(client, job_b, raw_none, headers=fullenrich_signed(raw_none))
        assert (crossed.status_code, unnamed.status_code) == (409, 409), crossed.text
        assert "another job" in crossed.json()["error"]
        stored = await jobs.get(job_b.key)
        assert stored is not None
        assert (stored.state, stored.status, stored.polled_at) == ("running", None, None)
        assert notified.calls == []
        # Nothing was recorded: A's body to A's URL, and B's own body, are first deliveries.
        assert (await post(client, job_a, raw_a, headers=fullenrich_signed(raw_a))).json() == {
            "ok": True
        }
        raw_b = body_bytes(_fullenrich_body("E-B", "b@b.example"))
        answer = await post(client, job_b, raw_b, headers=fullenrich_signed(raw_b))
    assert answer.json() == {"ok": True}
    stored = await jobs.get(job_b.key)
    assert stored is not None
    assert stored.state == "done"
    assert stored.status["datas"][0]["contact"]["most_probable_email"] == "b@b.example"
    assert notified.calls == ["run-b"]


async def test_an_unsigned_body_naming_another_job_is_refused(
    jobs: JobLedger, notified: Notified
) -> None:
    """G16, unsigned (the URL's token its only secret): a body naming another job id is
    refused and nothing recorded; a body that names none is the token's job's."""
    job = await open_job(
        jobs, tool_id="plain_enrich", provider="plainco", waiters=("run-p",), job_id="R-1"
    )
    other = {"success": True, "request_id": "R-2", "data": [{"email": "x@other.example"}]}
    own = {"success": True, "request_id": "R-1", "data": [{"email": "a@x.co"}]}
    async with http(jobs, notified, environ={}) as client:
        refused = await post(client, job, other, headers={})
        assert refused.status_code == 409
        stored = await jobs.get(job.key)
        assert stored is not None
        assert (stored.state, stored.status) == ("running", None)
        assert notified.calls == []
        answer = await post(client, job, own, headers={})
    assert answer.json() == {"ok": True}
    stored = await jobs.get(job.key)
    assert stored is not None
    assert (stored.state, stored.status) == ("done", own)
    assert notified.calls == ["run-p"]
