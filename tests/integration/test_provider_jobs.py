"""The provider server's asynchronous job providers (FullEnrich, Dropcontact), over real HTTP.

Submit, poll until done, map the results back (FullEnrich by ``custom``, Dropcontact by
order) and check them and their price against ``fake_data``; the 422s past the item
limits, the 429 past the queue cap, the polls' own rate-limit key; the ledger's job
counters; webhooks delivered to a small local receiver (signed with HMAC-SHA1),
retried, dropped and duplicated; jobs that never finish. Real HTTP to the session's
provider server subprocess; nothing is mocked and no timing is asserted: every wait
polls for a state, with a generous bound for a stuck server.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from aiohttp import web

from playline.provider_server import ProviderServerProcess, fake_data, free_port
from playline.provider_server.config import DEFAULT_HIT_RATES

FE_SUBMIT = "/fullenrich/api/v1/contact/enrich/bulk"
DC_SUBMIT = "/dropcontact/batch"
FE_KEY = "test-fullenrich-key"
FE = {"Authorization": f"Bearer {FE_KEY}"}
DC = {"X-Access-Token": "test-dropcontact-key"}
SECRET = "test-webhook-secret"
STUCK = "Neverending"
SIGNATURE = "X-Signature-SHA1"
FIRST = ("Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken")
LAST = ("Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov")
WAIT_S = 30.0

#: The job knobs as a fresh server has them (restored after each test).
JOB_DEFAULTS: dict[str, Any] = {
    "job_latency_s": {},
    "job_queue": {},
    "job_stuck": {},
    "job_stuck_last_names": [],
    "webhook_secret": {},
    "webhook_retry_s": {},
    "webhook_drop": {},
    "webhook_duplicates": {},
}


@pytest.fixture
def jobs(provider: ProviderServerProcess) -> Iterator[ProviderServerProcess]:
    """The provider server with fast jobs (0.2 to 0.8 s a contact) and fast retries."""
    provider.configure(
        **{
            **JOB_DEFAULTS,
            "job_latency_s": {"fullenrich": [0.2, 0.8], "dropcontact": [0.2, 0.8]},
            "webhook_retry_s": {"fullenrich": 0.1, "dropcontact": 0.1},
            "webhook_secret": {"fullenrich": SECRET},
        }
    )
    yield provider
    provider.reset()  # cancels the jobs and deliveries left
    provider.configure(**JOB_DEFAULTS)


@pytest.fixture
async def http(jobs: ProviderServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=jobs.base_url, timeout=30) as client:
        yield client


@dataclass
class Delivery:
    path_qs: str
    headers: dict[str, str]
    raw: bytes

    def json(self) -> Any:
        return json.loads(self.raw)


@dataclass
class Receiver:
    """A webhook receiver: records each POST and answers the next of ``statuses``
    (200 once they are used up)."""

    url: str = ""
    deliveries: list[Delivery] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.deliveries.append(
            Delivery(request.path_qs, dict(request.headers), await request.read())
        )
        status = self.statuses.pop(0) if self.statuses else 200
        return web.json_response({"ok": status < 300}, status=status)

    async def wait_for(self, count: int) -> list[Delivery]:
        await until(lambda: len(self.deliveries) >= count)
        return self.deliveries


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    receiver = Receiver()
    app = web.Application()
    app.router.add_post("/{tail:.*}", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    receiver.url = f"http://{host}:{port}"
    try:
        yield receiver
    finally:
        await runner.cleanup()


async def until(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the state was not reached within {timeout_s:g}s")
        await asyncio.sleep(0.05)


async def ledger_when(
    server: ProviderServerProcess, predicate: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    return await asyncio.to_thread(server.wait_ledger, predicate, WAIT_S, 0.05)


def job_counts(ledger: dict[str, Any], provider: str) -> dict[str, int]:
    counts: dict[str, int] = ledger["jobs_by_provider"].get(provider, {})
    return counts


def contacts(n: int, start: int = 0, **extra: Any) -> list[dict[str, Any]]:
    """``n`` FullEnrich contacts with their row number in ``custom``."""
    return [
        {
            "firstname": FIRST[i % len(FIRST)],
            "lastname": LAST[i % len(LAST)],
            "domain": f"company{i}.example",
            "custom": {"row": str(i)},
            **extra,
        }
        for i in range(start, start + n)
    ]


def records(n: int) -> list[dict[str, Any]]:
    """``n`` Dropcontact records: websites, company names, and some with no company."""
    result: list[dict[str, Any]] = []
    for i in range(n):
        record: dict[str, Any] = {"first_name": FIRST[i % len(FIRST)], "last_name": LAST[i % 5]}
        if i % 3 == 0:
            record["website"] = f"https://www.company{i}.example"
        elif i % 3 == 1:
            record["company"] = f"Company {i}"
            record["custom_fields"] = {"crm_id": f"crm-{i}"}
        result.append(record)
    return result


async def submit_fullenrich(
    http: httpx.AsyncClient, datas: list[dict[str, Any]], **body: Any
) -> str:
    response = await http.post(FE_SUBMIT, json={"name": "test", "datas": datas, **body}, headers=FE)
    assert response.status_code == 200, response.text
    enrichment_id: str = response.json()["enrichment_id"]
    uuid.UUID(enrichment_id)
    return enrichment_id


async def get_fullenrich(http: httpx.AsyncClient, enrichment_id: str) -> dict[str, Any]:
    response = await http.get(f"{FE_SUBMIT}/{enrichment_id}", headers=FE)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def poll(
    fetch: Callable[[], Awaitable[dict[str, Any]]],
    done: Callable[[dict[str, Any]], bool],
    seen: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Poll ``fetch`` until ``done``; every answer is appended to ``seen``."""
    deadline = time.monotonic() + WAIT_S
    while True:
        body = await fetch()
        if seen is not None:
            seen.append(body)
        if done(body):
            return body
        if time.monotonic() > deadline:
            raise TimeoutError(f"the job did not get there within {WAIT_S:g}s: {body}")
        await asyncio.sleep(0.05)


