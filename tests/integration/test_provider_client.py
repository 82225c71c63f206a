"""The HTTP client against the real provider server: secrets, timeouts, reports, keys."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from playline.calls.attempt import Attempt
from playline.calls.catalog import Catalog
from playline.calls.dispatch import Request
from playline.calls.http import ProviderClient, SecretScrubber
from playline.calls.live import PacedSender, RetryPolicy
from playline.calls.outcome import Answered, Failed
from playline.errors import ProviderRejected, ProviderTimeout, ProviderTransientError
from playline.pacing.governor import Governor
from playline.provider_server import ServerConfig, ThreadedProviderServer, start_in_thread
from playline.stores.receipts_ledger import ReceiptLedger

PERSON = {"first_name": "Ada", "last_name": "Lovelace", "domain": "example.com"}


def catalog(
    base_url: str, *, envs: list[str], timeout_s: float | None = None, per_day: int = 2
) -> Catalog:
    tool = {
        "provider": "acme",
        "path": "/acme/v1/email/find",
        "input": {"first_name": "str", "last_name": "str", "domain": "str"},
    }
    if timeout_s is not None:
        tool["timeout_s"] = timeout_s
    return Catalog.model_validate(
        {
            "providers": {
                "acme": {
                    "base_url": base_url,
                    "auth": {"env": envs, "header": "X-Api-Key"},
                    "pacing": {"rps": 100, "burst": 10},
                    "key_pacing": {"rps": 100, "burst": 10, "per_day": per_day},
                    # the provider server de-duplicates Idempotency-Key
                    "idempotency": "key",
                },
                "firmo": {"base_url": base_url, "auth": {"env": "FIRMO_KEY"}},
            },
            "tools": {"email_finder": tool},
        }
    )


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadedProviderServer]:
    handle = start_in_thread(ServerConfig(latency_ms=(0.0, 1.0)))
    yield handle
    handle.stop()


@pytest.fixture
async def http(server: ThreadedProviderServer) -> AsyncIterator[httpx.AsyncClient]:
    server.configure(**ServerConfig(latency_ms=(0.0, 1.0)).model_dump())
    server.reset()
    async with httpx.AsyncClient() as client:
        yield client


async def test_a_key_echoed_in_an_error_body_never_reaches_the_error(
    server: ThreadedProviderServer, http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    environ = {"ACME_KEY": "sk-live-0123456789abcdef", "FIRMO_KEY": "firmo-secret-value"}
    server.configure(api_keys={"acme": "another-account"}, echo_key_in_errors=True)
    cat = catalog(server.base_url, envs=["ACME_KEY"])
    client = ProviderClient(cat, http, environ=environ)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ProviderRejected) as rejected:
        await client.send(cat.tool("email_finder"), PERSON, idempotency_key="k1")
    message = str(rejected.value)
    assert "401" in message and "[redacted]" in message  # the body was quoted, scrubbed
    for secret in environ.values():
        assert secret not in message
        assert secret not in caplog.text


def test_the_scrubber_knows_every_form_and_leaves_short_values() -> None:
    scrub = SecretScrubber(["ab", "k/ey+1=="])
    assert scrub("got k/ey+1== and k%2Fey%2B1%3D%3D, ab") == "got [redacted] and [redacted], ab"
    assert scrub.headers({"X-Api-Key": "k/ey+1=="}) == {"X-Api-Key": "[redacted]"}


async def test_a_tool_timeout_overrides_the_provider_one(
    server: ThreadedProviderServer, http: httpx.AsyncClient
) -> None:
    server.configure(fail_next={"timeout": 1}, timeout_sleep_s=5.0)
    cat = catalog(server.base_url, envs=["ACME_KEY"], timeout_s=0.3)
    client = ProviderClient(cat, http, environ={"ACME_KEY": "k-123456"})
    started = time.monotonic()
    with pytest.raises(ProviderTimeout, match=r"within 0\.3s"):
        await client.send(cat.tool("email_finder"), PERSON, idempotency_key="k2")
    assert time.monotonic() - started < 2.0


async def test_rate_limit_headers_come_back_with_the_answer(
    server: ThreadedProviderServer, http: httpx.AsyncClient
) -> None:
    server.configure(
        limiters={"acme": [{"kind": "fixed_window", "limit": 50, "window_s": 3600}]},
        rate_limit_headers="x-ratelimit",
    )
    cat = catalog(server.base_url, envs=["ACME_KEY"])
    client = ProviderClient(cat, http, environ={"ACME_KEY": "k-123456"})
    exchange = await client.exchange(cat.tool("email_finder"), PERSON, idempotency_key="k3")
    assert exchange.status == 200 and exchange.result()["email"]
    (quota,) = exchange.report.quotas
    assert (quota.limit, quota.remaining) == (50, 49)


async def test_calls_spread_across_keys_and_each_key_keeps_its_budget(
    server: ThreadedProviderServer, http: httpx.AsyncClient, tmp_path
) -> None:
    environ = {"KEY_A": "key-aaaa-1111", "KEY_B": "key-bbbb-2222"}
    server.configure(
        api_keys={"acme": list(environ.values())},
        limiters={"acme": [{"kind": "quota", "limit": 2, "window_s": 86400, "per_key": True}]},
    )
    cat = catalog(server.base_url, envs=["KEY_A", "KEY_B"])
    client = ProviderClient(cat, http, environ=environ)
    governor = Governor(cat.pacing_policies())
    receipts = ReceiptLedger.in_file(tmp_path / "r.db")
    attempt = Attempt(receipts=receipts, owner="t", lease_id="l", lease_ttl_s=30)
    sender = PacedSender(attempt, governor, client)
    tool = cat.tool("email_finder")
    for n in range(4):  # each key's daily budget is 2 (key_pacing.per_day): 4 in all
        outcome = await sender.send(
            Request(tool, {**PERSON, "first_name": f"A{n}"}, f"idem-{n}", ())
        )
        assert isinstance(outcome, Answered)
    ok = [c for c in server.calls() if c["status"] == 200]
    assert len(ok) == 4 and server.ledger()["rate_limited"] == 0
    per_key = {}
    for call in ok:
        per_key[call["key"]] = per_key.get(call["key"], 0) + 1
    assert sorted(per_key.values()) == [2, 2]
    snap = governor.snapshot()
    assert snap["acme:key=KEY_A"]["successes"] == snap["acme:key=KEY_B"]["successes"] == 2
    assert governor.blocked_until("acme:key=KEY_A") is not None
    await receipts.close()


async def _conflict(
    server: ThreadedProviderServer,
    http: httpx.AsyncClient,
    tmp_path,
    retry: RetryPolicy,
    slow_s: float = 4.0,
) -> tuple[asyncio.Task[object], object]:
    """An earlier request with the same key is slow (``slow_s``); the sender sends it
    again. The tool's timeout is ``slow_s`` + 1 s."""
    server.configure(latency_ms=(slow_s * 1000, slow_s * 1000))
    cat = catalog(server.base_url, envs=["ACME_KEY"], timeout_s=slow_s + 1, per_day=1000)
    client = ProviderClient(cat, http, environ={"ACME_KEY": "k-123456"})
    tool = cat.tool("email_finder")
    earlier = asyncio.create_task(client.send(tool, PERSON, idempotency_key="k-slow"))
    await asyncio.sleep(0.3)
    receipts = ReceiptLedger.in_file(tmp_path / "r.db")
    attempt = Attempt(receipts=receipts, owner="t", lease_id="l", lease_ttl_s=30)
    sender = PacedSender(attempt, Governor(cat.pacing_policies()), client, retry)
    try:
        outcome = await sender.send(Request(tool, PERSON, "k-slow", ()))
        if isinstance(outcome, Failed):
            raise outcome.error
        assert isinstance(outcome, Answered)
        return earlier, outcome.data
    except BaseException:
        earlier.cancel()  # the test ends here: leave no request running
        raise
    finally:
        await receipts.close()


async def test_a_key_still_in_flight_is_waited_out_past_the_retry_budget(
    server: ThreadedProviderServer, http: httpx.AsyncClient, tmp_path
) -> None:
    """409s for longer than five quick retries last; the answer is the earlier request's."""
    earlier, answer = await _conflict(server, http, tmp_path, RetryPolicy())
    assert answer == await earlier
    ledger = server.ledger()
    assert ledger["conflicts"] >= 5  # more 409s than max_attempts allows for failures
    assert ledger["charged"] == 1 and ledger["duplicates"] == 1


async def test_waiting_out_a_key_in_flight_is_bounded(
    server: ThreadedProviderServer, http: httpx.AsyncClient, tmp_path
) -> None:
    """Patience is a multiple of the tool's timeout: 0.2 x 13 s gives up well before the
    earlier request's 12 s end, however slowly a loaded machine sets the sender up."""
    with pytest.raises(ProviderTransientError, match="still in flight"):
        await _conflict(server, http, tmp_path, RetryPolicy(conflict_patience=0.2), slow_s=12)
    assert server.ledger()["charged"] <= 1
