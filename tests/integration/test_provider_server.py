"""The local provider server over real HTTP: data, auth, validation, charging, limits, faults.

One server runs in a background thread for the whole module (fast); every test
starts from a reset ledger and the base config. The subprocess launcher is
tested separately, end to end.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from playline.provider_server import (
    ProviderServerError,
    ProviderServerProcess,
    ServerConfig,
    ThreadedProviderServer,
    key_digest,
    start_in_thread,
)

BASE = ServerConfig(latency_ms=(0.0, 1.0))
ACME = {"X-Api-Key": "test-acme-key"}
FIRMO = {"Authorization": "Bearer test-firmo-key"}
PERSON = {"first_name": "Ada", "last_name": "Lovelace", "domain": "Example.com"}
EMAIL_FIND = "/acme/v1/email/find"
LOOKUP = "/firmo/v1/company/lookup"
BULK = "/firmo/v1/company/lookup/bulk"


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadedProviderServer]:
    handle = start_in_thread(BASE)
    yield handle
    handle.stop()


@pytest.fixture(autouse=True)
def fresh(server: ThreadedProviderServer) -> None:
    server.configure(**BASE.model_dump())
    server.reset()


@pytest.fixture
async def client(server: ThreadedProviderServer) -> AsyncIterator[httpx.AsyncClient]:
    limits = httpx.Limits(max_connections=100)
    async with httpx.AsyncClient(base_url=server.base_url, limits=limits, timeout=10) as c:
        yield c


async def find(client: httpx.AsyncClient, body: Any = None, **headers: str) -> httpx.Response:
    return await client.post(
        EMAIL_FIND, json=PERSON if body is None else body, headers=ACME | headers
    )


async def test_data_is_deterministic(client: httpx.AsyncClient) -> None:
    first, second = await find(client), await find(client)
    assert first.status_code == second.status_code == 200
    assert first.content == second.content
    body = first.json()
    assert body["email"] == "ada.lovelace@example.com"
    assert 0.0 <= body["confidence"] <= 1.0
    assert body["status"] in {"valid", "risky"}
    other = await find(client, {**PERSON, "first_name": "Grace"})
    assert other.json()["email"] == "grace.lovelace@example.com"

    person = await client.post(
        "/acme/v1/person/enrich", json={"email": body["email"]}, headers=ACME
    )
    assert set(person.json()) == {"email", "title", "seniority", "linkedin_url", "location"}
    company = await client.post(LOOKUP, json={"domain": "acme.io"}, headers=FIRMO)
    assert set(company.json()) == {"domain", "name", "industry", "employees", "country", "founded"}
    assert isinstance(company.json()["employees"], int)


async def test_missing_or_wrong_key_is_401(
    server: ThreadedProviderServer, client: httpx.AsyncClient
) -> None:
    assert (await client.post(EMAIL_FIND, json=PERSON)).status_code == 401
    bare = await client.post(LOOKUP, json={"domain": "a.com"}, headers={"Authorization": "k"})
    assert bare.status_code == 401
    assert "error" in bare.json()

    server.configure(api_keys={"acme": "s3cret"})
    assert (await find(client)).status_code == 401
    assert (await find(client, **{"X-Api-Key": "s3cret"})).status_code == 200
    assert server.current_config()["api_keys"] == {"acme": key_digest("s3cret")}
    ledger = server.ledger()
    assert ledger["unauthorized"] == 3
    assert ledger["charged"] == 1
    assert "s3cret" not in json.dumps(ledger)


async def test_bad_body_is_422(client: httpx.AsyncClient) -> None:
    broken = await client.post(EMAIL_FIND, content=b"{not json", headers=ACME)
    missing = await find(client, {"first_name": "Ada", "domain": "x.com"})
    empty_bulk = await client.post(BULK, json={"items": []}, headers=FIRMO)
    bad_item = await client.post(BULK, json={"items": [{"domain": "a.com"}, {}]}, headers=FIRMO)
    for response in (broken, missing, empty_bulk, bad_item):
        assert response.status_code == 422
        assert response.json()["error"]
    assert "last_name" in missing.json()["error"]


async def test_idempotent_replay_is_not_charged(
    server: ThreadedProviderServer, client: httpx.AsyncClient
) -> None:
    first = await find(client, **{"Idempotency-Key": "row-1"})
    again = await find(client, **{"Idempotency-Key": "row-1"})
    assert first.status_code == again.status_code == 200
    assert first.content == again.content
    assert again.headers["Idempotent-Replayed"] == "true"
    reused = await find(client, {**PERSON, "domain": "other.com"}, **{"Idempotency-Key": "row-1"})
    assert reused.status_code == 422
    ledger = server.ledger()
    assert (ledger["charged"], ledger["duplicates"], ledger["double_charged"]) == (1, 1, 0)


async def test_repeated_input_without_key_is_double_charged(
    server: ThreadedProviderServer, client: httpx.AsyncClient
) -> None:
    for _ in range(3):
        assert (await find(client)).status_code == 200
    await find(client, {**PERSON, "first_name": "Grace"})
    ledger = server.ledger()
    assert ledger["charged"] == 4
    assert ledger["double_charged"] == 2
    assert ledger["charged_by_path"] == {EMAIL_FIND: 4}


async def test_burst_over_rps_gets_429_with_retry_after(
    server: ThreadedProviderServer, client: httpx.AsyncClient
) -> None:
    server.configure(rate_limit_rps={"acme": 2.0}, rate_limit_burst={"acme": 3})
    responses = await asyncio.gather(*(find(client) for _ in range(20)))
    statuses = [r.status_code for r in responses]
    limited = [r for r in responses if r.status_code == 429]
    assert 3 <= statuses.count(200) <= 4
    assert len(limited) == 20 - statuses.count(200)
    assert all(int(r.headers["Retry-After"]) >= 1 for r in limited)
    assert "rate limit" in limited[0].json()["error"]
    firmo = await client.post(LOOKUP, json={"domain": "a.com"}, headers=FIRMO)
    assert firmo.status_code == 200  # the limit is per provider
    ledger = server.ledger()
    assert ledger["rate_limited"] == len(limited)
    assert ledger["rate_limited_by_provider"] == {"acme": len(limited)}
    assert ledger["charged"] == statuses.count(200) + 1

    server.configure(retry_after_header=False)
    assert "Retry-After" not in (await find(client)).headers


async def test_concurrency_cap_and_max_in_flight(
    server: ThreadedProviderServer, client: httpx.AsyncClient
) -> None:
    server.configure(max_concurrency={"firmo": 2}, latency_ms=(150.0, 150.0))
    responses = await asyncio.gather(
        *(client.post(LOOKUP, json={"domain": f"d{i}.com"}, headers=FIRMO) for i in range(6))
    )
    assert sorted(r.status_code for r in responses) == [200, 200, 429, 429, 429, 429]
    ledger = server.ledger()
    assert ledger["max_in_flight_by_provider"]["firmo"] >= 3  # rejected ones leave at once
    assert ledger["in_flight"] == 0
    assert ledger["rate_limited"] == 4


async def test_fail_next_5xx_is_exact(
    server: ThreadedProviderServer, client: httpx.AsyncClient
) -> None:
    server.configure(fail_next={"5xx": 3})
    statuses = [(await find(client)).status_code for _ in range(5)]
    assert statuses == [503, 503, 503, 200, 200]
    ledger = server.ledger()
    assert (ledger["faults"], ledger["charged"], ledger["faults_by_kind"]) == (3, 2, {"5xx": 3})
    assert server.current_config()["fail_next"] == {"5xx": 0}


async def test_malformed_is_charged_and_recoverable_by_key(
    server: ThreadedProviderServer, client: httpx.AsyncClient
) -> None:
    server.configure(fail_next={"malformed": 1})
    bad = await find(client, **{"Idempotency-Key": "k-mal"})
    assert bad.status_code == 200
    with pytest.raises(ValueError):
        bad.json()
    good = await find(client, **{"Idempotency-Key": "k-mal"})
    assert good.json()["email"] == "ada.lovelace@example.com"
    ledger = server.ledger()
    assert (ledger["charged"], ledger["duplicates"], ledger["double_charged"]) == (1, 1, 0)


async def test_timeout_fault_is_not_charged(
    server: ThreadedProviderServer, client: httpx.AsyncClient
) -> None:
    server.configure(fail_next={"timeout": 1}, timeout_sleep_s=0.3)
    headers = ACME | {"Idempotency-Key": "k-t"}
    with pytest.raises(httpx.ReadTimeout):
        await client.post(EMAIL_FIND, json=PERSON, headers=headers, timeout=0.1)
    assert (await find(client, **{"Idempotency-Key": "k-t"})).status_code == 200
    ledger = server.ledger()
    assert ledger["faults_by_kind"] == {"timeout": 1}
    assert ledger["charged"] == 1


async def test_same_key_in_flight_is_409(
    server: ThreadedProviderServer, client: httpx.AsyncClient
) -> None:
    server.configure(latency_ms=(200.0, 200.0))
    first = asyncio.create_task(find(client, **{"Idempotency-Key": "k-c"}))
    await asyncio.sleep(0.05)
    second = await find(client, **{"Idempotency-Key": "k-c"})
    assert second.status_code == 409
    assert (await first).status_code == 200
    assert server.ledger()["conflicts"] == 1


async def test_bulk_is_ordered_and_one_charge(
    server: ThreadedProviderServer, client: httpx.AsyncClient
) -> None:
    domains = [f"company{i}.com" for i in range(7)]
    single = await client.post(LOOKUP, json={"domain": domains[3]}, headers=FIRMO)
    bulk = await client.post(BULK, json={"items": [{"domain": d} for d in domains]}, headers=FIRMO)
    assert bulk.status_code == 200
    results = bulk.json()["results"]
    assert [r["domain"] for r in results] == domains
    assert results[3] == single.json()
    ledger = server.ledger()
    assert ledger["charged_by_path"] == {LOOKUP: 1, BULK: 1}
    assert ledger["charged"] == 2
    assert ledger["items_charged"] == 8
    assert ledger["double_charged"] == 0
    assert ledger["double_charged_items"] == 1
    calls = server.calls()
    assert [(c["path"], c["items"], c["charged"]) for c in calls] == [
        (LOOKUP, 1, True),
        (BULK, 7, True),
    ]


async def test_admin_reset_config_and_calls(
    server: ThreadedProviderServer, client: httpx.AsyncClient
) -> None:
    assert (await client.get("/healthz")).status_code == 200
    await find(client)
    before = server.calls()
    assert len(before) == 1 and before[0]["status"] == 200
    assert server.calls(since=before[0]["t"]) == []

    updated = server.configure(latency_ms=[2, 3], rate_limit_rps={"firmo": 100})
    assert updated["latency_ms"] == [2.0, 3.0]
    assert updated["rate_limit_rps"] == {"firmo": 100.0}
    assert updated["seed"] == BASE.seed  # untouched fields are kept
    invalid = await client.post("/_admin/config", json={"fault_rate_5xx": 2})
    unknown = await client.post("/_admin/config", json={"nope": 1})
    assert invalid.status_code == unknown.status_code == 422

    server.reset()
    ledger = server.ledger()
    assert (ledger["received"], ledger["charged"], ledger["calls_recorded"]) == (0, 0, 0)
    assert server.current_config()["latency_ms"] == [2.0, 3.0]  # reset keeps the config


def test_subprocess_launcher_starts_and_stops() -> None:
    with ProviderServerProcess({"latency_ms": [0, 1], "rate_limit_rps": {"acme": 50}}) as proc:
        assert proc.running
        response = httpx.post(f"{proc.base_url}{EMAIL_FIND}", json=PERSON, headers=ACME)
        assert response.json()["email"] == "ada.lovelace@example.com"
        assert proc.ledger()["charged"] == 1
        assert proc.configure(seed=7)["seed"] == 7
        proc.reset()
        assert proc.ledger()["received"] == 0
    assert not proc.running
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{proc.base_url}/healthz", timeout=1)


async def test_subprocess_launcher_async_and_startup_error() -> None:
    async with ProviderServerProcess() as proc, httpx.AsyncClient() as client:
        assert (await client.get(f"{proc.base_url}/healthz")).status_code == 200
    assert not proc.running

    broken = ProviderServerProcess()
    broken.command = lambda: [*ProviderServerProcess.command(broken), "--rps", "acme"]  # type: ignore[method-assign]
    with pytest.raises(ProviderServerError, match="PROVIDER=NUMBER"):
        broken.start()