def finished(body: dict[str, Any]) -> bool:
    return body["status"] == "FINISHED"


def by_row(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["custom"]["row"]: d["contact"] for d in body["datas"]}


def signed(raw: bytes, secret: str) -> str:
    return hmac.new(secret.encode(), raw, hashlib.sha1).hexdigest()


# -- FullEnrich -----------------------------------------------------------------------


async def test_fullenrich_results_map_back_by_custom_and_bill_what_was_found(
    jobs: ProviderServerProcess, http: httpx.AsyncClient
) -> None:
    rate = DEFAULT_HIT_RATES["fullenrich"]
    datas = contacts(8, enrich_fields=["contact.emails"])
    datas += contacts(8, start=8, enrich_fields=["contact.emails", "contact.phones"])
    expected = {c["custom"]["row"]: fake_data.fullenrich_contact(c, rate) for c in datas}
    prices = {row: fake_data.fullenrich_credits(c) for row, c in expected.items()}
    emails = sum(1 for c in expected.values() if c["most_probable_email"])
    phones = sum(1 for c in expected.values() if c["phones"])
    assert 0 < emails < len(datas) and phones > 0  # hits, misses and phones all occur
    assert sum(prices.values()) == emails + 10 * phones

    enrichment_id = await submit_fullenrich(http, datas)
    seen: list[dict[str, Any]] = []
    final = await poll(lambda: get_fullenrich(http, enrichment_id), finished, seen)

    for body in seen:  # while it runs: only finished contacts, billed as they finish
        assert body["id"] == enrichment_id and body["name"] == "test"
        assert body["status"] in ("CREATED", "IN_PROGRESS", "FINISHED")
        rows = by_row(body)
        assert all(contact == expected[row] for row, contact in rows.items())
        assert body["cost"]["credits"] == sum(prices[row] for row in rows)
    assert by_row(final) == expected
    assert final["cost"]["credits"] == sum(prices.values())

    ledger = jobs.ledger()
    counts = job_counts(ledger, "fullenrich")
    assert (counts["job_submits"], counts["jobs"], counts["job_members"]) == (1, 1, 16)
    assert (counts["duplicate_submits"], counts["jobs_finished"]) == (0, 1)
    assert counts["polls"] == len(seen)
    assert counts["webhooks_sent"] == 0  # no webhook_url
    assert ledger["credits_by_provider"]["fullenrich"] == sum(prices.values())
    assert ledger["credits_by_path"][FE_SUBMIT] == sum(prices.values())
    assert ledger["charged_by_provider"]["fullenrich"] == 16  # each contact, once
    assert ledger["double_charged"] == 0


