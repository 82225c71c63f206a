"""The run's account with each provider, checked against the provider server's ledger.

Real Temporal dev server, real worker, real SQLite, real HTTP to the provider server,
whose ledger is the judge. Per provider, playline's figures (``stats.accounts``, the
terms of :mod:`playline.calls.accounting`) must equal what the provider recorded:
requests sent == ``received_by_provider``, calls charged == ``billed_by_provider``
(charges billed more than 0), replays == ``replays_by_provider``, credits ==
``credits_by_provider``; under injected faults, charged ones included, where playline
re-sends under the same ``Idempotency-Key`` and the provider replays its answer.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from playline.calls.catalog import Catalog
from playline.calls.provenance import SpendTally, run_spend
from playline.calls.runner import ToolRunner
from playline.config import Settings
from playline.contract import PlayRunResult, RunOptions
from playline.provider_server import idem_digest
from playline.services import Services
from playline.spend import TERMS
from playline.stores.receipts import idempotency_key, receipt_key
from playline.stores.receipts_ledger import ReceiptLedger
from tests.conftest import (
    LEADS_CSV,
    bulk_catalog,
    core_charged,
    demo_catalog,
    live_runner,
    new_id,
    provider_client,
    start_worker_process,
)
from tests.e2e.test_cli import playline
from tests.e2e.test_crash_recovery import first_rows, wait_for
from tests.plays import lead, run, write_csv

#: About 10 % of the requests get a fault: 6 % of them after the provider charged
#: (the answer broken, dropped, or held past the client's timeout), 4 % before.
FAULT_RATES = {
    "fault_rate_5xx": 0.02,
    "fault_rate_timeout": 0.02,
    "fault_rate_malformed": 0.015,
    "fault_rate_500_after_charge": 0.015,
    "fault_rate_drop_after_charge": 0.015,
    "fault_rate_timeout_after_charge": 0.015,
}
#: The demo play's providers (its waterfall's included).
PROVIDERS = ("acme", "firmo", "mailfox", "prospectr", "verifly")
#: Providers that bill every request they charge (no free miss): billed == charged.
PER_REQUEST = ("acme", "firmo", "verifly")
#: Long enough that a test fails rather than hangs; never a timing assertion.
HUNG_S = 30.0
PERSON = {"first_name": "Ada", "last_name": "Lovelace", "domain": "accounts.example"}


def assert_accounts_equal_the_ledger(
    accounts: dict[str, Any], ledger: dict[str, Any], providers: tuple[str, ...] = PROVIDERS
) -> None:
    """Every term the ledger records, provider by provider."""
    for provider in providers:
        mine = accounts.get(provider, {})
        assert mine.get("requests", 0) == ledger["received_by_provider"].get(provider, 0), provider
        assert mine.get("charged", 0) == ledger["billed_by_provider"].get(provider, 0), provider
        assert mine.get("replays", 0) == ledger["replays_by_provider"].get(provider, 0), provider
        assert mine.get("credits", 0.0) == pytest.approx(
            ledger["credits_by_provider"].get(provider, 0.0), abs=1e-9
        ), provider
    for provider in PER_REQUEST:
        if provider in providers:
            assert ledger["billed_by_provider"].get(provider, 0) == ledger[
                "charged_by_provider"
            ].get(provider, 0)


async def test_under_ten_percent_faults_every_providers_account_equals_its_ledger(
    client, provider, worker, task_queue, tmp_path
) -> None:
    """The 240-row demo play with ~10 % injected faults (charged ones included), then
    the same play again: the first run's accounts equal the ledger term by term, and the
    rerun sends nothing and says what the receipts saved: what the first run paid."""
    # A held answer outlasts the client's timeout: the client gives up on a request
    # that went out (and, after the charge, was paid) and re-sends it under its key.
    catalog = demo_catalog(tmp_path, timeout_s=1.0)
    provider.configure(timeout_sleep_s=1.5, **FAULT_RATES)
    play_input = {"csv_path": str(LEADS_CSV)}
    async with worker(catalog_path=str(catalog)):
        first = await run(
            client,
            "enrich_leads",
            play_input,
            task_queue=task_queue,
            options=RunOptions(chunk_size=20),
            timeout_s=240,
        )
        # Requests the client gave up on are still held by the provider: let them end.
        ledger = await asyncio.to_thread(provider.wait_idle, 60)
        provider.configure(**dict.fromkeys(FAULT_RATES, 0.0))
        again = await run(
            client,
            "enrich_leads",
            play_input,
            task_queue=task_queue,
            options=RunOptions(chunk_size=20),
            timeout_s=240,
        )

    # The faults happened, charged ones too, and were answered by replays.
    faults = ledger["faults_by_kind"]
    assert {"500_after_charge", "drop_after_charge", "timeout_after_charge", "malformed"} <= set(
        faults
    ), faults
    assert sum(ledger["replays_by_provider"].values()) > 0
    assert ledger["double_charged"] == 0
    assert first.stats.rows_ok == 236 and first.stats.rows_failed == 0

    accounts = first.stats.accounts
    assert set(accounts) == set(PROVIDERS)
    assert_accounts_equal_the_ledger(accounts, ledger)
    # The dataset run's own figures are the play's (one dataset).
    assert first.datasets[0].stats.accounts == accounts
    # The accounts agree with the run's totals and with each other.
    assert sum(a["credits"] for a in accounts.values()) == pytest.approx(first.stats.credits)
    assert sum(a["shared"] for a in accounts.values()) == first.stats.calls_shared
    assert accounts["firmo"]["shared"] > 0  # company_name and industry: one call
    for name in ("acme", "mailfox", "prospectr", "verifly"):  # one call per person
        assert accounts[name]["hits"] == accounts[name]["followers"] == 0, name
        assert accounts[name]["saved"] == 0, name
    # A domain looked up by an earlier (or a concurrent) chunk is a receipt hit (or a
    # follower) here, and saves the lookup's price.
    firmo = accounts["firmo"]
    assert firmo["saved"] == pytest.approx(0.5 * (firmo["hits"] + firmo["followers"]))
    assert sum(a["followers"] for a in accounts.values()) == first.stats.calls_waited

    # The rerun: not one request; every call a receipt hit or shared, nothing charged.
    assert provider.ledger()["received"] == ledger["received"]
    rerun = again.stats.accounts
    assert set(rerun) == set(PROVIDERS)
    for name, counts in rerun.items():
        assert (counts["requests"], counts["charged"], counts["credits"]) == (0, 0, 0.0), name
        assert counts["hits"] > 0, name
    assert sum(a["hits"] for a in rerun.values()) == again.stats.calls_cached
    # Each person's calls are answered by their own receipts, once: saved is exactly
    # what the first run paid. (A company is looked up again by each chunk with a lead
    # there: it saves its price once per chunk, at least what was paid.)
    for name in ("acme", "mailfox", "prospectr", "verifly"):
        assert rerun[name]["saved"] == pytest.approx(accounts[name]["credits"]), name
    assert rerun["firmo"]["saved"] >= accounts["firmo"]["credits"]


async def test_a_charged_answer_lost_on_the_way_back_is_replayed_counted_and_not_charged(
    provider, tmp_path
) -> None:
    """The provider charges, the answer is lost (a 500, a dropped connection); playline
    re-sends under the same Idempotency-Key and the provider replays it: two requests,
    one replay, one charge; the same call again in the attempt is shared, in another
    attempt a receipt hit that saved the price; a call waited for while its owner's
    request is in flight is a follower."""
    catalog = demo_catalog(tmp_path)  # every provider de-duplicates keys
    store = ReceiptLedger.in_file(tmp_path / "receipts.db")
    try:
        async with httpx.AsyncClient() as http:
            client = provider_client(Catalog.from_toml(catalog), http)

            def attempt(name: str) -> ToolRunner:
                return live_runner(
                    Catalog.from_toml(catalog),
                    store,
                    client,
                    owner=name,
                    lease_id=name,
                    lease_ttl_s=120,
                )

            for n, fault in enumerate(("500_after_charge", "drop_after_charge"), start=1):
                provider.configure(fail_next={fault: 1})
                person = {**PERSON, "first_name": f"Ada{n}"}
                first = attempt(f"A{n}")
                found = await asyncio.wait_for(first.call("email_finder", person), HUNG_S)
                assert not found.cached and found.credits == 1.0
                shared = await asyncio.wait_for(first.call("email_finder", person), HUNG_S)
                assert shared.receipt == "shared"
                acme = first.stats.by_provider["acme"]
                assert (acme.requests, acme.replays, acme.charged, acme.credits) == (2, 1, 1, 1.0)
                assert (acme.hits, acme.shared, acme.followers, acme.saved) == (0, 1, 0, 0.0)
                # Both requests carried the call's key; the second was answered by replay.
                key = receipt_key(
                    "email_finder",
                    first.catalog.tool("email_finder").version,
                    first.catalog.tool("email_finder").validate_input(person),
                    client.auth_scope(first.catalog.tool("email_finder")),
                )
                calls = [
                    c for c in provider.calls() if c["idem"] == idem_digest(idempotency_key(key))
                ]
                assert [c["duplicate"] for c in calls] == [False, True]

                later = attempt(f"B{n}")
                reused = await asyncio.wait_for(later.call("email_finder", person), HUNG_S)
                assert reused.receipt == "reused"
                acme = later.stats.by_provider["acme"]
                assert (acme.requests, acme.charged, acme.hits, acme.saved) == (0, 0, 1, 1.0)
            ledger = provider.ledger()
            assert ledger["received_by_provider"] == {"acme": 4}
            assert ledger["replays_by_provider"] == {"acme": 2}
            assert ledger["billed_by_provider"] == ledger["charged_by_provider"] == {"acme": 2}
            assert ledger["double_charged"] == 0

            # A follower: the owner's request is held by the provider while it waits.
            # long enough that the follower claims while the owner's request is held,
            # however loaded the machine (the test waits for it either way)
            provider.configure(latency_ms=[4000, 4000])
            owner, follower = attempt("C"), attempt("D")
            owned = asyncio.ensure_future(owner.call("person_enrich", {"email": "g@x.example"}))
            await asyncio.to_thread(
                provider.wait_ledger, lambda ledger: ledger["in_flight"] >= 1, HUNG_S
            )
            waited = await asyncio.wait_for(
                follower.call("person_enrich", {"email": "g@x.example"}), HUNG_S
            )
            await asyncio.wait_for(owned, HUNG_S)
            assert waited.receipt == "waited"
            mine = follower.stats.by_provider["acme"]
            assert (mine.requests, mine.charged, mine.followers, mine.saved) == (0, 0, 1, 2.0)
            theirs = owner.stats.by_provider["acme"]
            assert (theirs.requests, theirs.charged, theirs.credits) == (1, 1, 2.0)
            assert provider.ledger()["received_by_provider"] == {"acme": 5}
    finally:
        await store.close()


async def test_a_bulk_request_is_one_request_and_one_charge_for_its_members(
    provider, tmp_path
) -> None:
    catalog = Catalog.from_toml(bulk_catalog(tmp_path))
    store = ReceiptLedger.in_file(tmp_path / "receipts.db")
    try:
        async with httpx.AsyncClient() as http:
            runner = live_runner(
                catalog,
                store,
                provider_client(catalog, http),
                owner="bulk",
                lease_id="bulk",
                lease_ttl_s=120,
            )
            domains = [f"bulk{n}.example" for n in range(3)]
            calls = [runner.call("company_lookup", {"domain": d}) for d in domains]
            await asyncio.wait_for(asyncio.gather(*calls), HUNG_S)
            await runner.dispatcher.aclose()
    finally:
        await store.close()
    ledger = provider.ledger()
    assert ledger["items_charged"] == 3
    firmo = runner.stats.by_provider["firmo"]
    assert (firmo.requests, firmo.charged, firmo.credits) == (1, 1, 1.5)
    assert_accounts_equal_the_ledger(
        {"firmo": {"requests": 1, "charged": 1, "replays": 0, "credits": 1.5}},
        ledger,
        ("firmo",),
    )


def table_row(output: str, provider: str) -> dict[str, float]:
    """A provider's row of the accounts table a command printed, by term."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "accounts by provider:")
    for line in lines[start + 2 :]:
        cells = line.split()
        if not cells or cells[0] != provider:
            continue
        return {term: float(cell) for (term, _), cell in zip(TERMS, cells[1:], strict=True)}
    raise AssertionError(f"no {provider} row in:\n{output}")


