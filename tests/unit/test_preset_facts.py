"""The presets say what their providers' current documents say (figures cited in each test).

Each test reads a preset as a user's catalog includes it; the figures come from the
page named in the test, never from the preset itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from playline.calls.catalog import Catalog, ProviderSpec, ToolSpec
from playline.errors import CatalogError


def included(tmp_path: Path, name: str, own: str = "") -> Catalog:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'include = ["{name}"]\n{own}')
    return Catalog.from_toml(path)


def apollo(tmp_path: Path, plan: str | None = None) -> ProviderSpec:
    own = f'[providers.apollo]\nplan = "{plan}"\n' if plan else ""
    return included(tmp_path, "apollo", own).providers["apollo"]


# https://docs.apollo.io/reference/rate-limits, "API Enrichment" (people enrichment and
# bulk people enrichment): Free 50/min, 200/h, 600/day.
def test_apollo_is_paced_at_the_free_plans_documented_limits(tmp_path: Path) -> None:
    free = apollo(tmp_path)
    assert free.plan == "free"
    assert free.pacing.per_minute == 50
    assert free.pacing.per_hour == 200
    assert free.pacing.per_day == 600


# The same page: Basic, Organization and Professional: 1,000/min, no hourly or daily limit.
@pytest.mark.parametrize("plan", ["basic", "organization", "professional"])
def test_apollos_paid_plans_allow_1000_a_minute_with_no_hourly_or_daily_cap(
    tmp_path: Path, plan: str
) -> None:
    paid = apollo(tmp_path, plan)
    assert paid.plan == plan
    assert paid.pacing.per_minute == 1000
    assert paid.pacing.per_hour is None and paid.pacing.per_day is None
    assert paid.pacing.sustained_rps() >= 1000 / 60


def test_a_users_apollo_plan_keeps_the_rest_of_the_preset(tmp_path: Path) -> None:
    paid = apollo(tmp_path, "basic")
    assert paid.base_url == "https://api.apollo.io"
    assert paid.auth is not None and paid.auth.header == "X-Api-Key"
    with pytest.raises(CatalogError, match=r"unknown plan 'enterprise'.*free"):
        apollo(tmp_path, "enterprise")


def dropcontact(tmp_path: Path) -> tuple[ProviderSpec, ToolSpec]:
    catalog = included(tmp_path, "dropcontact")
    return catalog.providers["dropcontact"], catalog.tools["dropcontact_contact"]


# https://developer.dropcontact.com/en/quickstart/: POST https://api.dropcontact.com/v1/enrich/all,
# then GET /v1/enrich/all/{request_id}.
def test_dropcontact_calls_the_documented_api(tmp_path: Path) -> None:
    provider, tool = dropcontact(tmp_path)
    assert provider.base_url == "https://api.dropcontact.com"
    assert (tool.method, tool.path) == ("POST", "/v1/enrich/all")
    assert tool.job is not None
    assert (tool.job.status_method, tool.job.status_path) == ("GET", "/v1/enrich/all/{job_id}")
    assert tool.job.items_field == "data" and tool.job.max_items <= 250


# https://developer.dropcontact.com/en/rate-limits/: 60 requests per second.
def test_dropcontact_is_paced_at_60_a_second(tmp_path: Path) -> None:
    provider, _ = dropcontact(tmp_path)
    assert provider.pacing.rps == 60
    assert provider.pacing.sustained_rps() == 60


# https://developer.dropcontact.com/en/credits/: "The credit is taken when the request is
# sent, then given back automatically if no email is found": a budget reserves it.
def test_dropcontact_takes_a_credit_at_submit_and_refunds_a_miss(tmp_path: Path) -> None:
    _, tool = dropcontact(tmp_path)
    assert tool.billing.rule == "refund_on_miss"
    assert tool.max_credits == 1  # reserved per record before the submit goes out
    found = {"email": [{"email": "denis.cohen@dropcontact.com"}]}
    assert tool.charge(found).credits == 1
    assert tool.charge({"first_name": "Denis"}).credits == 0


# https://developer.dropcontact.com/en/errors/: an unknown request_id answers like a
# running job, so a lost job waits out max_wait_s (and is given up, never re-sent).
def test_a_lost_dropcontact_job_is_given_up_within_half_an_hour(tmp_path: Path) -> None:
    _, tool = dropcontact(tmp_path)
    assert tool.job is not None and tool.job.max_wait_s <= 1800


def fullenrich(tmp_path: Path) -> ToolSpec:
    return included(tmp_path, "fullenrich").tools["fullenrich_contact"]


# https://docs.fullenrich.com/api/v2/contact/enrich/bulk/post: v2 body (`data`, each
# contact's `first_name`, `last_name`, `enrich_fields` among contact.work_emails|...).
def test_fullenrich_sends_the_v2_body(tmp_path: Path) -> None:
    tool = fullenrich(tmp_path)
    assert tool.path == "/api/v2/contact/enrich/bulk"
    assert {"first_name", "last_name"} <= set(tool.input)
    assert "firstname" not in tool.input and "lastname" not in tool.input
    assert tool.job is not None
    assert tool.job.items_field == "data"
    assert tool.job.status_path == "/api/v2/contact/enrich/bulk/{job_id}"
    fields = tool.job.item["enrich_fields"]
    assert fields and set(fields) <= {
        "contact.work_emails",
        "contact.personal_emails",
        "contact.phones",
    }


# https://docs.fullenrich.com/api/v2/contact/enrich/bulk/get: the work email is at
# contact_info.most_probable_work_email.email.
def test_fullenrich_reads_the_v2_answer(tmp_path: Path) -> None:
    tool = fullenrich(tmp_path)
    member = {"contact_info": {"most_probable_work_email": {"email": "john.snow@example.com"}}}
    assert tool.get(member, "email") == "john.snow@example.com"
    assert tool.charge(member).credits == 1
    assert tool.charge({"contact_info": {}}).credits == 0


# https://docs.fullenrich.com/ratelimit: "our queue handles 100 contacts at the same time".
def test_fullenrich_never_has_more_than_100_contacts_in_flight(tmp_path: Path) -> None:
    tool = fullenrich(tmp_path)
    assert tool.job is not None and tool.job.max_jobs_in_flight is not None
    assert tool.job.max_items * tool.job.max_jobs_in_flight <= 100
