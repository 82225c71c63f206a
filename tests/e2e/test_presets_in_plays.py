"""The presets from a play: real Temporal, the provider server answering in each vendor's
documented shape, the vendor's billing rule in its ledger.

A catalog that only ``include``s presets (and names one waterfall across two of them)
runs a play calling Hunter and Findymail (single calls, a waterfall mapping its input
onto Findymail's ``name``), Apollo's bulk match (members billed only when matched, the
charge reported in ``credits_consumed``) and Prospeo's bulk enrich (matched by an
``identifier`` playline numbers, ``free_enrichment``, ``total_cost``). playline's credits
per provider must equal the vendor's ledger, and a rerun costs nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from playline.calls.provenance import run_spend
from playline.config import Settings
from playline.services import Services
from tests.e2e.test_crash_recovery import first_rows
from tests.plays import run

VENDORS = ("hunter", "findymail", "apollo", "prospeo")

CATALOG = """
include = ["hunter", "findymail", "apollo", "prospeo"]

# The presets' placeholder limits are per plan; this test judges billing, not pacing,
# so it gives these two a plan that never binds (the catalog's own entries win).
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

[waterfalls.preset_email]
steps = [
    "hunter_email_finder",
    { tool = "findymail_email_finder", input = { name = "full_name", domain = "domain" } },
]
value = "email"
"""


@pytest.fixture
def vendors(provider, monkeypatch, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    """Every preset pointed at the provider server; the catalog's path."""
    for vendor in VENDORS:
        monkeypatch.setenv(f"{vendor.upper()}_BASE_URL", f"{provider.base_url}/{vendor}")
        monkeypatch.setenv(f"{vendor.upper()}_API_KEY", f"test-{vendor}-key")
    path = tmp_path / "presets.toml"
    path.write_text(CATALOG)
    return path


async def _spend(home: Path, run_ref: str) -> Any:
    services = await Services.open(Settings.from_env(home=home))
    try:
        return await run_spend(services.sheet, run_ref)
    finally:
        await services.close()


async def test_presets_bill_in_a_play_as_their_vendors_ledgers_say(
    client, provider, vendors, worker, task_queue, home, tmp_path
) -> None:
    csv_path = first_rows(24, tmp_path / "leads.csv")
    async with worker(catalog_path=str(vendors)):
        first = await run(
            client, "t_presets", {"csv_path": str(csv_path)}, task_queue=task_queue, timeout_s=120
        )
        ledger = provider.ledger()
        again = await run(
            client, "t_presets", {"csv_path": str(csv_path)}, task_queue=task_queue, timeout_s=120
        )
    assert first.stats.rows_ok == 24 and first.stats.rows_failed == 0
    billed = ledger["credits_by_provider"]
    assert all(billed.get(vendor, 0) > 0 for vendor in VENDORS), billed
    spend = await _spend(home, first.datasets[0].run_ref)
    for vendor in VENDORS:
        assert spend.by_provider.get(vendor, 0.0) == pytest.approx(billed[vendor]), vendor
    # Apollo and Prospeo went in bulk requests (10 and 50 members at most).
    paths = ledger["charged_by_path"]
    assert paths.get("/apollo/api/v1/people/bulk_match", 0) >= 3
    assert paths.get("/prospeo/bulk-enrich-person", 0) >= 1
    # The waterfall asked Findymail only for the rows Hunter missed.
    assert spend.steps["email"].get("hunter_email_finder", 0) > 0
    assert 0 < paths.get("/findymail/api/search/name", 0) < 24
    assert ledger["double_charged"] == 0
    # A rerun is answered from receipts: nothing sent, nothing billed.
    assert provider.ledger()["received"] == ledger["received"]
    assert again.stats.calls_made == 0
    assert (await _spend(home, again.datasets[0].run_ref)).credits == 0