async def test_the_cli_summary_and_runs_get_show_the_accounts_table(
    provider, worker, temporal_address, task_queue, home, tmp_path
) -> None:
    """``playline run`` prints the table, ``runs get`` the same, and they equal the
    ledger: 6 rows, two charged answers lost and replayed, then a rerun that is all
    receipt hits."""
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(6)])
    common = ("--address", temporal_address, "--task-queue", task_queue)
    provider.configure(fail_next={"500_after_charge": 1, "drop_after_charge": 1})
    async with worker():
        ran = await playline(
            "run", "t_tool_column", "--csv", str(csv_path), "--id", "acct-1", *common, home=home
        )
        assert ran.returncode == 0, ran.stderr
        got = await playline("runs", "get", "acct-1", *common, home=home)
        assert got.returncode == 0, got.stderr
        again = await playline(
            "run", "t_tool_column", "--csv", str(csv_path), "--id", "acct-2", *common, home=home
        )
        assert again.returncode == 0, again.stderr
    ledger = provider.ledger()
    assert (ledger["received"], ledger["charged"], ledger["duplicates"]) == (8, 6, 2)
    expected = {
        "requests": 8,
        "charged": 6,
        "replays": 2,
        "hits": 0,
        "shared": 0,
        "followers": 0,
        "credits": 6.0,
        "saved": 0.0,
    }
    assert table_row(ran.stdout, "acme") == expected
    assert table_row(got.stdout, "acme") == expected
    rerun = {**dict.fromkeys(expected, 0.0), "hits": 6, "saved": 6.0}
    assert table_row(again.stdout, "acme") == rerun
    header = "provider  requests  charged  replays  receipt hits  shared  followers  credits  saved"
    assert header in ran.stdout