async def test_a_stuck_contact_keeps_its_job_in_progress_while_the_others_finish(
    jobs: ProviderServerProcess, http: httpx.AsyncClient
) -> None:
    rate = DEFAULT_HIT_RATES["fullenrich"]
    jobs.configure(job_stuck_last_names=[STUCK])
    datas = contacts(4)
    datas.append({**contacts(1, start=4)[0], "lastname": STUCK})
    enrichment_id = await submit_fullenrich(http, datas)

    def four_done(body: dict[str, Any]) -> bool:
        return len(body["datas"]) == 4

    body = await poll(lambda: get_fullenrich(http, enrichment_id), four_done)
    expected = {c["custom"]["row"]: fake_data.fullenrich_contact(c, rate) for c in datas}
    assert body["status"] == "IN_PROGRESS"
    assert by_row(body) == {row: expected[row] for row in ("0", "1", "2", "3")}
    paid = sum(fake_data.fullenrich_credits(expected[row]) for row in ("0", "1", "2", "3"))
    assert body["cost"]["credits"] == paid
    await asyncio.sleep(1.0)  # past the slowest contact: the stuck one still is not done
    body = await get_fullenrich(http, enrichment_id)
    assert body["status"] == "IN_PROGRESS" and len(body["datas"]) == 4
    ledger = jobs.ledger()
    assert job_counts(ledger, "fullenrich")["jobs_finished"] == 0
    assert ledger["credits_by_provider"].get("fullenrich", 0) == paid

    jobs.configure(job_stuck_last_names=[])  # the provider recovers: the job finishes
    final = await poll(lambda: get_fullenrich(http, enrichment_id), finished)
    assert by_row(final) == expected


async def test_a_stuck_provider_never_finishes_a_job(
    jobs: ProviderServerProcess, http: httpx.AsyncClient
) -> None:
    jobs.configure(job_stuck={"fullenrich": True})
    enrichment_id = await submit_fullenrich(http, contacts(3))
    for _ in range(3):
        await asyncio.sleep(0.5)
        body = await get_fullenrich(http, enrichment_id)
        assert body["status"] == "IN_PROGRESS"
        assert body["datas"] == [] and body["cost"] == {"credits": 0}
    ledger = jobs.ledger()
    assert job_counts(ledger, "fullenrich")["jobs_finished"] == 0
    assert ledger["credits"] == 0 and ledger["charged"] == 0


# -- Dropcontact ----------------------------------------------------------------------


async def test_dropcontact_is_not_ready_until_done_then_answers_in_order(
    jobs: ProviderServerProcess, http: httpx.AsyncClient
) -> None:
    rate = DEFAULT_HIT_RATES["dropcontact"]
    jobs.configure(job_stuck={"dropcontact": True})
    data = records(24)
    expected = [fake_data.dropcontact_record(r, rate, siren=True) for r in data]
    found = sum(1 for r in expected if r.get("email"))
    assert 0 < found < len(data)

    body = {"data": data, "siren": True, "language": "en"}
    submitted = await http.post(DC_SUBMIT, json=body, headers=DC)
    assert submitted.status_code == 200, submitted.text
    answer = submitted.json()
    request_id = answer["request_id"]
    assert answer == {
        "success": True,
        "request_id": request_id,
        "error": False,
        "credits_left": 10_000,
    }

    async def fetch() -> dict[str, Any]:
        response = await http.get(f"{DC_SUBMIT}/{request_id}", headers=DC)
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result

    for _ in range(3):
        assert await fetch() == {
            "success": False,
            "reason": "Request not ready yet, try again in 30 seconds",
            "error": False,
        }
    assert jobs.ledger()["credits"] == 0  # billed when the job finishes

    jobs.configure(job_stuck={})
    final = await poll(fetch, lambda b: b["success"] is True)
    assert final == {"success": True, "error": False, "data": expected}
    assert [r.get("custom_fields") for r in final["data"]] == [r.get("custom_fields") for r in data]
    ledger = jobs.ledger()
    assert ledger["credits_by_provider"]["dropcontact"] == found
    assert ledger["charged_by_provider"]["dropcontact"] == len(data)
    assert job_counts(ledger, "dropcontact")["jobs_finished"] == 1

    again = await http.post(DC_SUBMIT, json={"data": data[:1]}, headers=DC)
    assert again.json()["credits_left"] == 10_000 - found


# -- validation, limits, the queue cap ---------------------------------------------------


