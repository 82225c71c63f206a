"""Edges of the call path that used to pay twice, wedge a receipt or fail a row for good.

Review findings F6 (bulk ``force`` / ``stale_after``), F19 (batch members completed and
credited once), F20 (API key rotation keeps receipts), F21 (bulk work ends with its
attempt) and F22 (429s park). Real receipt stores and real HTTP to the provider server.
(F8, a lost lease letting calls in flight finish, is
``tests/integration/test_leases.py::test_renewal_detects_a_takeover_stops_new_dispatch_and_lets_the_call_in_flight_finish``.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from playline.calls.attempt import Attempt
from playline.calls.catalog import Catalog
from playline.calls.dispatch import Request
from playline.calls.http import ProviderClient
from playline.calls.live import LiveDispatcher, PacedSender
from playline.calls.outcome import Parked
from playline.calls.runner import ToolRunner
from playline.errors import ProviderQuotaExhausted
from playline.pacing.governor import Governor
from playline.stores.backends import Stores
from playline.stores.receipts import ClaimRequest, ClaimStatus, ReceiptStore, receipt_key
from playline.stores.receipts_ledger import ReceiptLedger
from tests.conftest import BULK, bulk_catalog, live_runner, provider_client

#: Long enough that a test fails rather than hangs; never a timing assertion.
HUNG_S = 30.0

#: How long a call keeps asking a provider that answers 429 before it parks.
PARK_AFTER_S = 4.0

PERSON = {"first_name": "Ada", "last_name": "Lovelace", "domain": "edges.example"}


class WallClock:
    """Wall time the test can move forward (for ``stale_after``)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def tamper(path: Path, key: str, result: Any) -> None:
    """Overwrite a stored result, so an answer served from the receipt is recognisable."""
    with sqlite3.connect(path) as conn:
        changed = conn.execute(
            "UPDATE playline_receipts SET result = ? WHERE key = ?", (json.dumps(result), key)
        ).rowcount
    assert changed == 1


# -- F6: bulk members honour force and stale_after ---------------------------------


