"""The provider server's limit shapes over real HTTP: each one, its 429s and its headers.

These are the shapes the governor is judged against (token bucket, GCRA, fixed
window, sliding log, concurrency cap, hourly/daily quota), with ``Retry-After``
written every way providers write it and the rate-limit headers on or off.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from playline.pacing.headers import parse_rate_limit
from playline.provider_server import ServerConfig, ThreadedProviderServer, start_in_thread

BASE = ServerConfig(latency_ms=(0.0, 0.0))
ACME = {"X-Api-Key": "test-acme-key"}
PERSON = {"first_name": "Ada", "last_name": "Lovelace", "domain": "example.com"}
EMAIL_FIND = "/acme/v1/email/find"


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
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as c:
        yield c


def limit(server: ThreadedProviderServer, *specs: dict[str, Any], **config: Any) -> None:
    server.configure(limiters={"acme": list(specs)}, **config)


async def burst(
    client: httpx.AsyncClient, n: int, key: str = "test-acme-key"
) -> list[httpx.Response]:
    headers = {"X-Api-Key": key}
    return [await client.post(EMAIL_FIND, json=PERSON, headers=headers) for _ in range(n)]


def statuses(responses: list[httpx.Response]) -> list[int]:
    return [r.status_code for r in responses]


async def test_token_bucket_allows_its_burst_then_refills_at_its_rate(server, client) -> None:
    limit(server, {"kind": "token_bucket", "rate": 10, "burst": 3}, retry_after="exact")
    first = await burst(client, 4)
    assert statuses(first) == [200, 200, 200, 429]
    wait = float(first[-1].headers["Retry-After"])
    assert 0 < wait <= 0.1  # exact: a fraction of a second
    await asyncio.sleep(wait + 0.01)
    assert statuses(await burst(client, 1)) == [200]


async def test_gcra_rounds_retry_after_up_to_whole_seconds(server, client) -> None:
    limit(server, {"kind": "gcra", "rate": 20, "burst": 2}, retry_after="ceil")
    responses = await burst(client, 3)
    assert statuses(responses) == [200, 200, 429]
    assert responses[-1].headers["Retry-After"] == "1"
    assert server.ledger()["charged"] == 2


async def test_fixed_window_answers_with_an_http_date_and_x_ratelimit_headers(
    server, client
) -> None:
    limit(
        server,
        {"kind": "fixed_window", "limit": 3, "window_s": 2},
        retry_after="date",
        rate_limit_headers="x-ratelimit",
    )
    phase = time.time() % 2
    if phase > 1.0:  # start early in a window, so no boundary falls inside the burst
        await asyncio.sleep(2 - phase + 0.02)
    responses = await burst(client, 4)
    assert statuses(responses) == [200, 200, 200, 429]
    assert [r.headers["X-RateLimit-Remaining"] for r in responses] == ["2", "1", "0", "0"]
    assert all(r.headers["X-RateLimit-Limit"] == "3" for r in responses)
    when = email.utils.parsedate_to_datetime(responses[-1].headers["Retry-After"])
    assert 0 <= when.timestamp() - time.time() <= 3.1  # the rest of the window, in whole s
    report = parse_rate_limit(responses[0].headers, now_wall=time.time())
    assert report.quotas[0].remaining == 2 and 0 < report.quotas[0].reset_s <= 2


async def test_sliding_log_counts_any_window_and_reports_ietf_fields(server, client) -> None:
    limit(
        server,
        {"kind": "sliding_log", "limit": 2, "window_s": 0.5, "name": "half"},
        rate_limit_headers="ietf",
    )
    responses = await burst(client, 3)
    assert statuses(responses) == [200, 200, 429]
    assert responses[0].headers["RateLimit-Policy"] == '"half";q=2;w=1'
    assert responses[1].headers["RateLimit"].startswith('"half";r=0;t=')
    report = parse_rate_limit(responses[0].headers, now_wall=time.time())
    assert (report.quotas[0].name, report.quotas[0].remaining) == ("half", 1)
    await asyncio.sleep(0.55)
    assert statuses(await burst(client, 2)) == [200, 200]


async def test_concurrency_cap_refuses_only_what_is_in_flight_without_retry_after(
    server, client
) -> None:
    limit(server, {"kind": "concurrency", "limit": 2})
    server.configure(latency_ms=[200, 200])
    responses = await asyncio.gather(
        *(
            client.post(EMAIL_FIND, json={**PERSON, "first_name": f"A{i}"}, headers=ACME)
            for i in range(4)
        )
    )
    assert sorted(statuses(list(responses))) == [200, 200, 429, 429]
    assert all("Retry-After" not in r.headers for r in responses if r.status_code == 429)
    assert statuses(await burst(client, 1)) == [200]  # nothing in flight any more


async def test_quota_per_hour_answers_429_until_the_hour_turns(server, client) -> None:
    limit(
        server,
        {"kind": "quota", "limit": 2, "window_s": 3600},
        retry_after="date",
        rate_limit_headers="x-ratelimit",
    )
    responses = await burst(client, 3)
    assert statuses(responses) == [200, 200, 429]
    reset = int(responses[-1].headers["X-RateLimit-Reset"])
    assert 0 < reset <= 3600
    when = email.utils.parsedate_to_datetime(responses[-1].headers["Retry-After"])
    assert when.timestamp() == pytest.approx(time.time() + reset, abs=2)


async def test_limits_per_key_count_each_key_apart_and_several_keys_are_accepted(
    server, client
) -> None:
    limit(server, {"kind": "fixed_window", "limit": 1, "window_s": 3600, "per_key": True})
    server.configure(api_keys={"acme": ["key-one", "key-two"]})
    assert statuses(await burst(client, 2, "key-one")) == [200, 429]
    assert statuses(await burst(client, 1, "key-two")) == [200]
    assert statuses(await burst(client, 1, "key-three")) == [401]
    keys = {c["key"] for c in server.calls() if c["status"] == 200}
    assert len(keys) == 2 and "key-one" not in str(keys)


async def test_every_limiter_must_admit_and_a_refused_call_consumes_nothing(server, client) -> None:
    limit(
        server,
        {"kind": "token_bucket", "rate": 1, "burst": 5},
        {"kind": "quota", "limit": 2, "window_s": 3600},
    )
    assert statuses(await burst(client, 3)) == [200, 200, 429]
    server.configure(limiters={"acme": [{"kind": "token_bucket", "rate": 1, "burst": 5}]})
    # the 429 above took no token: a fresh bucket after the change has all 5
    assert statuses(await burst(client, 5)) == [200] * 5


async def test_a_provider_may_echo_the_key_it_got(server, client) -> None:
    server.configure(api_keys={"acme": "the-real-key"}, echo_key_in_errors=True)
    response = (await burst(client, 1, "test-acme-key"))[0]
    assert response.status_code == 401
    assert "test-acme-key" in response.text
