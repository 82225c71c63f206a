"""Balance readings: the store (SQLite and PostgreSQL) and reading them from the provider
server, where each vendor's balance endpoint reports its ledger.

A reading is receipted: the first recorded for a run, phase and provider stands, and
asking again reads the store, not the provider. A failed read is recorded with a reason
that holds no key.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from playline.calls.catalog import Catalog
from playline.reconcile.read import read_run_balances
from playline.stores.backends import Stores
from playline.stores.balances import BalanceLedger, BalanceReading

CATALOG = {
    "providers": {
        "hunter": {
            "base_url": "http://unused",
            "base_url_env": "HUNTER_BASE_URL",
            "auth": {"env": "HUNTER_API_KEY", "header": "X-API-KEY"},
            "balance": {"path": "/v2/account", "used": "data.requests.searches.used"},
        },
        "findymail": {
            "base_url": "http://unused",
            "base_url_env": "FINDYMAIL_BASE_URL",
            "auth": {"env": "FINDYMAIL_API_KEY", "scheme": "Bearer"},
            "balance": {"path": "/api/credits", "remaining": "credits"},
        },
        "apollo": {"base_url": "http://unused", "auth": {"env": "APOLLO_API_KEY"}},
    },
    "tools": {},
}


async def test_the_first_reading_stands_and_the_latest_is_per_provider(stores: Stores) -> None:
    ledger = stores.balances
    assert ledger is not None
    first = BalanceReading("run-1", "r1", "before", "hunter", "used", 3.0, None, 10.0)
    assert (await ledger.record(first)).value == 3.0
    again = BalanceReading("run-1", "r1", "before", "hunter", "used", 9.0, None, 11.0)
    assert await ledger.record(again) == first  # the first one stands
    failed = BalanceReading("run-1", "r1", "after", "hunter", "used", None, "answered 503", 12.0)
    await ledger.record(failed)
    other_run = BalanceReading("run-1", "r2", "before", "hunter", "used", 5.0, None, 13.0)
    await ledger.record(other_run)
    assert [r.phase for r in await ledger.readings("run-1", "r1")] == ["before", "after"]
    assert len(await ledger.readings("run-1")) == 3
    assert await ledger.readings("run-2") == []
    latest = await ledger.latest()
    assert latest["hunter"].value == 5.0  # the latest read that succeeded


async def test_readings_come_from_each_vendors_endpoint_once_per_phase(
    provider, tmp_path: Path
) -> None:
    catalog = Catalog.model_validate(CATALOG)
    environ = {
        "HUNTER_BASE_URL": f"{provider.base_url}/hunter",
        "HUNTER_API_KEY": "test-hunter-key",
        "FINDYMAIL_BASE_URL": f"{provider.base_url}/findymail",
        "FINDYMAIL_API_KEY": "test-findymail-key",
        # no APOLLO_API_KEY: apollo declares no balance anyway
    }
    provider.configure(starting_balance={"findymail": 40.0}, hit_rates={"hunter": 1.0})
    store = BalanceLedger.in_file(tmp_path / "balances.db")
    async with httpx.AsyncClient() as http:

        async def read(phase: str, run_id: str = "r1") -> dict[str, float | None]:
            found = await read_run_balances(
                store, http, catalog, environ, run="run-1", run_id=run_id, phase=phase
            )
            return {r.provider: r.value for r in found}

        assert await read("before") == {"findymail": 40.0, "hunter": 0.0}
        # Hunter bills one email found; the ledger's balance moves with it.
        found = await http.get(
            f"{provider.base_url}/hunter/v2/email-finder",
            params={"first_name": "Ada", "last_name": "Lovelace", "domain": "example.com"},
            headers={"X-API-KEY": "test-hunter-key"},
        )
        assert found.status_code == 200
        assert await read("after") == {"findymail": 40.0, "hunter": 1.0}
        # A retried activity, a replay: the store answers, the provider is not asked.
        assert await read("before") == {"findymail": 40.0, "hunter": 0.0}
        assert provider.ledger()["balance_reads_by_provider"] == {"hunter": 2, "findymail": 2}
        # A refused key is a failed reading, recorded, naming no key.
        provider.configure(api_keys={"hunter": "the-right-key"})
        [hunter] = [
            r
            for r in await read_run_balances(
                store, http, catalog, environ, run="run-1", run_id="r2", phase="before"
            )
            if r.provider == "hunter"
        ]
        assert hunter.value is None and hunter.error == "/v2/account answered 401"
    await store.close()


async def test_a_balance_endpoint_wants_the_providers_key(provider) -> None:
    async with httpx.AsyncClient() as http:
        refused = await http.get(f"{provider.base_url}/prospeo/account-information")
        assert refused.status_code == 401
        answer = await http.get(
            f"{provider.base_url}/fullenrich/api/v2/account/credits",
            headers={"Authorization": "Bearer test-key"},
        )
        assert answer.json() == {"balance": 10_000.0}
    assert provider.ledger()["received"] == 0  # a balance request is not a call