async def test_submits_past_the_item_limits_or_malformed_are_refused(
    jobs: ProviderServerProcess, http: httpx.AsyncClient
) -> None:
    person = contacts(1)[0]
    bad_fullenrich: list[Any] = [
        {"name": "x", "datas": contacts(101)},
        {"name": "x", "datas": []},
        {"datas": contacts(1)},
        {"name": "x", "datas": [{"firstname": "Ada", "lastname": "Lovelace"}]},
        {"name": "x", "datas": [{**person, "custom": {"row": 1}}]},
        {"name": "x", "datas": [{**person, "enrich_fields": ["contact.fax"]}]},
        {"name": "x", "datas": contacts(1), "webhook_url": "not a url"},
    ]
    for body in bad_fullenrich:
        response = await http.post(FE_SUBMIT, json=body, headers=FE)
        assert response.status_code == 422, body
        assert isinstance(response.json()["error"], str)
    response = await http.post(FE_SUBMIT, content=b"{not json", headers=FE)
    assert response.status_code == 422

    too_many = await http.post(DC_SUBMIT, json={"data": records(251)}, headers=DC)
    assert too_many.status_code == 422
    assert too_many.json() == {
        "error": True,
        "reason": "Too many records, you can only submit up to 250 records",
        "success": False,
    }
    for body in ({"data": []}, {"data": [{"website": "x.example"}]}, {"data": [1]}):
        response = await http.post(DC_SUBMIT, json=body, headers=DC)
        assert response.status_code == 422, body
        assert response.json()["error"] is True

    ledger = jobs.ledger()
    assert ledger["jobs_by_provider"] == {}  # no job was created
    assert ledger["invalid"] == len(bad_fullenrich) + 1 + 1 + 3

    assert (
        await http.post(FE_SUBMIT, json={"name": "x", "datas": contacts(100)}, headers=FE)
    ).status_code == 200
    assert (await http.post(DC_SUBMIT, json={"data": records(250)}, headers=DC)).status_code == 200


async def test_a_submit_past_the_queue_cap_is_a_429(
    jobs: ProviderServerProcess, http: httpx.AsyncClient
) -> None:
    jobs.configure(job_queue={"fullenrich": 2}, job_stuck={"fullenrich": True})
    first = await submit_fullenrich(http, contacts(1))
    await submit_fullenrich(http, contacts(1, start=1))
    refused = await http.post(FE_SUBMIT, json={"name": "x", "datas": contacts(1)}, headers=FE)
    assert refused.status_code == 429
    assert int(refused.headers["Retry-After"]) >= 1
    assert "unfinished jobs" in refused.json()["error"]
    other_account = {"Authorization": "Bearer another-fullenrich-key"}
    response = await http.post(
        FE_SUBMIT, json={"name": "x", "datas": contacts(1)}, headers=other_account
    )
    assert response.status_code == 200  # the cap is per account
    # another account cannot read this account's job
    other_poll = await http.get(f"{FE_SUBMIT}/{first}", headers=other_account)
    assert other_poll.status_code == 404

    ledger = jobs.ledger()
    assert job_counts(ledger, "fullenrich")["job_submits"] == 3
    assert ledger["rate_limited_by_provider"] == {"fullenrich": 1}

    jobs.configure(job_stuck={})  # the queue drains, and the account may submit again
    await ledger_when(jobs, lambda led: job_counts(led, "fullenrich")["jobs_finished"] == 3)
    await submit_fullenrich(http, contacts(1, start=2))


async def test_submits_and_polls_are_limited_on_their_own_keys(
    jobs: ProviderServerProcess, http: httpx.AsyncClient
) -> None:
    jobs.configure(
        limiters={
            "fullenrich": [{"kind": "sliding_log", "limit": 1, "window_s": 60}],
            "fullenrich:poll": [{"kind": "sliding_log", "limit": 2, "window_s": 60}],
        }
    )
    enrichment_id = await submit_fullenrich(http, contacts(1))
    second = await http.post(FE_SUBMIT, json={"name": "x", "datas": contacts(1)}, headers=FE)
    assert second.status_code == 429 and "Retry-After" in second.headers
    await get_fullenrich(http, enrichment_id)  # the polls have their own limit
    await get_fullenrich(http, enrichment_id)
    third = await http.get(f"{FE_SUBMIT}/{enrichment_id}", headers=FE)
    assert third.status_code == 429
    ledger = jobs.ledger()
    assert ledger["rate_limited_by_provider"] == {"fullenrich": 1, "fullenrich:poll": 1}
    assert job_counts(ledger, "fullenrich")["polls"] == 2
    assert job_counts(ledger, "fullenrich")["job_submits"] == 1


