"""Durable parking, the pacing side: a spent quota raises instead of waiting, nothing is sent.

Real HTTP to the provider server, a real SQLite receipt store, a real governor. The
provider allows 3 calls per 6-second window (a daily quota in miniature: the
governor only knows what its ``X-RateLimit-*`` headers say), so its reset is a few
seconds away when the 4th call comes.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from playline.calls.attempt import Attempt
from playline.calls.catalog import Catalog
from playline.calls.http import ProviderClient
from playline.calls.live import LiveDispatcher, PacedSender
from playline.calls.runner import ToolRunner
from playline.errors import ProviderQuotaExhausted
from playline.pacing.governor import Governor
from playline.provider_server import ServerConfig, ThreadedProviderServer, start_in_thread
from playline.stores.receipts_ledger import ReceiptLedger

WINDOW_S = 6.0
KEY = {"ACME_API_KEY": "park-test-key-1234"}


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadedProviderServer]:
    config = ServerConfig(
        latency_ms=(1.0, 2.0),
        limiters={"acme": [{"kind": "quota", "limit": 3, "window_s": WINDOW_S}]},
        rate_limit_headers="x-ratelimit",
        retry_after="date",
    )
    handle = start_in_thread(config)
    yield handle
    handle.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


def catalog(base_url: str) -> Catalog:
    return Catalog.model_validate(
        {
            "providers": {
                "acme": {
                    "base_url": base_url,
                    "auth": {"env": "ACME_API_KEY", "header": "X-Api-Key"},
                    "pacing": {"rps": 50, "burst": 5},
                }
            },
            "tools": {
                "email_finder": {
                    "provider": "acme",
                    "path": "/acme/v1/email/find",
                    "input": {"first_name": "str", "last_name": "str", "domain": "str"},
                }
            },
        }
    )


def runner(cat: Catalog, receipts, client, governor, lease: str) -> ToolRunner:
    attempt = Attempt(
        receipts=receipts, owner=lease, lease_id=lease, lease_ttl_s=30, park_after_s=1.0
    )
    sender = PacedSender(attempt, governor, client)
    return ToolRunner(cat, attempt, LiveDispatcher(attempt, sender))


def person(n: int) -> dict[str, str]:
    return {"first_name": f"P{n}", "last_name": "Quota", "domain": "example.com"}


async def test_a_spent_quota_parks_the_next_call_until_its_reset(
    server: ThreadedProviderServer, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    # Start at the beginning of a provider window, so its reset is ~6 s away.
    phase = time.time() % WINDOW_S
    if phase > 0.5:
        await asyncio.sleep(WINDOW_S - phase + 0.05)
    server.reset()
    cat = catalog(server.base_url)
    client = ProviderClient(cat, http, environ=KEY)
    governor = Governor(cat.pacing_policies())
    receipts = ReceiptLedger.in_file(tmp_path / "receipts.db")
    try:
        first = runner(cat, receipts, client, governor, "lease-1")
        for n in range(3):
            await first.call("email_finder", person(n))
        window_end = (math.floor(time.time() / WINDOW_S) + 1) * WINDOW_S

        before = server.ledger()["received"]
        with pytest.raises(ProviderQuotaExhausted) as parked:
            await first.call("email_finder", person(3))
        err = parked.value
        assert server.ledger()["received"] == before  # nothing was dispatched
        assert err.provider == "acme" and err.retryable and not err.chunk_fatal
        # resume_at: the provider's reset (its header is whole seconds, rounded up)
        assert window_end - 0.5 <= err.resume_at <= window_end + 1.5
        assert "acme quota exhausted until" in str(err) and "UTC" in str(err)
        assert governor.blocked_until("acme") == pytest.approx(err.resume_at, abs=0.1)
        assert first.stats.failed == 0  # parked, not failed

        # The receipt was released, not failed: after the reset a new attempt claims
        # it cleanly and the call is paid for exactly once.
        await asyncio.sleep(max(0.0, err.resume_at - time.time()) + 0.1)
        second = runner(cat, receipts, client, governor, "lease-2")
        result = await second.call("email_finder", person(3))
        assert result["email"] and not result.cached
        ledger = server.ledger()
        assert ledger["charged"] == 4 and ledger["double_charged"] == 0
        assert ledger["rate_limited"] == 0  # the headers said it all: no 429 needed
    finally:
        await receipts.close()
