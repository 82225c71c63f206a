"""The provider server bills like real enrichment APIs, and its ledger says what it billed.

playline's credit figures are checked against this ledger, so the ledger itself must
be right: for each demo endpoint, the credits over many inputs equal what the pure
functions of ``fake_data`` say each answer costs (per hit, refund on a miss, per field
with the charge in a header, per request); a keyed replay costs nothing; a charged
fault is billed once; and the hit rate is a knob (0.0 finds nothing, 1.0 everything).
Real HTTP to the session's provider server subprocess; nothing is mocked.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from playline.provider_server import ProviderServerProcess, fake_data
from playline.provider_server.config import DEFAULT_HIT_RATES

MAILFOX = "/mailfox/v1/email/find"
PROSPECTR_FIND = "/prospectr/v1/email/find"
PROSPECTR_ENRICH = "/prospectr/v1/contact/enrich"
VERIFY = "/verifly/v1/verify"
KEY = {"X-Api-Key": "test-key"}
BEARER = {"Authorization": "Bearer test-key"}
FIRST = ("Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken")
LAST = ("Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov")


def people(n: int = 40) -> list[dict[str, str]]:
    """``n`` distinct people at a handful of domains."""
    return [
        {
            "first_name": FIRST[i % len(FIRST)],
            "last_name": LAST[i % len(LAST)],
            "domain": f"company{i}.example",
        }
        for i in range(n)
    ]


@pytest.fixture
async def http(provider: ProviderServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=provider.base_url, timeout=30) as client:
        yield client


async def post(
    http: httpx.AsyncClient, path: str, body: Any, headers: dict[str, str]
) -> httpx.Response:
    response = await http.post(path, json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response


async def test_mailfox_bills_one_credit_per_hit_and_nothing_for_a_miss(
    provider: ProviderServerProcess, http: httpx.AsyncClient
) -> None:
    rate = DEFAULT_HIT_RATES["mailfox"]
    expected = 0.0
    for person in people():
        answer = (await post(http, MAILFOX, person, KEY)).json()
        assert answer == fake_data.mailfox_finds(**person, hit_rate=rate)
        expected += 1.0 if answer["email"] else 0.0
        if answer["email"] is None:
            assert answer["confidence"] == 0
        else:
            assert 40 <= answer["confidence"] <= 99
    ledger = provider.ledger()
    assert 0 < expected < 40  # both outcomes occurred
    assert ledger["credits"] == ledger["credits_by_provider"]["mailfox"] == expected
    assert ledger["credits_by_path"] == {MAILFOX: expected}
    assert ledger["refunds"] == 0
    calls = provider.calls()
    assert sum(c["credits"] for c in calls) == expected
    assert sorted({c["credits"] for c in calls}) == [0.0, 1.0]


async def test_prospectr_charges_two_and_refunds_a_miss(
    provider: ProviderServerProcess, http: httpx.AsyncClient
) -> None:
    rate = DEFAULT_HIT_RATES["prospectr"]
    hits = misses = 0
    for person in people():
        answer = (await post(http, PROSPECTR_FIND, person, BEARER)).json()
        assert answer == fake_data.prospectr_finds(**person, hit_rate=rate)
        if answer["email"] is None:
            misses += 1
            assert answer["score"] is None
        else:
            hits += 1
    ledger = provider.ledger()
    assert hits and misses
    assert ledger["credits"] == 2.0 * hits
    assert ledger["refunds"] == misses
    assert ledger["credits_refunded"] == 2.0 * misses
    assert ledger["charged_by_path"][PROSPECTR_FIND] == 40


async def test_prospectr_enrich_bills_per_field_and_reports_it_in_a_header(
    provider: ProviderServerProcess, http: httpx.AsyncClient
) -> None:
    expected = 0.0
    seen = {"mobile": 0, "personal_email": 0}
    for i in range(40):
        email = f"person{i}@company{i}.example"
        response = await post(http, PROSPECTR_ENRICH, {"email": email}, BEARER)
        answer = response.json()
        assert answer == fake_data.prospectr_enrich(email)
        price = fake_data.prospectr_enrich_credits(answer)
        assert float(response.headers["X-Credits-Charged"]) == price
        expected += price
        for name in seen:
            seen[name] += answer[name] is not None
    assert all(seen.values()), seen  # some mobiles and personal emails were found
    ledger = provider.ledger()
    assert ledger["credits"] == ledger["credits_by_path"][PROSPECTR_ENRICH] == expected
    assert expected == 40 * 1.0 + 10.0 * seen["mobile"] + 3.0 * seen["personal_email"]


async def test_verifier_bills_half_a_credit_and_knows_the_finders_bad_emails(
    provider: ProviderServerProcess, http: httpx.AsyncClient
) -> None:
    provider.configure(hit_rates={"mailfox": 1.0, "prospectr": 1.0})
    statuses: dict[str, list[str]] = {"mailfox": [], "prospectr": []}
    for person in people():
        for name, path, auth in (("mailfox", MAILFOX, KEY), ("prospectr", PROSPECTR_FIND, BEARER)):
            email = (await post(http, path, person, auth)).json()["email"]
            verdict = (await post(http, VERIFY, {"email": email}, KEY)).json()
            assert verdict == fake_data.verifly_verify(email)
            statuses[name].append(verdict["status"])
    assert set(statuses["prospectr"]) == {"valid"}
    bad = statuses["mailfox"].count("invalid")
    assert 0 < bad < 25  # about a quarter of mailfox's finds
    ledger = provider.ledger()
    assert ledger["credits_by_provider"]["verifly"] == 0.5 * 80
    assert ledger["credits"] == 0.5 * 80 + 40 * 1.0 + 40 * 2.0


async def test_a_keyed_replay_costs_nothing_and_repeats_the_charge_header(
    provider: ProviderServerProcess, http: httpx.AsyncClient
) -> None:
    email = next(
        f"p{i}@x.example"
        for i in range(100)
        if fake_data.prospectr_enrich(f"p{i}@x.example")["mobile"] is not None
    )
    headers = {**BEARER, "Idempotency-Key": "enrich-1"}
    first = await post(http, PROSPECTR_ENRICH, {"email": email}, headers)
    again = await post(http, PROSPECTR_ENRICH, {"email": email}, headers)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["X-Credits-Charged"] == first.headers["X-Credits-Charged"]
    assert again.content == first.content
    ledger = provider.ledger()
    assert ledger["duplicates"] == 1
    assert ledger["credits"] == float(first.headers["X-Credits-Charged"]) >= 11.0
    assert [c["credits"] for c in provider.calls()] == [ledger["credits"], 0.0]


async def test_a_charged_fault_is_billed_once_like_the_answer_it_broke(
    provider: ProviderServerProcess, http: httpx.AsyncClient
) -> None:
    provider.configure(hit_rates={"mailfox": 1.0}, fail_next={"500_after_charge": 1})
    person = people(1)[0]
    headers = {**KEY, "Idempotency-Key": "find-1"}
    failed = await http.post(MAILFOX, json=person, headers=headers)
    assert failed.status_code == 500
    retried = await post(http, MAILFOX, person, headers)  # recovered from the key's store
    assert retried.headers["Idempotent-Replayed"] == "true"
    ledger = provider.ledger()
    assert ledger["charged_unanswered_by_reason"] == {"500_after_charge": 1}
    assert ledger["credits"] == 1.0
    assert [(c["status"], c["credits"]) for c in provider.calls()] == [(500, 1.0), (200, 0.0)]


async def test_a_charged_fault_without_a_key_is_billed_again_on_a_resend(
    provider: ProviderServerProcess, http: httpx.AsyncClient
) -> None:
    provider.configure(idempotency="ignore", fail_next={"malformed": 1})
    headers = {**KEY, "Idempotency-Key": "verify-1"}
    broken = await http.post(VERIFY, json={"email": "a@b.example"}, headers=headers)
    assert broken.status_code == 200
    with pytest.raises(ValueError):
        broken.json()
    await post(http, VERIFY, {"email": "a@b.example"}, headers)
    assert provider.ledger()["credits"] == 1.0  # 0.5 each: the provider does not de-duplicate


@pytest.mark.parametrize("rate", [0.0, 1.0])
async def test_the_hit_rate_is_a_knob(
    provider: ProviderServerProcess, http: httpx.AsyncClient, rate: float
) -> None:
    provider.configure(hit_rates={"mailfox": rate, "prospectr": rate})
    for person in people(20):
        found = (await post(http, MAILFOX, person, KEY)).json()["email"] is not None
        assert found is (rate == 1.0)
        found = (await post(http, PROSPECTR_FIND, person, BEARER)).json()["email"] is not None
        assert found is (rate == 1.0)
    ledger = provider.ledger()
    assert ledger["credits_by_provider"].get("mailfox", 0.0) == 20 * rate
    assert ledger["credits_by_provider"].get("prospectr", 0.0) == 40 * rate
    assert ledger["refunds"] == (20 if rate == 0.0 else 0)


async def test_reset_restores_the_default_hit_rates_and_clears_the_credits(
    provider: ProviderServerProcess, http: httpx.AsyncClient
) -> None:
    provider.configure(hit_rates={"mailfox": 0.0})
    await post(http, VERIFY, {"email": "a@b.example"}, KEY)
    assert provider.ledger()["credits"] == 0.5
    provider.reset()
    assert provider.current_config()["hit_rates"] == DEFAULT_HIT_RATES
    ledger = provider.ledger()
    assert ledger["credits"] == ledger["credits_refunded"] == 0.0
    assert ledger["credits_by_provider"] == ledger["credits_by_path"] == {}


async def test_out_of_range_hit_rates_are_refused(provider: ProviderServerProcess) -> None:
    with pytest.raises(httpx.HTTPStatusError):
        provider.configure(hit_rates={"mailfox": 1.5})


async def test_the_demo_endpoints_bill_what_the_demo_catalog_says(
    provider: ProviderServerProcess, http: httpx.AsyncClient
) -> None:
    acme = {"X-Api-Key": "test-acme-key"}
    firmo = {"Authorization": "Bearer test-firmo-key"}
    await post(http, "/acme/v1/email/find", people(1)[0], acme)
    await post(http, "/acme/v1/person/enrich", {"email": "a@b.example"}, acme)
    await post(http, "/firmo/v1/company/lookup", {"domain": "a.example"}, firmo)
    bulk = {"items": [{"domain": f"d{i}.example"} for i in range(4)]}
    await post(http, "/firmo/v1/company/lookup/bulk", bulk, firmo)
    ledger = provider.ledger()
    assert ledger["credits_by_path"] == {
        "/acme/v1/email/find": 1.0,
        "/acme/v1/person/enrich": 2.0,
        "/firmo/v1/company/lookup": 0.5,
        "/firmo/v1/company/lookup/bulk": 2.0,
    }
    assert ledger["credits"] == 5.5