async def test_a_sigkilled_worker_never_makes_the_accounts_count_a_charge_twice(
    client, provider, temporal_address, task_queue, tmp_path
) -> None:
    """A worker killed mid-run loses what it counted since its last heartbeat (the
    docstring of ``playline.calls.accounting`` says so): the accounts may then fall
    short of the ledger, never exceed it; its rows read their own earlier answers as
    paid by them, so the cells' spend from the store stays exactly the ledger's."""
    provider.configure(latency_ms=[80, 120])
    csv_path = first_rows(60, tmp_path / "leads60.csv")
    home = tmp_path / "home"
    log = tmp_path / "worker.log"
    options = RunOptions(chunk_size=5, heartbeat_timeout_s=3, max_chunks_in_flight=4)
    first = start_worker_process(temporal_address, task_queue, home, log)
    handle = await client.start_workflow(
        "enrich_leads",
        args=[{"csv_path": str(csv_path)}, options],
        id=new_id("acct-kill"),
        task_queue=task_queue,
        result_type=PlayRunResult,
    )
    try:
        await wait_for(lambda: core_charged(provider.ledger()) >= 25, 60, "the first charges")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        assert core_charged(provider.ledger()) < 120, "the play finished before the kill"
        second = start_worker_process(temporal_address, task_queue, home, log)
        try:
            result = await asyncio.wait_for(handle.result(), 120)
        finally:
            second.terminate()
            second.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
    ledger = await asyncio.to_thread(provider.wait_idle, 60)
    assert result.stats.rows_ok == 60 and ledger["double_charged"] == 0
    accounts = result.stats.accounts
    for name in PROVIDERS:
        mine = accounts.get(name, {})
        for term, billed in (
            ("requests", "received_by_provider"),
            ("charged", "billed_by_provider"),
            ("replays", "replays_by_provider"),
        ):
            assert 0 <= mine.get(term, 0) <= ledger[billed].get(name, 0), (name, term)
        assert mine.get("credits", 0.0) <= ledger["credits_by_provider"].get(name, 0.0) + 1e-9
    spend = await run_spend_of(home, result.datasets[0].run_ref)
    for name in PROVIDERS:
        assert spend.by_provider.get(name, 0.0) == pytest.approx(
            ledger["credits_by_provider"].get(name, 0.0), abs=1e-9
        ), name


async def run_spend_of(home: Path, run_ref: str) -> SpendTally:
    """A dataset run's spend summed from the worker's store (the exact figure)."""
    services = await Services.open(Settings.from_env(home=home))
    try:
        return await run_spend(services.sheet, run_ref)
    finally:
        await services.close()
