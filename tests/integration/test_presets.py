"""The catalog presets for real vendors, over real HTTP against their shapes on the provider server.

Every preset loads through a small catalog that includes it; each preset tool is then
called once per input through playline's own ``ProviderClient`` (keys and base URLs
from the environment, as a worker reads them), at the provider server's ``/<vendor>``
copy of the vendor's documented endpoint. The getters must read the documented fields
(the email for a found input, None for a miss) and the credits the tool's billing rule
computes must equal what the provider's ledger billed.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from playline.calls.bulk import bulk_items, split_results
from playline.calls.catalog import Catalog, ToolSpec, load_preset, preset_names
from playline.calls.http import ProviderClient
from playline.provider_server import ProviderServerProcess, fake_data
from tests.conftest import provider_client

VENDORS = ("apollo", "findymail", "hunter", "prospeo")
FIRST = ("Ada", "Grace", "Alan", "Edsger", "Barbara")
LAST = ("Hopper", "Liskov", "Turing", "Knuth")
#: 20 people: one bulk request of Prospeo's (50), two of Apollo's (10 each)
PEOPLE = [
    (first, last, f"company{i}.example")
    for i, (first, last) in enumerate(zip(FIRST * 4, LAST * 5, strict=True))
]


def load(tmp_path: Path, *names: str) -> Catalog:
    """A catalog file that includes the named presets and declares nothing itself."""
    path = tmp_path / f"catalog-{uuid.uuid4().hex[:6]}.toml"
    path.write_text(f"include = {list(names)!r}\n".replace("'", '"'))
    return Catalog.from_toml(path)


@pytest.fixture
def vendors_env(provider: ProviderServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each vendor's base URL pointed at its copy on the provider server, and a key."""
    for vendor in VENDORS:
        monkeypatch.setenv(f"{vendor.upper()}_BASE_URL", f"{provider.base_url}/{vendor}")
        monkeypatch.setenv(f"{vendor.upper()}_API_KEY", f"test-{vendor}-key-0123")


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


def test_every_preset_loads_and_cites_its_docs(tmp_path: Path) -> None:
    assert set(VENDORS) <= set(preset_names())
    for name in preset_names():
        if not load_preset(name).get("providers"):
            continue  # waterfalls.toml: named waterfalls over the other presets' tools
        catalog = load(tmp_path, name)
        assert catalog.providers and (catalog.tools or catalog.sinks)
        for provider_name, provider in catalog.providers.items():
            assert provider.source and provider.source.startswith("https://")
            assert provider.base_url.startswith("https://")
            assert provider.auth is not None
            if catalog.sinks:  # CRMs name theirs: an access token, Salesforce's instance URL
                assert provider.base_url_env in (
                    f"{provider_name.upper()}_BASE_URL",
                    f"{provider_name.upper()}_INSTANCE_URL",
                )
                assert provider.auth.envs == (f"{provider_name.upper()}_ACCESS_TOKEN",)
                continue
            assert provider.base_url_env == f"{provider_name.upper()}_BASE_URL"
            assert provider.auth.envs == (f"{provider_name.upper()}_API_KEY",)
        for tool in catalog.tools.values():
            assert tool.source and tool.source.startswith("https://"), tool.id
            # Finders bill by outcome; a verifier billing every request states its price.
            assert tool.billing.rule != "per_request" or tool.billing.credits is not None
        for sink_name, sink in catalog.sinks.items():
            assert sink.source and sink.source.startswith("https://"), sink_name


def test_all_presets_load_together_and_the_catalog_wins_a_name_clash(tmp_path: Path) -> None:
    catalog = load(tmp_path, *VENDORS)
    assert set(catalog.providers) == set(VENDORS)
    path = tmp_path / "own.toml"
    path.write_text(
        'include = ["hunter"]\n'
        "[providers.hunter]\n"
        'base_url = "http://127.0.0.1:1"\n'
        'auth = { env = "MY_HUNTER_KEY", header = "X-API-KEY" }\n'
    )
    own = Catalog.from_toml(path)
    assert own.providers["hunter"].base_url == "http://127.0.0.1:1"
    assert "hunter_email_finder" in own.tools


async def send_each(
    client: ProviderClient, tool: ToolSpec, payloads: list[dict[str, str]]
) -> list[Any]:
    """One call per input, each with its own Idempotency-Key."""
    return [
        await client.send(tool, payload, idempotency_key=f"{tool.id}-{at}")
        for at, payload in enumerate(payloads)
    ]


async def send_batches(
    client: ProviderClient, tool: ToolSpec, payloads: list[dict[str, str]], run: str = "1"
) -> tuple[list[Any], float]:
    """Every input once, in bulk requests as playline builds them; the member results
    in input order and the credits the tool's billing computes for them.

    ``run`` is part of each request's Idempotency-Key: another run is a new request
    (the same key would be answered from the server's store, charge figures included).
    """
    assert tool.batch is not None
    results: list[Any] = []
    credits = 0.0
    size = tool.batch.max_items
    for start in range(0, len(payloads), size):
        chunk = payloads[start : start + size]
        body = {tool.batch.items_field: bulk_items(tool, chunk)}
        response = await client.send(
            tool, body, idempotency_key=f"{tool.id}#{run}-{start}", path=tool.batch.path
        )
        members = split_results(tool, response, len(chunk))
        shares, source = tool.bulk_charges(response, members)
        assert source == "provider"  # read from the body's reported total
        results += members
        credits += sum(shares)
    return results, credits