async def test_auth_unknown_ids_and_reset(
    jobs: ProviderServerProcess, http: httpx.AsyncClient
) -> None:
    assert (await http.post(FE_SUBMIT, json={"name": "x", "datas": contacts(1)})).status_code == 401
    assert (await http.post(DC_SUBMIT, json={"data": records(1)})).status_code == 401
    assert (await http.get(f"{FE_SUBMIT}/{uuid.uuid4()}")).status_code == 401
    assert (await http.get(f"{FE_SUBMIT}/{uuid.uuid4()}", headers=FE)).status_code == 404
    unknown = await http.get(f"{DC_SUBMIT}/nosuchrequest", headers=DC)
    assert unknown.status_code == 404 and unknown.json()["error"] is True

    jobs.configure(job_stuck={"fullenrich": True})
    enrichment_id = await submit_fullenrich(http, contacts(1))
    jobs.reset()  # the jobs are forgotten
    assert (await http.get(f"{FE_SUBMIT}/{enrichment_id}", headers=FE)).status_code == 404
    assert jobs.ledger()["jobs_by_provider"]["fullenrich"]["polls"] == 1


# -- the ledger -----------------------------------------------------------------------


async def test_the_ledger_counts_submits_jobs_members_and_duplicates(
    jobs: ProviderServerProcess, http: httpx.AsyncClient
) -> None:
    rate = DEFAULT_HIT_RATES["fullenrich"]
    c0, c1, c2, c3 = contacts(4)
    again = {"Idempotency-Key": "same-key"}  # ignored: every submit is a new job
    batches = [
        [c0, c1],
        [{**c0, "custom": {"row": "other"}}, c2],  # c0 again (custom is not who it is)
        [c0, c1],  # the first batch again: a duplicate job
        [c3, c3],  # a duplicate within one job
    ]
    ids = []
    for datas in batches:
        body = {"name": "dup", "datas": datas}
        response = await http.post(FE_SUBMIT, json=body, headers=FE | again)
        assert response.status_code == 200
        ids.append(response.json()["enrichment_id"])
    assert len(set(ids)) == 4

    ledger = await ledger_when(
        jobs, lambda led: job_counts(led, "fullenrich")["jobs_finished"] == 4
    )
    counts = job_counts(ledger, "fullenrich")
    assert counts["job_submits"] == 4
    assert counts["jobs"] == 3
    assert counts["job_members"] == 8
    assert counts["duplicate_submits"] == 4
    members = [c for datas in batches for c in datas]
    price = [fake_data.fullenrich_credits(fake_data.fullenrich_contact(c, rate)) for c in members]
    assert ledger["credits_by_provider"]["fullenrich"] == sum(price)  # every copy is paid
    assert ledger["charged_by_provider"]["fullenrich"] == 8
    assert ledger["double_charged"] == 4
    emails = sum(1 for c in (c0, c1, c2, c3) if fake_data.fullenrich_contact(c, rate)["emails"])
    assert emails > 0


async def test_a_submit_whose_answer_is_lost_still_created_its_job(
    jobs: ProviderServerProcess, http: httpx.AsyncClient
) -> None:
    jobs.configure(fail_next={"500_after_charge": 1})
    response = await http.post(FE_SUBMIT, json={"name": "lost", "datas": contacts(2)}, headers=FE)
    assert response.status_code == 500
    ledger = await ledger_when(
        jobs, lambda led: job_counts(led, "fullenrich")["jobs_finished"] == 1
    )
    counts = job_counts(ledger, "fullenrich")
    assert counts["job_submits"] == 1 and counts["submits_unanswered"] == 1
    assert ledger["faults_by_kind"] == {"500_after_charge": 1}
    assert ledger["charged_by_provider"]["fullenrich"] == 2


# -- webhooks -------------------------------------------------------------------------


async def test_fullenrich_posts_the_finished_job_signed_with_hmac_sha1(
    jobs: ProviderServerProcess, http: httpx.AsyncClient, receiver: Receiver
) -> None:
    enrichment_id = await submit_fullenrich(
        http, contacts(3), webhook_url=f"{receiver.url}/hooks/fullenrich"
    )
    (delivery,) = await receiver.wait_for(1)
    assert delivery.path_qs == "/hooks/fullenrich"
    assert delivery.headers[SIGNATURE] == signed(delivery.raw, SECRET)
    assert delivery.headers["Content-Type"] == "application/json"
    body = delivery.json()
    assert body["status"] == "FINISHED" and body["id"] == enrichment_id
    assert body == await get_fullenrich(http, enrichment_id)  # the same as the GET
    ledger = await ledger_when(
        jobs, lambda led: job_counts(led, "fullenrich")["webhooks_delivered"] == 1
    )
    assert job_counts(ledger, "fullenrich")["webhooks_sent"] == 1