async def test_a_forced_or_stale_bulk_call_pays_once_for_a_fresh_answer_and_frees_its_receipt(
    provider, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    catalog = Catalog.from_toml(bulk_catalog(tmp_path))
    tool = catalog.tool("company_lookup")
    assert tool.batch is not None
    wall = WallClock()
    db = tmp_path / "receipts.db"
    store = ReceiptLedger.in_file(db, clock=wall)
    item = {"domain": "forced.example"}
    try:
        async with httpx.AsyncClient() as http:
            client = provider_client(catalog, http)
            key = receipt_key(
                tool.id, tool.version, tool.validate_input(item), client.auth_scope(tool)
            )

            def runner(lease_id: str) -> ToolRunner:
                # A lease far longer than HUNG_S: a receipt left running would stall the
                # next call until the test gives up.
                return live_runner(
                    catalog, store, client, owner=lease_id, lease_id=lease_id, lease_ttl_s=120
                )

            first = await asyncio.wait_for(runner("L1").call(tool.id, item), HUNG_S)
            assert first.get("domain") == "forced.example" and not first.cached
            assert provider.ledger()["charged"] == 1

            for n, fresh_by in enumerate(({"force": True}, {"stale_after_seconds": 60.0}), start=2):
                tamper(db, key, {"name": "the old answer"})
                wall.offset += 3600  # the stored answer is an hour old
                fresh = runner(f"F{n}")
                result = await asyncio.wait_for(fresh.call(tool.id, item, **fresh_by), HUNG_S)
                assert result.data == first.data  # the provider's answer, not the stored one
                assert not result.cached and fresh.stats.made == 1 and fresh.stats.cached == 0
                assert provider.ledger()["charged"] == n  # one new bulk request: paid once
                receipt = (await store.get([key]))[key]
                assert (receipt.status, receipt.lease_id) == ("completed", None)
                assert receipt.result == first.data and receipt.generation == n - 1

                # Not wedged: a plain call right after is a free hit on the fresh answer.
                later = runner(f"P{n}")
                again = await asyncio.wait_for(later.call(tool.id, item), HUNG_S)
                assert again.cached and again.data == first.data
                assert later.stats.cached == 1 and later.stats.made == 0
                assert provider.ledger()["charged"] == n
    finally:
        await store.close()
    bulk = [c for c in provider.calls() if c["path"].endswith("/bulk")]
    assert len(bulk) == 3 and {c["status"] for c in bulk} == {200}


# -- F19: complete_batch completes (and credits) each member once ---------------------


async def test_complete_batch_leaves_members_already_completed_as_they_were(
    stores: Stores,
) -> None:
    store: ReceiptStore = stores.receipts
    members = ["m1", "m2", "m3"]
    await store.claim([ClaimRequest(k, "t") for k in members], owner="a", lease_id="L1", ttl_s=30)
    assert await store.open_batch(
        "agg",
        tool_id="t",
        member_keys=members,
        request={"items": []},
        owner="a",
        lease_id="L1",
        ttl_s=30,
    )
    # One member's answer was recorded already (an earlier settlement of the same batch).
    assert await store.complete("m1", lease_id="L1", result={"first": True}, credits=2)
    assert await store.complete_batch(
        "agg",
        lease_id="L1",
        results={k: {"k": k} for k in members},
        member_credits=dict.fromkeys(members, 2.0),
    )
    receipts = await store.get(["agg", *members])
    assert receipts["m1"].result == {"first": True}  # not replaced...
    assert receipts["m1"].credits == 2  # ...and not credited a second time
    assert [receipts[k].result for k in ("m2", "m3")] == [{"k": "m2"}, {"k": "m3"}]
    assert {receipts[k].credits for k in members} == {2}
    # The aggregate is credited what this settlement charged: m2 and m3.
    assert receipts["agg"].status == "completed" and receipts["agg"].credits == 4
    # Settling the batch again (a resumed attempt's late answer) changes nothing.
    assert not await store.complete_batch(
        "agg",
        lease_id="L1",
        results={k: {"late": k} for k in members},
        member_credits=dict.fromkeys(members, 2.0),
    )
    again = await store.get(members)
    assert sum(r.credits for r in again.values()) == 6
    assert again["m2"].result == {"k": "m2"}


# -- F20: a named account keeps its receipts when its key rotates ----------------------


def account_catalog(base_url: str, *, envs: list[str], account: str | None) -> Catalog:
    auth: dict[str, Any] = {"env": envs, "header": "X-Api-Key"}
    if account is not None:
        auth["account"] = account
    return Catalog.model_validate(
        {
            "providers": {"acme": {"base_url": base_url, "auth": auth}},
            "tools": {
                "email_finder": {
                    "provider": "acme",
                    "path": "/acme/v1/email/find",
                    "input": {"first_name": "str", "last_name": "str", "domain": "str"},
                }
            },
        }
    )


async def test_rotating_the_api_key_of_a_named_account_keeps_its_receipts(
    provider, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    old_key, new_key, second_key = "acme-key-old-1111", "acme-key-new-2222", "acme-key-two-3333"
    provider.configure(api_keys={"acme": old_key})
    store = ReceiptLedger.in_file(tmp_path / "receipts.db")
    try:
        async with httpx.AsyncClient() as http:

            def runner(envs: list[str], environ: dict[str, str], lease: str) -> ToolRunner:
                catalog = account_catalog(provider.base_url, envs=envs, account="acme-prod")
                client = ProviderClient(catalog, http, environ=environ)
                return live_runner(
                    catalog, store, client, owner=lease, lease_id=lease, lease_ttl_s=30
                )

            before = runner(["ACME_KEY"], {"ACME_KEY": old_key}, "L1")
            paid = await asyncio.wait_for(before.call("email_finder", PERSON), HUNG_S)
            assert not paid.cached and provider.ledger()["charged"] == 1

            # The old key leaked: the provider now takes only the new one.
            provider.configure(api_keys={"acme": [new_key, second_key]})
            rotated = runner(["ACME_KEY"], {"ACME_KEY": new_key}, "L2")
            hit = await asyncio.wait_for(rotated.call("email_finder", PERSON), HUNG_S)
            assert hit.cached and hit.data == paid.data and rotated.stats.made == 0

            # A second key added to the same account: still the same receipts.
            envs = {"ACME_KEY": new_key, "ACME_KEY_2": second_key}
            added = runner(["ACME_KEY", "ACME_KEY_2"], envs, "L3")
            again = await asyncio.wait_for(added.call("email_finder", PERSON), HUNG_S)
            assert again.cached and again.data == paid.data and added.stats.made == 0

            # New inputs do go out, under the new key.
            fresh = await asyncio.wait_for(
                rotated.call("email_finder", {**PERSON, "first_name": "Grace"}), HUNG_S
            )
            assert not fresh.cached
    finally:
        await store.close()
    ledger = provider.ledger()
    assert ledger["charged"] == 2 and ledger["received"] == 2  # no charge for the rotation


async def test_without_an_account_the_scope_follows_the_keys_and_with_one_it_does_not() -> None:
    """What the test above relies on: the account, not the key, names the receipts."""
    async with httpx.AsyncClient() as http:
        check_scopes(http)


def check_scopes(http: httpx.AsyncClient) -> None:
    scopes = {}
    for account in (None, "acme-prod"):
        catalog = account_catalog("http://127.0.0.1:9", envs=["ACME_KEY"], account=account)
        tool = catalog.tool("email_finder")
        scopes[account] = [
            ProviderClient(catalog, http, environ={"ACME_KEY": key}).auth_scope(tool)
            for key in ("acme-key-old-1111", "acme-key-new-2222")
        ]
    assert scopes[None][0] != scopes[None][1]
    assert scopes["acme-prod"][0] == scopes["acme-prod"][1]
    assert scopes["acme-prod"][0] not in scopes[None]
    other = account_catalog("http://127.0.0.1:9", envs=["ACME_KEY"], account="acme-staging")
    staging = ProviderClient(other, http, environ={"ACME_KEY": "acme-key-old-1111"})
    assert staging.auth_scope(other.tool("email_finder")) != scopes["acme-prod"][0]


# -- F21: bulk work ends with its attempt ------------------------------------------


@contextlib.asynccontextmanager
async def bulk_attempt(
    tmp_path: Path, *, linger_ms: int
) -> AsyncIterator[tuple[ToolRunner, LiveDispatcher, ReceiptLedger]]:
    """One chunk attempt's runner over a bulk company_lookup (this linger), its live
    dispatcher and its SQLite receipt store; the store and HTTP client closed after."""
    path = bulk_catalog(tmp_path)
    path.write_text(
        path.read_text().replace(BULK, BULK.replace("linger_ms = 50", f"linger_ms = {linger_ms}"))
    )
    catalog = Catalog.from_toml(path)
    assert catalog.tool("company_lookup").batch.linger_ms == linger_ms  # type: ignore[union-attr]
    store = ReceiptLedger.in_file(tmp_path / "receipts.db")
    try:
        async with httpx.AsyncClient() as http:
            runner = live_runner(
                catalog,
                store,
                provider_client(catalog, http),
                owner="a",
                lease_id="L1",
                lease_ttl_s=30,
            )
            dispatcher = runner.dispatcher
            assert isinstance(dispatcher, LiveDispatcher)
            yield runner, dispatcher, store
    finally:
        await store.close()


async def until(predicate, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + HUNG_S
    while not predicate():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.01)


async def test_members_whose_rows_were_cancelled_are_never_sent_when_the_linger_ends(
    provider, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The chunk attempt is cancelled while its members wait for their batch to fill."""
    async with bulk_attempt(tmp_path, linger_ms=400) as (runner, dispatcher, _):
        rows = [
            asyncio.ensure_future(runner.call("company_lookup", {"domain": f"c{n}.example"}))
            for n in range(2)
        ]
        await until(lambda: runner.attempt.leases.keys(), "the members were claimed")
        await asyncio.sleep(0.05)  # they are queued, the linger timer is armed
        for row in rows:
            row.cancel()
        await asyncio.gather(*rows, return_exceptions=True)
        await dispatcher.aclose()
        assert not dispatcher.bulk.tasks
        await asyncio.sleep(0.8)  # twice the linger: a timer left armed would fire
        assert not dispatcher.bulk.tasks
    assert provider.ledger()["received"] == 0  # nothing went out for the cancelled rows


async def test_closing_the_dispatcher_waits_for_the_batch_in_flight_and_records_it(
    provider, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    provider.configure(latency_ms=[300, 350])
    async with bulk_attempt(tmp_path, linger_ms=20) as (runner, dispatcher, store):
        row = asyncio.ensure_future(runner.call("company_lookup", {"domain": "w.example"}))
        await until(lambda: dispatcher.bulk.tasks, "a batch was started")
        await asyncio.wait_for(dispatcher.aclose(), HUNG_S)
        assert not dispatcher.bulk.tasks  # the batch finished inside the attempt...
        assert (await row).get("domain") == "w.example"
        assert runner.attempt.leases.keys() == []  # ...and nothing is left held
        tool = runner.catalog.tool("company_lookup")
        scope = runner.dispatcher.auth_scope(tool)
        key = receipt_key(tool.id, tool.version, {"domain": "w.example"}, scope)
        assert (await store.get([key]))[key].status == "completed"
    assert provider.ledger()["charged"] == 1


async def test_cancelling_the_close_cancels_the_batch_and_nothing_is_sent_after(
    provider, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    provider.configure(latency_ms=[5000, 5000])
    try:
        async with bulk_attempt(tmp_path, linger_ms=20) as (runner, dispatcher, _):
            rows = [
                asyncio.ensure_future(runner.call("company_lookup", {"domain": f"x{n}.example"}))
                for n in range(7)  # one full batch of 5 goes out, 2 wait for the linger
            ]
            await until(lambda: provider.ledger()["received"] >= 1, "the first batch was sent")
            closing = asyncio.ensure_future(dispatcher.aclose())
            await asyncio.sleep(0.05)
            closing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await closing
            await until(lambda: not dispatcher.bulk.tasks, "the batches were cancelled")
            for row in rows:
                row.cancel()
            await asyncio.gather(*rows, return_exceptions=True)
            sent = provider.ledger()["received"]
            await asyncio.sleep(0.5)  # well past the linger
            assert provider.ledger()["received"] == sent  # nothing sent after the close
    finally:
        # The provider still works on the cancelled request: let it end before the
        # next test resets the ledger (it would be charged there).
        await asyncio.to_thread(provider.wait_idle)
    assert sent <= 2  # the two batches that existed when the close began, at most


async def test_abort_cancels_the_running_batch_and_sends_nothing_queued(
    provider, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A cancelled chunk attempt aborts its dispatcher: the batch in flight is cancelled,
    members still waiting for the linger are never sent, no timer fires later."""
    provider.configure(latency_ms=[5000, 5000])
    try:
        async with bulk_attempt(tmp_path, linger_ms=300) as (runner, dispatcher, _):
            rows = [
                asyncio.ensure_future(runner.call("company_lookup", {"domain": f"y{n}.example"}))
                for n in range(7)  # one full batch of 5 goes out, 2 wait for the linger
            ]
            await until(lambda: provider.ledger()["received"] >= 1, "the first batch was sent")
            dispatcher.abort()
            await until(lambda: not dispatcher.bulk.tasks, "the batch was cancelled")
            outcomes = await asyncio.gather(*rows, return_exceptions=True)
            await asyncio.sleep(0.6)  # well past the linger
            assert provider.ledger()["received"] == 1  # the queued two were never sent
    finally:
        await asyncio.to_thread(provider.wait_idle)
    assert all(isinstance(o, asyncio.CancelledError) for o in outcomes)


# -- F22: a provider answering 429 over and over parks the call ---------------------


async def test_a_tool_answering_429_over_and_over_parks_instead_of_failing_the_row(
    provider, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    # No Retry-After: the governor backs off by itself, never past the parking horizon,
    # so only counting 429s as failures (the old way) could end the call.
    provider.configure(fail_next={"429": 10_000}, retry_after_header=False)
    catalog = account_catalog(provider.base_url, envs=["ACME_KEY"], account=None)
    tool = catalog.tool("email_finder")
    store = ReceiptLedger.in_file(tmp_path / "receipts.db")
    try:
        async with httpx.AsyncClient() as http:
            client = ProviderClient(catalog, http, environ={"ACME_KEY": "acme-key-1111"})

            def runner(lease: str) -> ToolRunner:
                attempt = Attempt(
                    receipts=store,
                    owner=lease,
                    lease_id=lease,
                    lease_ttl_s=30,
                    park_after_s=PARK_AFTER_S,
                )
                sender = PacedSender(attempt, Governor(catalog.pacing_policies()), client)
                return ToolRunner(catalog, attempt, LiveDispatcher(attempt, sender))

            # Through the runner the row is parked: its receipt is released, not failed.
            parked = runner("L1")
            with pytest.raises(ProviderQuotaExhausted) as raised:
                await asyncio.wait_for(parked.call("email_finder", PERSON), HUNG_S)
            assert raised.value.provider == "acme"
            assert parked.stats.failed == 0
            key = receipt_key(
                tool.id, tool.version, tool.validate_input(PERSON), client.auth_scope(tool)
            )
            receipt = (await store.get([key]))[key]
            assert receipt.status == "running" and receipt.error is None  # released
            [claim] = await store.claim(
                [ClaimRequest(key, tool.id)], owner="x", lease_id="X", ttl_s=0.01
            )
            assert claim.status is ClaimStatus.CLAIMED  # free for the next attempt at once
            await store.release([key], lease_id="X")

            # The sender's outcome is Parked: a value, not a failure.
            attempt = Attempt(
                receipts=store, owner="s", lease_id="S", lease_ttl_s=30, park_after_s=PARK_AFTER_S
            )
            sender = PacedSender(attempt, Governor(catalog.pacing_policies()), client)
            outcome = await asyncio.wait_for(
                sender.send(Request(tool, tool.validate_input(PERSON), "idem-429", ())), HUNG_S
            )
            assert isinstance(outcome, Parked), outcome
            assert attempt.stats.failed == 0 and attempt.stats.made == 0

            # The provider takes it later: the same call, retried, is answered and paid once.
            provider.configure(fail_next={})
            later = runner("L2")
            answer = await asyncio.wait_for(later.call("email_finder", PERSON), HUNG_S)
            assert not answer.cached and answer.data["email"]
    finally:
        await store.close()
    ledger = provider.ledger()
    assert ledger["rate_limited"] >= 2 and ledger["charged"] == 1


async def test_a_row_that_shares_a_call_it_paid_for_in_a_killed_attempt_still_counts_its_cost(
    provider, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Row A paid for a company lookup in an attempt that died before its row was
    written; in the retry row B leads the same call and finds the receipt (reused, free),
    and row A shares B's call: A's cell must still say A paid, or the run's spend would
    fall short of the provider's bill."""
    from tests.conftest import demo_catalog

    catalog = Catalog.from_toml(demo_catalog(tmp_path))
    tool = catalog.tool("company_lookup")
    store = ReceiptLedger.in_file(tmp_path / "receipts.db")
    item = {"domain": "shared.example"}
    try:
        async with httpx.AsyncClient() as http:
            client = provider_client(catalog, http)

            def runner(lease_id: str) -> ToolRunner:
                return live_runner(
                    catalog, store, client, owner=lease_id, lease_id=lease_id, lease_ttl_s=30
                )

            first = await runner("killed").call(tool.id, item, payer="run#A")
            assert first.receipt == "paid" and first.credits == 0.5
            retry = runner("retry")
            led, shared = await asyncio.gather(
                retry.call(tool.id, item, payer="run#B"), retry.call(tool.id, item, payer="run#A")
            )
            # Row A's next column asks for the same company: its cost is counted once.
            again = await retry.call(tool.id, item, payer="run#A")
    finally:
        await store.close()
    assert (led.receipt, led.credits) == ("reused", 0.0)
    assert (shared.receipt, shared.credits) == ("paid", 0.5)
    assert (again.receipt, again.credits) == ("shared", 0.0)
    assert provider.ledger()["charged"] == 1
