"""Reconciliation end to end: real Temporal, the provider server reporting each vendor's
balance in its documented shape, and ``playline runs reconcile`` as a user runs it.

A clean run of the presets' play reconciles to 0 difference for every provider that
reports a balance (Hunter's usage counter, Findymail's and Prospeo's credits left),
Apollo (no balance endpoint) is named as not read. A run where the server charges a
Hunter call and drops the connection before the answer ("charged then dropped") shows
a difference of exactly that call's credit, and names its receipt: the one the
provider's ledger says was dropped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from playline.provider_server import idem_digest
from playline.stores.receipts import idempotency_key
from tests.e2e.test_cli import playline
from tests.e2e.test_controls import current_details
from tests.e2e.test_crash_recovery import first_rows
from tests.plays import run
from tests.plays_reconcile import t_reconcile_hunter

PLAY = t_reconcile_hunter.play_name

#: Hunter as the preset has it, with the balance its account endpoint reports.
HUNTER = """
[providers.hunter]
base_url = "https://api.hunter.io"
base_url_env = "HUNTER_BASE_URL"
auth = { env = "HUNTER_API_KEY", header = "X-API-KEY" }
idempotency = "none"
pacing = { rps = 50, burst = 10, max_concurrency = 8 }
balance = { path = "/v2/account", used = "data.requests.searches.used" }
"""

PRESETS = (
    """
include = ["hunter", "findymail", "apollo", "prospeo"]
"""
    + HUNTER
    + """
[providers.findymail]
base_url = "https://app.findymail.com"
base_url_env = "FINDYMAIL_BASE_URL"
auth = { env = "FINDYMAIL_API_KEY", header = "Authorization", scheme = "Bearer" }
pacing = { rps = 50, burst = 10, max_concurrency = 8 }
balance = { path = "/api/credits", remaining = "credits" }

[providers.apollo]
base_url = "https://api.apollo.io"
base_url_env = "APOLLO_BASE_URL"
auth = { env = "APOLLO_API_KEY", header = "X-Api-Key" }
pacing = { rps = 50, burst = 10, max_concurrency = 8 }

[providers.prospeo]
base_url = "https://api.prospeo.io"
base_url_env = "PROSPEO_BASE_URL"
auth = { env = "PROSPEO_API_KEY", header = "X-KEY" }
idempotency = "natural"
pacing = { rps = 50, burst = 10, max_concurrency = 8 }
balance = { path = "/account-information", remaining = "response.remaining_credits" }

[waterfalls.preset_email]
steps = [
    "hunter_email_finder",
    { tool = "findymail_email_finder", input = { name = "full_name", domain = "domain" } },
]
value = "email"
"""
)

VENDORS = ("hunter", "findymail", "apollo", "prospeo")


@pytest.fixture
def vendors(provider, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every vendor pointed at the provider server."""
    for vendor in VENDORS:
        monkeypatch.setenv(f"{vendor.upper()}_BASE_URL", f"{provider.base_url}/{vendor}")
        monkeypatch.setenv(f"{vendor.upper()}_API_KEY", f"test-{vendor}-key")