async def test_without_a_secret_the_webhook_is_signed_with_the_api_key(
    jobs: ProviderServerProcess, http: httpx.AsyncClient, receiver: Receiver
) -> None:
    jobs.configure(webhook_secret={})
    await submit_fullenrich(http, contacts(1), webhook_url=receiver.url)
    (delivery,) = await receiver.wait_for(1)
    assert delivery.headers[SIGNATURE] == signed(delivery.raw, FE_KEY)


async def test_a_failed_delivery_is_retried_then_abandoned(
    jobs: ProviderServerProcess, http: httpx.AsyncClient, receiver: Receiver
) -> None:
    receiver.statuses = [500, 503]
    await submit_fullenrich(http, contacts(1), webhook_url=receiver.url)
    deliveries = await receiver.wait_for(3)
    assert len({d.raw for d in deliveries}) == 1  # the same body each time
    ledger = await ledger_when(
        jobs, lambda led: job_counts(led, "fullenrich")["webhooks_delivered"] == 1
    )
    counts = job_counts(ledger, "fullenrich")
    assert (counts["webhooks_sent"], counts["webhooks_failed"]) == (3, 2)

    closed = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens: connection errors
    body = {"data": records(1), "custom_callback_url": closed}
    assert (await http.post(DC_SUBMIT, json=body, headers=DC)).status_code == 200
    ledger = await ledger_when(
        jobs, lambda led: job_counts(led, "dropcontact")["webhooks_abandoned"] == 1
    )
    counts = job_counts(ledger, "dropcontact")
    assert counts["webhooks_sent"] == counts["webhooks_failed"] == 6  # once, then 5 retries
    assert counts["webhooks_delivered"] == 0


async def test_a_dropped_delivery_is_never_delivered(
    jobs: ProviderServerProcess, http: httpx.AsyncClient, receiver: Receiver
) -> None:
    jobs.configure(webhook_drop={"dropcontact": 1})
    first = {"data": records(2), "custom_callback_url": f"{receiver.url}/cb?job=1"}
    assert (await http.post(DC_SUBMIT, json=first, headers=DC)).status_code == 200
    ledger = await ledger_when(
        jobs, lambda led: job_counts(led, "dropcontact")["webhooks_dropped"] == 1
    )
    assert job_counts(ledger, "dropcontact")["webhooks_sent"] == 1  # it believes it sent it
    assert job_counts(ledger, "dropcontact")["webhooks_delivered"] == 0
    assert receiver.deliveries == []
    assert jobs.current_config()["webhook_drop"] == {"dropcontact": 0}

    second = {"data": records(3), "custom_callback_url": f"{receiver.url}/cb?job=2"}
    submitted = await http.post(DC_SUBMIT, json=second, headers=DC)
    (delivery,) = await receiver.wait_for(1)
    assert delivery.path_qs == "/cb?job=2"
    assert SIGNATURE not in delivery.headers  # Dropcontact's callbacks are not signed
    request_id = submitted.json()["request_id"]
    polled = await http.get(f"{DC_SUBMIT}/{request_id}", headers=DC)
    assert delivery.json() == polled.json()
    assert delivery.json()["success"] is True and len(delivery.json()["data"]) == 3


async def test_a_duplicated_delivery_arrives_n_times(
    jobs: ProviderServerProcess, http: httpx.AsyncClient, receiver: Receiver
) -> None:
    jobs.configure(webhook_duplicates={"fullenrich": 3})
    await submit_fullenrich(http, contacts(2), webhook_url=receiver.url)
    deliveries = await receiver.wait_for(3)
    ledger = await ledger_when(
        jobs, lambda led: job_counts(led, "fullenrich")["webhooks_delivered"] == 3
    )
    assert len(receiver.deliveries) == 3
    assert len({d.raw for d in deliveries}) == 1
    assert all(d.headers[SIGNATURE] == signed(d.raw, SECRET) for d in deliveries)
    assert job_counts(ledger, "fullenrich")["webhooks_sent"] == 3