def assert_billed(provider: ProviderServerProcess, vendor: str, credits: float) -> None:
    ledger = provider.ledger()
    assert ledger["credits_by_provider"].get(vendor, 0.0) == pytest.approx(credits)
    assert ledger["double_charged"] == 0


@pytest.mark.usefixtures("vendors_env")
async def test_hunter_email_finder(
    provider: ProviderServerProcess, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    catalog = load(tmp_path, "hunter")
    tool = catalog.tool("hunter_email_finder")
    payloads = [{"first_name": f, "last_name": ln, "domain": d} for f, ln, d in PEOPLE]
    results = await send_each(provider_client(catalog, http), tool, payloads)
    rate = provider.current_config()["hit_rates"]["hunter"]
    found = 0
    for payload, result in zip(payloads, results, strict=True):
        expected = fake_data.hunter_email_finder(**payload, hit_rate=rate)
        assert result == expected
        assert tool.get(result, "email") == expected["data"]["email"]
        found += tool.get(result, "email") is not None
        assert tool.charge(result).credits == (1.0 if tool.get(result, "email") else 0.0)
    assert 0 < found < len(payloads)
    assert_billed(provider, "hunter", float(found))
    assert {c["path"] for c in provider.calls()} == {"/hunter/v2/email-finder"}


@pytest.mark.usefixtures("vendors_env")
async def test_findymail_email_finder(
    provider: ProviderServerProcess, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    catalog = load(tmp_path, "findymail")
    tool = catalog.tool("findymail_email_finder")
    payloads = [{"name": f"{f} {ln}", "domain": d} for f, ln, d in PEOPLE]
    results = await send_each(provider_client(catalog, http), tool, payloads)
    rate = provider.current_config()["hit_rates"]["findymail"]
    credits = 0.0
    for payload, result in zip(payloads, results, strict=True):
        expected = fake_data.findymail_search_name(**payload, hit_rate=rate)
        assert result == expected
        contact = expected["contact"]
        assert tool.get(result, "email") == (contact["email"] if contact else None)
        credits += tool.charge(result).credits
    assert 0 < credits < len(payloads)
    assert_billed(provider, "findymail", credits)


@pytest.mark.usefixtures("vendors_env")
async def test_prospeo_bulk_enrich_person(
    provider: ProviderServerProcess, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    catalog = load(tmp_path, "prospeo")
    tool = catalog.tool("prospeo_enrich_person")
    payloads = [{"first_name": f, "last_name": ln, "company_website": d} for f, ln, d in PEOPLE]
    client = provider_client(catalog, http)
    results, credits = await send_batches(client, tool, payloads)
    rate = provider.current_config()["hit_rates"]["prospeo"]
    found = 0
    for payload, result in zip(payloads, results, strict=True):
        match = fake_data.prospeo_person(payload, rate)
        if match is None:
            assert result is None
            continue
        found += 1
        assert tool.get(result, "email") == match["person"]["email"]["email"]
        assert tool.get(result, "free_enrichment") is False
    assert 0 < found < len(payloads)
    assert credits == found
    assert_billed(provider, "prospeo", credits)

    # The same records again: Prospeo does not bill a record twice per account.
    again, credits_again = await send_batches(client, tool, payloads, run="2")
    assert credits_again == 0.0
    assert all(r is None or tool.get(r, "free_enrichment") is True for r in again)
    ledger = provider.ledger()
    assert ledger["credits_by_provider"]["prospeo"] == credits
    assert ledger["double_charged"] == 1  # the second request was processed, for 0 credits


@pytest.mark.usefixtures("vendors_env")
async def test_apollo_bulk_people_match(
    provider: ProviderServerProcess, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    catalog = load(tmp_path, "apollo")
    tool = catalog.tool("apollo_people_match")
    payloads = [{"first_name": f, "last_name": ln, "domain": d} for f, ln, d in PEOPLE]
    results, credits = await send_batches(provider_client(catalog, http), tool, payloads)
    rate = provider.current_config()["hit_rates"]["apollo"]
    for payload, result in zip(payloads, results, strict=True):
        match = fake_data.apollo_match(payload, rate)
        assert result == match
        assert tool.get(result, "email") == (match["email"] if match else None)
    found = sum(r is not None for r in results)
    assert 0 < found < len(payloads)
    assert credits == found
    assert_billed(provider, "apollo", credits)


@pytest.mark.usefixtures("vendors_env")
async def test_a_wrong_vendor_header_is_refused(
    provider: ProviderServerProcess, http: httpx.AsyncClient
) -> None:
    """The vendor copies check each vendor's own auth header, as the real APIs do."""
    response = await http.get(
        f"{provider.base_url}/hunter/v2/email-finder",
        params={"first_name": "Ada", "last_name": "Hopper", "domain": "a.example"},
        headers={"Authorization": "Bearer k"},
    )
    assert response.status_code == 401
    assert provider.ledger()["credits"] == 0.0