def catalog(tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The catalog file, also the CLI's (``PLAYLINE_CATALOG``: each tool's provider)."""
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    monkeypatch.setenv("PLAYLINE_CATALOG", str(path))
    return path


async def reconcile(run_id: str, common: tuple[str, ...], home: Path) -> tuple[int, dict]:  # type: ignore[type-arg]
    done = await playline("runs", "reconcile", run_id, "--json", *common, home=home)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


async def test_a_clean_run_reconciles_to_zero_with_every_balance(
    client, provider, vendors, worker, temporal_address, task_queue, home, tmp_path, monkeypatch
) -> None:
    path = catalog(tmp_path, PRESETS, monkeypatch)
    csv_path = first_rows(12, tmp_path / "leads.csv")
    common = ("--address", temporal_address, "--task-queue", task_queue)
    provider.configure(starting_balance={"findymail": 500.0, "prospeo": 250.0})
    async with worker(catalog_path=str(path)):
        result = await run(
            client,
            "t_presets",
            {"csv_path": str(csv_path)},
            task_queue=task_queue,
            workflow_id="reconcile-clean",
            timeout_s=120,
        )
        code, report = await reconcile("reconcile-clean", common, home)
        got = await playline("runs", "get", "reconcile-clean", *common, home=home)
    shown = await playline("providers", "show", "hunter", "--json", home=home)
    assert result.stats.rows_ok == 12
    ledger = provider.ledger()
    billed = ledger["credits_by_provider"]
    assert code == 0 and report["ok"] is True, report
    figures = report["providers"]
    for vendor, started in (("hunter", None), ("findymail", 500.0), ("prospeo", 250.0)):
        line = figures[vendor]
        assert billed[vendor] > 0, billed
        assert line["verdict"] == "reconciled", line
        assert line["difference"] == pytest.approx(0.0, abs=1e-9)
        assert line["balance_spent"] == pytest.approx(billed[vendor])
        assert line["playline_credits"] == pytest.approx(billed[vendor])
        assert line["calls"] == []
        if started is not None:  # credits left: read down from the starting balance
            assert line["balance_before"]["value"] == started
            assert line["balance_after"]["value"] == pytest.approx(started - billed[vendor])
    # Hunter's usage counter went up from 0 by what it billed.
    assert figures["hunter"]["balance_before"]["value"] == 0.0
    # Prospeo reports its charge in every bulk answer (total_cost): all of it reported.
    assert figures["prospeo"]["reported_credits"] == pytest.approx(billed["prospeo"])
    assert figures["prospeo"]["rule_answers"] == 0
    # Apollo documents no balance endpoint: its figure stands alone.
    assert figures["apollo"]["verdict"] == "no balance"
    assert figures["apollo"]["playline_credits"] == pytest.approx(billed["apollo"])
    # Each balance was read twice (before, after), free, and never counted as a call.
    assert ledger["balance_reads_by_provider"] == {"hunter": 2, "findymail": 2, "prospeo": 2}
    assert got.returncode == 0, got.stderr
    assert "reconciliation of reconcile-clean: every balance read matches" in got.stdout
    # `providers show` gives the last balance read: the run's reading after it.
    assert shown.returncode == 0, shown.stderr
    last = json.loads(shown.stdout)["last_balance"]
    assert last["value"] == pytest.approx(billed["hunter"]) and last["kind"] == "used"
    assert (last["run"], last["phase"]) == ("reconcile-clean", "after")


async def test_a_call_charged_then_dropped_is_the_difference_and_is_named(
    client, provider, vendors, worker, temporal_address, task_queue, home, tmp_path, monkeypatch
) -> None:
    path = catalog(tmp_path, 'include = ["hunter"]\n' + HUNTER, monkeypatch)
    csv_path = first_rows(6, tmp_path / "leads.csv")
    common = ("--address", temporal_address, "--task-queue", task_queue)
    # Hunter de-duplicates nothing, finds every email (1 credit each), and the first
    # call is charged, then its connection dropped half-way through the answer.
    provider.configure(
        idempotency="ignore", hit_rates={"hunter": 1.0}, fail_next={"drop_after_charge": 1}
    )
    async with worker(catalog_path=str(path)):
        result = await run(
            client,
            PLAY,
            {"csv_path": str(csv_path), "dataset": "t_reconcile"},
            task_queue=task_queue,
            workflow_id="reconcile-dropped",
            timeout_s=120,
        )
        handle = client.get_workflow_handle("reconcile-dropped")
        state = await handle.query("state")
        details = await current_details(handle)
        code, report = await reconcile("reconcile-dropped", common, home)
    ledger = provider.ledger()
    assert ledger["charged_unanswered_by_reason"] == {"drop_after_charge": 1}
    assert ledger["credits_by_provider"]["hunter"] == 6.0
    assert result.stats.rows_ok == 5  # the dropped call's row has no answer
    assert code == 1 and report["ok"] is False
    hunter = report["providers"]["hunter"]
    assert hunter["verdict"] == "difference"
    assert hunter["playline_credits"] == 5.0
    assert hunter["balance_spent"] == 6.0
    assert hunter["difference"] == 1.0
    [named] = hunter["calls"]
    # The call named is the one the provider dropped: its Idempotency-Key is the
    # receipt's (playline sends it even to a provider that ignores it).
    dropped = [c for c in provider.calls() if c["unanswered_reason"] == "drop_after_charge"]
    [call] = dropped
    key = named.split(" receipt ", 1)[1].split(" ", 1)[0]
    assert call["idem"] == idem_digest(idempotency_key(key))
    assert "sent, no answer recorded" in named
    # The play's state and its details in the Temporal UI carry the reconciliation.
    assert any("hunter" in line and "difference" in line for line in state["reconciliation"])
    assert "**reconciliation with the providers' balances**" in details
    assert "| hunter | 5 | 0 | 0 | 6 | 6 | 1 (difference) |" in details
    assert key in details
